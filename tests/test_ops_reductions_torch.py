"""Reductions and scans against PyTorch: forward values and gradients (skipped when torch
is absent)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from oracle import check_against_torch, tensor

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
_t = tensor


_check = functools.partial(check_against_torch, rng=RNG)


TAGS = ("a", "b", "c")
DATA = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def test_max_min_first_occurrence_gradient_vs_torch(ctx):
    _check(ctx, TAGS, DATA, lambda x: x.max("b"), lambda t: t.max(1).values)
    _check(ctx, TAGS, DATA, lambda x: x.min("c"), lambda t: t.min(2).values)
    ties = np.float32([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -5, 4]])
    _check(ctx, ("r", "c"), ties, lambda x: x.max("c"), lambda t: t.max(1).values)
    _check(ctx, ("r", "c"), ties, lambda x: x.min("c"), lambda t: t.min(1).values)
    _check(ctx, ("r", "c"), ties, lambda x: x.max("r"), lambda t: t.max(0).values)


def test_max_nan_propagates_and_routes_gradient_to_the_nan(ctx):
    v = np.float32([[1, np.nan, 3, np.nan], [np.inf, 2, np.inf, -np.inf]])
    _check(ctx, ("r", "c"), v, lambda x: x.max("c"), lambda t: t.max(1).values)
    _check(ctx, ("r", "c"), v, lambda x: x.min("c"), lambda t: t.min(1).values)


def test_masked_max_mean_gradients(ctx):
    v = RNG.standard_normal((3, 5)).astype(np.float32)
    v[0, 4] = 10.0  # the unmasked max sits outside the selection
    m0 = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 1]], bool)
    m = _t(ctx, ("r", "c"), m0, "bool")

    def t_masked_max(t):
        return torch.where(torch.tensor(m0), t, torch.tensor(-np.inf)).max(1).values

    x = _t(ctx, ("r", "c"), v, variable=True)
    xt = torch.tensor(v, requires_grad=True)
    with ctx.exec_scope():
        y = x.max("c", mask=m, empty=0)
        np.testing.assert_allclose(y.numpy()[[0, 2]], t_masked_max(xt).detach().numpy()[[0, 2]])
        assert y.numpy()[1] == 0
        y.sum_all().backward()
    t_masked_max(xt)[[0, 2]].sum().backward()
    np.testing.assert_array_equal(x.grad().numpy(), xt.grad.numpy())  # empty lane: none

    x2 = _t(ctx, ("r", "c"), v, variable=True)
    with ctx.exec_scope():
        y = x2.mean("c", mask=m, empty=0)
        y.sum_all().backward()
    counts = m0.sum(1, keepdims=True)
    want = np.where(m0, 1.0 / np.maximum(counts, 1), 0)
    np.testing.assert_allclose(x2.grad().numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("rows", [
    [1.5, -2.0, 0.5, 3.0],    # no zero
    [1.5, 0.0, 0.5, 3.0],     # one zero
    [0.0, 2.0, 0.0, 3.0],     # two zeros
    [0.0, 0.0, 0.0, 0.0],
])
def test_prod_gradient_with_zeros_vs_torch(ctx, rows):
    data = np.float32([rows, [2.0, -1.0, 0.25, 4.0]])
    _check(ctx, ("r", "c"), data, lambda x: x.prod("c"), lambda t: t.prod(1))
    _check(ctx, ("r", "c"), data, lambda x: x.prod("r"), lambda t: t.prod(0))


@pytest.mark.parametrize("rows", [
    [1.5, -2.0, 0.5, 3.0, -0.7],
    [1.5, 0.0, 0.5, 3.0, 2.0],
    [0.0, 2.0, 0.0, 3.0, 1.0],
    [2.0, 3.0, 1.0, 0.5, 0.0],
    [0.0, 0.0, 0.0, 0.0, 0.0],
])
def test_cumsum_cumprod_gradients_vs_torch(ctx, rows):
    data = np.float32([rows, [2.0, -1.0, 0.25, 4.0, 0.5]])
    _check(ctx, ("r", "c"), data, lambda x: x.cumprod("c"), lambda t: t.cumprod(1),
           rtol=1e-5, atol=1e-5)
    _check(ctx, ("r", "c"), data, lambda x: x.cumprod("r"), lambda t: t.cumprod(0))
    _check(ctx, ("r", "c"), data, lambda x: x.cumsum("c"), lambda t: t.cumsum(1))
    _check(ctx, TAGS, DATA, lambda x: x.cumsum("b"), lambda t: t.cumsum(1))


def test_variance_vs_torch(ctx):
    for ddof in (0, 1):
        _check(ctx, TAGS, DATA, lambda x, d=ddof: x.variance("c", d),
               lambda t, d=ddof: t.var(2, correction=d))
        _check(ctx, TAGS, DATA, lambda x, d=ddof: x.variance("a", d),
               lambda t, d=ddof: t.var(0, correction=d))
    one = _t(ctx, ("r", "c"), np.float32([[1.0], [2.0]]), variable=True)
    v = one.variance("c", 1)
    assert np.isnan(v.numpy()).all()
    np.testing.assert_array_equal(one.variance("c", 0).numpy(), [0, 0])


@pytest.mark.parametrize("order,tord", [("l1", 1), ("l2", 2), ("inf", float("inf"))])
def test_norms_vs_torch(ctx, order, tord):
    _check(ctx, TAGS, DATA, lambda x: x.norm("c", order),
           lambda t: torch.linalg.vector_norm(t, ord=tord, dim=2))
    _check(ctx, TAGS, DATA, lambda x: x.norm_all(order),
           lambda t: torch.linalg.vector_norm(t, ord=tord))
    ties = np.float32([[1, -3, 3, 0], [2, -2, 2, 1]])
    _check(ctx, ("r", "c"), ties, lambda x: x.norm("c", order),
           lambda t: torch.linalg.vector_norm(t, ord=tord, dim=1))


def test_norm_defaults_and_l2_zero_lane(ctx):
    x = _t(ctx, ("r", "c"), np.float32([[3, 4], [0, 0]]), variable=True)
    np.testing.assert_array_equal(x.norm("c").numpy(), [5, 0])
    np.testing.assert_array_equal(x.norm("c", 2).numpy(), [5, 0])
    np.testing.assert_array_equal(x.norm_all(1).numpy(), [7])
    with x._ctx.exec_scope():
        x.norm("c").sum_all().backward()
    g = x.grad().numpy()
    np.testing.assert_allclose(g[0], [0.6, 0.8], rtol=1e-6)
    assert np.isnan(g[1]).all()  # sqrt'(0): NaN, as the reference documents


def test_logsumexp_vs_torch(ctx):
    _check(ctx, TAGS, DATA * 10, lambda x: x.logsumexp("c"), lambda t: torch.logsumexp(t, 2),
           rtol=1e-5, atol=1e-5)
    _check(ctx, TAGS, DATA, lambda x: x.logsumexp("a"), lambda t: torch.logsumexp(t, 0))
    big = np.float32([[1000, 1000, -1000], [-1e30, 5, 6]])
    # torch differentiates exp(x - lse) with lse rounded to f32 (ulp 6e-5 at 1000): rtol 1e-4
    _check(ctx, ("r", "c"), big, lambda x: x.logsumexp("c"), lambda t: torch.logsumexp(t, 1),
           rtol=1e-4)
    edge = np.float32([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0], [-np.inf, 2.0]])
    x = _t(ctx, ("r", "c"), edge)
    np.testing.assert_allclose(x.logsumexp("c").numpy(),
                               torch.logsumexp(torch.tensor(edge), 1).numpy(), equal_nan=True)


def test_any_all_vs_torch(ctx):
    v = np.float32([[0, 0, 0], [0, np.nan, 0], [1, 2, -3], [0, -0.0, 5]])
    x = _t(ctx, ("r", "c"), v)
    t = torch.tensor(v)
    np.testing.assert_array_equal(x.any("c").numpy(), torch.any(t, 1).numpy())
    np.testing.assert_array_equal(x.all("c").numpy(), torch.all(t, 1).numpy())
    np.testing.assert_array_equal(x.any("r").numpy(), torch.any(t, 0).numpy())
    assert x.any_all().item() == bool(torch.any(t)) and x.all_all().item() == bool(torch.all(t))
