"""The softmax family, composed from primitives so it fuses (one row kernel compiled).

The shift by the lane max is a constant (it cancels in the value), so it is
built without gradient; a lane whose max is infinite is shifted by 0, as in
``logsumexp``.

The fused options of REFERENCE §4.10 (ggml's ``soft_max_ext``) are more
primitives in the same row kernel: the effective logit is
``x * scale + slope * mask`` (ALiBi slopes per head from ``max_bias``), a
causal window replaces sources beyond ``source_offset + query`` by -inf
(exactly 0 after the exp) through a comparison of two small index vectors,
and per-head ``sinks`` join the lane max and the denominator only. Masks,
slopes and sinks are constants, so the gradient flows to ``x`` alone.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidDataLength, InvalidShape, TagError, UnsupportedGradient
from ..ir.autodiff import broadcast_back
from ..ir.execute import emit
from ..ir.graph import Node, leaf
from ..runtime.gradmode import no_grad
from ..runtime.raw import RawTensor
from .base import Tensor, align_node, check_tensor, same_ctx
from .unary import float_op, real

if TYPE_CHECKING:
    from typing_extensions import Self


def _shift(x: Node, axes: tuple[int, ...], sinks: Node | None = None) -> Node:
    """The lane max (joined by the sinks, over the reduced shape), 0 where not finite."""
    with no_grad():
        m = emit("reduce", (x,), fn="max", axes=axes, dtype=DType.f32)
        if sinks is not None:
            m = emit("binary", (m, sinks), fn="maximum")
        finite = emit("unary", (m,), fn="isfinite")
        zero = emit("fill", (), shape=m.shape, dtype=DType.f32, value=0.0)
        return emit("where", (finite, m, zero))


def _const(dtype: DType, arr: np.ndarray) -> Node:
    return leaf(RawTensor.from_array(dtype, np.ascontiguousarray(arr)), None, False)


def _along(c: Node, shape: tuple[int, ...], axis: int | None) -> Node:
    """A rank-1 constant viewed over ``shape`` along ``axis`` (None: one broadcast value)."""
    coeffs = tuple((1,) if k == axis else (0,) for k in range(len(shape)))
    return emit("view", (c,), shape=shape, coeffs=coeffs, base=(0,))


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's ALiBi slope per head: powers of ``2**(-max_bias / h)``, ``h`` the head
    count rounded down to a power of two, the heads beyond it interleaved between."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=np.float32)
    h = 2 ** int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / h)
    m1 = 2.0 ** (-max_bias / 2.0 / h)
    k = np.arange(n_head, dtype=np.float64)
    slopes = np.where(k < h, m0 ** (k + 1), m1 ** (2 * (k - h) + 1))
    return slopes.astype(np.float32)


def _causal_options(self: Any, tag: str, causal: Any) -> tuple[int, int]:
    """(query axis, source offset) of a ``causal={"query_tag": ..., "source_offset": ...}``."""
    if not isinstance(causal, dict):
        raise TypeError(f"causal must be a dict with query_tag (and source_offset), got "
                        f"{type(causal).__name__}")
    extra = set(causal) - {"query_tag", "source_offset"}
    if extra:
        raise TypeError(f"causal: unknown options {sorted(extra)} (query_tag, source_offset)")
    if "query_tag" not in causal:
        raise TypeError("causal needs a query_tag")
    qa = T.softmax_query_axis(self.axis_tags, tag, causal["query_tag"])
    off = causal.get("source_offset", 0)
    if isinstance(off, bool) or not isinstance(off, numbers.Integral):
        raise TypeError(f"causal source_offset must be an int, got {off!r}")
    off = int(off)
    q_dim, s_dim = self.shape[qa], self.shape[T.index(self.axis_tags, tag)]
    if off < 0 or off + q_dim > s_dim:
        raise InvalidShape(f"softmax causal: source_offset {off} + query size {q_dim} must "
                           f"lie within the source size {s_dim}")
    return qa, off


def _sink_values(self: Any, sinks: Any, head_axis: int | None) -> np.ndarray:
    try:
        arr = np.asarray(sinks, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError, OverflowError):  # (an int beyond float)
        raise InvalidDataLength("sinks must be a sequence of numbers") from None
    if head_axis is None:
        if arr.size != 1:
            raise InvalidShape(f"sinks: {arr.size} values need head_tag (one sink per head); "
                               f"only a single sink works without one")
        return arr.astype(np.float32)
    heads = self.shape[head_axis]
    if arr.size not in (1, heads):
        raise InvalidDataLength(f"sinks has {arr.size} values for {heads} heads")
    return np.broadcast_to(arr, (heads,)).astype(np.float32)


def _logits(self: Any, x: Node, scale: float | None, mask: Any,
            slopes: Node | None = None) -> Node:
    if scale is not None:
        x = emit("scalar", (x,), fn="mul", value=real(scale, "scale"))
    if mask is not None:
        check_tensor(mask, "mask")
        same_ctx(self, mask)
        if mask.requires_grad:
            raise UnsupportedGradient("a softmax mask is additive control data: no gradient")
        if mask.dtype is not self.dtype:
            raise TagError(f"mask dtype {mask.dtype.value} differs from {self.dtype.value}")
        for t in mask.axis_tags:
            T.index(self.axis_tags, t)
        m = align_node(mask, self.axis_tags, self.shape)
        if mask.dtype is not DType.f32:
            m = emit("cast", (m,), dtype=DType.f32, src=mask.dtype)
        if slopes is not None:
            m = emit("binary", (m, slopes), fn="mul")
        x = emit("binary", (x, m), fn="add")
    return x


class Softmax(Tensor):
    """Softmax and log-softmax over a tag (f32, f16, bf16), fused under compile."""

    __slots__ = ()

    def softmax(self, tag: str, scale: float | None = None, mask: Tensor | None = None, *,
                max_bias: float | None = None, head_tag: str | None = None,
                sinks: Sequence[float] | np.ndarray | None = None,
                causal: dict[str, Any] | None = None) -> Self:
        """Softmax over ``tag`` of ``x * scale + slope * mask`` (ggml ``soft_max_ext``).

        ``mask`` is additive and broadcast by tag (a ``[q, k]`` mask serves every
        head); it must not require grad. ``max_bias`` (needs ``mask`` and
        ``head_tag``) gives head ``h`` the ALiBi slope of ggml's schedule
        (``slope = 1`` without it). ``sinks`` holds one extra logit per head
        (``head_tag``; a single value needs none) that joins the lane max and the
        denominator only, so lanes sum to less than 1. ``causal={"query_tag": q,
        "source_offset": o}`` lets query ``i`` see sources ``[0, o + i]``; the rest
        are exactly 0 (``o + dim(q) <= dim(tag)``). The gradient flows to ``self``.
        """
        ax = T.index(self.axis_tags, tag)
        axes = (ax,)
        shape = tuple(self.shape)
        head_axis = None
        if head_tag is not None:
            head_axis = T.index(self.axis_tags, head_tag)
            if head_axis == ax:
                raise TagError(f"softmax: head_tag {head_tag!r} is the softmax tag itself")
        slope_vals = None
        if max_bias is not None:
            b = real(max_bias, "max_bias")
            if mask is None or head_axis is None:
                raise InvalidShape("softmax max_bias (ALiBi) needs a mask and a head_tag")
            slope_vals = alibi_slopes(shape[head_axis], b)
        sink_vals = None if sinks is None else _sink_values(self, sinks, head_axis)
        window = None if causal is None else _causal_options(self, tag, causal)

        def build(x: Node) -> Node:
            slopes = None if slope_vals is None else _along(
                _const(DType.f32, slope_vals), shape, head_axis)
            x = _logits(self, x, scale, mask, slopes)
            if window is not None:
                qa, off = window
                queries = _along(_const(DType.i64, np.arange(shape[qa]) + off), shape, qa)
                sources = _along(_const(DType.i64, np.arange(shape[ax])), shape, ax)
                seen = emit("compare", (sources, queries), fn="le")
                hidden = _along(_const(DType.f32, np.array([-np.inf], np.float32)), shape, None)
                x = emit("where", (seen, x, hidden))
            sink_r = None
            if sink_vals is not None:  # over the lanes' (reduced) shape
                lanes = tuple(d for k, d in enumerate(shape) if k != ax) or (1,)
                hr = None if head_axis is None else head_axis - (head_axis > ax)
                sink_r = _along(_const(DType.f32, sink_vals), lanes, hr)
            m = _shift(x, axes, sink_r)
            e = emit("unary", (emit("binary", (x, broadcast_back(m, shape, axes)),
                                    fn="sub"),), fn="exp")
            total = emit("reduce", (e,), fn="sum", axes=axes, dtype=DType.f32)
            if sink_r is not None:
                sink_e = emit("unary", (emit("binary", (sink_r, m), fn="sub"),), fn="exp")
                total = emit("binary", (total, sink_e), fn="add")
            # times the reciprocal, as torch does: one divide per row instead of per element
            # ([4096, 1024] f32 on Zen 4, one thread: 2.32 -> 2.15 ms)
            inv = emit("unary", (total,), fn="reciprocal")
            return emit("binary", (e, broadcast_back(inv, e.shape, axes)), fn="mul")

        return float_op(self, build)

    def log_softmax(self, tag: str) -> Self:
        """log(softmax(x)) over ``tag``, computed as x - max - log(sum(exp(x - max)))."""
        axes = (T.index(self.axis_tags, tag),)

        def build(x: Node) -> Node:
            z = emit("binary", (x, broadcast_back(_shift(x, axes), x.shape, axes)), fn="sub")
            e = emit("unary", (z,), fn="exp")
            lse = emit("unary", (emit("reduce", (e,), fn="sum", axes=axes, dtype=DType.f32),),
                       fn="log")
            return emit("binary", (z, broadcast_back(lse, z.shape, axes)), fn="sub")

        return float_op(self, build)
