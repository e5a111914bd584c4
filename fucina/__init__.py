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
    CheckpointMissingInputGradient,
    CheckpointOutputNotDifferentiable,
    ContextMismatch,
    Deinitialized,
    DivisionByZero,
    EmptySelection,
    GradientCastUnsupported,
    IndexOutOfBounds,
    InvalidDataLength,
    InvalidGradcheckOptions,
    InvalidShape,
    MissingAnalyticalGradient,
    MissingBackwardGradient,
    MissingOutputGradient,
    MutableDataRequiresNoGrad,
    NestedCheckpointRecompute,
    NoGradientGraph,
    NoVariableInputs,
    ShapeMismatch,
    TagError,
    TensorError,
    UnsupportedGradient,
    UnsupportedView,
)
from .kernels.cache import CacheInfo, cache_info
from .runtime.context import ExecContext
from .runtime.gradmode import is_grad_enabled, no_grad
from .tensor import SliceRange, Tensor, einsum_many

__version__ = "0.1.0"

# Module-level dtype aliases: fucina.f32, fucina.bool_, fucina.q8_0, ...
for _dt in DType:
    globals()["bool_" if _dt is DType.bool else _dt.value] = _dt
del _dt


def __getattr__(name: str) -> Any:
    if name == "RawTensor":
        raise AttributeError(
            "fucina.RawTensor is not public: the raw tensor lives at fucina.internal.RawTensor")
    raise AttributeError(f"module 'fucina' has no attribute {name!r}")


__all__ = [
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
    "ExecContext",
    "GradientCastUnsupported",
    "IndexOutOfBounds",
    "InvalidDataLength",
    "InvalidShape",
    "MissingOutputGradient",
    "MutableDataRequiresNoGrad",
    "NoGradientGraph",
    "ShapeMismatch",
    "SliceRange",
    "TagError",
    "Tensor",
    "TensorError",
    "UnsupportedGradient",
    "UnsupportedView",
    "einsum_many",
    "internal",
    "is_grad_enabled",
    "no_grad",
    "rng",
]
