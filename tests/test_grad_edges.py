"""Gradients of binary pointwise ops at edge values: subnormal divisors, NaN operands of
maximum/minimum (torch's values), eager and compiled."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F


def test_division_gradient_at_a_subnormal_divisor(ctx):
    # Regression: d(a/b)/db was (g / b) (a / b): g / b overflowed at b = 1e-40, giving NaN
    # (times a zero quotient) and -inf where -g a / b^2 is 0 and -1.4e35 (torch's values).
    a0 = np.array([0.0, 1e-45, 3.0], np.float32)
    b0 = np.array([1e-40, 1e-40, 2.0], np.float32)

    def f(a, b):
        a.div(b).sum_all().backward()

    for run in (f, F.compile(f)):
        a = F.Tensor("i").variable_from_slice(ctx, (3,), a0)
        b = F.Tensor("i").variable_from_slice(ctx, (3,), b0)
        run(a, b)
        want = -(a0.astype(np.float64) / b0.astype(np.float64)) / b0.astype(np.float64)
        np.testing.assert_allclose(b.grad().numpy(), want, rtol=1e-6)
        with np.errstate(over="ignore"):
            want_a = (1.0 / b0.astype(np.float64)).astype(np.float32)  # inf, inf, 0.5
        np.testing.assert_allclose(a.grad().numpy(), want_a, rtol=1e-6)



@pytest.mark.parametrize("fn", ["maximum", "minimum"])
def test_maximum_minimum_gradients_with_a_nan_operand_reach_both(ctx, fn):
    # Regression: with a NaN on either side no operand "won", so both got 0; torch gives
    # the gradient to both (neither lost). Winners, losers and exact ties as before.
    a0 = np.array([1, 5, np.nan, 2, np.nan, np.inf], np.float32)
    b0 = np.array([3, 2, 1, 2, np.nan, np.inf], np.float32)
    big_a = [0.0, 1.0, 1.0, 0.5, 1.0, 0.5]
    big_b = [1.0, 0.0, 1.0, 0.5, 1.0, 0.5]
    want_a, want_b = (big_a, big_b) if fn == "maximum" else (big_b, big_a)

    def f(a, b):
        getattr(a, fn)(b).sum_all().backward()

    for run in (f, F.compile(f)):
        a = F.Tensor("i").variable_from_slice(ctx, (6,), a0)
        b = F.Tensor("i").variable_from_slice(ctx, (6,), b0)
        run(a, b)
        np.testing.assert_array_equal(a.grad().numpy(), want_a)
        np.testing.assert_array_equal(b.grad().numpy(), want_b)
