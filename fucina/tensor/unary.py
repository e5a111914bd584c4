"""Unary and parameterized elementwise ops: activations, rounding, clamp, dropout, pow.

Every op records one ``unary`` primitive (parameters travel in its ``params``
attribute; its VJP lives in ``fucina.ir.autodiff``). On the f16/bf16 branch
the ops compute through f32 and narrow once: the recorded program is
``cast -> f32 op -> cast``, so the result is exactly "widen, run the f32 op,
narrow". Typed-float math is forward-only (operands that require grad are
rejected).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import InvalidShape, TagError
from ..ir.execute import emit
from ..ir.graph import Node
from ..kernels.elementwise import PUBLIC_UNARY
from ..rng import MASK64
from . import math as _math
from .base import POOL, identity_coeffs, method, result

HALF = (DType.f16, DType.bf16)


# -- helpers shared by the op modules ----------------------------------------------


def widen(x: Any) -> Node:
    """``x``'s node in f32 (a cast node for f16/bf16, the node itself otherwise)."""
    node = x._node
    if x.dtype in HALF:
        return emit("cast", (node,), dtype=DType.f32, src=x.dtype)
    return node


def narrow(node: Node, dtype: DType) -> Node:
    """Round an f32 result back to ``dtype`` once (identity unless f16/bf16)."""
    if dtype in HALF:
        return emit("cast", (node,), dtype=dtype, src=DType.f32)
    return node


def float_op(self: Any, build: Callable[[Node], Node]) -> Any:
    """Shape-preserving float op: ``build`` maps the f32 node to the f32 result."""
    _math._forward_only(self)
    return result(self, self.axis_tags, narrow(build(widen(self)), self.dtype))


def real(v: Any, what: str) -> float:
    """A real Python/numpy number (bool rejected) as a float."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {v!r}")
    return float(v)


def f32_param(v: Any, what: str) -> float:
    """A real parameter rounded to f32 (kernels and the reference agree on its value)."""
    with np.errstate(over="ignore"):
        return float(np.float32(real(v, what)))


def _unary_node(node: Node, fn: str, params: tuple[Any, ...] = ()) -> Node:
    if params:
        return emit("unary", (node,), fn=fn, params=params)
    return emit("unary", (node,), fn=fn)


# -- unary(op) and its aliases ----------------------------------------------------------


@method
def unary(self: Any, op: str) -> Any:
    """Apply the elementwise op named ``op`` (the reference's UnaryOp set, e.g. "relu",
    "softplus", "gelu_quant"); TagError for an unknown name."""
    if not isinstance(op, str) or op not in PUBLIC_UNARY:
        raise TagError(f"unknown unary op {op!r}; expected one of {PUBLIC_UNARY}")
    if op == "neg":
        return self.neg()
    return float_op(self, lambda n: _unary_node(n, op))


_ALIASES = {
    "relu": ("relu", "max(x, 0) (NaN propagates); gradient 1 where x > 0."),
    "exp": ("exp", "e^x."),
    "sqrt": ("sqrt", "Square root (NaN below 0)."),
    "rsqrt": ("rsqrt", "1 / sqrt(x)."),
    "sigmoid": ("sigmoid", "1 / (1 + e^-x)."),
    "silu": ("silu", "x * sigmoid(x)."),
    "log": ("log", "Natural log."),
    "log1p": ("log1p", "log(1 + x), accurate near 0."),
    "abs": ("abs", "|x|; gradient sign(x) (0 at 0)."),
    "sin": ("sin", "sin(x)."),
    "cos": ("cos", "cos(x)."),
    "tanh": ("tanh", "tanh(x)."),
    "fast_tanh": ("fast_tanh", "The NAM rational tanh approximation."),
    "softcap30": ("softcap_30", "30 tanh(x / 30) logit softcap."),
    "softcap15": ("softcap_15", "15 tanh(x / 15) logit softcap."),
    "gelu": ("gelu", "GELU, tanh approximation."),
    "quick_gelu": ("quick_gelu", "x * sigmoid(1.702 x)."),
    "elu": ("elu", "ELU with alpha 1: x > 0 ? x : expm1(x)."),
    "gelu_erf": ("gelu_erf", "Exact (erf) GELU."),
    "floor": ("floor", "Round toward -inf; zero gradient."),
    "ceil": ("ceil", "Round toward +inf; zero gradient."),
    "round": ("round", "Round half to even (torch.round); zero gradient."),
    "sign": ("sign", "1 / -1 / x itself (keeps +-0 and NaN); zero gradient."),
    "reciprocal": ("reciprocal", "1 / x."),
}


def _make_alias(name: str, fn: str, doc: str) -> None:
    def op(self: Any) -> Any:
        return float_op(self, lambda n: _unary_node(n, fn))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    POOL[name] = op


for _name, (_fn, _doc) in _ALIASES.items():
    _make_alias(_name, _fn, _doc)


@method
def __abs__(self: Any) -> Any:
    return self.abs()


# -- parameterized elementwise ops -----------------------------------------------


@method
def leaky_relu(self: Any, negative_slope: float = 0.01) -> Any:
    """x > 0 ? x : negative_slope * x."""
    s = f32_param(negative_slope, "negative_slope")
    return float_op(self, lambda n: _unary_node(n, "leaky_relu", (s,)))


def _bound(v: Any, default: float, what: str) -> float:
    if v is None:
        return default
    b = f32_param(v, what)
    if math.isnan(b):
        raise InvalidShape(f"{what} must not be NaN")
    return b


def _clamp(self: Any, lo: float, hi: float) -> Any:
    if lo > hi:
        raise InvalidShape(f"clamp bounds are reversed: min {lo} > max {hi}")
    return float_op(self, lambda n: _unary_node(n, "clamp", (lo, hi)))


@method
def clamp(self: Any, min_value: float | None, max_value: float | None) -> Any:
    """min(max(x, min_value), max_value) (torch.clamp; NaN propagates). ``None`` leaves a
    side open. Gradient 1 inside [min, max] (inclusive), 0 outside. InvalidShape when
    min > max or a bound is NaN."""
    return _clamp(self, _bound(min_value, -math.inf, "min_value"),
                  _bound(max_value, math.inf, "max_value"))


@method
def clamp_min(self: Any, min_value: float) -> Any:
    """max(x, min_value) (torch.clamp_min)."""
    return _clamp(self, _bound(real(min_value, "min_value"), -math.inf, "min_value"), math.inf)


@method
def clamp_max(self: Any, max_value: float) -> Any:
    """min(x, max_value) (torch.clamp_max)."""
    return _clamp(self, -math.inf, _bound(real(max_value, "max_value"), math.inf, "max_value"))


@method
def dropout(self: Any, p: float, seed: int) -> Any:
    """Inverted dropout: element i (row-major flat index) keeps x[i] / (1 - p) iff the
    53-bit uniform of ``fucina.rng.at(seed, i)`` is below 1 - p, else 0.

    The mask is never stored: forward and backward regenerate it from (seed, i).
    Requires 0 <= p < 1 (InvalidShape otherwise); p == 0 is an identity view.
    """
    pv = real(p, "p")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    p32 = f32_param(pv, "p")
    if not (0.0 <= pv < 1.0) or not (0.0 <= p32 < 1.0):
        raise InvalidShape(f"dropout needs 0 <= p < 1, got {p!r}")
    _math._forward_only(self)
    node = self._node
    if p32 == 0.0:
        r = len(node.shape)
        return result(self, self.axis_tags, emit(
            "view", (node,), shape=node.shape, coeffs=identity_coeffs(r), base=(0,) * r))
    # the seed travels as a uint64 scalar so every kernel specializes on one type
    params = (np.uint64(int(seed) & MASK64), p32)
    return result(self, self.axis_tags, _unary_node(node, "dropout", params))


# -- pow -------------------------------------------------------------------------


@method
def pow(self: Any, other: Any) -> Any:
    """self ** other elementwise with tag broadcasting (C pow domain: a negative base with
    a non-integer exponent is NaN, 0 ** 0 = 1). Differentiable in both operands; the
    exponent gradient ln(a) a^b is meaningful for positive bases, as in torch. A Python
    number exponent is :meth:`pow_scalar`."""
    if isinstance(other, numbers.Real) and not isinstance(other, bool):
        return self.pow_scalar(other)
    return _math._binary(self, other, "pow")


@method
def pow_scalar(self: Any, exponent: float) -> Any:
    """x ** exponent (f16/bf16: computed in f32 with an f32 exponent, narrowed once)."""
    e = real(exponent, "exponent")
    return float_op(self, lambda n: emit("scalar", (n,), fn="pow", value=e))
