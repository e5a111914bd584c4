"""Blocks transposed in registers (fucina.kernels.transpose) and the GEMM panels packed
with them: exact copies, ragged edges included, same product bits as an unpacked B."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from fucina.kernels import batched_gemm as bg
from fucina.kernels.transpose import LANES, make_tblock, tblock


@njit(cache=True)
def _one_block(src, s_off, s_ld, dst, d_off, d_ld):  # type: ignore[no-untyped-def]
    tblock(src, s_off, s_ld, dst, d_off, d_ld)


_BLOCKS = {lanes: make_tblock(lanes) for lanes in (1, 2, 4, 8, 16)}


def _at_width(lanes: int):  # type: ignore[no-untyped-def]
    block = _BLOCKS[lanes]

    @njit
    def one(src, s_off, s_ld, dst, d_off, d_ld):  # type: ignore[no-untyped-def]
        block(src, s_off, s_ld, dst, d_off, d_ld)

    return one


def _check_block(one, lanes: int) -> None:  # type: ignore[no-untyped-def]
    src = np.arange(40 * 50, dtype=np.float32)
    src.flags.writeable = False  # read-only sources are accepted
    dst = np.full(60 * 70, -1.0, np.float32)
    one(src, 3 * 50 + 5, 50, dst, 2 * 70 + 7, 70)
    want = np.full((60, 70), -1.0, np.float32)
    want[2:2 + lanes, 7:7 + lanes] = src.reshape(40, 50)[3:3 + lanes, 5:5 + lanes].T
    np.testing.assert_array_equal(dst.reshape(60, 70), want)


def test_block_lands_transposed_at_its_offsets():
    _check_block(_one_block, LANES)


@pytest.mark.parametrize("lanes", [1, 2, 4, 8, 16])
def test_every_width_transposes(lanes):
    # the AVX2 (8) and AVX-512 (16) widths both run on every host
    _check_block(_at_width(lanes), lanes)


def test_width_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two, got 12"):
        make_tblock(12)


@pytest.mark.parametrize("k,n", [(1, 1), (LANES, LANES), (2 * LANES + 3, LANES + 5),
                                 (LANES - 1, 3 * LANES), (64, 128), (5, 2 * bg.NR6 + 3)])
@pytest.mark.parametrize("layout", ["k_unit", "n_unit", "strided"])
def test_pack_copies_every_element_and_only_those(k, n, layout):
    rng = np.random.default_rng(k * 100 + n)
    if layout == "k_unit":  # a transposed B: the register-block path plus its edges
        b = rng.standard_normal((n, k)).astype(np.float32).T
    elif layout == "n_unit":
        b = rng.standard_normal((k, n + 3)).astype(np.float32)[:, :n]
    else:
        b = rng.standard_normal((k, 2 * n)).astype(np.float32)[:, ::2]
    flat, b0 = bg._span(b, False)
    strips = -(-n // bg.NR6)
    panel = np.full(strips * k * bg.NR6, np.nan, np.float32)
    bg._pack(flat, b0, b.strides[0] // 4, b.strides[1] // 4, k, n, panel, 0, strips)
    got = panel.reshape(strips, k, bg.NR6).transpose(1, 0, 2).reshape(k, strips * bg.NR6)
    np.testing.assert_array_equal(got[:, :n], b)
    assert np.isnan(got[:, n:]).all()  # the padding columns are left alone
    if strips > 1:  # a range of strips touches only its own
        part = np.full_like(panel, np.nan)
        bg._pack(flat, b0, b.strides[0] // 4, b.strides[1] // 4, k, n, part, 1, strips)
        mine = part.reshape(strips, k, bg.NR6)
        assert np.isnan(mine[0]).all()
        np.testing.assert_array_equal(mine[1:], panel.reshape(strips, k, bg.NR6)[1:])


@pytest.mark.parametrize("shape", [(6, 128, 64, 128), (5, 37, 45, 29)])
def test_stack_with_transposed_b_has_the_bits_of_a_contiguous_b(shape):
    nb, m, k, n = shape
    rng = np.random.default_rng(7)
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    keys = rng.standard_normal((nb, n, k)).astype(np.float32)
    bt = keys.transpose(0, 2, 1)  # attention's keys read transposed
    got = bg.matmul(a, bt, np.empty((nb, m, n), np.float32))
    want = bg.matmul(a, np.ascontiguousarray(bt), np.empty((nb, m, n), np.float32))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.matmul(a.astype(np.float64), bt), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(96, 256, 128), (70, 2 * LANES + 5, 3 * bg.NR6 + 9)])
def test_plane_with_transposed_b_has_the_bits_of_a_contiguous_b(m, k, n):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)  # a weight [out, in]
    got = bg._run(a, w.T, np.empty((m, n), np.float32))
    want = bg._run(a, np.ascontiguousarray(w.T), np.empty((m, n), np.float32))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, a.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-3)
