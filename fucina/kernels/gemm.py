"""Contractions lowered to BLAS GEMM with the orientation read from strides.

A contraction arrives as two strided operands whose axes carry integer
labels, and the output's label order. Labels split into batch (both operands
and the output), M (left and output), N (right and output) and K (both
operands, contracted); private labels were summed away before. Each operand
is viewed, without copying, as a stack of matrices ``[batch..., M, K]`` and
``[batch..., K, N]`` by collapsing its M, K and N axis groups; the GEMM then
reads each matrix in whichever orientation its strides give: row-major
(``N``) when its inner group has unit stride, transposed (``T``) when its outer
group does. Only an operand whose groups cannot collapse, or that has no unit
stride in either group, is copied, once. BLAS serves every N/T pairing, so a
transposed weight (``[n, k]`` storage) never costs a copy. Batch axes stay
separate stack axes (numpy's matmul iterates them, stride 0 included) unless
they collapse into one. A float32 stack of small matrices runs in one parallel
kernel (:mod:`fucina.kernels.batched_gemm`) instead of one BLAS call per matrix.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..runtime.lru import LRU
from . import batched_gemm, blas_threads
from .cache import SIZE_SOURCES


@dataclass(frozen=True)
class Side:
    """How one operand is read: its matrix orientation and whether it is copied."""

    orient: str          # "N", "T" or "copy"
    strides: tuple[int, ...]  # element strides of the [batch..., rows, cols] view


@dataclass(frozen=True)
class GemmPlan:
    """Everything decided from shapes and strides alone (trace time or run time)."""

    batch: tuple[int, ...]
    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    msize: int
    nsize: int
    ksize: int
    a: Side
    b: Side
    out_perm: tuple[int, ...] | None  # canonical [batch, M, N] axes -> output order
    # The operands trade places (the right one is read as the GEMM's left): the output's
    # order is [batch, N, M], which C^T = B^T A^T writes directly, with no transpose copy.
    swapped: bool = False

    @property
    def orientation(self) -> str:
        """plain, trans_a, trans_b or trans_ab (after any copy, which reads plain)."""
        ta = self.a.orient == "T"
        tb = self.b.orient == "T"
        return {(False, False): "plain", (True, False): "trans_a",
                (False, True): "trans_b", (True, True): "trans_ab"}[(ta, tb)]

    @property
    def copies(self) -> tuple[str, ...]:
        """Operands materialized before the GEMM ('a', 'b')."""
        return tuple(n for n, s in (("a", self.a), ("b", self.b)) if s.orient == "copy")

    def describe(self) -> str:
        """One line for ``fast.ir()``."""
        batch = "x".join(str(d) for d in self.batch_sizes) or "none"
        copied = ", ".join(self.copies) or "none"
        swapped = " operands=swapped" if self.swapped else ""
        return (f"gemm {self.orientation} M={self.msize} N={self.nsize} K={self.ksize} "
                f"batch={batch} copied={copied}{swapped}")


def _group(shape: tuple[int, ...], strides: tuple[int, ...], labels: tuple[int, ...],
           group: tuple[int, ...]) -> tuple[int, int | None]:
    """(size, stride) of ``group`` collapsed to one axis, stride None when it cannot."""
    dims = [(shape[labels.index(lbl)], strides[labels.index(lbl)]) for lbl in group]
    live = [(d, s) for d, s in dims if d != 1]
    size = math.prod(d for d, _ in dims)
    if not live:
        return size, 0
    for (_, s0), (d1, s1) in zip(live, live[1:]):
        if s0 != d1 * s1:
            return size, None
    return size, live[-1][1]


def _side(shape: tuple[int, ...], strides: tuple[int, ...], labels: tuple[int, ...],
          batch: tuple[int, ...], rows: tuple[int, ...], cols: tuple[int, ...]) -> Side:
    r, rs = _group(shape, strides, labels, rows)
    c, cs = _group(shape, strides, labels, cols)
    bstr = tuple(strides[labels.index(lbl)] for lbl in batch)
    if rs is not None and cs is not None:
        # A size-1 group's stride is free: pick the one that keeps BLAS happy.
        if c == 1:
            cs = 1
        if r == 1:
            rs = max(c, 1) if cs == 1 else 1
        if cs == 1 and rs >= max(c, 1):
            return Side("N", bstr + (rs, cs))
        if rs == 1 and cs >= max(r, 1):
            return Side("T", bstr + (rs, cs))
        if r == 1 and c == 1:
            return Side("N", bstr + (1, 1))
    return Side("copy", bstr + (c, 1))


#: Most GEMM signatures (shapes, strides, labels) a process keeps plans for: eager
#: ``dot`` plans at run time, and re-planning costs more than a tiny GEMM itself.
GEMM_PLAN_CACHE_SIZE = 1024
PLANS = LRU(GEMM_PLAN_CACHE_SIZE)
SIZE_SOURCES["gemm_plan_cache"] = lambda: (len(PLANS), PLANS.maxsize)


def plan(a_shape: tuple[int, ...], a_strides: tuple[int, ...], la: tuple[int, ...],
         b_shape: tuple[int, ...], b_strides: tuple[int, ...], lb: tuple[int, ...],
         lo: tuple[int, ...]) -> GemmPlan:
    """Decide the GEMM for operands with these shapes/strides (in elements) and labels.

    Plans are pure functions of their arguments, so they are cached per signature.
    An output ordered [batch, N, M] swaps the operands (``swapped``): the GEMM then
    writes the output in its own order instead of a transposed result being copied.
    """
    key = (a_shape, a_strides, la, b_shape, b_strides, lb, lo)
    p = PLANS.get(key)
    if p is None:
        p = _plan(*key)
        if p.out_perm is not None:
            q = _plan(b_shape, b_strides, lb, a_shape, a_strides, la, lo)
            if q.out_perm is None and len(q.copies) <= len(p.copies):
                p = dataclasses.replace(q, swapped=True)
        PLANS.put(key, p)
    return p


def _plan(a_shape: tuple[int, ...], a_strides: tuple[int, ...], la: tuple[int, ...],
          b_shape: tuple[int, ...], b_strides: tuple[int, ...], lb: tuple[int, ...],
          lo: tuple[int, ...]) -> GemmPlan:
    batch = tuple(x for x in lo if x in la and x in lb)
    m = tuple(x for x in lo if x in la and x not in lb)
    n = tuple(x for x in lo if x in lb and x not in la)
    k = tuple(x for x in la if x in lb and x not in lo)
    sizes = dict(zip(la, a_shape)) | dict(zip(lb, b_shape))
    a_side = _side(a_shape, a_strides, la, batch, m, k)
    b_side = _side(b_shape, b_strides, lb, batch, k, n)
    canon = batch + m + n
    perm = tuple(canon.index(x) for x in lo)
    bsizes = tuple(sizes[x] for x in batch)
    if len(batch) > 1:
        # Batch axes fold into one batched-GEMM axis when both operands lay them out
        # as one (a copied operand is contiguous, so it always can).
        def folds(side: Side) -> bool:
            if side.orient == "copy":
                return True
            st = side.strides[:len(batch)]
            live = [(d, t) for d, t in zip(bsizes, st) if d != 1]
            return all(t0 == d1 * t1 for (_, t0), (d1, t1) in zip(live, live[1:]))

        if folds(a_side) and folds(b_side):
            def fold(side: Side) -> Side:
                st = side.strides[:len(batch)]
                live = [t for d, t in zip(bsizes, st) if d != 1]
                return Side(side.orient, ((live[-1] if live else 0),) + side.strides[len(batch):])

            a_side, b_side = fold(a_side), fold(b_side)
            bsizes = (math.prod(bsizes),)
    return GemmPlan(batch, m, n, k, bsizes,
                    math.prod(sizes[x] for x in m), math.prod(sizes[x] for x in n),
                    math.prod(sizes[x] for x in k), a_side, b_side,
                    None if perm == tuple(range(len(perm))) else perm)


def matrix_view(x: np.ndarray, labels: tuple[int, ...], batch: tuple[int, ...],
                 rows: tuple[int, ...], cols: tuple[int, ...], side: Side,
                 bsizes: tuple[int, ...], nrows: int, ncols: int) -> np.ndarray:
    shape = bsizes + (nrows, ncols)
    if side.orient == "copy":
        order = [labels.index(lbl) for lbl in batch + rows + cols]
        return np.ascontiguousarray(x.transpose(order)).reshape(shape)
    item = x.itemsize
    if x.flags.c_contiguous and side.orient == "N" and _contiguous(shape, side.strides):
        return x.reshape(shape)  # a plain view: as_strided costs microseconds per call
    return np.lib.stride_tricks.as_strided(x, shape, tuple(s * item for s in side.strides),
                                           writeable=False)


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether element ``strides`` are the C-contiguous strides of ``shape`` (size-1 axes
    may carry any stride)."""
    want = 1
    for d, st in zip(reversed(shape), reversed(strides)):
        if d != 1 and st != want:
            return False
        want *= d
    return True


def contract(a: np.ndarray, b: np.ndarray, la: tuple[int, ...], lb: tuple[int, ...],
             lo: tuple[int, ...], acc: np.dtype, out: np.ndarray | None = None,
             decided: GemmPlan | None = None) -> np.ndarray:
    """Contract labelled operands into ``lo`` order, accumulating in ``acc``.

    ``out``, when given, is a flat contiguous buffer of the result's size and
    dtype ``acc``; the GEMM writes into it directly when no output permutation
    is needed. ``decided`` is a plan made earlier (at trace time) for these layouts.
    """
    a = np.asarray(a, dtype=acc)
    b = np.asarray(b, dtype=acc)
    if not la:
        a = a.reshape(())
    if not lb:
        b = b.reshape(())
    item = a.itemsize
    p = decided or plan(a.shape, tuple(s // item for s in a.strides), la,
                        b.shape, tuple(s // b.itemsize for s in b.strides), lb, lo)
    if p.swapped:
        a, b, la, lb = b, a, lb, la
    A = matrix_view(a, la, p.batch, p.m, p.k, p.a, p.batch_sizes, p.msize, p.ksize)
    B = matrix_view(b, lb, p.batch, p.k, p.n, p.b, p.batch_sizes, p.ksize, p.nsize)
    sizes = dict(zip(la, a.shape)) | dict(zip(lb, b.shape))
    canon = p.batch + p.m + p.n
    shape = p.batch_sizes + (p.msize, p.nsize)
    if out is not None and p.out_perm is None and out.dtype == acc:
        batched_gemm.matmul(A, B, out.reshape(shape))
        return out.reshape(tuple(sizes[x] for x in canon) or (1,))
    if A.dtype == np.float32 and batched_gemm.routes_here(shape, p.ksize, A.dtype):
        C = batched_gemm.matmul(A, B, np.empty(shape, A.dtype))  # maybe fucina's kernels
    else:
        C = blas_threads.matmul(A, B)
    C = C.reshape(tuple(sizes[x] for x in canon) or ())
    if p.out_perm is not None:
        C = C.transpose(p.out_perm)
    return C
