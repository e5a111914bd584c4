"""Stacks of small float32 matrix products in one parallel kernel.

``np.matmul`` on a stack ``[batch, M, K] x [batch, K, N]`` makes one BLAS call
per matrix; for attention-sized matrices (a few hundred rows, head widths of
64) each call is too small for BLAS's own threads, and the stack ran 2x slower
than torch's batched GEMM (issue 13: 64 calls of 256 x 256 x 64). Here the
stack runs in one ``prange`` over contiguous runs of matrices (one run per
thread), each matrix on the register-blocked micro-kernel of
``fucina.kernels.microkernel``.

The micro-kernel reads ``A`` in any layout, but wants ``B`` and ``C`` with
unit stride along ``N``. Per call one of two orientations is chosen, the one
that moves fewer elements: ``C = A B`` as given, or ``C^T = B^T A^T`` written
through the transposed views. A ``B`` operand that is still not unit-stride
along ``N`` is packed per matrix into a thread-local ``[K, N]`` panel, and an
output that is not is computed into a thread-local matrix and copied out.

Indexing is by element offsets from each array's first element, computed from
the arrays' own shapes and strides; :func:`matmul` checks shapes, dtypes and
strides before the kernel runs, so every offset the kernel forms is inside
its array.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from .microkernel import MR6, NR, gemm6
from .threads import THREAD_SAFE

#: Largest M, N or K served by the kernel: beyond it BLAS's cache blocking (packed
#: panels of A and B) wins over per-matrix micro-kernel passes.
MAX_DIM = 512
#: Fewest multiply-adds a stack must hold: below it one parallel launch costs more
#: than the product.
MIN_WORK = 1 << 16


@intrinsic
def _ld(typingctx, arr, off):
    """``arr``'s float32 element at element offset ``off`` from its first element."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32:
        return None
    sig = types.float32(arr, types.int64)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load(builder.gep(data, [args[1]]))

    return sig, codegen


@intrinsic
def _st(typingctx, arr, off, val):
    """Store float32 ``val`` at element offset ``off`` from ``arr``'s first element."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32:
        return None
    sig = types.void(arr, types.int64, types.float32)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        builder.store(args[2], builder.gep(data, [args[1]]))
        return context.get_dummy_value()

    return sig, codegen


_jit = njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _product(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, M, N, K, arows, crows):
    """C = A B for one matrix, every product on the vector micro-kernel.

    ``B`` and ``C`` are unit-stride along N (row strides ``ldb``, ``ldc``) and ``N`` is
    a multiple of 16 (callers pad). Rows past the last whole 6-row tile are copied
    into the zero-padded ``arows`` ([6, K]) and computed into ``crows`` ([6, N]):
    scalar edge loops cost as much as the whole vector part (measured)."""
    m6 = M - M % MR6
    if m6 > 0:
        gemm6(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, m6, N, K, False)
    r = M - m6
    if r > 0:
        arows[:] = 0.0
        for i in range(r):
            for k in range(K):
                arows[i * K + k] = _ld(A, a_off + (m6 + i) * a_rs + k * a_ks)  # type: ignore[call-arg]
        gemm6(arows, 0, K, 1, B, b_off, ldb, crows, 0, N, MR6, N, K, False)
        for i in range(r):
            for n in range(N):
                _st(C, c_off + (m6 + i) * ldc + n, crows[i * N + n])  # type: ignore[call-arg]


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _stack(A, B, C, pack_b, via_scratch, runs):
    """C[i, j] = A[i, j] B[i, j] for every matrix of the stack (4-D arrays: two batch
    axes, any strides; attention's [batch, head] axes need not fold into one).

    ``pack_b``: copy each B[i] into a contiguous [K, Np] panel first, Np = N rounded
    up to 16 with zero columns (required when B's N stride is not 1 or N % 16);
    ``via_scratch``: compute each C[i] into a contiguous [M, Np] matrix and copy it
    out (required when C's N stride is not 1 or N % 16); ``runs``: how many
    contiguous runs of matrices (one per thread; numba.get_num_threads() here would
    keep the kernel out of the cache)."""
    n1, n2, M, K = A.shape
    nb = n1 * n2
    N = B.shape[3]
    Np = (N + NR - 1) // NR * NR
    a_s1, a_s2, a_rs, a_ks = (A.strides[0] // 4, A.strides[1] // 4, A.strides[2] // 4,
                              A.strides[3] // 4)
    b_s1, b_s2, b_ks, b_ns = (B.strides[0] // 4, B.strides[1] // 4, B.strides[2] // 4,
                              B.strides[3] // 4)
    c_s1, c_s2, c_ms, c_ns = (C.strides[0] // 4, C.strides[1] // 4, C.strides[2] // 4,
                              C.strides[3] // 4)
    for r in prange(runs):
        lo = r * nb // runs
        hi = (r + 1) * nb // runs
        panel = np.zeros(K * Np if pack_b else 1, dtype=np.float32)
        out = np.empty(M * Np if via_scratch else 1, dtype=np.float32)
        arows = np.empty(MR6 * K, dtype=np.float32)
        crows = np.empty(MR6 * Np, dtype=np.float32)
        for i in range(lo, hi):
            i1, i2 = divmod(i, n2)
            a_off = i1 * a_s1 + i2 * a_s2
            b0 = i1 * b_s1 + i2 * b_s2
            c0 = i1 * c_s1 + i2 * c_s2
            if pack_b:
                for n in range(N):
                    for k in range(K):
                        panel[k * Np + n] = _ld(B, b0 + k * b_ks + n * b_ns)  # type: ignore[call-arg]
            if via_scratch:
                if pack_b:
                    _product(A, a_off, a_rs, a_ks, panel, 0, Np, out, 0, Np, M, Np, K,
                             arows, crows)
                else:
                    _product(A, a_off, a_rs, a_ks, B, b0, b_ks, out, 0, Np, M, Np, K,
                             arows, crows)
                for m in range(M):
                    for n in range(N):
                        _st(C, c0 + m * c_ms + n * c_ns, out[m * Np + n])  # type: ignore[call-arg]
            elif pack_b:
                _product(A, a_off, a_rs, a_ks, panel, 0, Np, C, c0, c_ms, M, N, K,
                         arows, crows)
            else:
                _product(A, a_off, a_rs, a_ks, B, b0, b_ks, C, c0, c_ms, M, N, K,
                         arows, crows)


def _needs(B: np.ndarray, out: np.ndarray) -> tuple[bool, bool]:
    """(pack B, compute through scratch) for ``out = A @ B`` as oriented."""
    n = B.shape[-1]
    ragged = n % NR != 0
    return ragged or not _unit(B.strides[-1], n), ragged or not _unit(out.strides[-1], n)


def _moved(B: np.ndarray, out: np.ndarray) -> int:
    """Elements copied besides the product for ``out = A @ B`` as oriented."""
    pack_b, via_scratch = _needs(B, out)
    k, n = B.shape[-2:]
    return (k * n if pack_b else 0) + (out.shape[-2] * n if via_scratch else 0)


def _unit(stride: int, size: int) -> bool:
    """Whether an axis of ``size`` elements with this byte stride counts as unit-stride."""
    return stride == 4 or size == 1


def serves(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether :func:`matmul` runs ``out = A @ B`` on the stacked kernel (else BLAS):
    float32 stacks (one or two batch axes, the same in all three) of two or more small
    matrices with enough work in total."""
    if not THREAD_SAFE or not 3 <= A.ndim <= 4 or not A.ndim == B.ndim == out.ndim:
        return False
    if not (A.dtype == B.dtype == out.dtype == np.float32):
        return False
    if not A.shape[:-2] == B.shape[:-2] == out.shape[:-2]:
        return False  # numpy broadcasts batch axes
    m, k = A.shape[-2:]
    n = B.shape[-1]
    nb = math.prod(A.shape[:-2])
    if nb < 2 or min(m, n, k) < 1 or max(m, n, k) > MAX_DIM or nb * m * n * k < MIN_WORK:
        return False
    if not all(s % 4 == 0 for s in A.strides + B.strides + out.strides):
        return False
    # numpy copies overlapping operands first; the kernel would read what it wrote
    return not (np.may_share_memory(out, A) or np.may_share_memory(out, B))


def matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = A @ B`` for stacks ``A [*b, M, K]``, ``B [*b, K, N]``, ``out [*b, M, N]``.

    Same contract as ``np.matmul(A, B, out=out)`` (values agree to float32
    rounding); the stacked kernel serves the stacks :func:`serves` accepts and
    BLAS the rest. Shapes are checked here: the kernel trusts them.
    """
    if not serves(A, B, out):
        return np.matmul(A, B, out=out)
    m, k = A.shape[-2:]
    n = B.shape[-1]
    if B.shape[-2] != k or out.shape[-2:] != (m, n):
        raise ValueError(f"matmul stacks do not match: {A.shape} @ {B.shape} -> {out.shape}")
    if not out.flags.writeable:
        raise ValueError("matmul output is read-only")
    # Pick the orientation that moves fewer elements besides the product.
    res = out
    if A.ndim == 3:
        A, B, out = A[None], B[None], out[None]
    if _moved(A.swapaxes(2, 3), out.swapaxes(2, 3)) < _moved(B, out):
        A, B, out = B.swapaxes(2, 3), A.swapaxes(2, 3), out.swapaxes(2, 3)
    pack_b, via_scratch = _needs(B, out)
    runs = min(A.shape[0] * A.shape[1], numba.get_num_threads())
    _stack(A, B, out, pack_b, via_scratch, runs)
    return res
