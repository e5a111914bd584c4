"""Quantized and packed weights on the facade: ternary STE, packed RHS.

``x.dot(w_q, tag)`` with a block-quantized ``w_q`` is :class:`contract.Dot`'s
``dot`` (it routes block weights to the ``qcontract`` primitive). The tag
rules and the IR live in :mod:`fucina.ir.quantized`; these mixins validate
their tensor arguments and wrap the results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import tags as T
from ..dtypes import DType
from ..ir import quantized as Q
from ..kernels.qmatmul import PackedRhs
from .base import Tensor, check_tensor, result, same_ctx

if TYPE_CHECKING:
    from .branches import F32Tensor

__all__ = ["PackRhs", "QuantizedMatmul"]


class QuantizedMatmul(Tensor):
    """Ternary straight-through linear and matmul against a packed RHS (f32)."""

    __slots__ = ()

    def dot_ternary_ste(self, weight: Tensor, contract: str) -> F32Tensor:
        """BitNet b1.58 linear: the f32 latent ``weight`` ([free, contract], contract a
        multiple of 256) is encoded to TQ2_0 with one absmean scale on every call and
        contracted with ``self`` ([..., contract]); the gradient reaches ``self``
        through the ternary weight and ``weight`` straight through (plain matmul VJP)."""
        check_tensor(weight, "weight")
        same_ctx(self, weight)
        node, out = Q.ternary_nodes(self._node, self.axis_tags, weight._node,
                                    weight.axis_tags, T.check_tag(contract))
        return result(self, out, node, DType.f32)

    def dot_packed(self, packed: PackedRhs, contract: str, out_tag: str) -> F32Tensor:
        """``[free, contract]`` times a ``pack_rhs`` snapshot -> ``[free, out_tag]``;
        inference only (``GradientQuantizedMatmulUnsupported`` /
        ``GradientPackedMatmulUnsupported`` when ``self`` requires grad)."""
        node, out = Q.packed_nodes(self._node, self.axis_tags, packed, T.check_tag(contract),
                                   out_tag)
        return result(self, out, node, DType.f32)


class PackRhs(Tensor):
    """Load-time snapshots of a rank-2 ``[out, contract]`` weight for ``dot_packed``
    (f32, f16, bf16, block formats)."""

    __slots__ = ()

    def pack_rhs(self) -> PackedRhs:
        """Snapshot this weight in its dtype's layout: ``"dense_f32"`` (f16/bf16 widened
        once) or ``"blocks"`` (GGML rows as stored); independent of this tensor."""
        return Q.pack_nodes(self._node, None)

    def pack_rhs_layout(self, layout: str) -> PackedRhs:
        """``pack_rhs`` with an explicit layout name (``"dense_f32"`` or ``"blocks"``)."""
        return Q.pack_nodes(self._node, layout)
