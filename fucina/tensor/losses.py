"""Losses composed from primitives (their gradients come from the primitives' rules)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import IndexOutOfBounds, InvalidDataLength, InvalidShape, TagError
from ..ir.execute import emit
from ..ir.graph import leaf
from ..runtime.raw import RawTensor
from .base import Tensor, align_node, check_tensor, new, result, same_ctx, tensor_type

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import F32Tensor

_REDUCTIONS = ("mean", "sum", "none")


class Losses(Tensor):
    """Losses against host labels (f32)."""

    __slots__ = ()

    def cross_entropy(self, class_tag: str, labels: Sequence[int] | np.ndarray | Tensor,
                      reduction: str = "mean",
                      ignore_index: int | None = None, label_smoothing: float = 0.0) -> Self:
        """Log-softmax + NLL over ``class_tag`` against integer ``labels`` (torch parity).

        ``labels`` holds one class per position, positions ordered row-major over
        the remaining tags: a host sequence or array, or an integer tensor (tagged
        with the other tags in any order, or flat), which under ``compile`` is a
        traced input: new labels never retrace. ``reduction`` is "mean" (over positions not equal to
        ``ignore_index``; 0 when every position is ignored), "sum" or "none"
        (per-position losses, ``class_tag`` removed). ``label_smoothing`` in
        [0, 1) mixes the one-hot target with the uniform distribution.
        """
        x = cast("F32Tensor", self)  # Losses is an f32 mixin: the f32 surface is here
        c = T.index(self.axis_tags, class_tag)
        if reduction not in _REDUCTIONS:
            raise TagError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        if not 0.0 <= label_smoothing < 1.0:
            raise InvalidShape(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
        if isinstance(labels, Tensor):
            return cast("Self", _cross_entropy_traced(x, c, class_tag, labels, reduction,
                                                      ignore_index, label_smoothing))
        shape = self.shape
        k = shape[c]
        rest = tuple(d for i, d in enumerate(shape) if i != c) if self.tag_count > 1 else ()
        positions = int(np.prod(rest)) if rest else 1
        lab = np.asarray(labels)
        if lab.dtype.kind not in "iu":
            raise InvalidDataLength(f"labels must be integers, got {lab.dtype}")
        lab = lab.reshape(-1).astype(np.int64)
        if lab.size != positions:
            raise InvalidShape(f"{lab.size} labels for {positions} positions")
        ignored = lab == ignore_index if ignore_index is not None else np.zeros(positions, bool)
        bad = ((lab < 0) | (lab >= k)) & ~ignored
        if bad.any():
            raise IndexOutOfBounds(f"label {int(lab[np.argmax(bad)])} out of range for "
                                   f"{class_tag!r} of size {k}")
        # Target distribution q (class axis last while building, then moved into place).
        q: np.ndarray = np.full((positions, k), label_smoothing / k, dtype=np.float32)
        keep = ~ignored
        q[np.arange(positions)[keep], lab[keep]] += 1.0 - label_smoothing
        q[ignored] = 0.0
        q = np.moveaxis(q.reshape((*rest, k)), -1, c) if rest else q.reshape(shape)
        target = new(type(self), leaf(RawTensor.from_array(DType.f32, q, shape), self.axis_tags,
                                      False), self._ctx, op_result=False)
        # loss_p = sum_c q_pc (lse_p - x_pc) = w_p lse_p - sum_c q_pc x_pc, w_p = sum_c q_pc.
        lse = x.logsumexp(class_tag)
        weight_np = q.sum(axis=c) if rest else q.sum(keepdims=True).reshape(-1)
        rest_tags = T.remove_tags(self.axis_tags, (class_tag,))
        wcls = tensor_type(tags=rest_tags, dtype=DType.f32)
        weight = new(wcls, leaf(RawTensor.from_array(DType.f32, weight_np.astype(np.float32),
                                                     rest or (1,)), rest_tags, False), self._ctx,
                     op_result=False)
        per = lse.mul(weight).sub(x.mul(target).sum(class_tag))
        if reduction == "none":
            return cast("Self", per)
        total = per.sum_all()
        if reduction == "sum":
            return cast("Self", total)
        count = int(keep.sum())
        if count == 0:
            return result(self, (), total.scale(0.0)._node)
        return cast("Self", total.div_scalar(float(count)))


def _cross_entropy_traced(self: F32Tensor, c: int, class_tag: str, labels: Tensor,
                          reduction: str, ignore_index: int | None, smoothing: float) -> Any:
    """cross_entropy with labels in an integer tensor: no host read, so under compile the
    labels are a traced input (new labels never retrace). The labels carry the other tags
    (any order) or are a flat sequence of positions in row-major order."""
    check_tensor(labels, "labels")
    same_ctx(self, labels)
    if not labels.dtype.is_integer:
        raise InvalidDataLength(f"labels must be integers, got {labels.dtype.value}")
    rest_tags = T.remove_tags(self.axis_tags, (class_tag,))
    rest = tuple(self.dim(t) for t in rest_tags)
    n = labels._node.value.numel
    if n != int(np.prod(rest)):
        raise InvalidShape(f"{n} labels for {int(np.prod(rest))} positions")
    if rest_tags and set(labels.axis_tags) == set(rest_tags):
        node = align_node(labels, rest_tags, rest)
    else:  # row-major positions
        node = labels._node
        if not node.value.is_contiguous():
            node = emit("copy", (node,))
        node = emit("reshape", (node,), shape=rest or (1,))
    if labels.dtype is not DType.i64:
        node = emit("cast", (node,), dtype=DType.i64, src=labels.dtype)
    keep = None
    if ignore_index is not None:  # ignored positions read class 0 and weigh nothing
        keep = emit("compare", (node,), fn="ne", value=ignore_index)
        node = emit("where", (keep, node, emit("fill", (), shape=node.shape, dtype=DType.i64,
                                                value=0)))
    idx = result(self, rest_tags, node, DType.i64).insert_axis(class_tag, c)
    # loss_p = lse_p - (1 - s) x[p, label_p] - (s / K) sum_c x[p, c], on kept positions.
    per = self.logsumexp(class_tag).sub(
        self.take_along_axis(class_tag, idx).sum(class_tag).scale(1.0 - smoothing))
    if smoothing:
        per = per.sub(self.sum(class_tag).scale(smoothing / self.shape[c]))
    if keep is not None:
        per = per.mul(result(self, rest_tags, emit("cast", (keep,), dtype=DType.f32,
                                                   src=DType.bool), DType.f32))
    if reduction == "none":
        return per
    total = per.sum_all()
    if reduction == "sum":
        return total
    if keep is None:
        return total.div_scalar(float(max(n, 1)))
    count = result(self, (), emit("reduce", (emit("cast", (keep,), dtype=DType.f32,
                                                      src=DType.bool),),
                                  fn="sum", axes=tuple(range(len(node.shape))),
                                  dtype=DType.f32))
    return total.div(count.maximum(count.ones_like()))  # all ignored: 0, as the list form
