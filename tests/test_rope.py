"""RoPE without torch: the reference's snippet, tables, AxisRange and every input check."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina as F


def test_snippet_rope_rotates_feature_pairs_by_position(ctx):
    """REFERENCE §4.12: position 0 is the identity, position 1 turns by 1 rad."""
    x = F.Tensor("seq", "d").from_slice(ctx, (2, 2), [1, 0, 1, 0])
    y = x.rope("seq", "d", F.RopeTheta(positions=[0, 1], theta_base=10000), "half")
    out = y.data_const()
    assert abs(out[0] - 1) <= 1e-6
    assert abs(out[2] - math.cos(1.0)) <= 1e-6
    assert abs(out[3] - math.sin(1.0)) <= 1e-6


def test_hand_computed_modes(ctx):
    """One position at angle pi/2 on pairs (0, 2)/(1, 3) (half) or (0, 1)/(2, 3)."""
    cos = np.zeros((1, 2), np.float32)
    sin = np.ones((1, 2), np.float32)
    table = F.RopeTable(cos, sin, 4)
    x = F.Tensor("seq", "d").from_slice(ctx, (1, 6), [1, 2, 3, 4, 5, 6])
    # a partial span of 4 over 6 features: the last two (first two for _tail) pass through
    np.testing.assert_array_equal(x.rope("seq", "d", table, "half").numpy(),
                                  [[-3, -4, 1, 2, 5, 6]])
    np.testing.assert_array_equal(x.rope("seq", "d", table, "interleaved").numpy(),
                                  [[-2, 1, -4, 3, 5, 6]])
    np.testing.assert_array_equal(x.rope("seq", "d", table, "interleaved_tail").numpy(),
                                  [[1, 2, -4, 3, -6, 5]])


def test_inverse_table_and_negative_positions_undo_the_rotation(ctx):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((5, 3, 8)).astype(np.float32)
    x = F.Tensor("seq", "h", "d").from_slice(ctx, x0.shape, x0)
    pos = [3, 9, 27, 81, 243]
    fwd = ctx.prepare_rope_table(pos, 8, 10000.0)
    inv = ctx.prepare_rope_table(pos, 8, 10000.0, inverse=True)
    back = ctx.prepare_rope_table([-p for p in pos], 8, 10000.0)
    for mode in ("half", "interleaved"):
        y = x.rope("seq", "d", fwd, mode)
        np.testing.assert_allclose(y.rope("seq", "d", inv, mode).numpy(), x0, atol=2e-6)
        np.testing.assert_allclose(y.rope("seq", "d", back, mode).numpy(), x0, atol=2e-6)
    np.testing.assert_array_equal(inv.sin, -fwd.sin)


def test_rope_gradient_is_the_inverse_rotation(ctx):
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((4, 6)).astype(np.float32)
    g0 = rng.standard_normal((4, 6)).astype(np.float32)
    T = F.Tensor("seq", "d")
    x = T.variable_from_slice(ctx, x0.shape, x0)
    table = ctx.prepare_rope_table([0, 5, 10, 15], 6, 100.0)
    inv = ctx.prepare_rope_table([0, 5, 10, 15], 6, 100.0, inverse=True)
    x.rope("seq", "d", table, "interleaved").backward_with_grad(T.from_slice(ctx, (4, 6), g0))
    want = T.from_slice(ctx, (4, 6), g0).rope("seq", "d", inv, "interleaved").numpy()
    np.testing.assert_allclose(x.grad().numpy(), want, atol=1e-6)


def test_range_tables_are_bitwise_identical_to_arrays(ctx):
    for origin in (0, 7, 1000, -5):
        r = F.AxisRange(origin=origin, len=9)
        for inverse in (False, True):
            a = ctx.prepare_rope_table(r.positions(), 16, 5e5, inverse)
            b = ctx.prepare_rope_table_range(r, 16, 5e5, inverse)
            assert np.array_equal(a.cos, b.cos) and np.array_equal(a.sin, b.sin)
            ff = [1.0, 2.0, 4.0, 8.0, 1.0, 1.5, 3.0, 0.5]
            a = ctx.prepare_rope_table_factors(r.positions(), 16, 5e5, inverse, ff)
            b = ctx.prepare_rope_table_factors_range(r, 16, 5e5, inverse, ff)
            assert np.array_equal(a.cos, b.cos) and np.array_equal(a.sin, b.sin)


def test_freq_factors_divide_the_frequencies(ctx):
    plain = ctx.prepare_rope_table([12], 4, 100.0)
    half = ctx.prepare_rope_table_factors([24], 4, 100.0, False, [2.0, 2.0])
    np.testing.assert_allclose(plain.cos, half.cos, atol=1e-6)
    np.testing.assert_allclose(plain.sin, half.sin, atol=1e-6)


def test_inv_freqs_f64_table(ctx):
    inv = np.array([1.0, 0.1, 1e-3])
    t = ctx.prepare_rope_table_inv_freqs_f64(100000, 3, inv)
    assert t.feature_dim == 6 and t.positions == 3
    ang = (np.arange(100000, 100003, dtype=np.float64)[:, None] * inv).astype(np.float32)
    np.testing.assert_array_equal(t.cos, np.cos(ang.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(t.sin, np.sin(ang.astype(np.float64)).astype(np.float32))
    ti = ctx.prepare_rope_table_inv_freqs_f64(100000, 3, inv, inverse=True)
    np.testing.assert_array_equal(ti.sin, -t.sin)


def test_yarn_blend():
    ctx = F.ExecContext()
    dim, base, factor, orig = 64, 10000.0, 40.0, 4096
    plain = base ** (-np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(ctx.yarn_blend_inv_freqs_f64(dim, base, 1.0, orig), plain)
    got = ctx.yarn_blend_inv_freqs_f64(dim, base, factor, orig)

    def corr(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), dim - 1)
    assert 0 < low < high < dim // 2
    # fast pairs keep their frequency, slow ones are divided by the factor, a ramp between
    np.testing.assert_allclose(got[:low + 1], plain[:low + 1])
    np.testing.assert_allclose(got[high:], plain[high:] / factor)
    mid = (low + high) // 2
    t = (mid - low) / (high - low)
    np.testing.assert_allclose(got[mid], plain[mid] / factor * t + plain[mid] * (1 - t))


def test_axis_range():
    r = F.AxisRange(origin=10, len=4)
    assert F.AxisRange(len=3).origin == 0
    assert r.at(0) == 10 and r.at(3) == 13 and r.end() == 14
    assert r.narrowed(1, 2) == F.AxisRange(origin=11, len=2)
    assert r.shifted(-10) == F.AxisRange(origin=0, len=4)
    assert r.rebased(100) == F.AxisRange(origin=100, len=4)
    assert r.contains(13) and not r.contains(14) and not r.contains(9)
    out = np.zeros(4, np.int32)
    r.write_into(out)
    np.testing.assert_array_equal(out, [10, 11, 12, 13])
    with pytest.raises(F.IndexOutOfBounds):
        r.at(4)
    with pytest.raises(F.IndexOutOfBounds):
        r.narrowed(3, 2)
    with pytest.raises(F.InvalidDataLength):
        r.write_into(np.zeros(3, np.int32))
    with pytest.raises(F.InvalidShape):
        F.AxisRange(len=-1)
    with pytest.raises(TypeError):
        F.AxisRange(origin=1.5, len=2)
    with pytest.raises(TypeError):
        F.AxisRange(0, 2)  # keyword fields only


def test_hand_filled_table_is_read_when_the_program_runs(ctx):
    x0 = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    x = F.Tensor("seq", "d").from_slice(ctx, x0.shape, x0)
    table = F.RopeTable(np.ones((2, 2)), np.zeros((2, 2)), 4)
    fast = F.compile(lambda x: x.rope("seq", "d", table, "half"))
    np.testing.assert_array_equal(fast(x).numpy(), x0)
    table.cos[...] = 0.0
    table.sin[...] = 1.0
    np.testing.assert_array_equal(fast(x).numpy(), [[-3, -4, 1, 2], [-7, -8, 5, 6]])
    np.testing.assert_array_equal(x.rope("seq", "d", table, "half").numpy(),
                                  fast(x).numpy())


def test_errors(ctx):
    x = F.Tensor("seq", "d").zeros(ctx, (3, 8))
    table = ctx.prepare_rope_table([0, 1, 2], 8, 1e4)
    with pytest.raises(F.TagError):
        x.rope("pos", "d", table, "half")
    with pytest.raises(F.TagError):
        x.rope("seq", "seq", table, "half")
    with pytest.raises(F.TagError, match="mode"):
        x.rope("seq", "d", table, "neox")
    with pytest.raises(F.ShapeMismatch, match="positions"):
        x.rope("seq", "d", ctx.prepare_rope_table([0, 1], 8, 1e4), "half")
    with pytest.raises(F.InvalidShape, match="spans"):
        x.rope("seq", "d", ctx.prepare_rope_table([0, 1, 2], 10, 1e4), "half")
    with pytest.raises(F.ShapeMismatch):
        x.rope("seq", "d", F.RopeTheta(positions=[0, 1], theta_base=1e4), "half")
    with pytest.raises(F.InvalidShape, match="odd"):
        F.Tensor("seq", "d").zeros(ctx, (3, 7)).rope(
            "seq", "d", F.RopeTheta(positions=[0, 1, 2], theta_base=1e4), "half")
    with pytest.raises(TypeError, match="source"):
        x.rope("seq", "d", [0, 1, 2], "half")
    with pytest.raises(TypeError, match="unknown"):
        x.rope("seq", "d", {"positions": [0, 1, 2], "theta": 1e4}, "half")
    with pytest.raises(F.InvalidShape):
        F.RopeTheta(positions=[0], theta_base=0.0)
    with pytest.raises(F.InvalidDataLength):
        x.rope("seq", "d", F.RopeTheta(positions=[0.5, 1, 2], theta_base=1e4), "half")
    with pytest.raises(F.InvalidShape):
        ctx.prepare_rope_table([0, 1], 7, 1e4)
    with pytest.raises(F.InvalidDataLength):
        ctx.prepare_rope_table_factors([0, 1], 8, 1e4, False, [1.0, 2.0])
    with pytest.raises(TypeError):
        ctx.prepare_rope_table_range([0, 1], 8, 1e4)
    with pytest.raises(F.InvalidShape):
        F.RopeTable(np.ones((2, 3)), np.ones((2, 3)), 8)
    assert not hasattr(F.Tensor("seq", "d", dtype="i32"), "rope")
    table.deinit()
    with pytest.raises(F.Deinitialized):
        x.rope("seq", "d", table, "half")
    with pytest.raises(F.Deinitialized):
        table.deinit()


def test_rms_norm_mul_rope_half_prepared_is_norm_then_rope(ctx):
    x0 = np.array([[3.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    x = F.Tensor("seq", "d").from_slice(ctx, x0.shape, x0)
    w = F.Tensor("d").from_slice(ctx, (4,), [1.0, 2.0, 1.0, 1.0])
    table = F.RopeTable(np.array([[1.0, 1.0], [0.0, 0.0]]), np.array([[0.0, 0.0],
                                                                      [1.0, 1.0]]), 4)
    y = x.rms_norm_mul_rope_half_prepared("seq", "d", w, 0.0, table).numpy()
    r0 = np.sqrt((9 + 16) / 4)  # row 0: identity rotation
    np.testing.assert_allclose(y[0], [3 / r0, 8 / r0, 0, 0], rtol=1e-6)
    # row 1: rms 1, weight (1, 2, 1, 1), then a quarter turn: (a, b) -> (-b, a)
    np.testing.assert_allclose(y[1], [-1, -1, 1, 2], rtol=1e-6)
    with pytest.raises(TypeError, match="RopeTable"):
        x.rms_norm_mul_rope_half_prepared("seq", "d", w, 0.0,
                                          F.RopeTheta(positions=[0, 1], theta_base=10.0))
    with pytest.raises(F.TagError):
        x.rms_norm_mul_rope_half_prepared("seq", "seq", w, 0.0, table)
