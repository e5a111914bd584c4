"""Rotary position embedding (REFERENCE §4.12), composed from primitives.

Each rotary pair ``(a, b)`` at position ``p`` becomes
``(a cos - b sin, a sin + b cos)``. The feature axis is viewed as ``(2, d/2)``
(``half``: pair ``i`` is features ``i`` and ``i + d/2``) or ``(d/2, 2)``
(``interleaved``: features ``2i``, ``2i + 1``). Two broadcast views read the
pair's first and second member for both output slots, so the rotation is
``first * A + second * B`` with per-(position, slot, pair) factors ``A =
(cos, sin)`` and ``B = (-sin, cos)``: views, ``where``, two multiplies and an
add, which compile to one elementwise kernel over the tensor (plus a small
one over the table); the gradient (the inverse rotation) comes from the
primitives' rules. A partial rotary span is rotated and concatenated with the
untouched features.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidShape, ShapeMismatch, TagError
from ..ir.execute import emit
from ..ir.graph import Node, leaf
from ..runtime import rope as R
from ..runtime.raw import RawTensor
from ..runtime.rope import RopeTable, RopeTheta
from .arguments import choice_arg
from .base import Tensor, check_tensor, result, same_ctx

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import F32Tensor

ROPE_MODES = ("half", "interleaved", "interleaved_tail")


def _const(dtype: DType, arr: np.ndarray, borrow: bool = False) -> Node:
    return leaf(RawTensor.from_array(dtype, arr, borrow=borrow), None, False)


def _table_nodes(table: R.RopeTable, positions: int) -> tuple[Node, Node]:
    """The table's cos/sin as constants over its own buffers (read when a program runs)."""
    if table.positions != positions:
        raise ShapeMismatch(f"rope: the table has {table.positions} positions, the position "
                            f"axis has {positions}")
    return _const(DType.f32, table.cos, borrow=True), _const(DType.f32, table.sin, borrow=True)


def _theta_nodes(self: Any, theta: R.RopeTheta, positions: int, dim: int) -> tuple[Node, Node]:
    """cos/sin [positions, dim/2] for on-the-fly factors (angles f32(p) * f32(inv_freq))."""
    pos = theta.positions
    if isinstance(pos, Tensor):
        check_tensor(pos, "positions")
        same_ctx(self, pos)
        if not pos.dtype.is_integer or pos.tag_count != 1:
            raise TagError(f"rope: positions must be a rank-1 integer tensor, got {type(pos)!r}")
        if pos.shape[0] != positions:
            raise ShapeMismatch(f"rope: {pos.shape[0]} positions for a position axis of "
                                f"{positions}")
        h = dim // 2
        p = emit("cast", (pos._node,), dtype=DType.f32, src=pos.dtype)
        inv = _const(DType.f32, R.pow_inv_freqs(dim, theta.theta_base).astype(np.float32))
        pb = emit("view", (p,), shape=(positions, h), coeffs=((1,), (0,)), base=(0,))
        ib = emit("view", (inv,), shape=(positions, h), coeffs=((0,), (1,)), base=(0,))
        ang = emit("binary", (pb, ib), fn="mul")
        return emit("unary", (ang,), fn="cos"), emit("unary", (ang,), fn="sin")
    host = R.host_positions(pos)
    if host.size != positions:
        raise ShapeMismatch(f"rope: {host.size} positions for a position axis of {positions}")
    table = R.prepare(host, dim, theta.theta_base)
    return _const(DType.f32, table.cos), _const(DType.f32, table.sin)


def _source(self: Any, source: Any, positions: int, dim: int) -> tuple[Node, Node, int]:
    """(cos, sin, rotary span) for a RopeTable, RopeTheta or a {positions, theta_base} dict."""
    if isinstance(source, R.RopeTable):
        span = source.feature_dim
        if span > dim:
            raise InvalidShape(f"rope: the table spans {span} features, the feature axis has "
                               f"{dim}")
        cos, sin = _table_nodes(source, positions)
        return cos, sin, span
    if isinstance(source, dict):
        extra = set(source) - {"positions", "theta_base"}
        if extra:
            raise TypeError(f"rope: unknown RopeTheta fields {sorted(map(repr, extra))}")
        missing = [k for k in ("positions", "theta_base") if k not in source]
        if missing:
            raise TypeError(f"rope: the RopeTheta dict lacks {missing}")
        source = R.RopeTheta(**source)
    if isinstance(source, R.RopeTheta):
        if dim % 2:
            raise InvalidShape(f"rope: the feature axis has odd size {dim}")
        cos, sin = _theta_nodes(self, source, positions, dim)
        return cos, sin, dim
    raise TypeError(f"rope: source must be a fucina.RopeTable or fucina.RopeTheta, got "
                    f"{type(source).__name__}")


def _rotate(x: Node, pa: int, fa: int, cos: Node, sin: Node, interleaved: bool) -> Node:
    """Rotate the pairs of ``x``'s feature axis ``fa`` (the whole axis) by position ``pa``."""
    shape = x.shape
    P, h = cos.shape
    rank = len(shape)
    t_ax, i_ax = (fa + 1, fa) if interleaved else (fa, fa + 1)
    t_step, i_step = (1, 2) if interleaved else (h, 1)
    split = shape[:fa] + ((h, 2) if interleaved else (2, h)) + shape[fa + 1:]
    pa2 = pa if pa < fa else pa + 1

    def member(second: bool) -> Node:
        # Both output slots of a pair read the same member: the slot axis broadcasts.
        coeffs = []
        for k in range(rank + 1):
            row = [0] * rank
            if k == i_ax:
                row[fa] = i_step
            elif k != t_ax:
                row[k if k < fa else k - 1] = 1
            coeffs.append(tuple(row))
        base = tuple(t_step if (second and j == fa) else 0 for j in range(rank))
        return emit("view", (x,), shape=split, coeffs=tuple(coeffs), base=base)

    # Factors over the table's own small shape [P, slot, pair] (or [P, pair, slot]).
    small = (P, h, 2) if interleaved else (P, 2, h)
    tab = ((1, 0), (0, 0), (0, 1)) if not interleaved else ((1, 0), (0, 1), (0, 0))
    cos_s = emit("view", (cos,), shape=small, coeffs=tab, base=(0, 0))
    sin_s = emit("view", (sin,), shape=small, coeffs=tab, base=(0, 0))
    first_slot = _const(DType.bool, np.array([True, False]))
    slot_coeffs = ((0,), (0,), (1,)) if interleaved else ((0,), (1,), (0,))
    slot = emit("view", (first_slot,), shape=small, coeffs=slot_coeffs, base=(0,))
    a = emit("where", (slot, cos_s, sin_s))
    b = emit("where", (slot, emit("unary", (sin_s,), fn="neg"), cos_s))

    def spread(f: Node) -> Node:
        # [P, slot, pair] -> the split shape of x (position, slot and pair axes kept).
        coeffs = []
        for k in range(rank + 1):
            if k == pa2:
                coeffs.append((1, 0, 0))
            elif k == t_ax:
                coeffs.append((0, 0, 1) if interleaved else (0, 1, 0))
            elif k == i_ax:
                coeffs.append((0, 1, 0) if interleaved else (0, 0, 1))
            else:
                coeffs.append((0, 0, 0))
        return emit("view", (f,), shape=split, coeffs=tuple(coeffs), base=(0, 0, 0))

    out = emit("binary", (emit("binary", (member(False), spread(a)), fn="mul"),
                          emit("binary", (member(True), spread(b)), fn="mul")), fn="add")
    return emit("merge", (out,), start=fa, count=2)


def _narrow(x: Node, axis: int, start: int, length: int) -> Node:
    r = len(x.shape)
    shape = tuple(length if k == axis else d for k, d in enumerate(x.shape))
    coeffs = tuple(tuple(1 if j == k else 0 for j in range(r)) for k in range(r))
    base = tuple(start if k == axis else 0 for k in range(r))
    return emit("view", (x,), shape=shape, coeffs=coeffs, base=base)


class Rope(Tensor):
    """Rotary position embedding on f32 tensors."""

    __slots__ = ()

    def rope(self, position_tag: str, feature_tag: str,
             source: RopeTable | RopeTheta | dict[str, Any], mode: str) -> Self:
        """Rotate feature pairs of ``feature_tag`` by angles that depend on ``position_tag``.

        ``source`` is a ``fucina.RopeTable`` (prepared factors; its
        ``feature_dim`` is the rotary span) or a ``fucina.RopeTheta`` /
        ``{"positions": ..., "theta_base": ...}`` (on-the-fly factors over the
        whole feature axis: pair ``i`` at position ``p`` turns by
        ``p / theta_base**(2i/d)``; positions may be an integer tensor).
        ``mode``: ``"half"`` pairs feature ``i`` with ``i + span/2`` (NEOX/Llama),
        ``"interleaved"`` pairs adjacent features, both over the leading
        ``span`` features; ``"interleaved_tail"`` pairs adjacent features of the
        trailing ``span`` features. Features outside the span pass through.
        Differentiable in ``self``.
        """
        pa, fa = T.rope_axes(self.axis_tags, position_tag, feature_tag)
        choice_arg(mode, ROPE_MODES, "rope: mode")
        shape = self.shape
        P, D = shape[pa], shape[fa]
        cos, sin, span = _source(self, source, P, D)
        interleaved = mode != "half"
        x = self._node
        if span == D:
            return result(self, self.axis_tags, _rotate(x, pa, fa, cos, sin, interleaved))
        if mode == "interleaved_tail":
            keep, rot = _narrow(x, fa, 0, D - span), _narrow(x, fa, D - span, span)
            parts = (keep, _rotate(rot, pa, fa, cos, sin, True))
        else:
            rot, keep = _narrow(x, fa, 0, span), _narrow(x, fa, span, D - span)
            parts = (_rotate(rot, pa, fa, cos, sin, interleaved), keep)
        return result(self, self.axis_tags, emit("concat", parts, axis=fa))

    def rms_norm_mul_rope_half_prepared(self, position_tag: str, feature_tag: str,
                                        weight: Tensor, eps: float, table: RopeTable) -> Self:
        """``rms_norm_mul`` over ``feature_tag`` then half-mode ``rope`` from a prepared
        table: the per-head QK-norm + RoPE step of attention blocks. Differentiable in
        ``self`` and ``weight``; compiled, the norm is one row kernel."""
        if not isinstance(table, RopeTable):
            raise TypeError(f"rms_norm_mul_rope_half_prepared: table must be a "
                            f"fucina.RopeTable, got {type(table).__name__}")
        T.rope_axes(self.axis_tags, position_tag, feature_tag)
        x = cast("F32Tensor", self)  # Rope is an f32 mixin: the f32 surface is here
        return cast("Self", x.rms_norm_mul(feature_tag, weight, eps).rope(
            position_tag, feature_tag, table, "half"))


__all__ = ["ROPE_MODES", "Rope"]
