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


def test_host_width_follows_the_target():
    from fucina.kernels.vecmath import wide_vectors

    assert mk.LANES == (16 if wide_vectors() else 8)
    assert mk.NR6 == 2 * mk.LANES and mk.NR % mk.LANES == 0
