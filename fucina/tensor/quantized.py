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
from ..errors import GradientQuantizedMatmulUnsupported, ShapeMismatch, TagError
from ..ir import quantized as Q
from ..kernels.qmatmul import PackedRhs
from .arguments import choice_arg
from .base import Tensor, check_tensor, operand_requires_grad, result, same_ctx

if TYPE_CHECKING:
    from .branches import F32Tensor

__all__ = ["PackRhs", "QuantizedMatmul"]


#: Pack dtypes the reference's fused packed entries have kernels for (its q8_0x4, q4_kx8,
#: q5_kx8, q6_kx4 layouts; here the "blocks" layout of those dtypes).
_FUSED_PACKS = ("q8_0", "q4_k", "q5_k", "q6_k")


def _fused_operands(what: str, pack: object, dtypes: tuple[str, ...], *xs: Tensor) -> None:
    """The fused packed entries' checks, in the reference's order: the pack's kind first
    (its compile errors), then any operand requiring grad."""
    if not isinstance(pack, PackedRhs):
        raise TypeError(f"{what} needs a PackedRhs (from pack_rhs), got {type(pack).__name__}")
    if pack.layout != "blocks" or pack.dtype not in dtypes:
        raise TagError(f"{what} has kernels for packed {'/'.join(dtypes)} weights only, got "
                       f"a {pack.dtype} {pack.layout!r} pack (use the unfused ops and "
                       "dot_packed)")
    for x in xs:
        if operand_requires_grad(x):
            raise GradientQuantizedMatmulUnsupported(
                f"{what} is inference only: an operand requires grad (use dot for training)")


def _rank2(what: str, x: Tensor, tag: str) -> None:
    if x.tag_count != 2 or x.axis_tags[1] != tag:
        raise TagError(f"{what}: the input must be rank 2 stored [free, {tag!r}], got tags "
                       f"{x.axis_tags}")


class QuantizedMatmul(Tensor):
    """Ternary straight-through linear and matmul against a packed RHS (f32).

    The fused packed entries (``rms_norm_mul_dot_packed``, ``split_swi_glu_dot_packed``,
    ``geglu_quant_dot_packed``) compose the unfused ops with ``dot_packed``: compile
    fuses the pre-GEMM step into one kernel, and the values equal the unfused pair.
    """

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
                                   out_tag, operand_requires_grad(self))
        return result(self, out, node, DType.f32)

    def rms_norm_mul_dot_packed(self, norm_weight: Tensor, eps: float, rhs: PackedRhs,
                                contract: str, out_tag: str) -> F32Tensor:
        """``rms_norm_mul(contract, norm_weight, eps)`` then ``dot_packed(rhs, contract,
        out_tag)``: ``self`` is the pre-norm ``[free, contract]`` input, ``norm_weight``
        the ``[contract]`` scale row, ``rhs`` a q8_0/q4_k/q5_k/q6_k pack."""
        what = "rms_norm_mul_dot_packed"
        check_tensor(norm_weight, "norm_weight")
        _fused_operands(what, rhs, _FUSED_PACKS, self, norm_weight)
        _rank2(what, self, T.check_tag(contract))
        normed = self.rms_norm_mul(contract, norm_weight, eps)  # type: ignore[attr-defined]
        return normed.dot_packed(rhs, contract, out_tag)

    def split_swi_glu_dot_packed(self, rhs: PackedRhs, split_tag: str,
                                 out_tag: str) -> F32Tensor:
        """``split_gated("swiglu", split_tag, split_tag)`` (silu of the first half times
        the second) then ``dot_packed(rhs, split_tag, out_tag)``: ``self`` is the fused
        gate/up ``[free, split_tag]`` projection, ``rhs`` a q8_0/q4_k/q5_k/q6_k pack of
        the down projection."""
        what = "split_swi_glu_dot_packed"
        _fused_operands(what, rhs, _FUSED_PACKS, self)
        _rank2(what, self, T.check_tag(split_tag))
        gated = self.split_gated("swiglu", split_tag, split_tag)  # type: ignore[attr-defined]
        return gated.dot_packed(rhs, split_tag, out_tag)

    def geglu_quant_dot_packed(self, up: Tensor, rhs: PackedRhs, in_tag: str,
                               out_tag: str) -> F32Tensor:
        """``(up * unary("gelu_quant"))`` of ``self`` (the gate), then ``dot_packed(rhs,
        in_tag, out_tag)``; ``self`` and ``up`` are ``[free, in_tag]`` with the same tags
        and sizes, ``rhs`` a q8_0 pack."""
        what = "geglu_quant_dot_packed"
        check_tensor(up, "up")
        same_ctx(self, up)
        _fused_operands(what, rhs, ("q8_0",), self, up)
        _rank2(what, self, T.check_tag(in_tag))
        if up.axis_tags != self.axis_tags or up.dtype is not DType.f32:
            raise TagError(f"{what}: up must be an f32 tensor tagged {self.axis_tags}, got "
                           f"{type(up)!r}")
        if up.shape != self.shape:
            raise ShapeMismatch(f"{what}: up has sizes {up.shape}, the gate {self.shape}")
        h = up.mul(self.unary("gelu_quant"))  # type: ignore[attr-defined]
        return h.dot_packed(rhs, in_tag, out_tag)


class PackRhs(Tensor):
    """Load-time snapshots of a rank-2 ``[out, contract]`` weight for ``dot_packed``
    (f32, f16, bf16, block formats)."""

    __slots__ = ()

    def pack_rhs(self) -> PackedRhs:
        """Snapshot this weight in its dtype's layout: ``"dense_f32"`` (f16/bf16 widened
        once) or ``"blocks"`` (GGML rows as stored); a ``fucina.PackedRhs`` independent
        of this tensor."""
        return Q.pack_nodes(self._node, None)

    def pack_rhs_layout(self, layout: str) -> PackedRhs:
        """``pack_rhs`` with an explicit layout name (``"dense_f32"`` or ``"blocks"``)."""
        return Q.pack_nodes(self._node,
                            choice_arg(layout, Q.PACK_LAYOUTS, "pack_rhs_layout: layout"))
