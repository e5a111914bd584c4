"""Reductions and scans: masked sum/mean/max/min, prod, variance, norms, logsumexp,
any/all, cumsum/cumprod, argmax (forward, gradients, edge cases, f16/bf16 forms)."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import tensor

import fucina as F

RNG = np.random.default_rng(5)




_t = tensor


# -- numpy-only: the reference snippets and the masked forms ---------------------------------


def test_reference_snippet_axis_reductions(ctx):
    x = _t(ctx, ("row", "col"), np.float32([[1, 2], [3, 4]]))
    s = x.sum("col")
    assert s.axis_tags == ("row",)
    np.testing.assert_array_equal(s.numpy(), [3, 7])
    np.testing.assert_array_equal(x.variance("col", 0).numpy(), [0.25, 0.25])
    assert abs(x.sum_all().item() - 10) < 1e-6
    np.testing.assert_array_equal(_t(ctx, ("d",), np.float32([1, 2, 3])).cumsum("d").numpy(),
                                  [1, 3, 6])


def test_reference_snippet_masked_reductions(ctx):
    M = F.Tensor("row", "col", dtype="bool")
    x = _t(ctx, ("row", "col"), np.float32([[1, 2, 3], [4, 5, 6]]), variable=True)
    mask = M.from_slice(ctx, (2, 3), [True, False, True, False, True, False])
    total = x.sum("col", mask=mask)
    np.testing.assert_array_equal(total.numpy(), [4, 5])
    np.testing.assert_array_equal(x.mean("col", mask=mask).numpy(), [2, 5])
    total.sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy().ravel(), [1, 0, 1, 0, 1, 0])

    y = _t(ctx, ("row", "col"), np.float32([[1, 2], [3, 4]]))
    m2 = M.from_slice(ctx, (2, 2), [False, False, True, False])
    np.testing.assert_array_equal(y.sum("col", mask=m2).numpy(), [0, 3])
    np.testing.assert_array_equal(y.mean("col", mask=m2, empty=0).numpy(), [0, 3])
    m = y.mean("col", mask=m2).numpy()
    assert np.isnan(m[0]) and m[1] == 3
    np.testing.assert_array_equal(y.max("col", mask=m2).numpy(), [-np.inf, 3])
    np.testing.assert_array_equal(y.min("col", mask=m2).numpy(), [np.inf, 3])
    np.testing.assert_array_equal(y.max("col", mask=m2, empty=-1).numpy(), [-1, 3])
    np.testing.assert_array_equal(y.sum("col", mask=m2, empty=7).numpy(), [7, 3])


def test_masked_sum_is_bitwise_the_masked_fill_composition(ctx):
    v = RNG.standard_normal((5, 37)).astype(np.float32) * 100
    v[1, 3] = np.nan  # an excluded NaN must not poison its lane
    m0 = RNG.random((5, 37)) > 0.4
    m0[1, 3] = False
    x = _t(ctx, ("r", "c"), v)
    m = _t(ctx, ("r", "c"), m0, "bool")
    a = x.sum("c", mask=m).numpy()
    b = x.masked_fill(m.logical_not(), 0).sum("c").numpy()
    np.testing.assert_array_equal(a, b)
    allm = _t(ctx, ("r", "c"), np.ones((5, 37), bool), "bool")
    np.testing.assert_array_equal(x.sum("c", mask=allm).numpy(), x.sum("c").numpy())
    # float masks read by truthiness, in any tag order
    fm = _t(ctx, ("c", "r"), m0.T.astype(np.float32) * 3)
    np.testing.assert_array_equal(x.sum("c", mask=fm).numpy(), a)
    assert not np.isnan(a[1])


def test_masked_max_nan_only_among_selected(ctx):
    v = np.float32([[1, np.nan, 3], [np.nan, 2, 5]])
    m0 = np.array([[True, False, True], [True, True, False]])
    x = _t(ctx, ("r", "c"), v)
    m = _t(ctx, ("r", "c"), m0, "bool")
    got = x.max("c", mask=m).numpy()
    assert got[0] == 3 and np.isnan(got[1])
    np.testing.assert_array_equal(x.min("c", mask=m).numpy()[0], 1)


def test_masked_integer_and_bool_sums(ctx):
    xi = _t(ctx, ("r", "c"), np.int32([[1, 2, 3], [4, 5, 6]]), "i32")
    m = _t(ctx, ("r", "c"), np.array([[1, 0, 1], [0, 0, 0]], bool), "bool")
    s = xi.sum("c", mask=m)
    assert s.dtype is F.i64
    np.testing.assert_array_equal(s.numpy(), [4, 0])
    np.testing.assert_array_equal(xi.sum("c", mask=m, empty=-1).numpy(), [4, -1])
    np.testing.assert_array_equal(m.sum("c", mask=m).numpy(), [2, 0])


def test_masked_reduction_errors(ctx):
    x = _t(ctx, ("r", "c"), np.zeros((2, 3), np.float32))
    with pytest.raises(F.TagError):
        x.sum("c", empty=0)  # empty= only with mask=
    with pytest.raises(F.TagError):
        x.max("c", mask=_t(ctx, ("r", "c"), np.zeros((2, 3), np.int64), "i64"))
    with pytest.raises(F.TagError):
        x.mean("c", mask=_t(ctx, ("c",), np.ones(3, bool), "bool"))
    with pytest.raises(F.ShapeMismatch):
        x.sum("c", mask=_t(ctx, ("r", "c"), np.ones((2, 2), bool), "bool"))
    with pytest.raises(F.TagError):
        x.max("z")
    with pytest.raises(TypeError):
        x.sum("c", mask=_t(ctx, ("r", "c"), np.ones((2, 3), bool), "bool"), empty="x")
    with pytest.raises(TypeError):
        x.sum("c", None)  # options are keyword-only


def test_reduction_option_errors_and_branches(ctx):
    x = _t(ctx, ("r", "c"), np.ones((2, 3), np.float32))
    for bad in (2, -1, True, 0.5):
        with pytest.raises(F.TagError):
            x.variance("c", bad)
    for bad in ("l3", 3, None):
        with pytest.raises(F.TagError):
            x.norm("c", bad)
    I = F.Tensor("d", dtype="i32")
    for name in ("max", "prod", "variance", "cumsum", "argmax", "any", "logsumexp"):
        assert not hasattr(I, name), name
    assert not hasattr(F.Tensor("d", dtype="bool"), "any")
    assert not hasattr(F.Tensor("d", dtype="f64"), "max")
    H = F.Tensor("d", dtype="bf16")
    for name in ("max", "min", "prod", "variance", "logsumexp", "argmax", "cumsum", "cumprod"):
        assert hasattr(H, name), name
    for name in ("norm", "any", "all_all"):
        assert not hasattr(H, name), name


def test_any_all_truthiness(ctx):
    v = np.float32([[0, 0, 0], [0, np.nan, 0], [1, 2, -3], [0, -0.0, 5]])
    x = _t(ctx, ("r", "c"), v)
    np.testing.assert_array_equal(x.any("c").numpy(), [False, True, True, True])
    np.testing.assert_array_equal(x.all("c").numpy(), [False, False, True, False])
    np.testing.assert_array_equal(x.all("r").numpy(), [False, False, False])
    assert x.any_all().item() is True and x.all_all().item() is False
    assert x.any("c").dtype is F.bool_ and x.any_all().axis_tags == ()
    y = _t(ctx, ("r", "c"), v, variable=True)
    assert not y.any("c").requires_grad


def test_argmax_nan_never_wins_and_first_tie(ctx):
    v = np.float32([[1, 3, 3, 2], [np.nan, 1, 5, np.nan], [np.nan] * 4,
                    [-np.inf, -np.inf, np.nan, -np.inf], [2, np.inf, np.inf, 0]])
    x = _t(ctx, ("r", "c"), v)
    a = x.argmax("c")
    assert a.dtype is F.i64 and a.axis_tags == ("r",)
    np.testing.assert_array_equal(a.numpy(), [1, 2, 0, 0, 1])
    np.testing.assert_array_equal(x.argmax("r").numpy(), [4, 4, 4, 0])
    for dt in ("f16", "bf16"):
        np.testing.assert_array_equal(x.to(dt).argmax("c").numpy(), [1, 2, 0, 0, 1])
    assert not _t(ctx, ("r", "c"), np.float32(v), variable=True).argmax("c").requires_grad


def test_argmax_nan_ahead_of_a_minus_inf_maximum(ctx):
    # Regression: NaN was read as -inf, so a NaN ahead of a -inf maximum won ([nan, -inf]
    # gave 0); the winner is the first element equal to the non-NaN maximum.
    n, i = np.nan, -np.inf
    v = np.float32([[n, i], [n, i], [i, n], [n, n]])
    x = _t(ctx, ("r", "c"), v)
    fast = F.compile(lambda t: t.argmax("c"))
    for y in (x, x.to("f16"), x.to("bf16")):
        np.testing.assert_array_equal(y.argmax("c").numpy(), [1, 1, 0, 0])
        np.testing.assert_array_equal(fast(y).numpy(), [1, 1, 0, 0])
    np.testing.assert_array_equal(x.argmax("r").numpy(), [2, 0])
    w = _t(ctx, ("r", "c"), np.float32([[n, n, i, 3, n, 3]]))
    np.testing.assert_array_equal(w.argmax("c").numpy(), [3])
    np.testing.assert_array_equal(fast(w).numpy(), [3])


def test_cumsum_is_sequential_and_cumprod_values(ctx):
    v = RNG.standard_normal((3, 50)).astype(np.float32)
    x = _t(ctx, ("r", "c"), v)
    want = np.cumsum(v, axis=1, dtype=np.float32)  # serial f32 accumulation
    np.testing.assert_array_equal(x.cumsum("c").numpy(), want)
    np.testing.assert_array_equal(x.cumprod("r").numpy(), np.cumprod(v, axis=0))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_half_widened_reductions_and_scans(ctx, dt):
    v = (RNG.standard_normal((3, 6)) * 2).astype(np.float32)
    v[0, 1] = np.nan
    h = _t(ctx, ("r", "c"), v).to(dt)
    w = h.to("f32")
    for name, call in (("max", lambda t: t.max("c")), ("min", lambda t: t.min("r")),
                       ("prod", lambda t: t.prod("c")),
                       ("variance", lambda t: t.variance("c", 1)),
                       ("logsumexp", lambda t: t.logsumexp("c"))):
        got, want = call(h), call(w)
        assert got.dtype is F.f32, name
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)
    # sum/mean are native typed reductions (f32 accumulation): equal up to rounding
    np.testing.assert_allclose(h.mean("r").numpy(), w.mean("r").numpy(), rtol=1e-6)
    m = _t(ctx, ("r", "c"), RNG.random((3, 6)) > 0.5, "bool")
    np.testing.assert_array_equal(h.max("c", mask=m).numpy(), w.max("c", mask=m).numpy())
    np.testing.assert_array_equal(h.mean("c", mask=m, empty=0).numpy(),
                                  w.mean("c", mask=m, empty=0).numpy())
    for name in ("cumsum", "cumprod"):
        got = getattr(h, name)("c")
        assert got.dtype is F.DType(dt)
        np.testing.assert_array_equal(got.data_const().view(np.uint16),
                                      getattr(w, name)("c").to(dt).data_const().view(np.uint16))
    hv = F.Tensor("r", "c", dtype=dt).variable_from_slice(ctx, (3, 6), np.abs(v) + 1)
    with pytest.raises(F.UnsupportedGradient):
        hv.max("c")
    with pytest.raises(F.UnsupportedGradient):
        hv.cumsum("c")


def test_compiled_reductions_match_eager(ctx):
    v = (RNG.standard_normal((4, 6)) * 2).astype(np.float32)
    x = F.Tensor("r", "c").from_slice(ctx, (4, 6), v)
    m = _t(ctx, ("r", "c"), RNG.random((4, 6)) > 0.5, "bool")
    fns = [
        lambda t: t.logsumexp("c"), lambda t: t.variance("c", 1), lambda t: t.norm("c", "inf"),
        lambda t: t.max("c"), lambda t: t.mean("c", mask=m, empty=0),
        lambda t: t.cumsum("c").cumprod("r"), lambda t: t.argmax("c"),
        lambda t: t.exp().any("c"), lambda t: t.prod("c"), lambda t: t.norm_all("l2"),
    ]
    for fn in fns:
        np.testing.assert_allclose(F.compile(fn)(x).numpy(), fn(x).numpy(), rtol=1e-5,
                                   atol=1e-6, equal_nan=True)
