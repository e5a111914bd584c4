"""The normalization family: rms_norm (+ weight, + residual), layer_norm, group_norm,
standardize_axis, l2_normalize.

Every norm is a composition of primitives (reductions over the normalized
axis, elementwise math on the row statistics broadcast back), so gradients
come from the primitives' VJP rules (statistics are recomputed in the
backward, nothing is saved) and ``fucina.compile`` fuses each norm into one
row kernel: the statistics are reduced in phases over a row that is still
in cache, then the row is written once. On f16/bf16 the math runs in f32 and
narrows once; typed-float norms are forward-only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidShape, ShapeMismatch, TagError
from ..ir.autodiff import broadcast_back
from ..ir.execute import emit
from ..ir.graph import Node
from .arguments import choice_arg, is_int
from .base import Tensor, align_node, check_tensor, result, same_ctx
from .math import forward_only
from .structural import _const
from .unary import HALF, narrow, real, widen

if TYPE_CHECKING:
    from typing_extensions import Self


# -- building blocks ---------------------------------------------------------------------


def _axes(self: Any, tag: str) -> tuple[int, ...]:
    return (T.index(self.axis_tags, T.check_tag(tag)),)


def _reduce(x: Node, fn: str, axes: tuple[int, ...], dtype: DType = DType.f32) -> Node:
    return emit("reduce", (x,), fn=fn, axes=axes, dtype=dtype)


def _mul(a: Node, b: Node) -> Node:
    return emit("binary", (a, b), fn="mul")


def _back(stat: Node, x: Node, axes: tuple[int, ...]) -> Node:
    """A row statistic viewed over the row again (stride 0: no copy, fuses in the row)."""
    return broadcast_back(stat, x.shape, axes)


def _cast(x: Node, dtype: DType) -> Node:
    return x if x.dtype is dtype else emit("cast", (x,), dtype=dtype, src=x.dtype)


def _sum_f64(x: Node, axes: tuple[int, ...]) -> Node:
    """Sum accumulated in f64, returned in f32 (the f32 element stays f32, so the
    gradient path never mixes dtypes)."""
    return _cast(_reduce(_cast(x, DType.f64), "sum", axes, DType.f64), DType.f32)


def _rsqrt_plus(stat: Node, eps: float) -> Node:
    return emit("unary", (emit("scalar", (stat,), fn="add", value=eps),), fn="rsqrt")


def _rms_core(x: Node, axes: tuple[int, ...], eps: float) -> Node:
    """x * rsqrt(mean(x^2) + eps)."""
    ms = _reduce(_mul(x, x), "mean", axes)
    return _mul(x, _back(_rsqrt_plus(ms, eps), x, axes))


def _centered(x: Node, axes: tuple[int, ...]) -> tuple[Node, Node]:
    """(x - mean, biased variance): the two-pass form, exact for offset data."""
    d = emit("binary", (x, _back(_reduce(x, "mean", axes), x, axes)), fn="sub")
    return d, _reduce(_mul(d, d), "mean", axes)


def param_vector(self: Any, p: Any, tag: str, what: str, numeric_ok: bool = False) -> Node:
    """A validated rank-1 per-``tag`` parameter's node in f32.

    ``p`` must be tagged ``(tag,)`` (or ``("_0",)`` when ``numeric_ok``), have
    ``self``'s dtype and ``self.dim(tag)`` elements.
    """
    T.check_tag(tag)
    check_tensor(p, what)
    same_ctx(self, p)
    allowed = ((tag,), ("_0",)) if numeric_ok else ((tag,),)
    if tuple(p.axis_tags) not in allowed:
        want = " or ".join(repr(a) for a in allowed)
        raise TagError(f"{what} must be tagged {want}, got {p.axis_tags}")
    if p.dtype is not self.dtype:
        raise TagError(f"{what} dtype {p.dtype.value} differs from {self.dtype.value}")
    n = self.dim(tag)
    if p.shape[0] != n:
        raise ShapeMismatch(f"{what} has {p.shape[0]} elements, tag {tag!r} has {n}")
    return widen(p)


def spread(vec: Node, shape: tuple[int, ...], coeffs: tuple[int, ...]) -> Node:
    """View a rank-1 node over ``shape``: element index = sum(index[k] * coeffs[k])."""
    return emit("view", (vec,), shape=tuple(shape), coeffs=tuple((c,) for c in coeffs),
                base=(0,))


def axis_param(self: Any, p: Any, tag: str, what: str, numeric_ok: bool = False) -> Node:
    """A rank-1 per-``tag`` parameter broadcast over ``self`` (see :func:`param_vector`)."""
    vec = param_vector(self, p, tag, what, numeric_ok)
    axis = T.index(self.axis_tags, tag)
    return spread(vec, tuple(self.shape), tuple(int(k == axis) for k in range(self.tag_count)))


def _norm_op(self: Any, others: tuple[Any, ...], build: Any) -> Any:
    """Shape-preserving norm: ``build(x_f32)`` -> f32 result, narrowed to self's dtype."""
    forward_only(self, *others)
    return result(self, self.axis_tags, narrow(build(widen(self)), self.dtype))


def _eps(eps: Any) -> float:
    e = real(eps, "eps")
    if math.isnan(e):
        raise InvalidShape("eps must not be NaN")
    return e


class Norms(Tensor):
    """rms_norm, rms_norm_mul and layer_norm (f32, f16, bf16; typed floats: plain
    layer_norm only, forward-only, computed in f32 and narrowed once)."""

    __slots__ = ()

    def rms_norm(self, tag: str, eps: float) -> Self:
        """x / sqrt(mean(x^2 over ``tag``) + eps)."""
        axes, e = _axes(self, tag), _eps(eps)
        return _norm_op(self, (), lambda x: _rms_core(x, axes, e))

    def rms_norm_mul(self, tag: str, weight: Tensor, eps: float) -> Self:
        """rms_norm(x) * weight, ``weight`` a ``Tensor(tag)`` of self's dtype."""
        axes, e = _axes(self, tag), _eps(eps)
        w = axis_param(self, weight, tag, "weight")
        return _norm_op(self, (weight,), lambda x: _mul(_rms_core(x, axes, e), w))

    def layer_norm(self, tag: str, eps: float, *, weight: Tensor | None = None,
                   bias: Tensor | None = None) -> Self:
        """(x - mean) / sqrt(biased var + eps) over ``tag`` (torch.nn.LayerNorm).

        The affine form takes ``weight=`` and ``bias=`` together (TagError for one
        alone), each a rank-1 tensor tagged ``(tag,)`` or ``("_0",)`` with
        ``dim(tag)`` elements (ShapeMismatch otherwise). f16/bf16: plain form only.
        """
        axes, e = _axes(self, tag), _eps(eps)
        if (weight is None) != (bias is None):
            raise TagError("layer_norm's affine form takes weight= and bias= together")
        if weight is None:
            def plain(x: Node) -> Node:
                d, var = _centered(x, axes)
                return _mul(d, _back(_rsqrt_plus(var, e), x, axes))

            return _norm_op(self, (), plain)
        if self.dtype in HALF:
            raise TagError(f"layer_norm on {self.dtype.value} has the plain form only "
                           "(no weight/bias)")
        w = axis_param(self, weight, tag, "weight", numeric_ok=True)
        b = axis_param(self, bias, tag, "bias", numeric_ok=True)

        def affine(x: Node) -> Node:
            d, var = _centered(x, axes)
            y = _mul(_mul(d, _back(_rsqrt_plus(var, e), x, axes)), w)
            return emit("binary", (y, b), fn="add")

        return _norm_op(self, (weight, bias), affine)


_EPS_MODES = ("outside_sqrt", "inside_sqrt")
_ACCUMULATIONS = ("f32", "f64")


class NormsF32(Tensor):
    """rms_norm_mul_add, group_norm, standardize_axis and l2_normalize (f32)."""

    __slots__ = ()

    def rms_norm_mul_add(self, tag: str, weight: Tensor, residual: Tensor, eps: float,
                         ) -> Self:
        """rms_norm(x) * weight + residual (``residual`` has self's tags and sizes)."""
        axes, e = _axes(self, tag), _eps(eps)
        w = axis_param(self, weight, tag, "weight")
        check_tensor(residual, "residual")
        same_ctx(self, residual)
        if residual.dtype is not self.dtype:
            raise TagError(f"residual dtype {residual.dtype.value} differs from "
                           f"{self.dtype.value}")
        if set(residual.axis_tags) != set(self.axis_tags) or \
                len(residual.axis_tags) != len(self.axis_tags):
            raise TagError(f"residual tags {residual.axis_tags} differ from {self.axis_tags}")
        sizes = dict(zip(residual.axis_tags, residual.shape))
        for t, d in zip(self.axis_tags, self.shape):
            if sizes[t] != d:
                raise ShapeMismatch(f"residual: tag {t!r} has size {sizes[t]}, self has {d}")
        r = align_node(residual, self.axis_tags, self.shape)

        def build(x: Node) -> Node:
            return emit("binary", (_mul(_rms_core(x, axes, e), w), r), fn="add")

        return _norm_op(self, (weight, residual), build)

    def group_norm(self, channel_tag: str, groups: int, eps: float,
                   weight: Tensor | None = None, bias: Tensor | None = None) -> Self:
        """GroupNorm over a rank-2 ``[time, channel]`` tensor (ggml's GroupNorm).

        Channels split into ``groups`` contiguous groups; each group is normalized
        over all its ``time x channels/groups`` elements with f64-accumulated mean and
        biased variance, eps inside the sqrt. ``weight``/``bias`` (each optional,
        ``Tensor(channel_tag)``) apply per channel afterwards.
        """
        if self.tag_count != 2:
            raise TagError(f"group_norm takes a rank-2 [time, channel] tensor, got tags "
                           f"{self.axis_tags}")
        c_axis = T.index(self.axis_tags, T.check_tag(channel_tag))
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
            raise TypeError(f"groups must be an int, got {groups!r}")
        c = self.shape[c_axis]
        if groups < 1 or c % groups:
            raise InvalidShape(f"group_norm: {c} channels do not split into {groups} groups")
        e = _eps(eps)
        w = None if weight is None else param_vector(self, weight, channel_tag, "weight")
        b = None if bias is None else param_vector(self, bias, channel_tag, "bias")
        t_axis = 1 - c_axis
        shape = tuple(self.shape)
        cpg = c // int(groups)
        # [time, channel] viewed as [time, group, cpg] ([channel, time]: [group, cpg, time]);
        # the per-channel affine is read through the same split, so the row kernel ends
        # with it and the result is a view of its output.
        if c_axis == 1:
            split, axes, ch = (shape[0], int(groups), cpg), (0, 2), (0, cpg, 1)
        else:
            split, axes, ch = (int(groups), cpg, shape[1]), (1, 2), (cpg, 1, 0)
        n = float(shape[t_axis] * cpg)

        def build(x: Node) -> Node:
            if not x.value.is_contiguous():
                x = emit("copy", (x,))
            g = emit("reshape", (x,), shape=split)
            mean = emit("scalar", (_sum_f64(g, axes),), fn="div", value=n)
            d = emit("binary", (g, _back(mean, g, axes)), fn="sub")
            var = emit("scalar", (_sum_f64(_mul(d, d), axes),), fn="div", value=n)
            y = _mul(d, _back(_rsqrt_plus(var, e), g, axes))
            if w is not None:
                y = _mul(y, spread(w, split, ch))
            if b is not None:
                y = emit("binary", (y, spread(b, split, ch)), fn="add")
            return emit("reshape", (y,), shape=shape)

        others = tuple(p for p in (weight, bias) if p is not None)
        return _norm_op(self, others, build)

    def standardize_axis(self, tag: str, *, ddof: int = 0, eps: float = 0.0,
                         eps_mode: str = "outside_sqrt", accumulation: str = "f32",
                         valid_len: int | None = None) -> Self:
        """(x - mean) / denom over ``tag``.

        ``denom`` is ``sqrt(var) + eps`` (``eps_mode="outside_sqrt"``) or
        ``sqrt(var + eps)`` (``"inside_sqrt"``), ``var`` with ``ddof`` 0 (biased) or 1.
        ``accumulation="f64"`` accumulates the sums in f64. With ``valid_len`` only
        the first ``valid_len`` elements are standardized; the rest are zeros with
        zero gradient.
        """
        axes = _axes(self, tag)
        if not is_int(ddof) or ddof not in (0, 1):
            raise TagError(f"standardize_axis ddof must be 0 or 1, got {ddof!r}")
        choice_arg(eps_mode, _EPS_MODES, "eps_mode")
        choice_arg(accumulation, _ACCUMULATIONS, "accumulation")
        e = _eps(eps)
        dim = self.shape[axes[0]]
        n = dim
        keep = None
        if valid_len is not None:
            if isinstance(valid_len, bool) or not isinstance(valid_len, (int, np.integer)):
                raise TypeError(f"valid_len must be an int or None, got {valid_len!r}")
            if not 1 <= valid_len <= dim:
                raise InvalidShape(f"valid_len {valid_len} is outside 1..{dim} (size of "
                                   f"{tag!r})")
            n = int(valid_len)
            if n < dim:
                flags = np.arange(dim) < n
                coeffs = tuple((1,) if k == axes[0] else (0,) for k in range(len(self.shape)))
                keep = emit("view", (_const(DType.bool, flags),), shape=tuple(self.shape),
                            coeffs=coeffs, base=(0,))
        f64 = accumulation == "f64"

        def total(v: Node) -> Node:
            if keep is not None:
                zero = emit("fill", (), shape=v.shape, dtype=DType.f32, value=0.0)
                v = emit("where", (keep, v, zero))
            return _sum_f64(v, axes) if f64 else _reduce(v, "sum", axes)

        def build(x: Node) -> Node:
            mean = emit("scalar", (total(x),), fn="div", value=float(n))
            d = emit("binary", (x, _back(mean, x, axes)), fn="sub")
            ss = total(_mul(d, d))
            if n - ddof == 0:  # one element, Bessel-corrected: undefined, NaN like torch
                var = emit("scalar", (ss,), fn="mul", value=math.nan)
            else:
                var = emit("scalar", (ss,), fn="div", value=float(n - ddof))
            if eps_mode == "inside_sqrt":
                y = _mul(d, _back(_rsqrt_plus(var, e), x, axes))
            else:
                den = emit("scalar", (emit("unary", (var,), fn="sqrt"),), fn="add", value=e)
                y = emit("binary", (d, _back(den, x, axes)), fn="div")
            if keep is not None:
                zero = emit("fill", (), shape=y.shape, dtype=DType.f32, value=0.0)
                y = emit("where", (keep, y, zero))
            return y

        return _norm_op(self, (), build)

    def l2_normalize(self, tag: str, eps: float) -> Self:
        """x * rsqrt(sum(x^2 over ``tag``) + eps): eps is added to the squared norm
        (the rms_norm convention, not torch.nn.functional.normalize's clamp)."""
        axes, e = _axes(self, tag), _eps(eps)

        def build(x: Node) -> Node:
            ss = _reduce(_mul(x, x), "sum", axes)
            return _mul(x, _back(_rsqrt_plus(ss, e), x, axes))

        return _norm_op(self, (), build)
