"""Masks, comparisons and conditionals: where, masked_fill, isnan/isinf/isfinite,
band_part/tril/triu (forward, gradients, error paths, f16/bf16 forms)."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import tensor

import fucina as F

RNG = np.random.default_rng(11)




_t = tensor


# -- numpy-only --------------------------------------------------------------------------


def test_reference_snippet_band_part_and_tril(ctx):
    B = F.Tensor("q", "k", dtype="bool")
    causal = B.band_mask(ctx, (3, 3), None, 0)
    np.testing.assert_array_equal(causal.numpy().ravel(),
                                  [True, False, False, True, True, False, True, True, True])
    x = _t(ctx, ("row", "col"), np.array([[1, 2], [3, 4]], np.float32), variable=True)
    lo = x.tril("row", "col", 0)
    np.testing.assert_array_equal(lo.numpy().ravel(), [1, 0, 3, 4])
    lo.sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy().ravel(), [1, 0, 1, 1])


def test_reference_snippet_compare_mask_feeds_masked_fill(ctx):
    x = _t(ctx, ("d",), np.array([-1, 0, 2], np.float32))
    neg = x.compare("lt", 0)
    assert neg.dtype is F.bool_
    np.testing.assert_array_equal(x.masked_fill(neg, 0).numpy(), [0, 0, 2])
    n_neg = neg.sum_all()
    assert n_neg.dtype is F.i64 and n_neg.item() == 1


def test_where_truthiness_and_tag_order(ctx):
    x = _t(ctx, ("r", "c"), np.arange(6, dtype=np.float32).reshape(2, 3))
    y = _t(ctx, ("r", "c"), -np.ones((2, 3), np.float32))
    # a float condition reads != 0 (NaN is truthy), in any tag order
    c = _t(ctx, ("c", "r"), np.array([[0, np.nan], [1, 0], [-0.0, 2]], np.float32))
    np.testing.assert_array_equal(x.where(c, y).numpy(), [[-1, 1, -1], [3, -1, 5]])
    m = _t(ctx, ("r", "c"), np.array([[True, False, True], [False, True, False]]), "bool")
    np.testing.assert_array_equal(x.where(m, y).numpy(), [[0, -1, 2], [-1, 4, -1]])
    np.testing.assert_array_equal(x.masked_fill(m, -np.inf).numpy(),
                                  [[-np.inf, 1, -np.inf], [3, -np.inf, 5]])


def test_where_and_masked_fill_errors(ctx):
    x = _t(ctx, ("r", "c"), np.zeros((2, 3), np.float32))
    y = _t(ctx, ("r", "c"), np.zeros((2, 3), np.float32))
    imask = _t(ctx, ("r", "c"), np.zeros((2, 3), np.int32), "i32")
    with pytest.raises(F.TagError):
        x.where(imask, y)  # integer masks are not masks
    with pytest.raises(F.TagError):
        x.masked_fill(_t(ctx, ("r",), np.zeros(2, bool), "bool"), 1.0)  # fewer tags
    with pytest.raises(F.ShapeMismatch):
        x.masked_fill(_t(ctx, ("r", "c"), np.zeros((2, 2), bool), "bool"), 1.0)
    with pytest.raises(F.TagError):
        x.where(_t(ctx, ("r", "c"), np.zeros((2, 3), bool), "bool"),
                _t(ctx, ("r", "c"), np.zeros((2, 3), np.float32)).to("f16"))
    with pytest.raises(TypeError):
        x.masked_fill(_t(ctx, ("r", "c"), np.zeros((2, 3), bool), "bool"), "zero")
    with pytest.raises(TypeError):
        x.where([True], y)
    with pytest.raises(F.ContextMismatch):
        x.where(_t(F.ExecContext(), ("r", "c"), np.zeros((2, 3), bool), "bool"), y)


def test_float_predicates(ctx):
    v = np.array([np.nan, np.inf, -np.inf, 0.0, -1e-40, 3e38], np.float32)
    x = _t(ctx, ("d",), v, variable=True)
    for name, ref in (("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite)):
        m = getattr(x, name)()
        assert m.dtype is F.bool_ and not m.requires_grad
        np.testing.assert_array_equal(m.numpy(), ref(v), err_msg=name)


def test_band_part_bounds_and_extra_axes(ctx):
    v = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    v[0, 0, 4] = np.nan  # outside the band: zeroed, not NaN * 0
    v[1, 3, 0] = np.inf
    x = _t(ctx, ("b", "i", "j"), v)
    i = np.arange(4)[:, None]
    j = np.arange(5)[None, :]
    for lower, upper in ((None, 0), (1, 1), (0, None), (-1, 2), (None, None), (2, -3)):
        keep = np.ones((4, 5), bool)
        if lower is not None:
            keep &= (i - j) <= lower
        if upper is not None:
            keep &= (j - i) <= upper
        np.testing.assert_array_equal(x.band_part("i", "j", lower, upper).numpy(),
                                      np.where(keep, v, 0), err_msg=str((lower, upper)))
    # the plane axes may come in any order relative to the tensor's
    xt = x.permute_to(("j", "b", "i"))
    np.testing.assert_array_equal(xt.band_part("i", "j", 1, 0).numpy(),
                                  np.transpose(x.band_part("i", "j", 1, 0).numpy(), (2, 0, 1)))


def test_band_part_errors(ctx):
    x = _t(ctx, ("i", "j"), np.zeros((3, 3), np.float32))
    with pytest.raises(F.TagError):
        x.band_part("i", "i", 0, 0)
    with pytest.raises(F.TagError):
        x.tril("i", "k")
    with pytest.raises(TypeError):
        x.band_part("i", "j", 0.5, None)
    with pytest.raises(TypeError):
        x.triu("i", "j", None)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_half_where_and_masked_fill(ctx, dt):
    v = RNG.standard_normal((2, 3)).astype(np.float32)
    x = _t(ctx, ("r", "c"), v).to(dt)
    y = _t(ctx, ("r", "c"), -v).to(dt)
    m = _t(ctx, ("r", "c"), np.array([[True, False, True], [False, True, False]]), "bool")
    w = x.where(m, y)
    assert w.dtype is F.DType(dt)
    np.testing.assert_array_equal(w.to("f32").numpy(),
                                  np.where(m.numpy(), x.to("f32").numpy(), y.to("f32").numpy()))
    f = x.masked_fill(m, 0.1)
    np.testing.assert_array_equal(f.to("f32").numpy(),
                                  np.where(m.numpy(), _t(ctx, ("d",), np.float32([0.1])).to(dt)
                                           .to("f32").numpy()[0], x.to("f32").numpy()))
    # a same-dtype float mask reads by truthiness
    np.testing.assert_array_equal(x.where(x, y).to("f32").numpy(), x.to("f32").numpy())
    hv = F.Tensor("r", "c", dtype=dt).variable_from_slice(ctx, (2, 3), v)
    with pytest.raises(F.UnsupportedGradient):
        hv.masked_fill(m, 0.0)
