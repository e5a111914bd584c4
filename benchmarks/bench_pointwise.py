"""Fused pointwise chains and row programs: fucina compiled vs eager vs numpy.

Run with ``python -m pytest benchmarks/bench_pointwise.py``; compare rows of
one run (the machine is shared and noisy).
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

N = 1 << 22


def _chain(x, w):
    return (x.mul(w).add_scalar(1.0).tanh().mul(x)).sigmoid()


@pytest.fixture
def chain_inputs(ctx):
    T = F.Tensor("i")
    return T.randn(ctx, (N,), 1), T.randn(ctx, (N,), 2)


def test_chain_compiled(benchmark, chain_inputs):
    fast = F.compile(_chain)
    benchmark(fast, *chain_inputs)


def test_chain_eager(benchmark, chain_inputs):
    benchmark(_chain, *chain_inputs)


def test_chain_numpy(benchmark, chain_inputs):
    x, w = (t.numpy() for t in chain_inputs)
    benchmark(lambda: 1.0 / (1.0 + np.exp(-(np.tanh(x * w + np.float32(1.0)) * x))))


def _softmax(x):
    e = x.sub(x.max("col")).exp()
    return e.div(e.sum("col"))


def test_softmax_compiled(benchmark, ctx):
    x = F.Tensor("row", "col").randn(ctx, (4096, 1024), 3)
    benchmark(F.compile(_softmax), x)


def test_softmax_numpy(benchmark, ctx):
    x = F.Tensor("row", "col").randn(ctx, (4096, 1024), 3).numpy()

    def softmax():
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    benchmark(softmax)


def test_tiny_eager_add(benchmark, ctx):
    a = F.Tensor("d").from_slice(ctx, (8,), np.arange(8))
    benchmark(a.add, a)
