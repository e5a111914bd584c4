"""The flash forward's tasks: column tiles grouped per task give the same bits as one
tile per task, for causal, windowed, biased, grouped-query and offset inputs."""

from __future__ import annotations

import numpy as np
import pytest

from fucina.errors import InvalidShape
from fucina.kernels import attention as att


def _inputs(S, KV, H, KH, D, seed):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((S, H, D)).astype(np.float32)
    k = rng.standard_normal((KV, KH, D)).astype(np.float32)
    v = rng.standard_normal((KV, KH, D)).astype(np.float32)
    return q, k, v


def _reference(q, k, v, kvmap, scale, causal, window, bias):  # type: ignore[no-untyped-def]
    """Plain float64 softmax attention: output [S, H, D]."""
    S, H, D = q.shape
    KV = k.shape[0]
    off = KV - S if causal else 0
    out = np.empty((S, H, D))
    for h in range(H):
        s = (q[:, h].astype(np.float64) * scale) @ k[:, kvmap[h]].astype(np.float64).T
        if bias is not None:
            s = s + bias
        for i in range(S):
            p = i + off
            for j in range(KV):
                if causal and (j > p or (window > 0 and j <= p - window)):
                    s[i, j] = -np.inf
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kvmap[h]]
    return out


@pytest.mark.parametrize("S,KV,H,KH,D,causal,window,with_bias", [
    (200, 200, 4, 4, 64, True, 0, False),      # several tiles per head, causal
    (150, 230, 6, 2, 32, True, 40, False),     # grouped query heads, offset, window
    (130, 130, 3, 3, 48, False, 0, True),      # bidirectional with a bias, D not 16k
    (70, 90, 5, 1, 16, True, 0, False),        # one kv head for five query heads
])
def test_grouped_tiles_are_bit_identical(S, KV, H, KH, D, causal, window, with_bias):
    q, k, v = _inputs(S, KV, H, KH, D, S + H)
    kvmap = np.arange(H) * KH // H
    bias = (np.random.default_rng(1).standard_normal((S, KV)).astype(np.float32)
            if with_bias else None)
    scale = 1.0 / np.sqrt(D)
    one = att.forward(q, k, v, kvmap, scale, causal, window, bias, group=1)
    for group in (2, 3, 8):
        np.testing.assert_array_equal(
            att.forward(q, k, v, kvmap, scale, causal, window, bias, group=group), one)
    want = _reference(q, k, v, kvmap, scale, causal, window, bias)
    got = one[:S * H * D].reshape(S, H, D)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_tasks_cover_every_column_once_in_whole_tiles():
    kvmap = np.array([1, 0, 1, 1, 0])
    S = 150
    heads, t_kh, t_c0, t_c1 = att.forward_tasks(kvmap, np.bincount(kvmap), S, group=2)
    np.testing.assert_array_equal(heads, [1, 4, 0, 2, 3])  # by kv head, stable
    # kv head 0: 300 columns from 0; kv head 1: 450 columns from 300; two 64-column
    # tiles per task, a short last task per kv head
    assert [int(x) for x in t_kh] == [0, 0, 0, 1, 1, 1, 1]
    assert [(int(a), int(b)) for a, b in zip(t_c0, t_c1)] == [
        (0, 128), (128, 256), (256, 300), (300, 428), (428, 556), (556, 684), (684, 750)]


def test_tiles_per_task_from_shapes():
    one_each, three_each = np.ones(32, np.int64), np.full(3, 3)
    assert att.tiles_per_task(one_each, 512) == 8  # 256 tiles
    assert att.tiles_per_task(one_each, 128) == 4  # 64 tiles
    assert att.tiles_per_task(np.ones(20, np.int64), 100) == 2  # 40 tiles
    assert att.tiles_per_task(three_each, 12) == 1  # a short prompt
    assert att.tiles_per_task(three_each, 1) == 1  # a decode step


def test_group_below_one_is_rejected():
    q, k, v = _inputs(4, 4, 1, 1, 8, 0)
    with pytest.raises(InvalidShape, match="group 0"):
        att.forward(q, k, v, np.zeros(1, np.int64), 1.0, True, 0, group=0)
