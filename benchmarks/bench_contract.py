"""Contractions: GEMM orientation from strides against numpy's pre-arranged matmul."""

from __future__ import annotations

import numpy as np

import fucina as F


def test_trans_b_dot(benchmark, ctx):
    a = F.Tensor("m", "k").randn(ctx, (1024, 1024), 4)
    w = F.Tensor("n", "k").randn(ctx, (1024, 1024), 5)
    benchmark(a.dot, w, "k")


def test_trans_b_numpy(benchmark, ctx):
    a = F.Tensor("m", "k").randn(ctx, (1024, 1024), 4).numpy()
    w = F.Tensor("n", "k").randn(ctx, (1024, 1024), 5).numpy()
    benchmark(lambda: a @ w.T)


def test_attention_scores(benchmark, ctx):
    q = F.Tensor("b", "h", "q", "d").randn(ctx, (8, 8, 256, 64), 6)
    k = F.Tensor("b", "h", "k", "d").randn(ctx, (8, 8, 256, 64), 7)
    benchmark(F.compile(lambda q, k: q.dot(k, "d")), q, k)


def test_attention_scores_numpy(benchmark, ctx):
    q = F.Tensor("b", "h", "q", "d").randn(ctx, (8, 8, 256, 64), 6).numpy()
    kt = np.ascontiguousarray(np.swapaxes(
        F.Tensor("b", "h", "k", "d").randn(ctx, (8, 8, 256, 64), 7).numpy(), 2, 3))
    benchmark(np.matmul, q, kt)


def test_linear_bias_gelu_compiled(benchmark, ctx):
    x = F.Tensor("t", "in").randn(ctx, (4096, 256), 8)
    w = F.Tensor("out", "in").randn(ctx, (1024, 256), 9)
    b = F.Tensor("out").randn(ctx, (1024,), 10)
    benchmark(F.compile(lambda x, w, b: x.dot(w, "in").add(b).gelu()), x, w, b)
