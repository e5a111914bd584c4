"""Grouped-query attention (REFERENCE §4.13) on the f32 branch.

``grouped_attention`` records the dedicated ``attention`` primitive
(``fucina.ir.attention``): a flash-style streaming-softmax kernel whose
scores are never a [q, k] tensor, with a blockwise recomputing backward. It
is a primitive rather than a composition because the composition
materializes the scores: see docs/ARCHITECTURE.md for the measurement.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidShape, ShapeMismatch, TagError, UnsupportedGradient
from ..ir import attention as _attention_ir
from ..ir.execute import emit
from ..ir.graph import Node, leaf
from ..runtime.gradmode import is_grad_enabled, no_grad
from ..runtime.raw import RawTensor
from .base import Tensor, check_tensor, host_indices, result, same_ctx
from .unary import f32_param

if TYPE_CHECKING:
    from .branches import F32Tensor

_MASKS = ("causal", "bidirectional")


def _kv_map(self: Any, kv_head_for_head: Any, heads: int, kv_heads: int) -> Node:
    """The head -> kv head map as an i64 node (host data checked now; a tensor in-kernel)."""
    if isinstance(kv_head_for_head, Tensor):
        check_tensor(kv_head_for_head, "kv_head_for_head")
        same_ctx(self, kv_head_for_head)
        if not kv_head_for_head.dtype.is_integer or kv_head_for_head.tag_count != 1:
            raise TagError("kv_head_for_head must be a rank-1 integer tensor, got "
                           f"{type(kv_head_for_head)!r}")
        if kv_head_for_head.shape[0] != heads:
            raise ShapeMismatch(f"kv_head_for_head has {kv_head_for_head.shape[0]} entries "
                                f"for {heads} query heads")
        node = kv_head_for_head._node
        if kv_head_for_head.dtype is not DType.i64:
            node = emit("cast", (node,), dtype=DType.i64, src=kv_head_for_head.dtype)
        return node
    idx = host_indices(kv_head_for_head, kv_heads, "kv_head")
    if idx.size != heads:
        raise ShapeMismatch(f"kv_head_for_head has {idx.size} entries for {heads} query heads")
    return leaf(RawTensor.from_array(DType.i64, idx), None, False)


def _window(window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, numbers.Integral):
        raise TypeError(f"window must be an int, got {window!r}")
    if window < 0:
        raise InvalidShape(f"window must be >= 0 (0 = full causal), got {window}")
    return int(window)


class Attention(Tensor):
    """Attention on f32 tensors tagged (seq, head, d)."""

    __slots__ = ()

    def grouped_attention(self, k: Tensor, v: Tensor,
                          kv_head_for_head: Sequence[int] | np.ndarray | Tensor, out_tag: str,
                          scale_value: float, *, mask: str = "causal", window: int = 0,
                          bias: Tensor | None = None) -> F32Tensor:
        """Grouped-query flash attention; returns ``[seq, head * d]`` tagged (seq, out_tag).

        ``self`` is the query, tagged exactly ``(seq, head, d)``; ``k`` and ``v``
        are tagged ``(seq, kv_head, d)``, both f32 (full q/k/v gradients) or
        both f16 (a decode cache: widened to f32, gradient to q only).
        ``kv_head_for_head[h]`` is the kv head query head ``h`` reads (a
        sequence, numpy integers or an integer tensor). Scores are
        ``scale_value * q . k``.

        Options: ``mask="causal"`` (default; with more kv positions than
        queries, the queries are the last positions) or ``"bidirectional"``;
        ``window=w`` (causal only) limits query position ``p`` to keys
        ``[p - w + 1, p]`` (0 = unlimited); ``bias`` (bidirectional only) is an
        f32 ``[q seq, kv seq]`` tensor added to the scaled scores, inference
        only (``UnsupportedGradient`` when anything requires grad).
        """
        check_tensor(k, "k")
        check_tensor(v, "v")
        same_ctx(self, k, v)
        tags = T.attention_result(self.axis_tags, k.axis_tags, v.axis_tags, out_tag)
        if k.dtype is not v.dtype or k.dtype not in (DType.f32, DType.f16):
            raise TagError(f"grouped_attention: k and v must both be f32 or both f16, got "
                           f"{k.dtype.value} and {v.dtype.value}")
        if mask not in _MASKS:
            raise TagError(f"grouped_attention: mask must be one of {_MASKS}, got {mask!r}")
        causal = mask == "causal"
        w = _window(window)
        if w and not causal:
            raise TagError("grouped_attention: window needs mask='causal' (bidirectional "
                           "attention has no window: narrow k and v instead)")
        scale = f32_param(scale_value, "scale_value")
        S, H, D = self.shape
        KV, KH, Dk = k.shape
        if v.shape != k.shape:
            raise ShapeMismatch(f"grouped_attention: k has shape {k.shape}, v {v.shape}")
        if Dk != D:
            raise ShapeMismatch(f"grouped_attention: tag 'd' is {D} in q and {Dk} in k/v")
        if causal and S > KV:
            raise InvalidShape(f"grouped_attention: causal attention needs q seq {S} <= kv "
                               f"seq {KV} (the queries are the last kv positions)")
        kv_map = _kv_map(self, kv_head_for_head, H, KH)
        kn, vn = k._node, v._node
        if k.dtype is DType.f16:  # a cache is a constant: widened once, no gradient
            with no_grad():
                kn = emit("cast", (kn,), dtype=DType.f32, src=DType.f16)
                vn = emit("cast", (vn,), dtype=DType.f32, src=DType.f16)
        ins = [self._node, kn, vn, kv_map]
        if bias is not None:
            check_tensor(bias, "bias")
            same_ctx(self, bias)
            if causal:
                raise TagError("grouped_attention: bias needs mask='bidirectional'")
            if bias.dtype is not DType.f32 or bias.tag_count != 2:
                raise TagError(f"grouped_attention: bias must be a rank-2 f32 tensor, got "
                               f"{type(bias)!r}")
            if tuple(bias.shape) != (S, KV):
                raise ShapeMismatch(f"grouped_attention: bias shape {bias.shape} is not "
                                    f"[q seq, kv seq] = {(S, KV)}")
            if is_grad_enabled() and any(t.requires_grad for t in (self, k, v, bias)):
                raise UnsupportedGradient(
                    "grouped_attention with a bias is inference-only: no operand may "
                    "require grad (use fucina.no_grad() or detach())")
            ins.append(bias._node)
        node = emit("attention", tuple(ins), scale=scale, causal=causal, window=w)
        return result(self, tags, _attention_ir.flat_view(node, 0, (S, H * D)))


__all__ = ["Attention"]
