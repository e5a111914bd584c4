"""The attention primitives: flash-style forward and its gradient, registered into the IR.

``attention`` takes ``(q [S, H, D], k [KV, KH, D], v [KV, KH, D], kvmap [H] i64)``
and optionally a bias ``[S, KV]``; attributes ``scale``, ``causal``,
``window``. Its result is one flat f32 buffer: the output ``[S, H, D]``
followed by the per-row logsumexp ``[H, S]`` the backward needs (the IR has
single-result nodes, so the saved statistics travel in the same buffer; the
facade views the output part). ``attention_grad`` takes ``(q, k, v, kvmap,
attention result, its gradient)`` and returns ``dq``, ``dk``, ``dv`` in one
flat buffer. Both run their Numba kernels (``fucina.kernels.attention``)
through the reference-kernel table, so eager calls and compiled programs
take the same path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType
from ..kernels import attention as K
from ..kernels.reference import kernel
from ..runtime.raw import RawTensor
from .autodiff import rule
from .checks import VALUE_CHECKS, check_range
from .execute import emit
from .graph import Node
from .ops import OPS, Meta, OpDef


def _attention_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    S, H, D = ins[0].shape
    return (S * H * D + H * S,), DType.f32


def _grad_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    S, H, D = ins[0].shape
    KV, KH, _ = ins[1].shape
    return (S * H * D + 2 * KV * KH * D,), DType.f32


OPS["attention"] = OpDef("attention", infer=_attention_meta)
OPS["attention_grad"] = OpDef("attention_grad", infer=_grad_meta, differentiable=False)


def _kv_map_in_range(inputs: Any, attrs: dict[str, Any], arrays: list[np.ndarray]) -> None:
    """The head map (input 3) names existing kv heads: checked before the kernel reads it."""
    kv_heads = inputs[1].shape[1]
    check_range(arrays[3], 0, kv_heads, "'kv_head' (kv_head_for_head)", kv_heads)


VALUE_CHECKS["attention"] = _kv_map_in_range
VALUE_CHECKS["attention_grad"] = _kv_map_in_range


@kernel("attention")
def _attention(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    q, k, v, kvmap = ins[:4]
    bias = ins[4] if len(ins) > 4 else None
    return K.forward(q, k, v, kvmap, attrs["scale"], attrs["causal"], attrs["window"], bias)


@kernel("attention_grad")
def _attention_grad(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    q, k, v, kvmap, o, g = ins
    S, H, D = q.shape
    go = g[:S * H * D].reshape(S, H, D)
    return K.backward(q, k, v, o, go, kvmap, attrs["scale"], attrs["causal"], attrs["window"])


def flat_view(x: Node, start: int, shape: tuple[int, ...]) -> Node:
    """Contiguous ``shape`` view of the flat ``x`` from element ``start`` (no copy)."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    coeffs = tuple((s,) for s in reversed(strides))
    return emit("view", (x,), shape=shape, coeffs=coeffs, base=(start,))


@rule("attention")
def _attention_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    q, k, v, kvmap = n.inputs[:4]
    if len(n.inputs) > 4:  # the facade rejects this: a biased attention is inference-only
        raise KeyError("attention with a bias has no gradient")
    grads = emit("attention_grad", (q, k, v, kvmap, n, g), scale=n.attrs["scale"],
                 causal=n.attrs["causal"], window=n.attrs["window"])
    S, H, D = q.shape
    KV, KH, _ = k.shape
    nq, nk = S * H * D, KV * KH * D
    return (flat_view(grads, 0, (S, H, D)), flat_view(grads, nq, (KV, KH, D)),
            flat_view(grads, nq + nk, (KV, KH, D)), None)
