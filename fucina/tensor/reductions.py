"""Reductions and scans: masked sum/mean/max/min, prod, variance, norms, logsumexp,
any/all, cumsum/cumprod, argmax.

Every op records as a composition of primitives (``reduce``, ``scan``,
``argmax``, elementwise ops), so gradients come from the primitives' VJP
rules. On f16/bf16 the input is widened to f32 first: reductions return f32,
scans narrow back once, argmax returns i64. Typed-float math is forward-only.

``sum``/``mean`` take the reference's options form: ``x.sum("col", mask=m,
empty=v)``. They live in three mixins because their result dtype depends on
the branch: :class:`Sum` (f32, f64), :class:`HalfSum` (f16/bf16 -> f32),
:class:`CountSum` (integers and bool -> i64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import tags as T
from ..dtypes import DType, reduction_dtype
from ..errors import TagError
from ..ir.autodiff import broadcast_back
from ..ir.execute import emit
from ..ir.graph import Node
from ..runtime.gradmode import no_grad
from . import fast
from .arguments import is_int
from .base import Tensor, result
from .masks import mask_node
from .math import forward_only, reduce_tags
from .unary import HALF, narrow, real, widen

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import BoolTensor, F32Tensor, I64Tensor


def _axis(self: Any, tag: str) -> int:
    return T.index(self.axis_tags, T.check_tag(tag))


def _reduce_node(node: Node, fn: str, axes: tuple[int, ...], dtype: DType, **kw: Any) -> Node:
    return emit("reduce", (node,), fn=fn, axes=axes, dtype=dtype, **kw)


def _all_axes(self: Any) -> tuple[int, ...]:
    return tuple(range(self.tag_count)) if self.tag_count else (0,)


def _cast(node: Node, dtype: DType) -> Node:
    if node.dtype is dtype:
        return node
    return emit("cast", (node,), dtype=dtype, src=node.dtype)


# -- sum / mean / max / min with the masked options ------------------------------------

_IDENTITY = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf}


def _reduction(self: Any, tag: str, fn: str, mask: Any, empty: Any) -> Any:
    if mask is None and empty is not None:
        raise TagError(f"{fn}: empty= is only meaningful with mask=")
    fill_empty = None if empty is None else real(empty, "empty")
    if fn in ("max", "min"):
        if self.dtype not in (DType.f32, *HALF):
            raise TagError(f"{fn} is defined on f32/f16/bf16 tensors, not {self.dtype.value}")
    elif mask is None:
        hit = fast.reduce(self, tag, fn)
        if hit is not None:
            return hit
        out = reduce_tags(self, (T.check_tag(tag),), fn)
        fast.learn_reduce(self, tag, fn, out)
        return out
    forward_only(self)
    axes = (_axis(self, tag),)
    out_tags = T.remove_tags(self.axis_tags, (tag,))
    if fn in ("max", "min"):
        x, dt = widen(self), DType.f32
    else:
        dt = reduction_dtype(self.dtype)
        x = widen(self) if self.dtype in HALF else self._node
    if mask is None:
        return result(self, out_tags, _reduce_node(x, fn, axes, dt), dt)
    sel = mask_node(self, mask, fn)
    ident = emit("fill", (), shape=x.shape, dtype=x.dtype, value=_IDENTITY[fn])
    picked = emit("where", (sel, x, ident))
    out = _reduce_node(picked, "sum" if fn == "mean" else fn, axes, dt)
    if fn == "mean" or fill_empty is not None:
        cdt = dt if dt.is_float else DType.f32
        count = _reduce_node(_cast(sel, cdt), "sum", axes, cdt)
        none = emit("compare", (count,), fn="eq", value=0)  # lanes that selected nothing
    if fn == "mean":
        # sum / count, and NaN (0/0) on an empty lane; never divides by zero
        one = emit("fill", (), shape=count.shape, dtype=count.dtype, value=1)
        out = emit("binary", (out, emit("where", (none, one, count))), fn="div")
        if fill_empty is None:
            fill_empty = math.nan
    if fill_empty is not None:
        v = emit("fill", (), shape=out.shape, dtype=dt, value=fill_empty)
        out = emit("where", (none, v, out))
    return result(self, out_tags, out, dt)


# -- prod, variance, norms, logsumexp ---------------------------------------------------


def _float_reduction(self: Any, tag: str | None, build: Callable[[Node, tuple[int, ...]], Node],
                     ) -> Any:
    """Widen, reduce over ``tag`` (None: every axis) with ``build``, keep the f32 result."""
    forward_only(self)
    out_tags: tuple[str, ...] = ()
    if tag is None:
        axes = _all_axes(self)
    else:
        axes = (_axis(self, tag),)
        out_tags = T.remove_tags(self.axis_tags, (tag,))
    node = build(widen(self), axes)
    return result(self, out_tags, node, node.dtype)


_ORDERS = {"l1": "l1", "l2": "l2", "inf": "inf", 1: "l1", 2: "l2", math.inf: "inf"}


def _norm_build(order: Any) -> Callable[[Node, tuple[int, ...]], Node]:
    try:
        o = _ORDERS[order]
    except (KeyError, TypeError):
        raise TagError(f"norm order must be 'l1', 'l2' or 'inf', got {order!r}") from None

    def build(x: Node, axes: tuple[int, ...]) -> Node:
        if o == "l1":
            return _reduce_node(emit("unary", (x,), fn="abs"), "sum", axes, DType.f32)
        if o == "l2":
            sq = emit("binary", (x, x), fn="mul")
            return emit("unary", (_reduce_node(sq, "sum", axes, DType.f32),), fn="sqrt")
        # max|x|; ties share the gradient (torch.linalg.vector_norm's inf order)
        return _reduce_node(emit("unary", (x,), fn="abs"), "max", axes, DType.f32,
                            ties="split")

    return build


# -- any / all --------------------------------------------------------------------------


def _truth_count(self: Any, axes: tuple[int, ...]) -> Node:
    node = self._node
    if self.dtype is not DType.bool:
        node = emit("compare", (node,), fn="ne", value=0)  # NaN is truthy
    return _reduce_node(node, "sum", axes, DType.i64)


def _any_all(self: Any, tag: str | None, want_all: bool) -> Any:
    out_tags: tuple[str, ...] = ()
    if tag is None:
        axes = _all_axes(self)
    else:
        axes = (_axis(self, tag),)
        out_tags = T.remove_tags(self.axis_tags, (tag,))
    count = _truth_count(self, axes)
    if want_all:
        n = 1
        for a in axes:
            n *= self._node.shape[a]
        node = emit("compare", (count,), fn="eq", value=n)
    else:
        node = emit("compare", (count,), fn="gt", value=0)
    return result(self, out_tags, node, DType.bool)


# -- scans and argmax ---------------------------------------------------------------------


def _scan(self: Any, tag: str, fn: str) -> Any:
    forward_only(self)
    axis = _axis(self, tag)
    node = emit("scan", (widen(self),), axis=axis, fn=fn)
    return result(self, self.axis_tags, narrow(node, self.dtype))


class Sum(Tensor):
    """Sums and means, optionally masked (f32, f64: the result keeps the dtype)."""

    __slots__ = ()

    def sum(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
            ) -> Self:
        """Sum over ``tag`` (the tag is removed).

        ``mask=`` (bool, or float read as != 0, with self's tags in any order) restricts
        the sum to the selected elements; an empty lane is 0, or ``empty`` when given.
        The gradient is zero at excluded elements.
        """
        if mask is None and empty is None:
            hit = fast.reduce(self, tag, "sum")  # a known signature on a plain tensor
            if hit is not None:
                return hit
        return _reduction(self, tag, "sum", mask, empty)

    def mean(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
             ) -> Self:
        """Mean over ``tag``; with ``mask=`` it divides by the count of selected elements
        per lane (an empty lane is NaN, or ``empty``)."""
        return _reduction(self, tag, "mean", mask, empty)

    def sum_all(self) -> Self:
        """Sum of every element as a scalar tensor."""
        return reduce_tags(self, self.axis_tags, "sum")


class HalfSum(Tensor):
    """Sums and means of f16/bf16 tensors, accumulated and returned in f32."""

    __slots__ = ()

    def sum(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
            ) -> F32Tensor:
        """Sum over ``tag`` in f32 (the tag is removed); ``mask=``/``empty=`` as for
        f32 tensors."""
        return _reduction(self, tag, "sum", mask, empty)

    def mean(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
             ) -> F32Tensor:
        """Mean over ``tag`` in f32; ``mask=``/``empty=`` as for f32 tensors."""
        return _reduction(self, tag, "mean", mask, empty)

    def sum_all(self) -> F32Tensor:
        """Sum of every element as an f32 scalar tensor."""
        return reduce_tags(self, self.axis_tags, "sum")


class CountSum(Tensor):
    """Exact sums of integer and bool tensors (bool counts true elements), as i64."""

    __slots__ = ()

    def sum(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
            ) -> I64Tensor:
        """Sum over ``tag`` as i64 (the tag is removed); ``mask=``/``empty=`` as for
        f32 tensors."""
        return _reduction(self, tag, "sum", mask, empty)

    def sum_all(self) -> I64Tensor:
        """Sum of every element as an i64 scalar tensor."""
        return reduce_tags(self, self.axis_tags, "sum")


class FloatReductions(Tensor):
    """Max/min, products, variance, logsumexp, scans and argmax (f32, f16, bf16).

    f16/bf16 inputs reduce in f32 and return f32; scans narrow back once."""

    __slots__ = ()

    def max(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
            ) -> F32Tensor:
        """Maximum over ``tag`` (NaN propagates; f16/bf16 -> f32). The gradient goes to the
        first maximal element (torch.max over a dim). With ``mask=``, an empty lane is -inf
        (or ``empty``) and receives no gradient."""
        return _reduction(self, tag, "max", mask, empty)

    def min(self, tag: str, *, mask: Tensor | None = None, empty: float | None = None,
            ) -> F32Tensor:
        """Minimum over ``tag``; see :meth:`max` (an empty masked lane is +inf)."""
        return _reduction(self, tag, "min", mask, empty)

    def prod(self, tag: str) -> F32Tensor:
        """Product over ``tag`` (torch.prod; f16/bf16 -> f32). Gradient handles zeros like
        torch: none -> g prod / x; one -> the zero's slot gets g * (product of the rest);
        two or more -> 0."""
        return _float_reduction(self, tag, lambda x, axes: _reduce_node(x, "prod", axes,
                                                                        DType.f32))

    def variance(self, tag: str, ddof: int) -> F32Tensor:
        """Variance over ``tag``: ``ddof`` 0 is the biased (LayerNorm) form, 1 Bessel-corrected
        (torch.var's default). f16/bf16 -> f32."""
        if not is_int(ddof) or ddof not in (0, 1):
            raise TagError(f"variance ddof must be 0 or 1, got {ddof!r}")

        def build(x: Node, axes: tuple[int, ...]) -> Node:
            n = 1
            for a in axes:
                n *= x.shape[a]
            m = broadcast_back(_reduce_node(x, "mean", axes, DType.f32), x.shape, axes)
            d = emit("binary", (x, m), fn="sub")
            ss = _reduce_node(emit("binary", (d, d), fn="mul"), "sum", axes, DType.f32)
            if n - ddof == 0:  # one element, Bessel-corrected: undefined, NaN like torch
                return emit("scalar", (ss,), fn="mul", value=math.nan)
            return emit("scalar", (ss,), fn="div", value=float(n - ddof))

        return _float_reduction(self, tag, build)

    def logsumexp(self, tag: str) -> F32Tensor:
        """log(sum(exp(x))) over ``tag`` (torch.logsumexp; f16/bf16 -> f32), shifted by the
        lane max; a lane whose max is +-inf is shifted by 0 instead, so an all -inf lane
        gives -inf and a +inf entry gives +inf. Gradient: softmax(x) * g."""

        def build(x: Node, axes: tuple[int, ...]) -> Node:
            with no_grad():  # the shift is a constant (it cancels in the value)
                m = _reduce_node(x, "max", axes, DType.f32)
                finite = emit("unary", (m,), fn="isfinite")
                zero = emit("fill", (), shape=m.shape, dtype=DType.f32, value=0.0)
                shift = emit("where", (finite, m, zero))
            e = emit("unary", (emit("binary", (x, broadcast_back(shift, x.shape, axes)),
                                    fn="sub"),), fn="exp")
            s = emit("unary", (_reduce_node(e, "sum", axes, DType.f32),), fn="log")
            return emit("binary", (s, shift), fn="add")

        return _float_reduction(self, tag, build)

    def cumsum(self, tag: str) -> Self:
        """Inclusive prefix sum along ``tag`` (serial, sequence-exact); gradient: suffix sum."""
        return _scan(self, tag, "cumsum")

    def cumprod(self, tag: str) -> Self:
        """Inclusive running product along ``tag`` (torch.cumprod); the gradient is exact for
        lanes containing zeros."""
        return _scan(self, tag, "cumprod")

    def argmax(self, tag: str) -> I64Tensor:
        """i64 index of the first maximum along ``tag`` (tag removed). NaN never wins; an
        all-NaN lane gives 0 (documented divergence from torch.argmax). No gradient."""
        forward_only(self)
        axis = _axis(self, tag)
        out_tags = T.remove_tags(self.axis_tags, (tag,))
        node = emit("argmax", (self._node,), axis=axis)
        return result(self, out_tags, node, DType.i64)


class F32Reductions(Tensor):
    """Norms, any/all and multi-tag sums (f32)."""

    __slots__ = ()

    def norm(self, tag: str, order: str | float = "l2") -> Self:
        """Vector norm along ``tag`` (torch.linalg.vector_norm): "l1" sum |x|, "l2"
        sqrt(sum x^2) (NaN gradient at an all-zero lane, sqrt'(0)), "inf" max |x|."""
        return _float_reduction(self, tag, _norm_build(order))

    def norm_all(self, order: str | float = "l2") -> Self:
        """Vector norm over every element as a scalar tensor; see :meth:`norm`."""
        return _float_reduction(self, None, _norm_build(order))

    def any(self, tag: str) -> BoolTensor:
        """bool: some element along ``tag`` is truthy (!= 0; NaN counts)."""
        return _any_all(self, tag, False)

    def all(self, tag: str) -> BoolTensor:
        """bool: every element along ``tag`` is truthy (!= 0; NaN counts)."""
        return _any_all(self, tag, True)

    def any_all(self) -> BoolTensor:
        """bool scalar: some element is truthy."""
        return _any_all(self, None, False)

    def all_all(self) -> BoolTensor:
        """bool scalar: every element is truthy."""
        return _any_all(self, None, True)

    def sum_many(self, tags: Sequence[str]) -> Self:
        """Sum over several tags at once (all removed)."""
        return reduce_tags(self, T.check_tags(T.normalize_tags(tags)), "sum")
