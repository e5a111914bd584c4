"""Losses composed from primitives (their gradients come from the primitives' rules)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import IndexOutOfBounds, InvalidDataLength, InvalidShape, TagError
from ..ir.graph import leaf
from ..runtime.raw import RawTensor
from .base import Tensor, new, result, tensor_type

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
        """Log-softmax + NLL over ``class_tag`` against host integer ``labels`` (torch parity).

        ``labels`` holds one class per position, positions ordered row-major over
        the remaining tags. ``reduction`` is "mean" (over positions not equal to
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
