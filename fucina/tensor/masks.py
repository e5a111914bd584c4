"""Masks and conditionals: where, masked_fill, float predicates, band_part/tril/triu.

Mask consumers take a ``bool`` mask or a float tensor read by truthiness
(``!= 0``; NaN is truthy) carrying ``self``'s tags (any order) and sizes; the
mask is never differentiated. Integer masks are a TagError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import TagError
from ..ir.execute import emit
from ..ir.graph import Node
from ..runtime.gradmode import no_grad
from .base import Tensor, check_tensor, result, same_ctx
from .math import forward_only, same_shape
from .structural import _const
from .unary import real

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import BoolTensor


def mask_node(self: Any, mask: Any, what: str) -> Node:
    """``mask`` as a bool node aligned to ``self`` (tags in self's order, same sizes)."""
    check_tensor(mask, "mask")
    same_ctx(self, mask)
    if mask.dtype is not DType.bool and not mask.dtype.is_float:
        raise TagError(f"{what}: the mask must be bool or float, got {mask.dtype.value}")
    node = same_shape(self, mask, what)
    if mask.dtype is DType.bool:
        return node
    return emit("compare", (node,), fn="ne", value=0)


def _predicate(self: Any, fn: str) -> Any:
    with no_grad():  # a mask is a constant: no gradient graph
        node = emit("unary", (self._node,), fn=fn)
    return result(self, self.axis_tags, node, DType.bool)


def _offset(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int or None, got {v!r}")
    return int(v)


def _diagonal(offset: Any) -> int:
    k = _offset(offset, "offset")
    if k is None:
        raise TypeError("offset must be an int")
    return k


class Select(Tensor):
    """Conditional selection by a mask (f32, f16, bf16)."""

    __slots__ = ()

    def where(self, cond: Tensor, other: Tensor) -> Self:
        """``cond[i] ? self[i] : other[i]``; ``other`` has self's type (tags in any order, same
        sizes); differentiable in ``self`` and ``other``, never in ``cond``."""
        c = mask_node(self, cond, "where")
        check_tensor(other, "other")
        same_ctx(self, other)
        if other.dtype is not self.dtype:
            raise TagError(f"where requires matching dtypes ({self.dtype.value} vs "
                           f"{other.dtype.value}); cast explicitly with to()")
        forward_only(self, other)
        b = same_shape(self, other, "where")
        return result(self, self.axis_tags, emit("where", (c, self._node, b)))

    def masked_fill(self, mask: Tensor, value: float) -> Self:
        """``mask[i] ? value : self[i]``; the gradient is zeroed where filled."""
        c = mask_node(self, mask, "masked_fill")
        v = real(value, "value")
        forward_only(self)
        node = self._node
        fill = emit("fill", (), shape=node.shape, dtype=self.dtype, value=v)
        return result(self, self.axis_tags, emit("where", (c, fill, node)))


class MaskOps(Tensor):
    """Float predicates and band masks: isnan/isinf/isfinite, band_part, tril, triu (f32)."""

    __slots__ = ()

    def isnan(self) -> BoolTensor:
        """bool mask of NaN elements (x != x)."""
        return _predicate(self, "isnan")

    def isinf(self) -> BoolTensor:
        """bool mask of +-inf elements."""
        return _predicate(self, "isinf")

    def isfinite(self) -> BoolTensor:
        """bool mask of finite elements (-inf < x < inf; false for NaN)."""
        return _predicate(self, "isfinite")

    def band_part(self, row_tag: str, col_tag: str, lower: int | None,
                  upper: int | None) -> Self:
        """Keep the band ``i - j <= lower`` and ``j - i <= upper`` of the (row_tag, col_tag)
        plane (``None``: unbounded side) and zero everything else (tf.linalg.band_part);
        other axes pass through. The gradient is the same band."""
        T.check_tag(row_tag)
        T.check_tag(col_tag)
        if row_tag == col_tag:
            raise TagError(f"band_part needs two different tags, got {row_tag!r} twice")
        ri = T.index(self.axis_tags, row_tag)
        ci = T.index(self.axis_tags, col_tag)
        lo, up = _offset(lower, "lower"), _offset(upper, "upper")
        node = self._node
        rows, cols = node.shape[ri], node.shape[ci]
        i = np.arange(rows)[:, None]
        j = np.arange(cols)[None, :]
        keep = np.ones((rows, cols), dtype=bool)
        if lo is not None:
            keep &= (i - j) <= lo
        if up is not None:
            keep &= (j - i) <= up
        plane = _const(DType.bool, keep)
        coeffs = tuple((1, 0) if k == ri else (0, 1) if k == ci else (0, 0)
                       for k in range(len(node.shape)))
        band = emit("view", (plane,), shape=node.shape, coeffs=coeffs, base=(0, 0))
        zeros = emit("fill", (), shape=node.shape, dtype=self.dtype, value=0)
        return result(self, self.axis_tags, emit("where", (band, node, zeros)))

    def tril(self, row_tag: str, col_tag: str, offset: int = 0) -> Self:
        """Lower triangle (torch.tril): keep ``j - i <= offset``."""
        return self.band_part(row_tag, col_tag, None, _diagonal(offset))

    def triu(self, row_tag: str, col_tag: str, offset: int = 0) -> Self:
        """Upper triangle (torch.triu): keep ``j - i >= offset``."""
        return self.band_part(row_tag, col_tag, -_diagonal(offset), None)
