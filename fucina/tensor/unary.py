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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DType
from ..errors import InvalidShape, TagError
from ..ir.execute import emit
from ..ir.graph import Node
from ..kernels.elementwise import PUBLIC_UNARY
from ..rng import MASK64
from . import fast
from .arguments import int_arg, real_arg
from .base import Tensor, identity_view, result
from .math import binary, forward_only

if TYPE_CHECKING:
    from typing_extensions import Self

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
    forward_only(self)
    return result(self, self.axis_tags, narrow(build(widen(self)), self.dtype))


def real(v: Any, what: str) -> float:
    """A real Python/numpy number (bool rejected) as a float (:func:`real_arg`)."""
    return real_arg(v, what)


def f32_param(v: Any, what: str) -> float:
    """A real parameter rounded to f32 (kernels and the reference agree on its value)."""
    with np.errstate(over="ignore"):
        return float(np.float32(real(v, what)))


def _unary_node(node: Node, fn: str, params: tuple[Any, ...] = ()) -> Node:
    if params:
        return emit("unary", (node,), fn=fn, params=params)
    return emit("unary", (node,), fn=fn)


def _apply(self: Any, fn: str, params: tuple[Any, ...] = ()) -> Any:
    if not params:  # (a known signature is never a HALF type: see below)
        hit = fast.unary(self, fn)
        if hit is not None:
            return hit
    if params or self.dtype in HALF:  # parameters, or a cast -> op -> cast program
        return float_op(self, lambda n: _unary_node(n, fn, params))
    out = float_op(self, lambda n: _unary_node(n, fn))
    fast.learn_unary(self, fn, out)
    return out


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
    return _apply(self, "clamp", (lo, hi))


class UnaryMath(Tensor):
    """Elementwise activations, rounding and transcendental functions (f32, f16, bf16).

    On f16/bf16 each op computes through f32 and rounds once; typed-float math is
    forward-only.
    """

    __slots__ = ()

    def unary(self, op: str) -> Self:
        """Apply the elementwise op named ``op`` (the reference's UnaryOp set, e.g.
        "relu", "softplus", "gelu_quant"); TagError for an unknown name."""
        if not isinstance(op, str) or op not in PUBLIC_UNARY:
            raise TagError(f"unknown unary op {op!r}; expected one of {PUBLIC_UNARY}")
        if op == "neg":
            forward_only(self)
            return result(self, self.axis_tags, emit("unary", (self._node,), fn="neg"))
        return _apply(self, op)

    def relu(self) -> Self:
        """max(x, 0) (NaN propagates); gradient 1 where x > 0."""
        return _apply(self, "relu")

    def exp(self) -> Self:
        """e^x."""
        return _apply(self, "exp")

    def sqrt(self) -> Self:
        """Square root (NaN below 0)."""
        return _apply(self, "sqrt")

    def rsqrt(self) -> Self:
        """1 / sqrt(x)."""
        return _apply(self, "rsqrt")

    def sigmoid(self) -> Self:
        """1 / (1 + e^-x)."""
        return _apply(self, "sigmoid")

    def silu(self) -> Self:
        """x * sigmoid(x)."""
        return _apply(self, "silu")

    def log(self) -> Self:
        """Natural log."""
        return _apply(self, "log")

    def log1p(self) -> Self:
        """log(1 + x), accurate near 0."""
        return _apply(self, "log1p")

    def abs(self) -> Self:
        """|x|; gradient sign(x) (0 at 0)."""
        return _apply(self, "abs")

    def sin(self) -> Self:
        """sin(x)."""
        return _apply(self, "sin")

    def cos(self) -> Self:
        """cos(x)."""
        return _apply(self, "cos")

    def tanh(self) -> Self:
        """tanh(x)."""
        return _apply(self, "tanh")

    def fast_tanh(self) -> Self:
        """The NAM rational tanh approximation."""
        return _apply(self, "fast_tanh")

    def softcap30(self) -> Self:
        """30 tanh(x / 30) logit softcap."""
        return _apply(self, "softcap_30")

    def softcap15(self) -> Self:
        """15 tanh(x / 15) logit softcap."""
        return _apply(self, "softcap_15")

    def gelu(self) -> Self:
        """GELU, tanh approximation."""
        return _apply(self, "gelu")

    def quick_gelu(self) -> Self:
        """x * sigmoid(1.702 x)."""
        return _apply(self, "quick_gelu")

    def elu(self) -> Self:
        """ELU with alpha 1: x > 0 ? x : expm1(x)."""
        return _apply(self, "elu")

    def gelu_erf(self) -> Self:
        """Exact (erf) GELU."""
        return _apply(self, "gelu_erf")

    def floor(self) -> Self:
        """Round toward -inf; zero gradient."""
        return _apply(self, "floor")

    def ceil(self) -> Self:
        """Round toward +inf; zero gradient."""
        return _apply(self, "ceil")

    def round(self) -> Self:
        """Round half to even (torch.round); zero gradient."""
        return _apply(self, "round")

    def sign(self) -> Self:
        """1 / -1 / x itself (keeps +-0 and NaN); zero gradient."""
        return _apply(self, "sign")

    def reciprocal(self) -> Self:
        """1 / x."""
        return _apply(self, "reciprocal")

    def __abs__(self) -> Self:
        """``abs(a)`` is :meth:`abs`."""
        return self.abs()

    def leaky_relu(self, negative_slope: float = 0.01) -> Self:
        """x > 0 ? x : negative_slope * x."""
        return _apply(self, "leaky_relu", (f32_param(negative_slope, "negative_slope"),))

    def clamp(self, min_value: float | None, max_value: float | None) -> Self:
        """min(max(x, min_value), max_value) (torch.clamp; NaN propagates). ``None``
        leaves a side open. Gradient 1 inside [min, max] (inclusive), 0 outside.
        InvalidShape when min > max or a bound is NaN."""
        return _clamp(self, _bound(min_value, -math.inf, "min_value"),
                      _bound(max_value, math.inf, "max_value"))

    def pow_scalar(self, exponent: float) -> Self:
        """x ** exponent (f16/bf16: computed in f32 with an f32 exponent, narrowed once)."""
        e = real(exponent, "exponent")
        return float_op(self, lambda n: emit("scalar", (n,), fn="pow", value=e))


class UnaryF32(Tensor):
    """Tensor exponents, one-sided clamps and dropout (f32)."""

    __slots__ = ()

    def pow(self, other: Tensor | float) -> Self:
        """self ** other elementwise with tag broadcasting (C pow domain: a negative base
        with a non-integer exponent is NaN, 0 ** 0 = 1). Differentiable in both
        operands; the exponent gradient ln(a) a^b is meaningful for positive bases, as
        in torch. A Python number exponent is :meth:`UnaryMath.pow_scalar`."""
        if isinstance(other, numbers.Real) and not isinstance(other, bool):
            e = real(other, "exponent")
            return float_op(self, lambda n: emit("scalar", (n,), fn="pow", value=e))
        return binary(self, other, "pow")

    def clamp_min(self, min_value: float) -> Self:
        """max(x, min_value) (torch.clamp_min)."""
        return _clamp(self, _bound(real(min_value, "min_value"), -math.inf, "min_value"),
                      math.inf)

    def clamp_max(self, max_value: float) -> Self:
        """min(x, max_value) (torch.clamp_max)."""
        return _clamp(self, -math.inf,
                      _bound(real(max_value, "max_value"), math.inf, "max_value"))

    def dropout(self, p: float, seed: int) -> Self:
        """Inverted dropout: element i (row-major flat index) keeps x[i] / (1 - p) iff the
        53-bit uniform of ``fucina.rng.at(seed, i)`` is below 1 - p, else 0.

        The mask is never stored: forward and backward regenerate it from (seed, i).
        Requires 0 <= p < 1 (InvalidShape otherwise); p == 0 is an identity view.
        """
        pv = real(p, "p")
        seed = int_arg(seed, "seed")
        p32 = f32_param(pv, "p")
        if not (0.0 <= pv < 1.0) or not (0.0 <= p32 < 1.0):
            raise InvalidShape(f"dropout needs 0 <= p < 1, got {p!r}")
        forward_only(self)
        if p32 == 0.0:
            return result(self, self.axis_tags, identity_view(self))
        # the seed travels as a uint64 scalar so every kernel specializes on one type
        params = (np.uint64(int(seed) & MASK64), p32)
        return result(self, self.axis_tags, _unary_node(self._node, "dropout", params))
