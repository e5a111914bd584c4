"""The normalization family without torch: the reference's snippets, hand values, the
f16/bf16 branch, compiled kernel counts with backward, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina as F


def _t(ctx, tags, values, dtype=None):
    v = np.asarray(values, dtype=np.float32)
    T = F.Tensor(*tags, dtype=dtype) if dtype else F.Tensor(*tags)
    return T.from_slice(ctx, v.shape, v)


def test_reference_snippet_layer_norm_and_rms_norm(ctx):
    x = _t(ctx, ("t", "d"), [[1, 3]])
    ln = x.layer_norm("d", 0)
    np.testing.assert_array_equal(ln.data_const(), [-1, 1])
    rn = x.rms_norm("d", 0)
    rms = math.sqrt((1.0 + 9.0) / 2.0)
    assert abs(rn.data_const()[1] - 3.0 / rms) <= 1e-6


def test_reference_snippet_standardize_axis(ctx):
    x = _t(ctx, ("t", "d"), [[1, 2, 3, 4]])
    out = x.standardize_axis("d").data_const()
    assert abs(out.sum()) <= 1e-6
    assert abs(out[3] - 1.5 / math.sqrt(1.25)) <= 1e-6


def test_hand_values(ctx):
    x = _t(ctx, ("t", "d"), [[3, 4]])
    np.testing.assert_allclose(x.l2_normalize("d", 0).numpy(), [[0.6, 0.8]], rtol=1e-6)
    w = _t(ctx, ("d",), [2, -1])
    r = _t(ctx, ("t", "d"), [[10, 20]])
    rms = math.sqrt(12.5)
    np.testing.assert_allclose(x.rms_norm_mul_add("d", w, r, 0).numpy(),
                               [[10 + 6 / rms, 20 - 4 / rms]], rtol=1e-6)
    # group norm: two groups of one channel over time [1, 3] and [2, 6]
    g = _t(ctx, ("t", "c"), [[1, 2], [3, 6]]).group_norm("c", 2, 0)
    np.testing.assert_allclose(g.numpy(), [[-1, -1], [1, 1]], rtol=1e-6)
    # valid_len: the first 3 standardized (mean 2, biased std sqrt(2/3)), the rest 0
    s = _t(ctx, ("d",), [1, 2, 3, 100, -7]).standardize_axis("d", valid_len=3)
    np.testing.assert_allclose(s.numpy(), [-1 / math.sqrt(2 / 3), 0, 1 / math.sqrt(2 / 3),
                                           0, 0], rtol=1e-6, atol=1e-7)


def test_standardize_valid_len_suffix_gets_no_gradient(ctx):
    x = F.Tensor("d").variable_from_slice(ctx, (5,), [1, 2, 4, 100, -7])
    x.standardize_axis("d", valid_len=3, eps=0.1).mul(_t(ctx, ("d",), [1, 2, 3, 4, 5])) \
        .sum_all().backward()
    g = x.grad().numpy()
    assert g[3] == 0 and g[4] == 0 and np.all(g[:3] != 0)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_branch_computes_in_f32_and_narrows_once(ctx, dtype):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((3, 8)).astype(np.float32)
    w0 = rng.standard_normal(8).astype(np.float32)
    xh = _t(ctx, ("t", "d"), x0).to(dtype)
    wh = _t(ctx, ("d",), w0).to(dtype)
    x32, w32 = xh.to("f32"), wh.to("f32")
    for fu, _ref in [
        (lambda x, w: x.rms_norm("d", 1e-5), None),
        (lambda x, w: x.rms_norm_mul("d", w, 1e-5), None),
        (lambda x, w: x.layer_norm("d", 1e-5), None),
    ]:
        got = fu(xh, wh)
        assert got.dtype is F.DType(dtype) and type(got) is F.Tensor("t", "d", dtype=dtype)
        want = fu(x32, w32).to(dtype)  # the f32 op on the widened values, rounded once
        np.testing.assert_array_equal(got.to("f32").numpy(), want.to("f32").numpy())
        fast = F.compile(fu)
        np.testing.assert_array_equal(fast(xh, wh).to("f32").numpy(),
                                      want.to("f32").numpy())
    with pytest.raises(F.TagError, match="plain form"):
        xh.layer_norm("d", 1e-5, weight=wh, bias=wh)
    for name in ("rms_norm_mul_add", "group_norm", "standardize_axis", "l2_normalize"):
        assert not hasattr(xh, name)
    v = F.Tensor("d", dtype=dtype).variable_from_slice(ctx, (2,), [1.0, 2.0])
    with pytest.raises(F.UnsupportedGradient):
        v.rms_norm("d", 1e-5)


def test_norms_exist_only_on_float_branches(ctx):
    for name in ("rms_norm", "layer_norm"):
        assert hasattr(F.Tensor("d"), name) and hasattr(F.Tensor("d", dtype="f16"), name)
        assert not hasattr(F.Tensor("d", dtype="f64"), name)
        assert not hasattr(F.Tensor("d", dtype="i32"), name)
        assert not hasattr(F.Tensor("d", dtype="bool"), name)


def test_compiled_norm_with_backward_equals_eager(ctx):
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((4, 6)).astype(np.float32)
    w0 = rng.standard_normal(6).astype(np.float32)
    b0 = rng.standard_normal(6).astype(np.float32)

    def step(x, w, b):
        y = x.layer_norm("d", 1e-5, weight=w, bias=b).rms_norm("d", 1e-6)
        loss = y.mul(y.tanh()).sum_all()
        loss.backward()
        return loss

    def make():
        return (F.Tensor("t", "d").variable_from_slice(ctx, x0.shape, x0),
                F.Tensor("d").variable_from_slice(ctx, (6,), w0),
                F.Tensor("d").variable_from_slice(ctx, (6,), b0))

    eager = make()
    want = step(*eager).item()
    comp = make()
    fast = F.compile(step)
    np.testing.assert_allclose(fast(*comp).item(), want, rtol=1e-6)
    for e, c in zip(eager, comp):
        np.testing.assert_allclose(c.grad().numpy(), e.grad().numpy(), rtol=1e-5, atol=1e-6)


def test_norm_errors(ctx):
    x = _t(ctx, ("t", "d"), np.ones((2, 4)))
    w = _t(ctx, ("d",), np.ones(4))
    with pytest.raises(F.TagError, match="together"):
        x.layer_norm("d", 1e-5, weight=w)
    with pytest.raises(F.TagError, match="together"):
        x.layer_norm("d", 1e-5, bias=w)
    with pytest.raises(F.TagError):
        x.layer_norm("e", 1e-5)
    with pytest.raises(F.TagError, match="tagged"):
        x.rms_norm_mul("d", _t(ctx, ("_0",), np.ones(4)), 1e-5)  # numeric tag: layer_norm only
    with pytest.raises(F.ShapeMismatch, match="3 elements"):
        x.rms_norm_mul("d", _t(ctx, ("d",), np.ones(3)), 1e-5)
    with pytest.raises(F.ShapeMismatch):
        x.layer_norm("d", 1e-5, weight=_t(ctx, ("_0",), np.ones(3)),
                     bias=_t(ctx, ("_0",), np.ones(3)))
    with pytest.raises(F.TagError, match="dtype"):
        x.rms_norm_mul("d", w.to("f16"), 1e-5)
    with pytest.raises(F.TagError):
        x.rms_norm_mul_add("d", w, _t(ctx, ("t", "e"), np.ones((2, 4))), 1e-5)
    with pytest.raises(F.ShapeMismatch):
        x.rms_norm_mul_add("d", w, _t(ctx, ("t", "d"), np.ones((3, 4))), 1e-5)
    with pytest.raises(TypeError):
        x.rms_norm("d", "1e-5")
    with pytest.raises(F.InvalidShape):
        x.rms_norm("d", float("nan"))
    with pytest.raises(F.InvalidShape, match="groups"):
        x.group_norm("d", 3, 1e-5)
    with pytest.raises(F.TagError, match="rank-2"):
        _t(ctx, ("a", "t", "d"), np.ones((1, 2, 4))).group_norm("d", 2, 1e-5)
    with pytest.raises(F.TagError, match="ddof"):
        x.standardize_axis("d", ddof=2)
    with pytest.raises(F.TagError, match="eps_mode"):
        x.standardize_axis("d", eps_mode="inside")
    with pytest.raises(F.TagError, match="accumulation"):
        x.standardize_axis("d", accumulation="f16")
    with pytest.raises(F.InvalidShape, match="valid_len"):
        x.standardize_axis("d", valid_len=5)
    with pytest.raises(F.InvalidShape, match="valid_len"):
        x.standardize_axis("d", valid_len=0)
    with pytest.raises(TypeError):
        x.standardize_axis("d", bogus=1)


def _norm_grad64(x: np.ndarray, g: np.ndarray, kind: str, eps: float) -> np.ndarray:
    """float64 gradients of the plain norms over the last axis (closed forms)."""
    x, g = x.astype(np.float64), g.astype(np.float64)
    if kind == "layer_norm":
        d = x - x.mean(-1, keepdims=True)
        r = 1.0 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
        xn = d * r
        return r * (g - g.mean(-1, keepdims=True) - xn * (g * xn).mean(-1, keepdims=True))
    stat = (x * x).mean(-1, keepdims=True) if kind == "rms_norm" else (x * x).sum(-1,
                                                                              keepdims=True)
    r = 1.0 / np.sqrt(stat + eps)
    xn = x * r
    dot = (g * xn).mean(-1, keepdims=True) if kind == "rms_norm" else (g * xn).sum(-1,
                                                                             keepdims=True)
    return r * (g - xn * dot)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "l2_normalize"])
@pytest.mark.parametrize("scale", [1e15, 1e-14])
def test_norm_gradients_of_rows_spread_far_from_one(ctx, kind, scale):
    # Regression: rsqrt's gradient was g * (-0.5 y^3), and y^3 alone underflowed (rows
    # ~1e15: 16% error) or overflowed (rows ~1e-14, eps 0: NaN) in float32.
    rng = np.random.default_rng(2)
    x0 = (rng.standard_normal((3, 64)) * scale).astype(np.float32)
    g0 = rng.standard_normal((3, 64)).astype(np.float32)
    eps = 0.0 if scale < 1 else 1e-5

    def f(x, g):
        getattr(x, kind)("d", eps).backward_with_grad(g)

    want = _norm_grad64(x0, g0, kind, eps)
    for run in (f, F.compile(f)):
        x = F.Tensor("t", "d").variable_from_slice(ctx, x0.shape, x0)
        run(x, F.Tensor("t", "d").from_slice(ctx, g0.shape, g0))
        got = x.grad().numpy()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_reciprocal_gradient_where_y_squared_is_denormal(ctx):
    # d(1/x)/dx = -g y^2 with y = 1e-22: y^2 is a float32 denormal (2% off); g y y is not
    x = F.Tensor("d").variable_from_slice(ctx, (1,), [1e22])
    x.reciprocal().backward_with_grad(F.Tensor("d").from_slice(ctx, (1,), [1e22]))
    want = -1e22 / np.float64(np.float32(1e22)) ** 2
    np.testing.assert_allclose(x.grad().numpy(), [want], rtol=1e-6)

