"""Selection (REFERENCE §4.16) without torch: the reference's snippet, the NaN and tie
rules, gradients, the multinomial (seed, index) contract, router out arrays, compile,
ownership and errors."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F


def _t(ctx, tags, values, variable=False):
    v = np.asarray(values, dtype=np.float32)
    T = F.Tensor(*tags)
    return T.variable_from_slice(ctx, v.shape, v) if variable else T.from_slice(ctx, v.shape, v)


def test_argmax_top_k_router_and_multinomial_snippet(ctx):
    logits = _t(ctx, ("row", "expert"), [[1, 3, 2, 0]])
    best = logits.argmax("expert")  # i64 indices, no grad
    assert best.dtype is F.i64 and best.numpy().tolist() == [1]
    top = logits.top_k("expert", 2, "k")
    assert isinstance(top, F.TopKResult)
    np.testing.assert_array_equal(top.values.numpy(), [[3, 2]])
    selected = np.zeros(2, np.uint64)
    weights = np.zeros(2, np.float32)
    out = logits.router_top_k("expert", 2, selected, weights)
    assert out.selected is selected and out.weights is weights  # filled in place, returned
    assert selected[0] == 1
    assert weights[0] == pytest.approx(0.7310586, abs=1e-6)  # top-2 softmax mass renormalized
    probs = _t(ctx, ("row", "class"), [[0, 2, 0]])
    picks = probs.multinomial("class", "sample", 3, 42, True)
    assert picks.axis_tags == ("row", "sample") and picks.dtype is F.i64
    assert picks.numpy().tolist() == [[1, 1, 1]]  # zero-weight classes never drawn


def test_top_k_nan_never_places_and_sort_puts_nan_last(ctx):
    x = _t(ctx, ("r", "c"), [[np.nan, 1.0, np.nan, -np.inf], [2.0, np.nan, 5.0, 3.0]])
    top = x.top_k("c", 3, "k")
    np.testing.assert_array_equal(top.values.numpy(), [[1.0, -np.inf, -np.inf],
                                                       [5.0, 3.0, 2.0]])
    np.testing.assert_array_equal(top.indices.numpy(), [[1, 3, 0], [2, 3, 0]])
    for descending, order in ((False, [3, 1, 0, 2]), (True, [1, 3, 0, 2])):
        s = x.sort("c", descending)
        np.testing.assert_array_equal(s.indices.numpy()[0], order)
        assert np.isnan(s.values.numpy()[0, 2:]).all()
        np.testing.assert_array_equal(x.argsort("c", descending).numpy()[0], order)
    # large k takes the sorting path: the same rules
    wide = np.full((1, 12), np.nan, np.float32)
    wide[0, 5], wide[0, 7] = 4.0, 9.0
    t = _t(ctx, ("r", "c"), wide).top_k("c", 4, "k")
    np.testing.assert_array_equal(t.indices.numpy(), [[7, 5, 0, 0]])
    np.testing.assert_array_equal(t.values.numpy(), [[9.0, 4.0, -np.inf, -np.inf]])


def test_ties_keep_their_order(ctx):
    x = _t(ctx, ("c",), [2, 1, 2, 3, 1, 2])
    np.testing.assert_array_equal(x.top_k("c", 4, "k").indices.numpy(), [3, 0, 2, 5])
    np.testing.assert_array_equal(x.argsort("c").numpy(), [1, 4, 0, 2, 5, 3])
    np.testing.assert_array_equal(x.argsort("c", True).numpy(), [3, 0, 2, 5, 1, 4])
    big = np.zeros(100, np.float32)
    big[[10, 40, 70]] = 1.0
    np.testing.assert_array_equal(_t(ctx, ("c",), big).top_k("c", 5, "k").indices.numpy(),
                                  [10, 40, 70, 0, 1])


@pytest.mark.parametrize("k", [1, 5, 24, 120])  # the candidate heap, then whole-row sorts
@pytest.mark.parametrize("order", ["random", "ascending", "descending"])
def test_top_k_against_a_stable_numpy_sort(ctx, k, order):
    rng = np.random.default_rng(k)
    x0 = rng.integers(0, 6, (7, 200)).astype(np.float32)  # many ties
    if order != "random":
        x0 = np.sort(x0, axis=1)
        x0 = x0 if order == "ascending" else x0[:, ::-1].copy()
    want = np.argsort(-x0, axis=1, kind="stable")[:, :k]
    top = _t(ctx, ("r", "c"), x0).top_k("c", k, "k")
    np.testing.assert_array_equal(top.indices.numpy(), want)
    np.testing.assert_array_equal(top.values.numpy(), np.take_along_axis(x0, want, 1))


def test_values_gradients_scatter_back(ctx):
    x = _t(ctx, ("r", "c"), [[0.5, 3.0, 1.0, 2.0], [np.nan, -1.0, 4.0, 0.0]], variable=True)
    top = x.top_k("c", 3, "k")
    g = np.array([[1.0, 10.0, 100.0], [2.0, 20.0, 200.0]], np.float32)
    top.values.backward_with_grad(_t(ctx, ("r", "k"), g))
    # row 0 picks 3.0, 2.0, 1.0; row 1 picks 4.0, 0.0, -1.0 (NaN never places)
    np.testing.assert_array_equal(x.grad().numpy(), [[0, 1, 100, 10], [0, 200, 2, 20]])
    x.zero_grad()
    s = x.sort("c", True)
    s.values.backward_with_grad(_t(ctx, ("r", "c"), np.arange(8).reshape(2, 4)))
    np.testing.assert_array_equal(x.grad().numpy(), [[3, 0, 2, 1], [7, 6, 4, 5]])
    assert not top.indices.requires_grad and not x.argsort("c").requires_grad


def test_compiled_selection_equals_eager(ctx):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((5, 9)).astype(np.float32)
    x0[1, [2, 4, 6]] = np.nan
    x0[2] = np.nan
    x = _t(ctx, ("r", "c"), x0, variable=True)

    def step(x):
        top = x.top_k("c", 4, "k")
        s = x.sort("c", True)
        loss = top.values.mul(top.values).sum_all().add(s.values.slice(c=slice(0, 3)).sum_all())
        loss.backward()
        return top.values, top.indices, s.indices, x.argsort("c")

    fast = F.compile(step)
    got = [t.numpy() for t in fast(x)]
    g_fast = x.grad().numpy()
    x.zero_grad()
    want = [t.numpy() for t in step(x)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(g_fast, x.grad().numpy())
    w = _t(ctx, ("r", "c"), rng.uniform(0, 1, (5, 9)))
    draw = F.compile(lambda w: w.multinomial("c", "s", 6, 11, False))
    np.testing.assert_array_equal(draw(w).numpy(), w.multinomial("c", "s", 6, 11, False).numpy())


def _expected_draws(w, num, seed, replacement):
    """The documented mapping, in plain Python over fucina.rng.at."""
    out = np.zeros((w.shape[0], num), np.int64)
    for p in range(w.shape[0]):
        mass = [float(v) for v in w[p]]
        for s in range(num):
            total = 0.0
            for m in mass:
                total += m
            target = (F.rng.at(seed, p * num + s) >> 11) * 2.0**-53 * total
            acc, pick = 0.0, max(j for j, m in enumerate(mass) if m > 0)
            for j, m in enumerate(mass):
                if m > 0:
                    acc += m
                    if acc > target:
                        pick = j
                        break
            out[p, s] = pick
            if not replacement:
                mass[pick] = 0.0
    return out


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_is_a_pure_function_of_seed_and_index(ctx, replacement):
    rng = np.random.default_rng(1)
    w0 = rng.uniform(0, 3, (4, 7)).astype(np.float32)
    w0[1, [0, 3]] = 0.0
    w = _t(ctx, ("r", "c"), w0)
    got = w.multinomial("c", "s", 5, 1234, replacement).numpy()
    np.testing.assert_array_equal(got, _expected_draws(w0, 5, 1234, replacement))
    assert not np.isin(got[1], [0, 3]).any()
    if not replacement:
        assert all(len(set(r)) == 5 for r in got.tolist())
    row = _t(ctx, ("c",), w0[0]).multinomial("c", "s", 5, 1234, replacement)
    np.testing.assert_array_equal(row.numpy(), got[0])  # row 0 reads the same counters
    assert (w.multinomial("c", "s", 5, 99, replacement).numpy() != got).any()


def test_multinomial_frequencies_follow_the_weights(ctx):
    w = _t(ctx, ("c",), [1.0, 2.0, 7.0])
    draws = w.multinomial("c", "s", 20000, 7, True).numpy()
    freq = np.bincount(draws, minlength=3) / draws.size
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.7], atol=0.015)


def test_multinomial_errors(ctx):
    w = _t(ctx, ("r", "c"), [[1.0, 3.0, 2.0], [0.5, 0.5, 0.0]])
    with pytest.raises(F.InvalidShape, match="row 1 has 2 nonzero"):
        w.multinomial("c", "s", 3, 0, False)
    with pytest.raises(F.InvalidShape):
        w.multinomial("c", "s", 4, 0, False)
    with pytest.raises(F.InvalidShape):
        w.multinomial("c", "s", 0, 0, True)
    with pytest.raises(F.InvalidShape, match=">= 0"):
        _t(ctx, ("c",), [1.0, -1.0]).multinomial("c", "s", 1, 0, True)
    with pytest.raises(F.InvalidShape, match="finite"):
        _t(ctx, ("c",), [1.0, np.nan]).multinomial("c", "s", 1, 0, True)
    with pytest.raises(F.InvalidShape, match="no positive weight"):
        _t(ctx, ("c",), [0.0, 0.0]).multinomial("c", "s", 1, 0, True)
    with pytest.raises(F.TagError):
        w.multinomial("r", "s", 1, 0, True)  # the class tag must be last
    with pytest.raises(F.TagError):
        _t(ctx, ("a", "r", "c"), np.ones((1, 1, 2))).multinomial("c", "s", 1, 0, True)
    with pytest.raises(TypeError):
        w.multinomial("c", "s", 1, 0.5, True)
    bad = F.compile(lambda w: w.multinomial("c", "s", 3, 0, False))
    with pytest.raises(F.InvalidShape):  # value checks run inside the program too
        bad(w)


def test_router_top_k_arrays_and_errors(ctx):
    x = _t(ctx, ("tok", "expert"), [[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    sel, wts = x.router_top_k("expert", 2, normalize_selected=False)
    assert sel.dtype == np.int64 and wts.dtype == np.float32 and sel.shape == (4,)
    e = np.exp(np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]))
    p = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(sel, [2, 1, 0, 1])
    np.testing.assert_allclose(wts, [p[0, 2], p[0, 1], p[1, 0], p[1, 1]], rtol=1e-6)
    two_d = np.zeros((2, 2), np.int32)
    x.router_top_k("expert", 2, two_d)
    np.testing.assert_array_equal(two_d, [[2, 1], [0, 1]])
    with pytest.raises(F.InvalidDataLength):
        x.router_top_k("expert", 2, np.zeros(3, np.int64))
    with pytest.raises(TypeError):
        x.router_top_k("expert", 2, np.zeros(4, np.float32))
    with pytest.raises(TypeError):
        x.router_top_k("expert", 2, None, np.zeros(4, np.int64))
    with pytest.raises(F.InvalidShape):
        x.router_top_k("expert", 4)
    with pytest.raises(F.TagError):
        x.router_top_k("tok", 1)
    with pytest.raises(F.UnsupportedGradient):
        _t(ctx, ("tok", "expert"), [[1.0, 2.0]], variable=True).router_top_k("expert", 1)
    with pytest.raises(F.UnsupportedView):  # host arrays need data: not traceable
        F.compile(lambda t: t.router_top_k("expert", 1))(x)


def test_index_results_are_caller_owned_in_exec_scopes(ctx):
    x = _t(ctx, ("r", "c"), [[1.0, 5.0, 3.0]])
    with ctx.exec_scope():
        top = x.top_k("c", 2, "k")
        order = x.argsort("c")
    np.testing.assert_array_equal(top.indices.numpy(), [[1, 2]])
    np.testing.assert_array_equal(order.numpy(), [[0, 2, 1]])
    with pytest.raises(F.Deinitialized):
        top.values.numpy()  # the values arm was a scope-owned result


def test_selection_argument_errors(ctx):
    x = _t(ctx, ("r", "c"), np.zeros((2, 3)))
    with pytest.raises(F.InvalidShape):
        x.top_k("c", 4, "k")
    with pytest.raises(F.InvalidShape):
        x.top_k("c", 0, "k")
    with pytest.raises(F.TagError):
        x.top_k("nope", 1, "k")
    with pytest.raises(F.TagError):
        x.top_k("c", 1, "r")  # out_tag collides with a kept tag
    with pytest.raises(F.TagError):
        x.sort("nope")
    assert not hasattr(F.Tensor("c", dtype="i64"), "top_k")
