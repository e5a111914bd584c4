"""A register-blocked float32 matrix-multiply micro-kernel for Numba kernels.

``gemm(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, M, N, K, accumulate)``
computes ``C[m, n] (+)= sum_k A[m, k] * B[k, n]`` for ``M`` a multiple of 4 and
``N`` a multiple of 16, where (all in float32 elements from each array's
first element)

- ``A[m, k]`` is at ``a_off + m * a_rs + k * a_ks`` (any layout: its elements
  are broadcast, so a transposed ``A`` costs nothing),
- ``B[k, n]`` at ``b_off + k * ldb + n`` (rows contiguous),
- ``C[m, n]`` at ``c_off + m * ldc + n``.

Why not plain Numba loops: LLVM's loop vectorizer only vectorizes innermost
loops, so a matrix product written in Python either vectorizes the dot
product (a horizontal sum per output) or streams the output through memory
(a load and a store per multiply-add); Numba leaves the SLP vectorizer off.
The 4 x 16 tile here keeps eight 8-lane accumulators in registers across the
whole ``k`` loop (two vector loads of ``B`` and four broadcasts of ``A`` feed
eight fused multiply-adds), emitted as LLVM vector IR through an intrinsic.
Measured on a 64^3 product, one thread: ~90 GFLOP/s against ~30 for the best
plain-loop form (AMD EPYC Zen 3, AVX2). Any vector width is legal on every
x86-64 (LLVM splits vectors wider than the target's).

Vector width: where the compile target has AVX-512F
(:func:`fucina.kernels.vecmath.wide_vectors`) the tiles use 16-lane vectors: the
4 x 16 tile becomes four one-register rows, and :func:`gemm6`'s tile grows to
6 x 32 (twelve 16-lane accumulators of the 32 registers). One 256 x 256 x 64
product, one thread, AMD EPYC Zen 5: 6 x 32 on 16 lanes 36.7 us against 64.3 for
6 x 16 on 8 lanes and 71 for OpenBLAS; 4 x 16 on one 16-lane register 61 us
against 77 on two 8-lane ones.

The caller guarantees every index is inside its array: nothing is checked.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .vecmath import wide_vectors

LANES = 16 if wide_vectors() else 8
"""float32 lanes per vector in the tiles: 16 where the target has AVX-512F, else 8."""
MR = 4
"""Rows of ``C`` per tile of :func:`gemm`."""
NR = 16
"""Columns of ``C`` per tile of :func:`gemm` (one or two vectors, by :data:`LANES`)."""
MR6 = 6
"""Rows of ``C`` per tile of :func:`gemm6`: twelve accumulators, two ``B`` vectors and a
broadcast fill the 16 vector registers of AVX2 (measured on one 256 x 256 x 64
product, one thread: 119 us against 169 for 4 x 16, 146 for 4 x 24; 8 x 16 spills)."""
NR6 = 2 * LANES
"""Columns of ``C`` per tile of :func:`gemm6`: two vectors (16 on AVX2, 32 on AVX-512)."""


def _make_tile(mr: int, lanes: int, nv: int):  # type: ignore[no-untyped-def]
    """The ``mr`` x ``lanes * nv`` tile intrinsic (see the module docstring)."""

    @intrinsic
    def tile(typingctx, A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, K, accumulate):
        """One mr x NR tile of C (+)= A B over ``K`` (see the module docstring)."""
        for arr in (A, B, C):
            if not isinstance(arr, types.Array) or arr.dtype != types.float32:
                return None
        sig = types.void(A, types.int64, types.int64, types.int64, B, types.int64,
                         types.int64, C, types.int64, types.int64, types.int64, types.boolean)
        return sig, _codegen(mr, lanes, nv)

    return tile


def _codegen(rows: int, lanes: int, nv: int):  # type: ignore[no-untyped-def]
    """LLVM for a ``rows`` x ``lanes * nv`` tile (the signature is the tile intrinsic's)."""

    def codegen(context, builder, signature, args):
        (a_arr, a_off, a_rs, a_ks, b_arr, b_off, ldb, c_arr, c_off, ldc, k_len,
         acc_flag) = args
        f32 = ir.FloatType()
        vec = ir.VectorType(f32, lanes)
        i32 = ir.IntType(32)
        i64 = ir.IntType(64)
        vptr = vec.as_pointer()
        a_ptr = context.make_array(signature.args[0])(context, builder, a_arr).data
        b_ptr = context.make_array(signature.args[4])(context, builder, b_arr).data
        c_ptr = context.make_array(signature.args[7])(context, builder, c_arr).data
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{lanes}f32")
        zero = ir.Constant(vec, [0.0] * lanes)
        undef = ir.Constant(vec, ir.Undefined)
        splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
        # Accumulators live in allocas that LLVM promotes to registers.
        accs = []
        for _ in range(rows * nv):
            slot = cgutils.alloca_once(builder, vec)
            builder.store(zero, slot)
            accs.append(slot)
        with cgutils.for_range(builder, k_len) as loop:
            k = loop.index
            b_row = builder.add(b_off, builder.mul(k, ldb))
            bv = []
            for c in range(nv):
                p = builder.gep(b_ptr, [builder.add(b_row, ir.Constant(i64, lanes * c))])
                bv.append(builder.load(builder.bitcast(p, vptr), align=4))
            a_col = builder.add(a_off, builder.mul(k, a_ks))
            for r in range(rows):
                p = builder.gep(a_ptr, [builder.add(a_col, builder.mul(ir.Constant(i64, r), a_rs))])
                a = builder.load(p)
                av = builder.shuffle_vector(builder.insert_element(undef, a, ir.Constant(i32, 0)),
                                            undef, splat)
                for c in range(nv):
                    slot = accs[r * nv + c]
                    builder.store(builder.call(fma, [av, bv[c], builder.load(slot)]), slot)
        for r in range(rows):
            c_row = builder.add(c_off, builder.mul(ir.Constant(i64, r), ldc))
            for c in range(nv):
                at = builder.add(c_row, ir.Constant(i64, lanes * c))
                p = builder.bitcast(builder.gep(c_ptr, [at]), vptr)
                total = builder.load(accs[r * nv + c])
                with builder.if_then(acc_flag):
                    builder.store(builder.fadd(builder.load(p, align=4), total), p, align=4)
                with builder.if_then(builder.not_(acc_flag)):
                    builder.store(total, p, align=4)
        return context.get_dummy_value()

    return codegen


_tile = _make_tile(MR, LANES, NR // LANES)
_tile6 = _make_tile(MR6, LANES, 2)


@njit(cache=True, nogil=True)
def gemm4(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, M, N, K, accumulate):
    """C (+)= A B over whole MR x NR tiles (``M % 4 == 0``, ``N % 16 == 0``): the edges
    of :func:`gemm`.

    Column panels outermost: a ``K x 16`` panel of ``B`` stays in L1 while the
    rows of ``A`` stream past it (``A`` is re-read once per panel, ``B`` once).
    """
    for n in range(0, N, NR):
        for m in range(0, M, MR):
            _tile(A, a_off + m * a_rs, a_rs, a_ks, B, b_off + n, ldb,
                  C, c_off + m * ldc + n, ldc, K, accumulate)


@njit(cache=True, nogil=True)
def gemm6(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, M, N, K, accumulate):
    """:func:`gemm4` on 6 x :data:`NR6` tiles (``M % 6 == 0``, ``N % NR6 == 0``).

    Row blocks outermost: each 6-row block of ``A`` is read once and reused from L1
    across the column panels, ``B`` is re-read from cache per block (one thread, a
    256 x 256 x 64 product: 129 us against 155 with panels outermost; 256 x 64 x 256:
    148 against 144), which matters when other processes evict the caches."""
    for m in range(0, M, MR6):
        for n in range(0, N, NR6):
            _tile6(A, a_off + m * a_rs, a_rs, a_ks, B, b_off + n, ldb,
                   C, c_off + m * ldc + n, ldc, K, accumulate)


@njit(cache=True, nogil=True)
def gemm(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, M, N, K, accumulate):
    """C (+)= A B (``M % 4 == 0``, ``N % 16 == 0``; the module docstring has the layout) on
    the widest tiles that fit: :func:`gemm6`'s 6 x NR6 tiles over the largest block they
    cover, :func:`gemm4`'s 4 x 16 tiles over the edges.

    The 4 x 16 tile alone is four accumulators on AVX-512 (one 16-lane vector per row):
    too few to hide the multiply-add latency, so it runs at about half the 6 x 32 tile's
    rate there. Each element of C is the same chain of fused multiply-adds in k order
    whatever tile computes it, so the split changes no bit. An empty part is a no-op.
    """
    n6 = N - N % NR6
    # M is even: M % 6 is 0, 2 or 4, and the 4 x 16 tiles take the last 4 or 8 rows.
    r6 = M % MR6
    m6 = max(0, M - (r6 if r6 != 2 else 8))
    gemm6(A, a_off, a_rs, a_ks, B, b_off, ldb, C, c_off, ldc, m6, n6, K, accumulate)
    gemm4(A, a_off + m6 * a_rs, a_rs, a_ks, B, b_off, ldb, C, c_off + m6 * ldc, ldc,
          M - m6, n6, K, accumulate)
    gemm4(A, a_off, a_rs, a_ks, B, b_off + n6, ldb, C, c_off + n6, ldc, M, N - n6, K,
          accumulate)
