"""Fucina for Python: named-axis tensors whose ops record into a small IR.

Axes are named in the type (``fucina.Tensor("batch", "in")``), contractions
name the axis they consume (``x.dot(w, "in")``), and every op builds an IR
node run by one executor; reverse-mode autodiff is an IR transform.
"""

from __future__ import annotations

from typing import Any

from . import internal, optim, rng
from .autograd_tools import (
    GradcheckResult,
    checkpoint,
    checkpoint_with_context,
    custom_vjp,
    gradcheck,
)
from .blocks import *  # noqa: F403 - GGML block dtypes and block-size constants
from .blocks import BLOCK_DTYPES, BLOCK_SIZES
from .compile import Compiled, compile
from .dtypes import DType
from .errors import (
    ActiveExecScopeUnsupported,
    CheckpointMissingInputGradient,
    CheckpointOutputNotDifferentiable,
    ContextMismatch,
    Deinitialized,
    DivisionByZero,
    EmptySelection,
    EncoderUnavailable,
    GradientCastUnsupported,
    GradientPackedMatmulUnsupported,
    GradientPreparedConv2dUnsupported,
    GradientQuantizedMatmulUnsupported,
    IndexOutOfBounds,
    InvalidDataLength,
    InvalidGradcheckOptions,
    InvalidMagic,
    InvalidShape,
    InvalidTensorInfo,
    LinearCrossEntropyBackwardConsumed,
    LinearDistillBackwardConsumed,
    MissingAnalyticalGradient,
    MissingBackwardGradient,
    MissingOutputGradient,
    ModelFileError,
    MutableDataRequiresNoGrad,
    NestedCheckpointRecompute,
    NoGradientGraph,
    NonFiniteValue,
    NoVariableInputs,
    ShapeMismatch,
    TagError,
    TensorError,
    TensorNotFound,
    TernaryContractDimNotBlockAligned,
    TruncatedFile,
    UnsupportedDType,
    UnsupportedGradient,
    UnsupportedVersion,
    UnsupportedView,
)
from .kernels.cache import CacheInfo, cache_info
from .kernels.qmatmul import PackedRhs
from .runtime.context import ExecContext
from .runtime.gradmode import is_grad_enabled, no_grad
from .runtime.rope import AxisRange, RopeTable, RopeTheta
from .tensor import SliceRange, Tensor, einsum_many
from .tensor.autograd import GradState
from .tensor.conv import PreparedConvWeights
from .tensor.selection import RouterTopKResult, TopKResult

__version__ = "0.1.0"

# Module-level dtype aliases: fucina.f32, fucina.bool_, fucina.q8_0, ...
for _dt in DType:
    globals()["bool_" if _dt is DType.bool else _dt.value] = _dt
del _dt


def __getattr__(name: str) -> Any:
    if name in ("gguf", "safetensors"):  # model-file modules load on first use
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name == "RawTensor":
        raise AttributeError(
            "fucina.RawTensor is not public: the raw tensor lives at fucina.internal.RawTensor")
    raise AttributeError(f"module 'fucina' has no attribute {name!r}")


__all__ = [
    "ActiveExecScopeUnsupported",
    "AxisRange",
    "BLOCK_DTYPES",
    "CheckpointMissingInputGradient",
    "CheckpointOutputNotDifferentiable",
    "GradcheckResult",
    "InvalidGradcheckOptions",
    "MissingAnalyticalGradient",
    "MissingBackwardGradient",
    "NestedCheckpointRecompute",
    "NoVariableInputs",
    "checkpoint",
    "checkpoint_with_context",
    "custom_vjp",
    "gradcheck",
    "optim",
    "CacheInfo",
    "Compiled",
    "compile",
    "cache_info",
    "BLOCK_SIZES",
    "ContextMismatch",
    "DType",
    "Deinitialized",
    "DivisionByZero",
    "EmptySelection",
    "EncoderUnavailable",
    "GradientPackedMatmulUnsupported",
    "GradientQuantizedMatmulUnsupported",
    "InvalidMagic",
    "InvalidTensorInfo",
    "ModelFileError",
    "NonFiniteValue",
    "TensorNotFound",
    "TernaryContractDimNotBlockAligned",
    "TruncatedFile",
    "UnsupportedDType",
    "UnsupportedVersion",
    "ExecContext",
    "GradientCastUnsupported",
    "GradientPreparedConv2dUnsupported",
    "PreparedConvWeights",
    "PackedRhs",
    "GradState",
    "IndexOutOfBounds",
    "InvalidDataLength",
    "InvalidShape",
    "LinearCrossEntropyBackwardConsumed",
    "LinearDistillBackwardConsumed",
    "MissingOutputGradient",
    "MutableDataRequiresNoGrad",
    "NoGradientGraph",
    "RopeTable",
    "RopeTheta",
    "ShapeMismatch",
    "RouterTopKResult",
    "SliceRange",
    "TagError",
    "Tensor",
    "TensorError",
    "TopKResult",
    "UnsupportedGradient",
    "UnsupportedView",
    "einsum_many",
    "internal",
    "is_grad_enabled",
    "no_grad",
    "rng",
]
