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


class DivisionByZero(TensorError):
    """Integer division by zero."""


class ContextMismatch(TensorError):
    """Operands belong to different ExecContexts."""


class Deinitialized(TensorError):
    """The tensor was deinit'ed (or released by its exec scope) and cannot be used."""


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
    "TagError",
]
