"""Regression: a compiled max/min gradient whose input is recomputed in two loops.

The fused kernel computes ``v1 * x`` once for the max and again for the gradient's
``x == max`` mask. With ``reassoc`` on the whole kernel LLVM rounded the two
recomputations differently, the mask matched nothing and the gradient through the max
was lost (0.01 off, found by tests/test_compile.py's random programs). Only reduction
accumulators reassociate now.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

T = F.Tensor("a", "b")


def _loss(x: F.Tensor, fn: str) -> F.Tensor:
    v1 = x.scale(0.0654)
    y = getattr(v1.mul(x), fn)("b").mul(v1)
    return y.mul(y).sum_all()


def _grad(ctx: F.ExecContext, fn, x0: np.ndarray, reduce: str) -> np.ndarray:
    x = T.variable_from_slice(ctx, x0.shape, x0.reshape(-1))
    fn(x, reduce).backward()
    return x.grad().numpy().copy()


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_compiled_extremum_gradient_equals_eager_and_finite_differences(ctx, reduce):
    x0 = T.randn(ctx, (3, 4), 0).numpy().astype(np.float64)
    eager = _grad(ctx, _loss, x0.astype(np.float32), reduce)
    fast = F.compile(lambda x: _loss(x, reduce))
    compiled = _grad(ctx, lambda x, _: fast(x), x0.astype(np.float32), reduce)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)

    def f64(x: np.ndarray) -> float:  # the same loss in float64 numpy
        v1 = x * 0.0654
        m = getattr(np, reduce)(v1 * x, axis=1, keepdims=True)
        return float(((m * v1) ** 2).sum())

    fd = np.zeros_like(x0)
    h = 1e-6
    for i in np.ndindex(x0.shape):
        e = np.zeros_like(x0)
        e[i] = h
        fd[i] = (f64(x0 + e) - f64(x0 - e)) / (2 * h)
    np.testing.assert_allclose(eager, fd, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(compiled, fd, rtol=1e-3, atol=1e-4)
