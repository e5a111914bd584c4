"""Contractions by name: dot, einsum and einsum_many share one lowering.

Roles come from the shared x kept table in ``tags.py``. Private axes that
the output drops are summed away first, so the ``contract`` primitive only
ever sees batch, contracted and free axes; its gradient is again a
contraction through the same primitive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import tags as T
from ..dtypes import DType
from ..errors import ShapeMismatch, TagError, UnsupportedGradient
from ..ir import quantized
from ..ir.execute import emit
from ..ir.graph import Node
from . import fast
from .arguments import choice_arg
from .base import Tensor, check_tensor, result, same_ctx, sizes_of, tensor_list
from .math import binary

if TYPE_CHECKING:
    from typing_extensions import Self


def _result_dtype(a: DType, b: DType) -> DType:
    if a is b:
        return a
    if a is DType.f32 and b in (DType.f16, DType.bf16):
        return DType.f32  # mixed f32 x f16/bf16 constant RHS
    raise TagError(f"contraction of {a.value} with {b.value}: cast one side explicitly")


def _presum(x: Any, node: Node, tags_: tuple[str, ...], drop: Sequence[str]) -> tuple[Node, tuple]:
    """Sum away private axes the output drops; returns the node and its remaining tags."""
    if not drop:
        return node, tags_
    axes = tuple(sorted(tags_.index(t) for t in drop))
    acc = DType.f64 if node.dtype is DType.f64 else DType.f32
    summed = emit("reduce", (node,), fn="sum", axes=axes, dtype=acc)
    rest = tuple(t for t in tags_ if t not in drop)
    # An f16/bf16 operand's partial sum stays f32: the contraction widens 16-bit operands
    # and narrows its result once (narrowed here too, the sum overflowed f16 at 65504 and
    # lost its small terms: [1, 2^-12, 2^-12] summed to 1).
    return summed, rest


def contract_nodes(a: Any, an: Node, at: tuple[str, ...], b: Any, bn: Node,
                   bt: tuple[str, ...], out: tuple[str, ...], dtype: DType) -> Node:
    """Contract two nodes with tags ``at``/``bt`` into ``out`` (validated) order."""
    sa = dict(zip(at, an.shape)) if at else {}
    sb = dict(zip(bt, bn.shape)) if bt else {}
    for t in at:
        if t in sb and sa[t] != sb[t]:
            raise ShapeMismatch(f"tag {t!r} has sizes {sa[t]} and {sb[t]} in the contraction")
    # Private axes the output drops ("summed" in the shared x kept table) go first.
    an, at = _presum(a, an, at, [t for t in at if T.einsum_role(t, at, bt, out) == "summed"])
    bn, bt = _presum(b, bn, bt, [t for t in bt if T.einsum_role(t, bt, at, out) == "summed"])
    label = {t: i for i, t in enumerate(T.union(at, bt))}
    shape = tuple(sa[t] if t in sa else sb[t] for t in out) or (1,)
    return emit("contract", (an, bn), labels=(tuple(label[t] for t in at),
                                              tuple(label[t] for t in bt),
                                              tuple(label[t] for t in out)),
                shape=shape, dtype=dtype)


def _dot(self: Any, other: Any, contract: str) -> Any:
    hit = fast.dot(self, other, contract)
    if hit is not None:
        return hit
    out = _dot_slow(self, other, contract)
    fast.learn_dot(self, other, contract, out)
    return out


def _dot_slow(self: Any, other: Any, contract: str) -> Any:
    check_tensor(other)
    same_ctx(self, other)
    if other.dtype.is_block:  # f32 x block-quantized weight: the qcontract primitive
        qnode, qout = quantized.dot_nodes(self._node, self.axis_tags, other._node,
                                          other.axis_tags, T.check_tag(contract))
        return result(self, qout, qnode, DType.f32)
    out = T.dot_result(self.axis_tags, other.axis_tags, T.check_tag(contract))
    dt = _result_dtype(self.dtype, other.dtype)
    _check_grad(self, other)
    node = contract_nodes(self, self._node, self.axis_tags, other, other._node,
                          other.axis_tags, out, dt)
    return result(self, out, node, dt)


def _check_grad(self: Any, other: Any) -> None:
    if self.dtype is not DType.f32 and (self.requires_grad or other.requires_grad):
        raise UnsupportedGradient(
            f"{self.dtype.value} contractions are forward-only; cast with to('f32')")


_EINSUM_DTYPES = (DType.f32, DType.f16, DType.bf16)


def einsum_many(out_tags: Any, operands: Sequence[Any]) -> Any:
    """N-ary einsum over named axes: contract left to right into ``out_tags``."""
    ops = tensor_list(operands, "einsum operands")
    if not ops:
        raise TagError("einsum_many needs at least one operand")
    first = ops[0]
    same_ctx(first, *ops[1:])
    for x in ops:
        if x.dtype not in _EINSUM_DTYPES:
            raise TagError(f"einsum_many takes f32, f16 or bf16 operands (the branches with "
                           f"einsum), got a {x.dtype.value} tensor {type(x)!r}")
    out = T.einsum_many_validate([x.axis_tags for x in ops], T.normalize_tags(out_tags))
    sizes: dict[str, int] = {}
    for x in ops:
        for t, d in sizes_of(x).items():
            if sizes.setdefault(t, d) != d:
                raise ShapeMismatch(f"tag {t!r} has sizes {sizes[t]} and {d} across operands")
    dt = first.dtype
    for x in ops[1:]:
        dt = _result_dtype(dt, x.dtype)
    if dt is not DType.f32 and any(x.requires_grad for x in ops):
        raise UnsupportedGradient("einsum_many on non-f32 operands is forward-only")
    node, tags_ = first._node, first.axis_tags
    if len(ops) == 1:
        node, tags_ = _presum(first, node, tags_, [t for t in tags_ if t not in out])
        nxt = contract_nodes(first, node, tags_, first, _ones_like_scalar(node), (), out, dt)
        return result(first, out, nxt, dt)
    for k, x in enumerate(ops[1:], start=1):
        later = set(out)
        for y in ops[k + 1:]:
            later.update(y.axis_tags)
        keep = tuple(t for t in T.union(tags_, x.axis_tags) if t in later)
        if k == len(ops) - 1:
            keep = out
        node = contract_nodes(first, node, tags_, x, x._node, x.axis_tags, keep, dt)
        tags_ = keep
    return result(first, out, node, dt)


def _ones_like_scalar(node: Node) -> Node:
    return emit("fill", (), shape=(1,), dtype=node.dtype, value=1)


_KINDS = ("plain", "trans_a", "trans_b")


def _broadcast_batch(x: Any, batch: list[int], nb: int) -> Node:
    """View ``x`` with its leading axes broadcast to ``batch`` (stride 0, no copy)."""
    node = x._node
    r = len(node.shape)
    own = r - 2
    shape = tuple(batch) + node.shape[-2:]
    coeffs = []
    for i in range(nb):
        j = i - nb + own
        row = [0] * r
        if j >= 0 and node.shape[j] == batch[i]:
            row[j] = 1
        coeffs.append(tuple(row))
    coeffs += [tuple(1 if c == r - 2 else 0 for c in range(r)),
               tuple(1 if c == r - 1 else 0 for c in range(r))]
    if shape == node.shape and own == nb:
        return node
    return emit("view", (node,), shape=shape, coeffs=tuple(coeffs), base=(0,) * r)


class Dot(Tensor):
    """Contraction by name (f32, f16, bf16, f64; f32 with an f16/bf16 right operand)."""

    __slots__ = ()

    def dot(self, other: Tensor, contract: str) -> Self:
        """Contract ``contract`` (present in both); result tags batch ++ left free ++
        right free. Operands share a dtype, except an f32 tensor with an f16/bf16
        constant on the right (f32 result) or with a block-quantized weight stored
        [free, contract] (read in its blocks, never dequantized whole)."""
        return _dot(self, other, contract)


class Einsum(Tensor):
    """Two-operand einsum over named axes (f32, f16, bf16)."""

    __slots__ = ()

    def einsum(self, other: Tensor, out_tags: Sequence[str]) -> Self:
        """Two-operand einsum over named axes into ``out_tags``.

        Shared tags kept in the output are batch axes, shared and dropped are
        contracted, private and kept are free, private and dropped are summed.
        """
        check_tensor(other)
        same_ctx(self, other)
        out = T.einsum_validate(self.axis_tags, other.axis_tags, T.normalize_tags(out_tags))
        dt = _result_dtype(self.dtype, other.dtype)
        _check_grad(self, other)
        node = contract_nodes(self, self._node, self.axis_tags, other, other._node,
                              other.axis_tags, out, dt)
        return result(self, out, node, dt)


class Matmul(Tensor):
    """Positional GEMM and fused multiply-add (f32)."""

    __slots__ = ()

    def matmul(self, other: Tensor, kind: str, out_tags: Sequence[str]) -> Self:
        """Positional GEMM: the caller picks ``kind`` and names the result axes.

        Rank-2 operands: ``plain`` is [m,k]·[k,n], ``trans_b`` is [m,k]·[n,k]ᵀ.
        Higher ranks are batched over their leading axes, which broadcast
        (stride 0) like numpy's matmul; ``trans_a`` ([b..,k,m]ᵀ·[b..,k,n]) is
        batched-only. The operands' storage order is the GEMM layout.
        """
        check_tensor(other)
        same_ctx(self, other)
        choice_arg(kind, _KINDS, "matmul kind")
        if self.dtype is not DType.f32 or other.dtype is not DType.f32:
            raise TagError("matmul takes f32 operands; use dot for typed operands")
        ra, rb = self.tag_count, other.tag_count
        if ra < 2 or rb < 2:
            raise TagError(f"matmul needs operands of rank >= 2, got ranks {ra} and {rb}")
        if kind == "trans_a" and ra == 2 and rb == 2:
            raise TagError("rank-2 trans_a matmul does not exist: use dot, whose tag algebra "
                           "reaches the transposed-A GEMM")
        sa, sb = self.shape, other.shape
        ba, bb = sa[:-2], sb[:-2]
        nb = max(len(ba), len(bb))
        batch = []
        for i in range(nb):
            da = ba[i - nb + len(ba)] if i - nb + len(ba) >= 0 else 1
            db = bb[i - nb + len(bb)] if i - nb + len(bb) >= 0 else 1
            if da != db and 1 not in (da, db):
                raise ShapeMismatch(f"matmul batch axis {i}: sizes {da} and {db} do not broadcast")
            batch.append(max(da, db))
        out = T.check_tags(T.normalize_tags(out_tags))
        if len(out) != nb + 2:
            raise TagError(f"matmul result has rank {nb + 2}, out_tags {out} has {len(out)} tags")
        (m, k1) = (sa[-1], sa[-2]) if kind == "trans_a" else (sa[-2], sa[-1])
        (k2, n) = (sb[-1], sb[-2]) if kind == "trans_b" else (sb[-2], sb[-1])
        if k1 != k2:
            raise ShapeMismatch(f"matmul contracts sizes {k1} and {k2}")
        bl = tuple(range(nb))
        M, N, K = nb, nb + 1, nb + 2
        la = (M, K) if kind != "trans_a" else (K, M)
        lb = (N, K) if kind == "trans_b" else (K, N)
        an = _broadcast_batch(self, batch, nb)
        bn = _broadcast_batch(other, batch, nb)
        node = emit("contract", (an, bn), labels=(bl + la, bl + lb, bl + (M, N)),
                    shape=tuple(batch) + (m, n), dtype=DType.f32)
        return result(self, out, node, DType.f32)

    def add_dot(self, a: Tensor, b: Tensor, contract: str) -> Self:
        """``self + a·b`` contracting ``contract`` (torch.addmm): a [rows, contract],
        b [contract, cols], self exactly [rows, cols]; f32, differentiable in all three."""
        check_tensor(a, "a")
        check_tensor(b, "b")
        T.check_tag(contract)
        same_ctx(self, a, b)
        for x in (self, a, b):
            if x.dtype is not DType.f32:
                raise TagError("add_dot takes f32 operands; compose dot and add for other dtypes")
        if a.tag_count != 2 or b.tag_count != 2 or a.axis_tags[1] != contract \
                or b.axis_tags[0] != contract:
            raise TagError(f"add_dot needs a tagged [rows, {contract!r}] and b tagged "
                           f"[{contract!r}, cols]; got {a.axis_tags} and {b.axis_tags}")
        want = (a.axis_tags[0], b.axis_tags[1])
        if self.axis_tags != want:
            raise TagError(f"add_dot: self must be tagged exactly {want}, got {self.axis_tags}")
        return binary(self, _dot(a, b, contract), "add")
