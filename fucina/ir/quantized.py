"""IR primitives for f32 x block-quantized contractions and the ternary STE.

``qcontract(x, w)``: ``x`` is f32 ``[..., k]`` (contracted axis last, any
strides), ``w`` a block-quantized ``[n, k]`` weight (ggml's ``[out, in]``);
the result is f32 ``[..., n]``. ``qcontract_t(g, w)`` is its transpose
(``[..., n] -> [..., k]``), the input gradient. Both run the kernels of
:mod:`fucina.kernels.qmatmul`, which read the blocks directly. The weight is
a constant: a gradient asked of it raises ``GradientQuantizedMatmulUnsupported``.

``ternary_encode(w)`` encodes an f32 ``[n, k]`` latent weight to TQ2_0 with
one per-tensor absmean scale (BitNet b1.58); ``ternary_ste(x, wq, w)``
contracts ``x`` with the encoded ``wq`` and routes the gradient of the
latent ``w`` straight through (the plain matmul VJP, no clipping).

Every op registers its shape rule (``ops.OPS``), reference kernel (eager and
compiled programs run it between generated kernels) and VJP rule here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import GradientQuantizedMatmulUnsupported
from ..kernels import reference
from ..kernels.qmatmul import qmatmul, qmatmul_t
from ..runtime.raw import RawTensor
from .autodiff import Grads, rule
from .execute import emit
from .graph import Node
from .ops import Meta, _op

__all__ = ["absmean_scale", "encode_tq2_0_absmean"]


def _qcontract_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    x, w = ins[0], ins[1]
    return x.shape[:-1] + (w.shape[0],), DType.f32


def _qcontract_t_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    g, w = ins
    return g.shape[:-1] + (w.shape[1],), DType.f32


def _tq2_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[0].shape, DType.tq2_0


_op("qcontract", infer=_qcontract_meta)
_op("qcontract_t", infer=_qcontract_t_meta)
_op("ternary_encode", infer=_tq2_meta, differentiable=False)
_op("ternary_ste", infer=_qcontract_meta)


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


@reference.kernel("qcontract")
def _k_qcontract(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    x, w = ins[0], ins[1]
    y = qmatmul(_rows(np.ascontiguousarray(x)), w, attrs["fmt"].value)
    return y.reshape(x.shape[:-1] + (w.shape[0],))


reference.KERNELS["ternary_ste"] = _k_qcontract


@reference.kernel("qcontract_t")
def _k_qcontract_t(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    g, w = ins
    fmt: DType = attrs["fmt"]
    k = w.shape[1] * fmt.block_size
    y = qmatmul_t(_rows(np.ascontiguousarray(g)), w, fmt.value, k)
    return y.reshape(g.shape[:-1] + (k,))


def absmean_scale(w: np.ndarray) -> np.float32:
    """BitNet b1.58's per-tensor scale ``max(mean|w|, 1e-5)`` (f64 mean, rounded to f32)."""
    return np.float32(max(float(np.abs(w, dtype=np.float64).mean()), 1e-5))


def encode_tq2_0_absmean(w: np.ndarray) -> np.ndarray:
    """TQ2_0 blocks of ``w`` ([n, k], k % 256 == 0) with one absmean scale for the tensor.

    Trits are ``clamp(round(w / d), -1, 1)`` (round half away from zero, as
    ggml's encoders); every block stores ``d`` as its f16 scale.
    """
    from ..blocks import BlockTQ2_0
    from ..kernels.quant import _round_half_away

    w = np.ascontiguousarray(w, dtype=np.float32)
    d = absmean_scale(w)
    q = (np.clip(_round_half_away(w / d), -1, 1) + 1).astype(np.uint8)
    n, k = w.shape
    q = q.reshape(n * k // 256, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint8)[:, None]
    out = np.empty(n * k // 256, dtype=BlockTQ2_0)
    out["qs"] = (q[:, :, 0] | q[:, :, 1] | q[:, :, 2] | q[:, :, 3]).reshape(-1, 64)
    out["d"] = np.float16(d).view(np.uint16)
    return out.reshape(n, k // 256)


@reference.kernel("ternary_encode")
def _k_ternary_encode(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return encode_tq2_0_absmean(ins[0])


def _weight_grad_error(n: Node) -> GradientQuantizedMatmulUnsupported:
    return GradientQuantizedMatmulUnsupported(
        f"the {n.inputs[1].dtype.value} weight of a quantized contraction is a constant: "
        "it has no gradient (dequantize it with to('f32') to train it)")


@rule("qcontract")
def _vjp_qcontract(n: Node, g: Node) -> Grads:
    if n.inputs[1].requires_grad:
        raise _weight_grad_error(n)
    return emit("qcontract_t", (g, n.inputs[1]), fmt=n.attrs["fmt"]), None


@rule("qcontract_t")
def _vjp_qcontract_t(n: Node, g: Node) -> Grads:
    if n.inputs[1].requires_grad:
        raise _weight_grad_error(n)
    return emit("qcontract", (g, n.inputs[1]), fmt=n.attrs["fmt"]), None


@rule("ternary_ste")
def _vjp_ternary_ste(n: Node, g: Node) -> Grads:
    x, wq, w = n.inputs
    gx = emit("qcontract_t", (g, wq), fmt=DType.tq2_0)
    # straight-through: d/dw of x . w^T, i.e. g^T x over every leading axis of x
    lead = tuple(range(len(x.shape) - 1))
    r = len(lead)
    gw = emit("contract", (g, x), labels=(lead + (r,), lead + (r + 1,), (r, r + 1)),
              shape=w.shape, dtype=DType.f32)
    return gx, None, gw


def qcontract(x: Node, w: Node) -> Node:
    """Emit ``x[..., k] . w[n, k]`` -> ``[..., n]`` (validated by the caller)."""
    return emit("qcontract", (x, w), fmt=w.dtype)


def ternary_ste(x: Node, w: Node) -> Node:
    """Emit the STE ternary linear: forward through TQ2_0(absmean(w)), gradient to w as-is."""
    wq = emit("ternary_encode", (w,))
    return emit("ternary_ste", (x, wq, w), fmt=DType.tq2_0)


# -- facade support: tag rules of the quantized contractions --------------------------------


def _move_last(x: Node, axis: int) -> Node:
    """A zero-copy view of ``x`` with ``axis`` moved last."""
    r = len(x.shape)
    if axis == r - 1:
        return x
    order = [a for a in range(r) if a != axis] + [axis]
    shape = tuple(x.shape[a] for a in order)
    # coeffs[j][k]: output axis j advances input axis k
    coeffs = tuple(tuple(1 if order[j] == k else 0 for k in range(r)) for j in range(r))
    return emit("view", (x,), shape=shape, coeffs=coeffs, base=(0,) * r)


_NO_MATMUL = (DType.q8_1, DType.q8_k)  # activation-side formats (as in the reference)


def check_rhs(wtags: tuple[str, ...], wdtype: DType, contract: str, what: str) -> None:
    """The weight of a quantized/packed contraction: rank 2, stored [free, contract]."""
    from .. import tags as T
    from ..errors import TagError

    T.index(wtags, contract)
    if len(wtags) != 2 or wtags[1] != contract:
        raise TagError(f"{what}: the {wdtype.value} weight must be rank 2 and stored "
                       f"[free, {contract!r}], got tags {wtags}")
    if wdtype in _NO_MATMUL:
        raise TagError(f"{what}: {wdtype.value} is an activation format, not a weight format")


def dot_nodes(xn: Node, xtags: tuple[str, ...], wn: Node, wtags: tuple[str, ...],
              contract: str) -> tuple[Node, tuple[str, ...]]:
    """``x.dot(w_q, contract)``: checks tags and sizes, returns (node, result tags)."""
    from .. import tags as T
    from ..errors import ShapeMismatch, TagError

    check_rhs(wtags, wn.dtype, contract, "dot with a quantized weight")
    ax = T.index(xtags, contract)
    shared = [t for t in xtags if t in wtags and t != contract]
    if shared:
        raise TagError(f"dot with a quantized weight: shared batch tags {shared} are not "
                       "supported (the weight has one free axis)")
    if xn.dtype is not DType.f32:
        raise TagError(f"dot with a {wn.dtype.value} weight needs an f32 left operand, got "
                       f"{xn.dtype.value}: cast with to('f32')")
    if xn.shape[ax] != wn.shape[1]:
        raise ShapeMismatch(f"tag {contract!r} has sizes {xn.shape[ax]} and {wn.shape[1]} in "
                            "the contraction")
    out = T.dot_result(xtags, wtags, contract)
    return qcontract(_move_last(xn, ax), wn), out


def ternary_nodes(xn: Node, xtags: tuple[str, ...], wn: Node, wtags: tuple[str, ...],
                  contract: str) -> tuple[Node, tuple[str, ...]]:
    """``x.dot_ternary_ste(w, contract)``: the reference's storage rules, then the STE op."""
    from .. import tags as T
    from ..errors import ShapeMismatch, TagError, TernaryContractDimNotBlockAligned

    if xn.dtype is not DType.f32 or wn.dtype is not DType.f32:
        raise TagError("dot_ternary_ste takes an f32 input and an f32 latent weight")
    check_rhs(wtags, wn.dtype, contract, "dot_ternary_ste")
    if not xtags or xtags[-1] != contract:
        raise TagError(f"dot_ternary_ste: the input must be stored [..., {contract!r}], got "
                       f"tags {xtags}")
    shared = [t for t in xtags if t in wtags and t != contract]
    if shared:
        raise TagError(f"dot_ternary_ste: shared batch tags {shared} are not supported")
    k = wn.shape[1]
    if xn.shape[-1] != k:
        raise ShapeMismatch(f"tag {contract!r} has sizes {xn.shape[-1]} and {k} in the "
                            "contraction")
    if k % 256:
        raise TernaryContractDimNotBlockAligned(
            f"dot_ternary_ste: contracted size {k} is not a multiple of 256 (TQ2_0 blocks)")
    return ternary_ste(xn, wn), T.dot_result(xtags, wtags, contract)


_op("dot_packed", infer=lambda ins, attrs: ((ins[0].shape[0], attrs["pack"].n), DType.f32),
    differentiable=False)


@reference.kernel("dot_packed")
def _k_dot_packed(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    pack = attrs["pack"]
    if pack.data is None:
        raise ValueError("dot_packed: the packed RHS was deinit'ed")
    return pack.matmul(ins[0])


#: The layouts a PackedRhs has: weights of scalar dtypes widened to f32, or the blocks.
PACK_LAYOUTS = ("dense_f32", "blocks")


def pack_nodes(wn: Node, layout: str | None) -> Any:
    """The PackedRhs of a rank-2 weight (``layout`` None picks the dtype's default)."""
    from ..errors import TagError, UnsupportedView
    from ..kernels.cast import bf16_to_f32
    from ..kernels.qmatmul import PackedRhs

    v = wn.value
    if v.rank != 2:
        raise TagError(f"pack_rhs needs a rank-2 [out, contract] weight, got shape {v.shape}")
    if v.is_symbolic:
        raise TagError("pack_rhs is a load-time step: call it outside compile")
    want = "blocks" if v.dtype.is_block else "dense_f32"
    layout = layout or want
    if layout != want:
        raise TagError(f"pack_rhs_layout: layout {layout!r} does not apply to "
                       f"{v.dtype.value} weights (use {want!r})")
    if not v.is_contiguous():
        raise UnsupportedView(f"pack_rhs needs a contiguous weight, got strides {v.strides}")
    n, k = v.shape
    arr = v.array()
    if v.dtype.is_block:
        return PackedRhs(layout, v.dtype.value, np.array(arr, copy=True), n, k)
    if v.dtype is DType.bf16:
        data = bf16_to_f32(arr)
    else:
        data = np.asarray(arr, dtype=np.float32)
    return PackedRhs(layout, v.dtype.value, np.array(data, dtype=np.float32, copy=True), n, k)


def packed_nodes(xn: Node, xtags: tuple[str, ...], pack: Any, contract: str,
                 out_tag: str, requires_grad: bool | None = None
                 ) -> tuple[Node, tuple[str, ...]]:
    """``x.dot_packed(pack, contract, out_tag)``: rank-2 [free, contract] input
    (``requires_grad``: the caller's tensor's, when it differs from the traced node's)."""
    from .. import tags as T
    from ..errors import (
        GradientPackedMatmulUnsupported,
        ShapeMismatch,
        TagError,
    )
    from ..kernels.qmatmul import PackedRhs

    if not isinstance(pack, PackedRhs):
        raise TypeError(f"dot_packed needs a PackedRhs (from pack_rhs), got "
                        f"{type(pack).__name__}")
    if len(xtags) != 2 or xtags[1] != contract:
        raise TagError(f"dot_packed: the input must be rank 2 stored [free, {contract!r}], got "
                       f"tags {xtags}")
    T.check_tag(out_tag)
    if out_tag == xtags[0]:
        raise TagError(f"dot_packed: out_tag {out_tag!r} repeats the input's free tag")
    if xn.requires_grad if requires_grad is None else requires_grad:
        cls = GradientPackedMatmulUnsupported if pack.layout == "dense_f32" \
            else GradientQuantizedMatmulUnsupported
        raise cls("dot_packed has no gradient: the input requires grad (use dot for training)")
    if xn.dtype is not DType.f32:
        raise TagError(f"dot_packed takes an f32 input, got {xn.dtype.value}")
    if xn.shape[1] != pack.k:
        raise ShapeMismatch(f"tag {contract!r} has sizes {xn.shape[1]} and {pack.k} in "
                            "dot_packed")
    return emit("dot_packed", (xn,), pack=pack), (xtags[0], out_tag)
