"""Kernel edge values: division by tiny divisors, fast_tanh saturation."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

T = F.Tensor("d")


def _small(ctx, n=16):
    x0 = np.linspace(1e-36, 2e-35, n).astype(np.float32)  # x / 1e-40 is about 1e4..2e5
    return x0, T.from_slice(ctx, (n,), x0)


@pytest.mark.parametrize("n", [3, 16, 1000])  # scalar tail and vector loops
def test_division_by_a_tiny_divisor_stays_finite(ctx, n):
    x0, x = _small(ctx, n)
    d = np.float32(1e-40)  # subnormal: 1 / d overflows f32, x / d does not
    want = x0 / d
    assert np.all(np.isfinite(want))
    scalar = F.Tensor().from_slice(ctx, (1,), [1e-40])
    ways = {
        "div_scalar": lambda x: x.div_scalar(1e-40),
        "operator": lambda x: x / 1e-40,
        "scalar tensor": lambda x: x.div(scalar),
        "broadcast tensor": lambda x: x.div(T.from_slice(ctx, (n,), np.full(n, d))),
    }
    for name, fn in ways.items():
        for f in (fn, F.compile(fn)):
            np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-6, err_msg=name)


def test_fast_tanh_saturates_at_one(ctx):
    x0 = np.array([np.inf, -np.inf, 20.0, -20.0, 9.0, 8.5, np.nan, 0.0], dtype=np.float32)
    x = T.from_slice(ctx, (8,), x0)
    for f in (lambda t: t.fast_tanh(), F.compile(lambda t: t.fast_tanh())):
        y = f(x).numpy()
        np.testing.assert_array_equal(y[:4], [1.0, -1.0, 1.0, -1.0])
        assert abs(y[4] - 1.0) <= 4.4e-4 and abs(y[5] - np.tanh(8.5)) <= 4.4e-4
        assert np.isnan(y[6]) and y[7] == 0.0
        assert np.all(np.abs(y[~np.isnan(y)]) <= 1.0)


def test_fast_tanh_error_bound_and_gradient(ctx):
    x0 = np.linspace(-30, 30, 60001).astype(np.float32)
    x = T.variable_from_slice(ctx, x0.shape, x0)
    y = x.fast_tanh()
    err = np.abs(y.numpy().astype(np.float64) - np.tanh(x0.astype(np.float64)))
    assert err.max() <= 4.4e-4  # the documented bound
    y.sum_all().backward()
    g = x.grad().numpy()
    assert np.all(g[np.abs(x0) > 8.57] == 0.0)  # saturated: no slope
    inner = np.abs(x0) < 8.5
    fd = (np.tanh(x0[inner] + 1e-3) - np.tanh(x0[inner] - 1e-3)) / 2e-3
    assert np.max(np.abs(g[inner] - fd)) < 2e-2  # close to tanh's slope
