"""Central finite differences against autograd, shared by the gradient test modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import fucina as F


def fd_check(ctx: F.ExecContext, tags: tuple[str, ...], shape: tuple[int, ...],
             build: Callable[[Any], Any], seed: int = 0, eps: float = 1e-3,
             tol: float = 2e-2) -> None:
    """d sum(build(x) * w) / dx by autograd vs central differences (float64 sums), for a
    random x and random weights w; ``build``'s other operands must live on ``ctx``."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(np.float32)
    T = F.Tensor(*tags)
    x = T.variable_from_slice(ctx, shape, x0)
    y = build(x)
    w = rng.standard_normal(y.shape).astype(np.float32)
    y.mul(type(y).from_slice(ctx, y.shape, w)).sum_all().backward()
    got = x.grad().numpy().reshape(-1)

    def f(v: np.ndarray) -> float:
        with F.no_grad():
            out = build(T.from_slice(ctx, shape, v)).numpy()
        return float((out.astype(np.float64) * w).sum())

    num = np.zeros(x0.size)
    flat = x0.reshape(-1)
    for i in range(flat.size):
        p, m = flat.copy(), flat.copy()
        p[i] += eps
        m[i] -= eps
        num[i] = (f(p.reshape(shape)) - f(m.reshape(shape))) / (2 * eps)
    np.testing.assert_allclose(got, num, atol=tol, rtol=tol)
