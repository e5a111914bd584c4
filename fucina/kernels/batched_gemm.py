"""Stacks of small float32 matrix products in one parallel kernel.

``np.matmul`` on a stack ``[batch, M, K] x [batch, K, N]`` makes one BLAS call
per matrix; for attention-sized matrices (a few hundred rows, head widths of
64) each call is too small for BLAS's own threads, and the stack ran 2x slower
than torch's batched GEMM (issue 13: 64 calls of 256 x 256 x 64). Here the
stack runs in one ``prange`` over contiguous runs of matrices (one run per
thread), each matrix on the register-blocked micro-kernel of
``fucina.kernels.microkernel``.

One large float32 matrix product runs here too, where the micro-kernel has
16-lane tiles (AVX-512) and OpenBLAS is pinned to its AVX2 kernels
(``OPENBLAS_CORETYPE=Haswell`` is set in these machines' environment): blocks
of C shared out over the threads, K in chunks (:func:`_plane`), at up to twice
the pinned OpenBLAS's speed (1024 x 384 x 1536 on two threads, AMD EPYC Zen 5:
2.7 ms against 4.7-5.0).

The micro-kernel reads ``A`` in any layout, but wants ``B`` and ``C`` with
unit stride along ``N``. Per call one of two orientations is chosen, the one
that moves fewer elements: ``C = A B`` as given, or ``C^T = B^T A^T`` written
through the transposed views. A ``B`` operand that is still not unit-stride
along ``N`` is packed per matrix into a thread-local panel of contiguous
``[K, NR6]`` strips (a transposed ``B``, such as attention's keys, in blocks
transposed in registers: :mod:`fucina.kernels.transpose`), and an output that
is not is computed into a thread-local matrix and copied out.

The kernel sees every array as a flat, contiguous, aligned float32 span of the
memory it reaches (read-only for ``A`` and ``B``), with its offset and strides
passed as integers: one compiled signature serves every layout, rank and
read-only flag (it compiled once per combination before, seconds each).
Indexing is by element offsets into those spans; :func:`matmul` checks shapes,
dtypes and strides, and that every offset the kernel forms lies inside its
span, before the kernel runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numba
import numpy as np
from numba import njit, prange, types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic

from . import blas_threads
from .microkernel import LANES, MR6, NR6, gemm6
from .pool import lend_cores
from .threads import THREAD_SAFE
from .transpose import tblock

#: Largest M, N or K served by the kernel: beyond it BLAS's cache blocking (packed
#: panels of A and B) wins over per-matrix micro-kernel passes.
MAX_DIM = 512
#: Fewest multiply-adds a stack must hold: below it one parallel launch costs more
#: than the product.
MIN_WORK = 1 << 16
#: Columns per block when packing ``B`` or copying out ``C`` through strided memory.
PACK = 16
#: Blocks of one large product (:func:`_plane`): rows and columns of C per task, and
#: the K chunk. Chosen on the first version (B read in place, not packed in strips):
#: 1024 x 384 x 1536 on two threads, AMD EPYC Zen 5, 96 x 128 x 256 within 3% of the
#: best of 48-144 rows, 128-256 columns, 256-512 deep; not re-tuned since.
PLANE_M, PLANE_N, PLANE_K = 96, 128, 256
#: Fewest multiply-adds, and fewest rows and columns, of a product :func:`_plane` serves:
#: its two parallel launches cost ~40 us (Zen 5: 256^3 took 126 us against OpenBLAS's
#: 151, 128^3 46 us against 23).
PLANE_MIN_WORK, PLANE_MIN_SIDE = 1 << 24, 32


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
def _product(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, M, N, K, arows, crows,
             accumulate):
    """C (+)= A B for one matrix, every product on the vector micro-kernel.

    ``B`` and ``C`` are unit-stride along N (row strides ``ldb``, ``ldc``) and ``N`` is
    a multiple of :data:`NR6` (callers pad). Rows past the last whole 6-row tile are copied
    into the zero-padded ``arows`` ([6, K]) and computed into ``crows`` ([6, N]):
    scalar edge loops cost as much as the whole vector part (measured). With
    ``accumulate`` those rows are added as the tile adds: stored value + new sum."""
    m6 = M - M % MR6
    if m6 > 0:
        gemm6(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, m6, N, K, accumulate)
    r = M - m6
    if r > 0:
        arows[:] = 0.0
        for i in range(r):
            for k in range(K):
                arows[i * K + k] = _ld(A, a_off + (m6 + i) * a_rs + k * a_ks)  # type: ignore[call-arg]
        gemm6(arows, 0, K, 1, B, b_off, ldb, crows, 0, N, MR6, N, K, False)
        for i in range(r):
            for n in range(N):
                w = c_off + (m6 + i) * ldc + n
                v = crows[i * N + n]
                if accumulate:
                    v = _ld(C, w) + v  # type: ignore[call-arg]
                _st(C, w, v)  # type: ignore[call-arg]


@_jit
def _store(C, c0, c_ms, c_ns, src, ld, M, N):
    """``C[m, n] = src[m * ld + n]`` for an M x N block at ``c0`` of the span ``C`` (row
    stride ``c_ms``, column stride ``c_ns``), PACK columns at a time like the packing
    of B: a whole row at a time through a strided C thrashed L1's sets."""
    for n0 in range(0, N, PACK):
        for m in range(M):
            for n in range(n0, min(n0 + PACK, N)):
                _st(C, c0 + m * c_ms + n * c_ns, src[m * ld + n])  # type: ignore[call-arg]


@_jit
def _pack(B, b0, b_ks, b_ns, K, N, panel, s_lo, s_hi):
    """Copy ``B[k, n]`` (B at ``b0`` of its span, strides ``b_ks``, ``b_ns``) for every
    ``k < K`` and the columns ``n < N`` of strips ``s_lo <= s < s_hi`` into ``panel``,
    where each strip of NR6 columns is a contiguous ``[K, NR6]`` block:
    ``panel[(n // NR6) * K * NR6 + k * NR6 + n % NR6]``. Columns past N are left as
    they are (zero in a fresh panel).

    A ``B`` that is unit-stride along K (a transposed matrix: attention's keys, a
    weight ``[out, in]``) moves in ``LANES x LANES`` blocks transposed in registers
    (:func:`fucina.kernels.transpose.tblock`), one unit-stride along N a strip row at
    a time, any other element by element in blocks of PACK columns (a whole column at
    a time, at a power-of-two stride, thrashed L1's sets: half the scores product's
    time on Zen 5)."""
    ks = K * NR6
    lo, hi = s_lo * NR6, min(s_hi * NR6, N)
    if b_ns == 1:
        for n0 in range(lo, hi, NR6):
            base = n0 // NR6 * ks
            w = min(NR6, hi - n0)
            for k in range(K):
                for c in range(w):
                    panel[base + k * NR6 + c] = _ld(B, b0 + k * b_ks + n0 + c)  # type: ignore[call-arg]
        return
    k_full = K - K % LANES if b_ks == 1 else 0
    n_full = hi - (hi - lo) % LANES if b_ks == 1 else lo
    for n0 in range(lo, n_full, LANES):
        for k0 in range(0, k_full, LANES):
            tblock(B, b0 + n0 * b_ns + k0, b_ns,
                   panel, n0 // NR6 * ks + k0 * NR6 + n0 % NR6, NR6)
    for n0 in range(lo, hi, PACK):  # the ragged edges, and every other layout
        for k in range(K):
            if k < k_full and n0 + PACK <= n_full:
                continue
            for n in range(n0, min(n0 + PACK, hi)):
                if k < k_full and n < n_full:
                    continue
                panel[n // NR6 * ks + k * NR6 + n % NR6] = _ld(B, b0 + k * b_ks + n * b_ns)  # type: ignore[call-arg]


@intrinsic
def _frozen(typingctx, arr):
    """``arr`` typed read-only: the thread-local panel then passes to :func:`_product`
    as the same type as the caller's ``B`` (one compiled ``_product``)."""
    if not isinstance(arr, types.Array) or not arr.mutable:
        return None
    sig = arr.copy(readonly=True)(arr)

    def codegen(context, builder, signature, args):
        # same data model, only the type's flag differs; the result is a new reference
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    return sig, codegen


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _stack(A, B, C, geo, pack_b, via_scratch, runs):
    """C[i, j] = A[i, j] B[i, j] for every matrix of the stack (two batch axes, any
    strides; attention's [batch, head] axes need not fold into one).

    ``A``, ``B`` (read-only) and ``C`` are flat float32 spans of their buffers, so the
    kernel has one type signature whatever the callers' layouts (it compiled once per
    layout, rank and read-only flag before: 41 variants of ``_product`` in one test
    run). ``geo`` holds the stack's geometry in elements: sizes ``n1, n2, M, K, N``,
    then per array its offset in its span and its four strides (see :func:`_geometry`).

    ``pack_b``: copy each B[i] into a panel of Np / NR6 contiguous [K, NR6] strips
    first (:func:`_pack`), Np = N rounded up to NR6 (16, or 32 with AVX-512) with zero
    columns (required when B's N stride is not 1 or N % NR6), and multiply strip by
    strip (48 score matrices of 128 x 64 x 128 from transposed keys, Intel Xeon
    AVX-512, one process, old against new: 1.5-1.7x on two threads, 1.25x on one);
    ``via_scratch``: compute each C[i] into a contiguous [M, Np] matrix and copy it
    out (required when C's N stride is not 1 or N % NR6); ``runs``: how many
    contiguous runs of matrices (one per thread; numba.get_num_threads() here would
    keep the kernel out of the cache)."""
    (n1, n2, M, K, N, a0, a_s1, a_s2, a_rs, a_ks, b00, b_s1, b_s2, b_ks, b_ns,
     c00, c_s1, c_s2, c_ms, c_ns) = geo
    nb = n1 * n2
    Np = (N + NR6 - 1) // NR6 * NR6
    strips = Np // NR6
    zero = nb - nb  # an int64 zero, not a literal
    nr6 = zero + NR6
    fresh = zero != zero  # a bool False, not a literal
    for r in prange(runs):
        lo = r * nb // runs
        hi = (r + 1) * nb // runs
        panel = np.zeros(K * Np if pack_b else 1, dtype=np.float32)
        out = np.empty(M * Np if via_scratch else 1, dtype=np.float32)
        arows = np.empty(MR6 * K, dtype=np.float32)
        crows = np.empty(MR6 * Np, dtype=np.float32)
        for i in range(lo, hi):
            i1, i2 = divmod(i, n2)
            a_off = a0 + i1 * a_s1 + i2 * a_s2
            b0 = b00 + i1 * b_s1 + i2 * b_s2
            c0 = c00 + i1 * c_s1 + i2 * c_s2
            if pack_b:
                _pack(B, b0, b_ks, b_ns, K, N, panel, zero, strips)
            dst, to, ldc = (out, zero, Np) if via_scratch else (C, c0, c_ms)
            # int64 and bool variables, never literals: a literal 0 or NR6 in a call
            # compiled _product once per combination of literal and int64 arguments.
            if pack_b:
                # Strip by strip: the strip stays in L1 while A's row tiles pass.
                for s in range(strips):
                    _product(A, a_off, a_rs, a_ks, _frozen(panel), s * K * nr6,  # type: ignore[call-arg]
                             nr6, dst, to + s * nr6, ldc, M, nr6, K, arows, crows, fresh)
            else:
                _product(A, a_off, a_rs, a_ks, B, b0, b_ks, dst, to, ldc, M,
                         Np if via_scratch else N, K, arows, crows, fresh)
            if via_scratch:
                _store(C, c0, c_ms, c_ns, out, Np, M, N)


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _plane(A, B, C, geo, via_scratch, runs):
    """C = A B for one large matrix product (the geometry of :func:`_stack` with one
    matrix), cache-blocked over the micro-kernel.

    B is first packed (in parallel) into strips of NR6 columns, each a contiguous
    ``[K, NR6]`` block (zero columns past N): the tile then streams its B rows from
    one run of memory. Read in place, rows 4 KiB apart (N = 1024) alias in L1 and
    the product ran at two thirds of the speed (256 x 1024 x 1024, Zen 5: 2.3 ms against 1.5).
    Then PLANE_M x PLANE_N blocks of C are shared out over ``runs`` threads, each
    summed over K in chunks of PLANE_K, strip by strip (a strip's chunk stays in L1
    while the block's rows pass).

    Whole strips are written straight into C, and only the last strip of a ragged N
    (N % NR6 columns) goes through a ``[PLANE_M, NR6]`` scratch block; with
    ``via_scratch`` (C not unit-stride along N) every block does. (With every block of a
    ragged N through scratch, 300 x 270 x 260 and 1024 x 1000 x 500 ran 1.14-1.17x and
    1.08-1.10x slower, one and two threads, Zen 5.)

    Every element of C is the same chain of fused multiply-adds in k order within a
    chunk, chunks added in order, whatever the orientation, blocking or thread count:
    eager and compiled products agree bit for bit."""
    (n1, n2, M, K, N, a0, a_s1, a_s2, a_rs, a_ks, b0, b_s1, b_s2, b_ks, b_ns,
     c0, c_s1, c_s2, c_ms, c_ns) = geo
    Np = (N + NR6 - 1) // NR6 * NR6
    strips = Np // NR6
    Bp = np.empty(K * Np, dtype=np.float32)
    for r in prange(runs):
        _pack(B, b0, b_ks, b_ns, K, N, Bp, r * strips // runs, (r + 1) * strips // runs)
    last = (strips - 1) * K * NR6
    for k in range(K):  # the last strip's columns past N
        for c in range(NR6 - (Np - N), NR6):
            Bp[last + k * NR6 + c] = np.float32(0.0)
    src: Any = _frozen(Bp)  # type: ignore[call-arg]  # (mypy types intrinsic calls NoReturn)
    nm = (M + PLANE_M - 1) // PLANE_M
    nn = (Np + PLANE_N - 1) // PLANE_N
    tasks = nm * nn
    zero = tasks - tasks  # an int64 zero, not a literal
    nr6 = zero + NR6  # as in _stack: one signature of _product for both kernels
    for r in prange(runs):
        out = np.empty(PLANE_M * (PLANE_N if via_scratch else NR6), dtype=np.float32)
        arows = np.empty(MR6 * PLANE_K, dtype=np.float32)
        crows = np.empty(MR6 * NR6, dtype=np.float32)
        for t in range(r * tasks // runs, (r + 1) * tasks // runs):
            i, j = divmod(t, nn)
            m0 = i * PLANE_M
            n0 = j * PLANE_N
            rows = min(PLANE_M, M - m0)
            cols = min(PLANE_N, Np - n0)  # a multiple of NR6
            direct = c0 + m0 * c_ms + n0 * c_ns
            for k0 in range(0, K, PLANE_K):
                kk = min(PLANE_K, K - k0)
                a_off = a0 + m0 * a_rs + k0 * a_ks
                for q in range(0, cols, NR6):  # strip (n0 + q) / NR6 from its row k0
                    if via_scratch:
                        dst, d0, ldd = out, q, cols
                    elif n0 + q + NR6 > N:  # the ragged last strip
                        dst, d0, ldd = out, zero, nr6
                    else:
                        dst, d0, ldd = C, direct + q, c_ms
                    _product(A, a_off, a_rs, a_ks, src, (n0 + q) * K + k0 * nr6, nr6, dst,
                             d0, ldd, rows, nr6, kk, arows, crows, k0 > 0)
            if via_scratch:
                _store(C, direct, c_ms, c_ns, out, cols, rows, min(cols, N - n0))
            elif n0 + cols > N:
                q = cols - NR6
                _store(C, direct + q, c_ms, c_ns, out, NR6, rows, N - n0 - q)


def _span(x: np.ndarray, writable: bool) -> tuple[np.ndarray, int]:
    """(flat float32 span of the memory ``x`` can reach, element offset of ``x``'s first
    element in it): a view, never a copy. The span is 1-D, contiguous, aligned and
    read-only unless ``writable``, the one array type the kernel is compiled for."""
    lo = hi = 0
    for n, st in zip(x.shape, x.strides):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    start = x.__array_interface__["data"][0] + lo
    nbytes = hi - lo + x.itemsize
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.flags.c_contiguous or root.flags.f_contiguous:
        at = start - root.__array_interface__["data"][0]
        if at < 0 or at + nbytes > root.nbytes:
            raise ValueError("matmul operand reaches outside its buffer")
        raw = root.ravel(order="K")  # a view: root is contiguous
        if raw.dtype == np.float32 and at % 4 == 0:
            flat = raw[at // 4:(at + nbytes) // 4]
        else:
            flat = raw.view(np.uint8)[at:at + nbytes].view(np.float32)
    else:  # an ndarray over some other buffer, itself strided: x's own extent
        corner = x[tuple(slice(n - 1, n) if st < 0 else slice(0, 1)
                         for n, st in zip(x.shape, x.strides))]
        flat = np.lib.stride_tricks.as_strided(corner.reshape(-1), (nbytes // 4,), (4,))
    if not writable:  # flat is a new view object in every branch: its flag is ours
        flat.flags.writeable = False
    return flat, -lo // 4


def _needs(B: np.ndarray, out: np.ndarray) -> tuple[bool, bool]:
    """(pack B, compute through scratch) for ``out = A @ B`` as oriented."""
    n = B.shape[-1]
    ragged = n % NR6 != 0
    return ragged or not _unit(B.strides[-1], n), ragged or not _unit(out.strides[-1], n)


def _moved(B: np.ndarray, out: np.ndarray) -> int:
    """Elements copied besides the product for ``out = A @ B`` as oriented."""
    pack_b, via_scratch = _needs(B, out)
    k, n = B.shape[-2:]
    return (k * n if pack_b else 0) + (out.shape[-2] * n if via_scratch else 0)


def _moved_plane(B: np.ndarray, out: np.ndarray) -> int:
    """:func:`_moved` for the blocked kernel (:func:`_plane`), which computes a ragged N
    in place but for its last strip: only a B not unit-stride along N (packed through
    transposed blocks) and a C not unit-stride along N (every block through scratch)
    count. (Counted as for the stack, a ragged N chose the swapped form of the MLP's
    weight gradient, 512 x 784 x 256 from a transposed A: 1.17x slower, one thread, Zen 5.)"""
    k, n = B.shape[-2:]
    return ((0 if _unit(B.strides[-1], n) else k * n)
            + (0 if _unit(out.strides[-1], n) else out.shape[-2] * n))


def _unit(stride: int, size: int) -> bool:
    """Whether an axis of ``size`` elements with this byte stride counts as unit-stride."""
    return stride == 4 or size == 1


#: OpenBLAS cores with AVX-512 kernels (names as ``OPENBLAS_CORETYPE`` takes them).
WIDE_BLAS_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def blas_pinned_narrow(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``OPENBLAS_CORETYPE`` pins OpenBLAS to a core without AVX-512 kernels
    (these machines set ``Haswell``). Unset, OpenBLAS picks its own, its AVX-512
    kernels on AVX-512 CPUs it knows, and those match or beat :func:`_plane` (two
    threads, Zen 5: 1024^3 4.4-4.6 ms against 4.9; the MLP step's 256-row products
    0.9-1.3 ms against 1.1-1.8)."""
    core = environ.get("OPENBLAS_CORETYPE")
    return core is not None and core.strip().lower() not in WIDE_BLAS_CORES


#: Read once, as OpenBLAS reads the variable once, when numpy loads it.
BLAS_PINNED_NARROW = blas_pinned_narrow()


def plane_sized(m: int, n: int, k: int, dtype: np.dtype | type) -> bool:
    """Whether one ``[m, k] x [k, n]`` product of ``dtype`` goes to the blocked kernel
    (:func:`_plane`): only where it pays, with 16-lane tiles (AVX-512; with 8 lanes
    the tile only matches OpenBLAS's AVX2 kernels) while OpenBLAS is pinned to AVX2
    kernels (:data:`BLAS_PINNED_NARROW`); float32, at least PLANE_MIN_SIDE rows and
    columns and PLANE_MIN_WORK multiply-adds."""
    return (THREAD_SAFE and LANES == 16 and BLAS_PINNED_NARROW
            and np.dtype(dtype) == np.float32 and k >= 1
            and min(m, n) >= PLANE_MIN_SIDE and m * n * k >= PLANE_MIN_WORK)


def routes_here(out_shape: tuple[int, ...], k: int, dtype: np.dtype | type) -> bool:
    """Whether a planned product with this result matrix-stack shape and depth ``k``
    is handed to :func:`matmul` (else straight to numpy's BLAS): every stack, and the
    matrix products :func:`plane_sized` takes. Eager ``dot``, its fast path and
    compiled programs all decide here, so they run the same kernel."""
    return len(out_shape) in (3, 4) or (
        len(out_shape) == 2 and plane_sized(out_shape[0], out_shape[1], k, dtype))


def serves(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether :func:`matmul` runs ``out = A @ B`` on its own kernels (else BLAS):
    float32 stacks (one or two batch axes, the same in all three) of two or more small
    matrices with enough work in total, or one large float32 matrix product that
    :func:`plane_sized` accepts."""
    if not THREAD_SAFE or not 2 <= A.ndim <= 4 or not A.ndim == B.ndim == out.ndim:
        return False
    if not (A.dtype == B.dtype == out.dtype == np.float32):
        return False
    if not A.shape[:-2] == B.shape[:-2] == out.shape[:-2]:
        return False  # numpy broadcasts batch axes
    m, k = A.shape[-2:]
    n = B.shape[-1]
    nb = math.prod(A.shape[:-2])
    if A.ndim == 2:
        if not plane_sized(m, n, k, A.dtype):
            return False
    elif nb < 2 or min(m, n, k) < 1 or max(m, n, k) > MAX_DIM or nb * m * n * k < MIN_WORK:
        return False
    if not all(s % 4 == 0 for s in A.strides + B.strides + out.strides):
        return False
    if not (A.flags.aligned and B.flags.aligned and out.flags.aligned):
        return False  # the kernel's spans are aligned float32 arrays
    # numpy copies overlapping operands first; the kernel would read what it wrote
    return not (np.may_share_memory(out, A) or np.may_share_memory(out, B))


def matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = A @ B`` for matrices or stacks ``A [*b, M, K]``, ``B [*b, K, N]``,
    ``out [*b, M, N]``.

    Same contract as ``np.matmul(A, B, out=out)`` (values agree to float32
    rounding); the stacked kernel serves the stacks :func:`serves` accepts, the
    blocked kernel the large matrix products, and BLAS the rest. Shapes are checked
    here: the kernels trust them.
    """
    if not serves(A, B, out):
        return blas_threads.matmul(A, B, out)
    return _run(A, B, out)


def _run(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`matmul` on fucina's kernels for operands :func:`serves` would accept
    (whatever their size and the host: the tests call it directly): the blocked
    kernel for one matrix product, the stacked kernel for a stack."""
    m, k = A.shape[-2:]
    n = B.shape[-1]
    if B.shape[-2] != k or out.shape[-2:] != (m, n):
        raise ValueError(f"matmul stacks do not match: {A.shape} @ {B.shape} -> {out.shape}")
    if not out.flags.writeable:
        raise ValueError("matmul output is read-only")
    # Pick the orientation that moves fewer elements besides the product.
    res = out
    plane = A.ndim == 2
    while A.ndim < 4:
        A, B, out = A[None], B[None], out[None]
    # (The blocked kernel packs B whatever the orientation; counting that too chose
    # the swapped form for a plain A B, whose transposed A reads 4 KiB apart: 256 x
    # 1024 x 1024 ran 2.3 ms against 1.5.)
    moved = _moved_plane if plane else _moved
    if moved(A.swapaxes(2, 3), out.swapaxes(2, 3)) < moved(B, out):
        A, B, out = B.swapaxes(2, 3), A.swapaxes(2, 3), out.swapaxes(2, 3)
    threads = numba.get_num_threads()
    (a, a0), (b, b0), (c, c0) = _span(A, False), _span(B, False), _span(out, True)
    geo = (*A.shape, B.shape[3], a0, *_elems(A), b0, *_elems(B), c0, *_elems(out))
    _check_reach(geo, a.size, b.size, c.size)
    lend_cores()  # both kernels run on Numba's threads
    if plane:  # always packs B; scratch only for a strided C (a ragged N: its last strip)
        _plane(a, b, c, geo, not _unit(out.strides[-1], out.shape[-1]), threads)
    else:
        pack_b, via_scratch = _needs(B, out)
        _stack(a, b, c, geo, pack_b, via_scratch, min(A.shape[0] * A.shape[1], threads))
    return res


def _elems(x: np.ndarray) -> tuple[int, ...]:
    """``x``'s strides in float32 elements."""
    return tuple(st // 4 for st in x.strides)


def _check_reach(geo: tuple[int, ...], a_len: int, b_len: int, c_len: int) -> None:
    """Raise unless every element offset :func:`_stack` forms from ``geo`` lies inside
    its span (the kernel indexes unchecked)."""
    n1, n2, m, k, n = geo[:5]
    for name, at, size, rows, cols in (("A", 5, a_len, m, k), ("B", 10, b_len, k, n),
                                       ("C", 15, c_len, m, n)):
        off, s1, s2, sr, sc = geo[at:at + 5]
        lo = hi = off
        for d, st in ((n1, s1), (n2, s2), (rows, sr), (cols, sc)):
            if st < 0:
                lo += (d - 1) * st
            else:
                hi += (d - 1) * st
        if lo < 0 or hi >= size:
            raise ValueError(f"matmul operand {name} reaches outside its span")
