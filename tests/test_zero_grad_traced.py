"""Regression: ``x.zero_grad()`` on a variable inside ``fucina.compile`` is part of the
program (it was skipped while tracing, so compiled gradients kept accumulating across
calls where eager drops them)."""

from __future__ import annotations

import numpy as np

import fucina as F

W = F.Tensor("o", "i")
X = F.Tensor("b", "i")


def _run(ctx: F.ExecContext, compiled: bool) -> list[np.ndarray]:
    w = W.variable_from_slice(ctx, (2, 3), np.arange(6, dtype=np.float32) / 10)
    x = X.from_numpy(ctx, np.ones((4, 3), np.float32))

    def step(x: F.Tensor) -> F.Tensor:
        w.zero_grad()
        loss = x.dot(w, "i").tanh().sum_all()
        loss.backward()
        return loss

    fn = F.compile(step) if compiled else step
    grads = []
    for k in range(3):
        fn(x.scale(float(k + 1)))
        grads.append(w.grad().numpy().copy())
    return grads


def test_zero_grad_inside_compile_drops_the_gradient_every_call(ctx):
    eager = _run(ctx, False)
    compiled = _run(ctx, True)
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(c, e, rtol=1e-6, atol=1e-7)
    # hand check of the last call: d/dw sum(tanh(x.w)) with x = 3 * ones
    w = np.arange(6, dtype=np.float64).reshape(2, 3) / 10
    x = 3 * np.ones((4, 3))
    want = ((1 - np.tanh(x @ w.T) ** 2).T @ x)
    np.testing.assert_allclose(compiled[-1], want, rtol=1e-4)


def test_zero_grad_on_an_intermediate_inside_compile_matches_eager(ctx):
    w = W.variable_from_slice(ctx, (2, 3), np.arange(6, dtype=np.float32))

    def f(x: F.Tensor) -> F.Tensor:
        h = x.dot(w, "i")
        h.zero_grad()
        return h.sum_all()

    x = X.from_numpy(ctx, np.ones((4, 3), np.float32))
    np.testing.assert_allclose(F.compile(f)(x).item(), f(x).item())
