"""Exceptions raised by Fucina.

Runtime (size, index, lifetime) failures derive from :class:`TensorError`;
tag-level violations are :class:`TagError`, a ``TypeError`` raised when a type
is built or an op is called or traced, before any kernel runs.
"""


class TensorError(Exception):
    """Base class of every runtime tensor error."""


class InvalidShape(TensorError):
    """A shape is malformed: zero dims, wrong rank, factors that do not multiply out."""


class InvalidDataLength(TensorError):
    """A buffer holds a different number of elements than the shape needs."""


class ShapeMismatch(TensorError):
    """Two axes with the same tag have incompatible sizes."""


class UnsupportedView(TensorError):
    """The tensor's layout does not allow the requested zero-copy access."""


class MutableDataRequiresNoGrad(TensorError):
    """Mutable data access on a tensor that participates in autograd."""


class IndexOutOfBounds(TensorError):
    """An index lies outside the axis it addresses."""


class EmptySelection(TensorError):
    """A data-dependent selection matched nothing (zero-size tensors do not exist)."""


class GradientCastUnsupported(TensorError):
    """A cast that cannot carry gradients was applied to a tensor that requires grad."""


class NoGradientGraph(TensorError):
    """backward() was called on a tensor with no gradient graph."""


class MissingOutputGradient(InvalidShape):
    """backward() on a non-scalar output with no explicit output gradient."""


class UnsupportedGradient(TensorError):
    """The op cannot propagate gradients for this combination of operands."""


class MissingBackwardGradient(TensorError):
    """A custom VJP's backward returned no gradient for an input that requires grad."""


class NestedCheckpointRecompute(TensorError):
    """A checkpointed block re-ran (in backward) inside another checkpoint's recompute."""


class CheckpointOutputNotDifferentiable(TensorError):
    """A checkpointed block, re-run in backward, returned a tensor with no gradient graph."""


class CheckpointMissingInputGradient(TensorError):
    """A checkpoint input that requires grad received no gradient from the re-run block."""


class InvalidGradcheckOptions(ValueError):
    """gradcheck options out of range: eps not finite and positive, tolerances negative."""


class NoVariableInputs(TensorError):
    """gradcheck was given no variable input to check."""


class MissingAnalyticalGradient(TensorError):
    """The analytical backward produced no gradient for a checked gradcheck input."""


class GradientPreparedConv2dUnsupported(UnsupportedGradient):
    """A prepared-weight conv2d entry was given an operand that requires grad."""


class DivisionByZero(TensorError):
    """Integer division by zero."""


class ContextMismatch(TensorError):
    """Operands belong to different ExecContexts."""


class Deinitialized(TensorError):
    """The tensor was deinit'ed (or released by its exec scope) and cannot be used."""


class GradientQuantizedMatmulUnsupported(UnsupportedGradient):
    """A gradient was asked of a block-quantized weight (quantized weights are constants),
    or of the input of a packed quantized matmul (``dot_packed`` is inference-only)."""


class GradientPackedMatmulUnsupported(UnsupportedGradient):
    """``dot_packed`` against a dense packed RHS on an input that requires grad."""


class TernaryContractDimNotBlockAligned(InvalidShape):
    """``dot_ternary_ste``: the contracted size is not a positive multiple of 256."""


class EncoderUnavailable(TensorError, ValueError):
    """No f32 encoder exists for the requested format (decode-only formats)."""


class NonFiniteValue(TensorError, ValueError):
    """A NaN or infinity was passed to a block encoder (ggml's encoders assume finite input)."""


class ModelFileError(TensorError, ValueError):
    """A model file (GGUF, safetensors) is malformed; the message names the file (and tensor)."""


class InvalidMagic(ModelFileError):
    """The file does not start with the format's magic bytes."""


class UnsupportedVersion(ModelFileError):
    """The file's format version is not one this reader accepts (GGUF 2 and 3)."""


class TruncatedFile(ModelFileError):
    """The file ends inside its header, metadata or tensor directory."""


class InvalidTensorInfo(ModelFileError):
    """A tensor entry is inconsistent: bad rank or shape, misaligned, or data past the end of
    the file."""


class UnsupportedDType(ModelFileError):
    """A tensor's element type has no fucina dtype (unknown GGML type code, safetensors dtype)."""


class TensorNotFound(TensorError, KeyError):
    """No tensor of that name in the model file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ActiveExecScopeUnsupported(TensorError):
    """A storage-consuming op (take_add_no_grad, take_scale_no_grad) was given a tensor an
    exec scope owns: consuming it would release the scope's reference early."""


class LinearCrossEntropyBackwardConsumed(TensorError):
    """A second backward through one ``linear_cross_entropy`` result: its backward turns
    the saved logits into their gradient in place, so the record is single-use."""


class LinearDistillBackwardConsumed(TensorError):
    """A second backward through one ``linear_distill`` result (single-use record, as
    ``linear_cross_entropy``)."""


class TagError(TypeError):
    """A tag-level violation: unknown, duplicate or misplaced tags, rank overflow."""


__all__ = [
    "TensorError",
    "InvalidShape",
    "InvalidDataLength",
    "ShapeMismatch",
    "UnsupportedView",
    "MutableDataRequiresNoGrad",
    "IndexOutOfBounds",
    "EmptySelection",
    "GradientCastUnsupported",
    "NoGradientGraph",
    "UnsupportedGradient",
    "GradientPreparedConv2dUnsupported",
    "MissingOutputGradient",
    "MissingBackwardGradient",
    "NestedCheckpointRecompute",
    "CheckpointOutputNotDifferentiable",
    "CheckpointMissingInputGradient",
    "InvalidGradcheckOptions",
    "NoVariableInputs",
    "MissingAnalyticalGradient",
    "DivisionByZero",
    "ContextMismatch",
    "Deinitialized",
    "GradientQuantizedMatmulUnsupported",
    "GradientPackedMatmulUnsupported",
    "TernaryContractDimNotBlockAligned",
    "EncoderUnavailable",
    "NonFiniteValue",
    "ModelFileError",
    "InvalidMagic",
    "UnsupportedVersion",
    "TruncatedFile",
    "InvalidTensorInfo",
    "UnsupportedDType",
    "TensorNotFound",
    "ActiveExecScopeUnsupported",
    "LinearCrossEntropyBackwardConsumed",
    "LinearDistillBackwardConsumed",
    "TagError",
]
