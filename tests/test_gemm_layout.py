"""A GEMM whose result is only permuted and copied writes straight into the copy's
layout (fucina.ir.gemm_layout): the copy kernel goes, compiled equals eager bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F


def _heads_out(p, v):
    return (p.dot(v, "key").permute_to("batch", "seq", "head", "hd").contiguous()
            .merge("qd", ("head", "hd")))


def _hd_first(p, v):  # moves the GEMM's unit-stride axis: left as GEMM + copy
    return p.dot(v, "key").permute_to("batch", "hd", "head", "seq").contiguous()


_fast = F.compile(_heads_out)
_fast_hd = F.compile(_hd_first)


@pytest.mark.parametrize("b,h,s,k,d", [(2, 3, 40, 37, 24),   # stacked kernel, ragged
                                       (1, 2, 600, 30, 32),  # BLAS (M > MAX_DIM)
                                       (2, 2, 5, 7, 3)])     # BLAS (too little work)
def test_gemm_writes_the_permuted_layout(b, h, s, k, d):
    ctx = F.ExecContext()
    p = F.Tensor("batch", "head", "seq", "key").randn(ctx, (b, h, s, k), 1)
    v = F.Tensor("batch", "key", "head", "hd").randn(ctx, (b, k, h, d), 2)
    want = np.einsum("bhsk,bkhd->bhsd", p.numpy().astype(np.float64),
                     v.numpy().astype(np.float64))
    # One eager GEMM, permuted by numpy: a repeated eager dot of one signature takes
    # fucina.tensor.fast's np.matmul path, which need not round like the stacked kernel.
    eager = p.dot(v, "key").numpy()
    np.testing.assert_allclose(eager, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(_fast(p, v).numpy(),
                                  eager.transpose(0, 2, 1, 3).reshape(b, s, h * d))
    ir = _fast.ir(p, v)
    assert "copy(" not in ir and f"shape=({b}, {s}, {h}, {d})" in ir
    np.testing.assert_array_equal(_fast_hd(p, v).numpy(), eager.transpose(0, 3, 1, 2))
    assert "copy(" in _fast_hd.ir(p, v)


def test_gemm_with_other_readers_keeps_its_copy():
    ctx = F.ExecContext()
    p = F.Tensor("batch", "head", "seq", "key").randn(ctx, (2, 3, 44, 35), 3)
    v = F.Tensor("batch", "key", "head", "hd").randn(ctx, (2, 35, 3, 24), 4)

    def both(p, v):
        a = p.dot(v, "key")
        return a, a.permute_to("batch", "seq", "head", "hd").contiguous()

    fast = F.compile(both)  # shapes no other test's eager dot used (see above)
    for e, c in zip(both(p, v), fast(p, v)):
        np.testing.assert_array_equal(c.numpy(), e.numpy())
    assert "copy(" in fast.ir(p, v)
