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
from ..blocks import BlockQ8_0
from ..dtypes import DType
from ..errors import (
    InvalidDataLength,
    InvalidShape,
    ShapeMismatch,
    TagError,
    UnsupportedGradient,
    UnsupportedView,
)
from ..ir import attention as _attention_ir
from ..ir.execute import emit
from ..ir.graph import Node, leaf
from ..runtime.gradmode import is_grad_enabled, no_grad
from ..runtime.raw import RawTensor
from .arguments import choice_arg
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


def _kind(x: Any, name: str) -> str:
    """Which KV representation ``x`` is: a tensor, raw q8_0 blocks, or per-stream caches."""
    if isinstance(x, Tensor):
        check_tensor(x, name)
        return "tensor"
    if isinstance(x, np.ndarray) and x.dtype == BlockQ8_0:
        return "q8_0"
    if isinstance(x, (list, tuple)) and x:
        kinds = set()
        for a in x:
            if isinstance(a, np.ndarray) and a.dtype == np.float16:
                kinds.add("f16")
            elif isinstance(a, np.ndarray) and a.dtype == BlockQ8_0:
                kinds.add("q8_0")
            else:
                raise TypeError(f"grouped_attention: {name} streams must be numpy float16 "
                                f"arrays or fucina.BlockQ8_0 block arrays, got "
                                f"{type(a).__name__} {getattr(a, 'dtype', '')}")
        if len(kinds) != 1:
            raise TypeError(f"grouped_attention: {name} mixes f16 and q8_0 streams")
        return "streams_" + kinds.pop()
    raise TypeError(f"grouped_attention: {name} must be a fucina tensor tagged (seq, kv_head, "
                    f"d), a fucina.BlockQ8_0 array or a list of per-stream caches, got "
                    f"{type(x).__name__}")


def _count(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"grouped_attention: {what} must be an int, got {v!r}")
    if v <= 0:
        raise InvalidShape(f"grouped_attention: {what} must be positive, got {v}")
    return int(v)


def _cache_node(data: np.ndarray, kind: str, seq: int, kv_heads: int, d: int,
                what: str) -> Node:
    """An f32 [seq, kv_heads, d] node over a raw f16 or q8_0 cache (its leading positions).

    A cache is a constant: the widened values carry no gradient.
    """
    n = seq * kv_heads * d
    if kind == "q8_0":
        bs = DType.q8_0.block_size
        if d % bs:
            raise InvalidShape(f"grouped_attention: d = {d} is not a multiple of the q8_0 "
                               f"block size {bs}")
        need, dtype = n // bs, DType.q8_0
    else:
        need, dtype = n, DType.f16
    flat = data.reshape(-1)
    if flat.size < need:
        raise InvalidDataLength(f"grouped_attention: {what} holds {flat.size} "
                                f"{'blocks' if kind == 'q8_0' else 'values'}, "
                                f"{seq} positions x {kv_heads} kv heads x d {d} need {need}")
    raw = RawTensor.from_array(dtype, flat[:need], (seq, kv_heads, d))  # a copy: the caller's
    with no_grad():  # buffer may change after the call
        if kind == "q8_0":
            return emit("dequantize", (leaf(raw, None, False),), src=DType.q8_0)
        return emit("cast", (leaf(raw, None, False),), dtype=DType.f32, src=DType.f16)


class Attention(Tensor):
    """Attention on f32 tensors tagged (seq, head, d)."""

    __slots__ = ()

    def grouped_attention(self, k: Tensor | np.ndarray | Sequence[np.ndarray],
                          v: Tensor | np.ndarray | Sequence[np.ndarray],
                          kv_head_for_head: Sequence[int] | np.ndarray | Tensor, out_tag: str,
                          scale_value: float, *, mask: str = "causal", window: int = 0,
                          bias: Tensor | None = None, kv_seq: int | None = None,
                          kv_heads: int | None = None,
                          lens: Sequence[int] | np.ndarray | None = None) -> F32Tensor:
        """Grouped-query flash attention; returns ``[seq, head * d]`` tagged (seq, out_tag).

        ``self`` is the query, tagged exactly ``(seq, head, d)``;
        ``kv_head_for_head[h]`` is the kv head query head ``h`` reads (a
        sequence, numpy integers or an integer tensor). Scores are
        ``scale_value * q . k``. ``k`` and ``v`` (the same representation) are:

        - tensors tagged ``(seq, kv_head, d)``: both f32 (gradients to q, k and
          v) or both f16 (a decode cache: widened to f32, gradient to q only);
        - raw ``fucina.BlockQ8_0`` arrays laid out ``[kv_seq, kv_heads, d/32]``
          (options ``kv_seq`` and ``kv_heads`` required; causal only; gradient
          to q only);
        - lists of per-stream caches (numpy float16 arrays or BlockQ8_0 arrays,
          each laid out ``[positions, kv_heads, d]``; options ``lens`` and
          ``kv_heads`` required): the query's ``seq`` axis is the stream axis,
          row ``s`` attends the first ``lens[s]`` positions of stream ``s``;
          inference only, each row equal to a single-stream call.

        Options: ``mask="causal"`` (default; with more kv positions than
        queries, the queries are the last positions) or ``"bidirectional"``
        (tensor k/v only); ``window=w`` (causal, not streams) limits query
        position ``p`` to keys ``[p - w + 1, p]`` (0 = unlimited); ``bias``
        (bidirectional f32 tensors only) is an f32 ``[q seq, kv seq]`` tensor
        added to the scaled scores, inference only (``UnsupportedGradient``
        when anything requires grad). An option the representation does not
        take is a ``TagError``.
        """
        tags = T.attention_result(self.axis_tags, out_tag)
        kind = _kind(k, "k")
        if _kind(v, "v") != kind:
            raise TagError("grouped_attention: k and v must be the same representation")
        choice_arg(mask, _MASKS, "grouped_attention: mask")
        causal = mask == "causal"
        w = _window(window)
        if w and not causal:
            raise TagError("grouped_attention: window needs mask='causal' (bidirectional "
                           "attention has no window: narrow k and v instead)")
        scale = f32_param(scale_value, "scale_value")
        S, H, D = self.shape
        if kind != "tensor":
            if not causal or bias is not None:
                raise TagError("grouped_attention: raw q8_0 and multi-stream caches take "
                               "neither mask='bidirectional' nor bias")
            if kind == "q8_0":
                if lens is not None or kv_seq is None or kv_heads is None:
                    raise TagError("grouped_attention: q8_0 blocks need kv_seq and kv_heads "
                                   "(and take no lens)")
                return self._cached_attention(k, v, kind, kv_head_for_head, tags, scale, w,
                                              _count(kv_seq, "kv_seq"),
                                              _count(kv_heads, "kv_heads"))
            if kv_seq is not None or w or lens is None or kv_heads is None:
                raise TagError("grouped_attention: multi-stream caches need lens and "
                               "kv_heads (and take no kv_seq or window)")
            return self._stream_attention(k, v, kind[len("streams_"):], kv_head_for_head,
                                          tags, scale, lens, _count(kv_heads, "kv_heads"))
        if kv_seq is not None or kv_heads is not None or lens is not None:
            raise TagError("grouped_attention: kv_seq, kv_heads and lens are options of raw "
                           "q8_0 and multi-stream caches, not of tensors")
        assert isinstance(k, Tensor) and isinstance(v, Tensor)
        same_ctx(self, k, v)
        T.attention_kv("k", k.axis_tags)
        T.attention_kv("v", v.axis_tags)
        if k.dtype is not v.dtype or k.dtype not in (DType.f32, DType.f16):
            raise TagError(f"grouped_attention: k and v must both be f32 or both f16, got "
                           f"{k.dtype.value} and {v.dtype.value}")
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

    def _cached_attention(self, k: Any, v: Any, kind: str, kv_head_for_head: Any,
                          tags: tuple[str, ...], scale: float, window: int, kv_seq: int,
                          kv_heads: int) -> F32Tensor:
        """Causal attention over raw q8_0 caches (dequantized once; gradient to q)."""
        S, H, D = self.shape
        if S > kv_seq:
            raise InvalidShape(f"grouped_attention: causal attention needs q seq {S} <= "
                               f"kv_seq {kv_seq}")
        kv_map = _kv_map(self, kv_head_for_head, H, kv_heads)
        kn = _cache_node(k, kind, kv_seq, kv_heads, D, "k")
        vn = _cache_node(v, kind, kv_seq, kv_heads, D, "v")
        node = emit("attention", (self._node, kn, vn, kv_map), scale=scale, causal=True,
                    window=window)
        return result(self, tags, _attention_ir.flat_view(node, 0, (S, H * D)))

    def _stream_attention(self, k: Any, v: Any, kind: str, kv_head_for_head: Any,
                          tags: tuple[str, ...], scale: float, lens: Any,
                          kv_heads: int) -> F32Tensor:
        """One query row per stream over that stream's cache (inference only)."""
        S, H, D = self.shape
        if is_grad_enabled() and self.requires_grad:
            raise UnsupportedGradient("multi-stream grouped_attention is inference-only: "
                                      "use fucina.no_grad() or detach() the query")
        if isinstance(lens, Tensor):
            check_tensor(lens, "lens")
            same_ctx(self, lens)
            if lens._node.value.is_symbolic:  # lens size the cache views: host data only
                raise UnsupportedView(
                    "grouped_attention: lens fix each stream's cache length (a shape) and "
                    "cannot be a traced tensor under compile; pass them as a list (a "
                    "guarded value: new lens trace again)")
            lens = lens.numpy()
        try:
            n = np.asarray(lens).reshape(-1)
        except (TypeError, ValueError):
            raise InvalidDataLength("lens must be a sequence of ints") from None
        if n.dtype.kind not in "iu":
            raise InvalidDataLength(f"lens must be integers, got {n.dtype}")
        if not (n.size == len(k) == len(v) == S):
            raise ShapeMismatch(f"grouped_attention: {S} query rows (streams), {n.size} lens, "
                                f"{len(k)} k and {len(v)} v streams")
        if (n <= 0).any():
            raise InvalidShape(f"grouped_attention: stream lens must be positive, got "
                               f"{n.tolist()}")
        kv_map = _kv_map(self, kv_head_for_head, H, kv_heads)
        rows = []
        for s in range(S):
            length = int(n[s])
            kn = _cache_node(k[s], kind, length, kv_heads, D, f"k stream {s}")
            vn = _cache_node(v[s], kind, length, kv_heads, D, f"v stream {s}")
            q = emit("view", (self._node,), shape=(1, H, D),
                     coeffs=((0, 0, 0), (0, 1, 0), (0, 0, 1)), base=(s, 0, 0))
            node = emit("attention", (q, kn, vn, kv_map), scale=scale, causal=True, window=0)
            rows.append(_attention_ir.flat_view(node, 0, (1, H * D)))
        out = rows[0] if S == 1 else emit("concat", tuple(rows), axis=0)
        return result(self, tags, out)


__all__ = ["Attention"]
