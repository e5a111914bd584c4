"""Scans over one axis beyond cumsum/cumprod: the first-order linear recurrence and
contiguous segment sums (f32).

Both record one dedicated primitive (``fucina.ir.scans``): a recurrence is
inherently sequential along its axis, and neither has an exact composition
from the elementwise and reduction primitives (a cumprod/cumsum rewrite of the
recurrence divides by vanishing products).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidShape, ShapeMismatch, TagError
from ..ir import scans as S
from ..ir.execute import emit
from ..ir.graph import Node
from ..kernels.scans import check_offsets
from .base import Tensor, align_node, broadcast_sizes, check_tensor, result, same_ctx
from .structural import _const

if TYPE_CHECKING:
    from typing_extensions import Self


def _offsets_node(self: Any, offsets: Any, n: int) -> Node:
    """Segment offsets as an i64 node: host data is checked now, a tensor's values when
    known (a traced tensor's when the program runs)."""
    if isinstance(offsets, Tensor):
        check_tensor(offsets, "offsets")
        same_ctx(self, offsets)
        if not offsets.dtype.is_integer:
            raise TagError(f"offsets must be an integer tensor, got {offsets.dtype.value}")
        if offsets.tag_count != 1:
            raise TagError(f"offsets must be a rank-1 tensor, got tags {offsets.axis_tags}")
        node = offsets._node
        if node.dtype is not DType.i64:
            node = emit("cast", (node,), dtype=DType.i64, src=node.dtype)
        if not node.value.is_symbolic:
            check_offsets(node.value.array().reshape(-1), n, "segment_sum")
        return node
    try:
        off = np.asarray(offsets)
    except (TypeError, ValueError):
        raise TypeError(f"offsets must be a sequence of ints, got {offsets!r}") from None
    if off.dtype == np.bool_ or not np.issubdtype(off.dtype, np.integer):
        raise TypeError(f"offsets must be integers, got {off.dtype}")
    off = off.astype(np.int64).reshape(-1) if off.ndim <= 1 else off
    if off.ndim != 1:
        raise InvalidShape(f"offsets must be one-dimensional, got shape {off.shape}")
    check_offsets(off, n, "segment_sum")
    return _const(DType.i64, off)


class Scans(Tensor):
    """linear_recurrence and segment_sum (f32)."""

    __slots__ = ()

    def linear_recurrence(self, time_tag: str, decay: Tensor, *,
                          initial: Tensor | None = None) -> Self:
        """h_t = decay_t * h_{t-1} + self_t along ``time_tag``, every other-axes lane
        independently (shape-preserving).

        ``decay`` broadcasts by tag (its tags a subset of self's; no time tag: a static
        per-lane decay). ``initial`` is h_{-1}, with self's tags minus ``time_tag`` and
        exact sizes (default zeros): seeding with the last step of a previous chunk
        continues the sequence bit for bit. Each step is one multiply then one add,
        serial per lane. Differentiable in self, decay and initial.
        """
        axis = T.index(self.axis_tags, T.check_tag(time_tag))
        check_tensor(decay, "decay")
        same_ctx(self, decay)
        if decay.dtype is not self.dtype:
            raise TagError(f"decay dtype {decay.dtype.value} differs from {self.dtype.value}")
        extra = [t for t in decay.axis_tags if t not in self.axis_tags]
        if extra:
            raise TagError(f"decay tags {decay.axis_tags} must be a subset of {self.axis_tags}")
        if broadcast_sizes(self, decay, self.axis_tags) != tuple(self.shape):
            raise ShapeMismatch(f"decay sizes {dict(zip(decay.axis_tags, decay.shape))} do "
                                f"not broadcast to {dict(zip(self.axis_tags, self.shape))}")
        a = align_node(decay, self.axis_tags, self.shape)
        h0 = None
        if initial is not None:
            check_tensor(initial, "initial")
            same_ctx(self, initial)
            want = T.remove_tags(self.axis_tags, (time_tag,))
            if initial.dtype is not self.dtype:
                raise TagError(f"initial dtype {initial.dtype.value} differs from "
                               f"{self.dtype.value}")
            if sorted(initial.axis_tags) != sorted(want):
                raise TagError(f"initial must carry tags {want}, got {initial.axis_tags}")
            sizes = dict(zip(initial.axis_tags, initial.shape))
            for t, d in zip(self.axis_tags, self.shape):
                if t != time_tag and sizes[t] != d:
                    raise ShapeMismatch(f"initial: tag {t!r} has size {sizes[t]}, self has {d}")
            shape = tuple(1 if k == axis else d for k, d in enumerate(self.shape))
            h0 = align_node(initial, self.axis_tags, shape)
        return result(self, self.axis_tags, S.linear_recurrence(self._node, a, h0, axis))

    def segment_sum(self, tag: str, offsets: Sequence[int] | np.ndarray | Tensor) -> Self:
        """Sums of contiguous ranges of ``tag`` (torch.segment_reduce "sum" over sorted
        segments): out[s] = sum of x[offsets[s]:offsets[s+1]] along ``tag``, which keeps
        its name at size len(offsets) - 1. ``offsets`` (a sequence, integer numpy array
        or integer tensor) starts at 0, ends at dim(tag) and never decreases
        (InvalidShape otherwise); an empty segment sums to 0. The gradient repeats each
        output row over its segment."""
        axis = T.index(self.axis_tags, T.check_tag(tag))
        off = _offsets_node(self, offsets, self.shape[axis])
        return result(self, self.axis_tags, emit("segment_sum", (self._node, off), axis=axis))
