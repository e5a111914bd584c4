"""The GEMM micro-kernel's tiles at both vector widths (8 and 16 lanes), whatever the
host picks: LLVM splits the wider vectors on AVX2, so both variants run everywhere."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from fucina.kernels import microkernel as mk


def _driver(rows: int, lanes: int, nv: int):  # type: ignore[no-untyped-def]
    tile = mk._make_tile(rows, lanes, nv)
    cols = lanes * nv

    @njit
    def run(A, a_rs, a_ks, B, ldb, C, ldc, M, N, K, accumulate):  # pragma: no cover
        for m in range(0, M, rows):
            for n in range(0, N, cols):
                tile(A, m * a_rs, a_rs, a_ks, B, n, ldb, C, m * ldc + n, ldc, K, accumulate)

    return run


@pytest.mark.parametrize("rows,lanes,nv", [(4, 8, 2), (4, 16, 1), (6, 8, 2), (6, 16, 2)])
@pytest.mark.parametrize("a_transposed", [False, True])
def test_tiles_at_both_widths_match_numpy(rows, lanes, nv, a_transposed):
    rng = np.random.default_rng(rows * 100 + lanes)
    M, N, K = rows * 3, lanes * nv * 2, 37
    a = rng.standard_normal((M, K)).astype(np.float32)
    store = np.ascontiguousarray(a.T) if a_transposed else a
    a_rs, a_ks = (1, M) if a_transposed else (K, 1)
    b = rng.standard_normal((K, N + 3)).astype(np.float32)  # ldb > N
    c0 = rng.standard_normal((M, N + 5)).astype(np.float32)  # ldc > N
    run = _driver(rows, lanes, nv)
    want = a.astype(np.float64) @ b[:, :N].astype(np.float64)
    c = c0.copy()
    run(store.ravel(), a_rs, a_ks, b.ravel(), N + 3, c.ravel(), N + 5, M, N, K, False)
    np.testing.assert_allclose(c[:, :N], want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(c[:, N:], c0[:, N:])  # nothing written past N
    run(store.ravel(), a_rs, a_ks, b.ravel(), N + 3, c.ravel(), N + 5, M, N, K, True)
    np.testing.assert_allclose(c[:, :N], 2 * want, rtol=1e-5, atol=2e-4)


def test_host_gemm6_tiles_match_numpy():
    """The module's own compiled block kernel at the host's width (NR6 columns per
    tile), over several tiles in both directions, accumulating or not."""
    from fucina.kernels.vecmath import wide_vectors

    assert mk.NR6 == (32 if wide_vectors() else 16)  # 16 lanes only with AVX-512F
    rng = np.random.default_rng(4)
    M, N, K = 2 * mk.MR6, 3 * mk.NR6, 29
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    c = np.full((M, N), 0.5, np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    mk.gemm6(a.ravel(), 0, K, 1, b.ravel(), 0, N, c.ravel(), 0, N, M, N, K, True)
    np.testing.assert_allclose(c, want + 0.5, rtol=1e-5, atol=1e-4)
    mk.gemm6(a.ravel(), 0, K, 1, b.ravel(), 0, N, c.ravel(), 0, N, M, N, K, False)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("M", [4, 8, 12, 20, 24, 60, 64])
@pytest.mark.parametrize("N", [16, 32, 48, 64, 80])
def test_gemm_splits_tiles_without_changing_a_bit(M, N):
    """gemm (6 x NR6 tiles where they fit, 4 x 16 at the edges) gives the 4 x 16 tiles'
    exact bits on every row and column split, reading A either way, accumulating or
    not, and writes nothing past N (ldc > N) or outside its block of rows."""
    rng = np.random.default_rng(M * 1000 + N)
    K = 23
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N + 3)).astype(np.float32)
    c0 = rng.standard_normal((M + 2, N + 5)).astype(np.float32)
    want64 = a.astype(np.float64) @ b[:, :N].astype(np.float64)
    for a_transposed in (False, True):
        store = np.ascontiguousarray(a.T) if a_transposed else a
        a_rs, a_ks = (1, M) if a_transposed else (K, 1)
        for accumulate in (False, True):
            outs = []
            for fn in (mk.gemm4, mk.gemm):
                c = c0.copy()
                fn(store.ravel(), 0, a_rs, a_ks, b.ravel(), 0, N + 3, c.ravel(), N + 5, N + 5,
                   M, N, K, accumulate)
                outs.append(c)
            np.testing.assert_array_equal(outs[1], outs[0])
            c = outs[1]
            base = c0[1:M + 1, :N] if accumulate else 0.0
            np.testing.assert_allclose(c[1:M + 1, :N], want64 + base, rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(c[0], c0[0])  # the row before the block
            np.testing.assert_array_equal(c[M + 1], c0[M + 1])  # the row after it
            np.testing.assert_array_equal(c[:, N:], c0[:, N:])  # nothing written past N
