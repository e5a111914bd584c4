"""grouped_attention: the reference's snippet, hand-computed values and every input check."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

Q = F.Tensor("seq", "head", "d")
KV = F.Tensor("seq", "kv_head", "d")


def test_snippet_single_cached_position_returns_v(ctx):
    """REFERENCE §4.13: groupedAttention over a single cached position returns v."""
    q = Q.from_slice(ctx, (1, 1, 2), [1, 0])
    k = KV.from_slice(ctx, (1, 1, 2), [1, 1])
    v = KV.from_slice(ctx, (1, 1, 2), [5, 7])
    y = q.grouped_attention(k, v, [0], "out", 1.0)
    assert y.axis_tags == ("seq", "out")
    np.testing.assert_array_equal(y.data_const(), [5, 7])
    np.testing.assert_array_equal(F.compile(
        lambda q, k, v: q.grouped_attention(k, v, [0], "out", 1.0))(q, k, v).numpy(), [[5, 7]])


def test_hand_computed_two_keys(ctx):
    """Scores (s0, s1) -> softmax weights; causal keeps query 0 on key 0 only."""
    q = Q.from_slice(ctx, (2, 1, 1), [1.0, 2.0])
    k = KV.from_slice(ctx, (2, 1, 1), [1.0, -1.0])
    v = KV.from_slice(ctx, (2, 1, 1), [10.0, 20.0])
    causal = q.grouped_attention(k, v, [0], "o", 1.0).numpy().reshape(-1)
    p = np.exp([2.0, -2.0]) / np.exp([2.0, -2.0]).sum()  # query 1: scores 2, -2
    np.testing.assert_allclose(causal, [10.0, p @ [10.0, 20.0]], rtol=1e-6)
    both = q.grouped_attention(k, v, [0], "o", 1.0, mask="bidirectional").numpy().reshape(-1)
    p0 = np.exp([1.0, -1.0]) / np.exp([1.0, -1.0]).sum()
    np.testing.assert_allclose(both, [p0 @ [10.0, 20.0], p @ [10.0, 20.0]], rtol=1e-6)
    win = q.grouped_attention(k, v, [0], "o", 1.0, window=1).numpy().reshape(-1)
    np.testing.assert_allclose(win, [10.0, 20.0], rtol=1e-6)


def test_more_cached_positions_than_queries_are_the_last_positions(ctx):
    """API.md §8: queries are the last q_seq positions (causal offset kv_seq - q_seq)."""
    rng = np.random.default_rng(0)
    k0 = rng.standard_normal((6, 1, 4)).astype(np.float32)
    v0 = rng.standard_normal((6, 1, 4)).astype(np.float32)
    q0 = rng.standard_normal((6, 1, 4)).astype(np.float32)
    k, v = KV.from_slice(ctx, k0.shape, k0), KV.from_slice(ctx, v0.shape, v0)
    full = Q.from_slice(ctx, q0.shape, q0).grouped_attention(k, v, [0], "o", 0.5).numpy()
    tail = Q.from_slice(ctx, (2, 1, 4), q0[4:]).grouped_attention(k, v, [0], "o", 0.5).numpy()
    np.testing.assert_allclose(tail, full[4:], rtol=1e-6, atol=1e-6)


def test_tag_errors(ctx):
    q = Q.zeros(ctx, (2, 2, 4))
    k = KV.zeros(ctx, (2, 1, 4))
    with pytest.raises(F.TagError, match="query must be tagged"):
        F.Tensor("seq", "heads", "d").zeros(ctx, (2, 2, 4)).grouped_attention(
            k, k, [0, 0], "o", 1.0)
    with pytest.raises(F.TagError, match="k must be tagged"):
        q.grouped_attention(Q.zeros(ctx, (2, 1, 4)), k, [0, 0], "o", 1.0)
    with pytest.raises(F.TagError, match="v must be tagged"):
        q.grouped_attention(k, F.Tensor("seq", "d", "kv_head").zeros(ctx, (2, 4, 1)),
                            [0, 0], "o", 1.0)
    with pytest.raises(F.TagError):
        q.grouped_attention(k, k, [0, 0], "seq", 1.0)  # duplicate result tag
    with pytest.raises(F.TagError, match="mask"):
        q.grouped_attention(k, k, [0, 0], "o", 1.0, mask="full")
    with pytest.raises(F.TagError, match="window"):
        q.grouped_attention(k, k, [0, 0], "o", 1.0, mask="bidirectional", window=2)
    with pytest.raises(F.TagError, match="bidirectional"):
        q.grouped_attention(k, k, [0, 0], "o", 1.0, bias=F.Tensor("a", "b").zeros(ctx, (2, 2)))
    with pytest.raises(F.TagError, match="f32 or both f16"):
        q.grouped_attention(k, F.Tensor("seq", "kv_head", "d", dtype="f16").zeros(
            ctx, (2, 1, 4)), [0, 0], "o", 1.0)
    with pytest.raises(TypeError):
        q.grouped_attention(k, k, [0, 0], "o", 1.0, causal=True)  # misspelled option
    with pytest.raises(TypeError, match="k must be"):
        q.grouped_attention(np.zeros((2, 1, 4)), k, [0, 0], "o", 1.0)
    assert not hasattr(F.Tensor("seq", "head", "d", dtype="i32"), "grouped_attention")


def test_size_and_index_errors(ctx):
    q = Q.zeros(ctx, (3, 2, 4))
    k = KV.zeros(ctx, (3, 1, 4))
    with pytest.raises(F.ShapeMismatch, match="'d'"):
        q.grouped_attention(KV.zeros(ctx, (3, 1, 5)), KV.zeros(ctx, (3, 1, 5)), [0, 0], "o", 1)
    with pytest.raises(F.ShapeMismatch):
        q.grouped_attention(k, KV.zeros(ctx, (4, 1, 4)), [0, 0], "o", 1.0)
    with pytest.raises(F.ShapeMismatch, match="entries"):
        q.grouped_attention(k, k, [0], "o", 1.0)
    with pytest.raises(F.IndexOutOfBounds, match="kv_head"):
        q.grouped_attention(k, k, [0, 1], "o", 1.0)
    with pytest.raises(F.IndexOutOfBounds):
        q.grouped_attention(k, k, [0, -1], "o", 1.0)
    with pytest.raises(F.InvalidShape, match="causal"):
        Q.zeros(ctx, (4, 2, 4)).grouped_attention(k, k, [0, 0], "o", 1.0)
    with pytest.raises(F.InvalidShape, match="window"):
        q.grouped_attention(k, k, [0, 0], "o", 1.0, window=-1)
    with pytest.raises(F.ShapeMismatch, match="bias"):
        q.grouped_attention(k, k, [0, 0], "o", 1.0, mask="bidirectional",
                            bias=F.Tensor("a", "b").zeros(ctx, (3, 2)))
    with pytest.raises(TypeError, match="scale_value"):
        q.grouped_attention(k, k, [0, 0], "o", "1")
    other = F.ExecContext()
    with pytest.raises(F.ContextMismatch):
        q.grouped_attention(KV.zeros(other, (3, 1, 4)), k, [0, 0], "o", 1.0)
    # errors surface while tracing too, before any kernel runs
    with pytest.raises(F.IndexOutOfBounds):
        F.compile(lambda q, k: q.grouped_attention(k, k, [0, 3], "o", 1.0))(q, k)


def test_decode_loop_matches_full_causal(ctx):
    """Growing a cache one position per step equals one causal pass over the whole run."""
    rng = np.random.default_rng(2)
    n, H, KH, D = 7, 4, 2, 8
    q0 = rng.standard_normal((n, H, D)).astype(np.float32)
    k0 = rng.standard_normal((n, KH, D)).astype(np.float32)
    v0 = rng.standard_normal((n, KH, D)).astype(np.float32)
    kvmap = [0, 0, 1, 1]
    full = Q.from_slice(ctx, q0.shape, q0).grouped_attention(
        KV.from_slice(ctx, k0.shape, k0), KV.from_slice(ctx, v0.shape, v0), kvmap, "o",
        0.3).numpy()
    step = F.compile(lambda q, k, v: q.grouped_attention(k, v, kvmap, "o", 0.3))
    for t in range(n):
        q = Q.from_slice(ctx, (1, H, D), q0[t:t + 1])
        k = KV.from_slice(ctx, (t + 1, KH, D), k0[:t + 1])
        v = KV.from_slice(ctx, (t + 1, KH, D), v0[:t + 1])
        np.testing.assert_allclose(step(q, k, v).numpy(), full[t:t + 1], rtol=1e-5, atol=1e-6)


def _q8_0(values):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    raw = quantize(np.asarray(values, np.float32), GGMLQuantizationType.Q8_0)
    blocks = np.ascontiguousarray(raw).reshape(-1).view(F.BlockQ8_0)
    return blocks, dequantize(raw, GGMLQuantizationType.Q8_0).reshape(np.shape(values))


def test_q8_0_blocks_equal_the_dequantized_tensor_path(ctx):
    rng = np.random.default_rng(4)
    S, KVn, H, KH, D = 3, 70, 4, 2, 64
    q0 = rng.standard_normal((S, H, D)).astype(np.float32)
    kb, kd = _q8_0(rng.standard_normal((KVn, KH, D)))
    vb, vd = _q8_0(rng.standard_normal((KVn, KH, D)))
    q = Q.variable_from_slice(ctx, q0.shape, q0)
    got = q.grouped_attention(kb, vb, [0, 0, 1, 1], "o", 0.3, kv_seq=KVn, kv_heads=KH,
                              window=20)
    want = q.grouped_attention(KV.from_slice(ctx, kd.shape, kd), KV.from_slice(
        ctx, vd.shape, vd), [0, 0, 1, 1], "o", 0.3, window=20)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    got.sum_all().backward()  # q-gradient only: the cache is a constant
    g = q.grad().numpy()
    q.zero_grad()
    want.sum_all().backward()
    np.testing.assert_array_equal(g, q.grad().numpy())
    fast = F.compile(lambda q: q.grouped_attention(kb, vb, [0, 0, 1, 1], "o", 0.3,
                                                   kv_seq=KVn, kv_heads=KH, window=20))
    with F.no_grad():
        np.testing.assert_array_equal(fast(q).numpy(), want.numpy())
    with pytest.raises(F.InvalidDataLength, match="blocks"):
        q.grouped_attention(kb[:-1], vb, [0, 0, 1, 1], "o", 0.3, kv_seq=KVn, kv_heads=KH)
    with pytest.raises(F.TagError, match="kv_seq"):
        q.grouped_attention(kb, vb, [0, 0, 1, 1], "o", 0.3, kv_heads=KH)
    with pytest.raises(F.TagError):
        q.grouped_attention(kb, vb, [0, 0, 1, 1], "o", 0.3, kv_seq=KVn, kv_heads=KH,
                            mask="bidirectional")
    with pytest.raises(F.InvalidShape, match="block size"):
        Q.zeros(ctx, (1, 1, 16)).grouped_attention(kb, vb, [0], "o", 1.0, kv_seq=2,
                                                   kv_heads=1)
    with pytest.raises(F.TagError, match="same representation"):
        q.grouped_attention(kb, KV.from_slice(ctx, vd.shape, vd), [0, 0, 1, 1], "o", 0.3,
                            kv_seq=KVn, kv_heads=KH)


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_multi_stream_rows_equal_single_stream_calls(kind, ctx):
    rng = np.random.default_rng(5)
    H, KH, D = 4, 2, 32
    lens = [5, 1, 130]
    caps = [8, 3, 130]  # a stream's buffer may hold more positions than it uses
    q0 = rng.standard_normal((len(lens), H, D)).astype(np.float32)
    ks, vs, kf, vf = [], [], [], []
    for cap in caps:
        kk = rng.standard_normal((cap, KH, D)).astype(np.float32)
        vv = rng.standard_normal((cap, KH, D)).astype(np.float32)
        if kind == "f16":
            ks.append(kk.astype(np.float16))
            vs.append(vv.astype(np.float16))
            kf.append(kk.astype(np.float16).astype(np.float32))
            vf.append(vv.astype(np.float16).astype(np.float32))
        else:
            (kb, kd), (vb, vd) = _q8_0(kk), _q8_0(vv)
            ks.append(kb)
            vs.append(vb)
            kf.append(kd)
            vf.append(vd)
    q = Q.from_slice(ctx, q0.shape, q0)
    y = q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=lens, kv_heads=KH)
    assert y.axis_tags == ("seq", "o") and y.shape == (3, H * D)
    for s, n in enumerate(lens):
        one = Q.from_slice(ctx, (1, H, D), q0[s:s + 1]).grouped_attention(
            KV.from_slice(ctx, (n, KH, D), kf[s][:n]), KV.from_slice(ctx, (n, KH, D), vf[s][:n]),
            [0, 1, 1, 0], "o", 0.2)
        np.testing.assert_array_equal(y.numpy()[s:s + 1], one.numpy())
    fast = F.compile(lambda q: q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=lens,
                                                   kv_heads=KH))
    np.testing.assert_array_equal(fast(q).numpy(), y.numpy())
    lens_t = F.Tensor("s", dtype="i64").from_slice(ctx, (3,), lens)
    np.testing.assert_array_equal(
        q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=lens_t, kv_heads=KH).numpy(),
        y.numpy())
    traced = F.compile(lambda q, n: q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=n,
                                                        kv_heads=KH))
    with pytest.raises(F.UnsupportedView, match="grouped_attention: lens"):
        traced(q, lens_t)
    with pytest.raises(F.UnsupportedGradient):
        Q.variable_from_slice(ctx, q0.shape, q0).grouped_attention(
            ks, vs, [0, 1, 1, 0], "o", 0.2, lens=lens, kv_heads=KH)
    with pytest.raises(F.InvalidDataLength):
        q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=[5, 4, 130], kv_heads=KH)
    with pytest.raises(F.ShapeMismatch, match="streams"):
        q.grouped_attention(ks[:2], vs[:2], [0, 1, 1, 0], "o", 0.2, lens=lens[:2],
                            kv_heads=KH)
    with pytest.raises(F.TagError, match="lens"):
        q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, kv_heads=KH)
    with pytest.raises(F.TagError):
        q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=lens, kv_heads=KH, window=2)
    with pytest.raises(F.InvalidShape):
        q.grouped_attention(ks, vs, [0, 1, 1, 0], "o", 0.2, lens=[5, 0, 130], kv_heads=KH)
    with pytest.raises(TypeError, match="streams"):
        q.grouped_attention([np.zeros(3)] * 3, vs, [0, 1, 1, 0], "o", 0.2, lens=lens,
                            kv_heads=KH)


def test_tensor_kv_rejects_cache_options(ctx):
    q = Q.zeros(ctx, (2, 1, 4))
    k = KV.zeros(ctx, (2, 1, 4))
    with pytest.raises(F.TagError, match="kv_seq"):
        q.grouped_attention(k, k, [0], "o", 1.0, kv_seq=2)
    with pytest.raises(F.TagError):
        q.grouped_attention(k, k, [0], "o", 1.0, lens=[2, 2])


@pytest.mark.parametrize("mask,window", [("causal", 0), ("causal", 2), ("bidirectional", 0)])
def test_gradients_against_finite_differences(mask, window, ctx):
    """d sum(attention * w) / d(q, k, v) by autograd vs central differences (float64 sums)."""
    rng = np.random.default_rng(9)
    S, KVn, H, KH, D = 3, 5, 2, 1, 4
    arrays = {"q": rng.standard_normal((S, H, D)), "k": rng.standard_normal((KVn, KH, D)),
              "v": rng.standard_normal((KVn, KH, D))}
    w = rng.standard_normal((S, H * D))

    def attend(q, k, v):
        return q.grouped_attention(k, v, [0, 0], "o", 0.7, mask=mask, window=window)

    def value(vals):
        with F.no_grad():
            y = attend(Q.from_slice(ctx, (S, H, D), vals["q"]),
                       KV.from_slice(ctx, (KVn, KH, D), vals["k"]),
                       KV.from_slice(ctx, (KVn, KH, D), vals["v"])).numpy()
        return float((y.astype(np.float64) * w).sum())

    q = Q.variable_from_slice(ctx, (S, H, D), arrays["q"])
    k = KV.variable_from_slice(ctx, (KVn, KH, D), arrays["k"])
    v = KV.variable_from_slice(ctx, (KVn, KH, D), arrays["v"])
    attend(q, k, v).mul(F.Tensor("seq", "o").from_slice(ctx, w.shape, w)).sum_all().backward()
    eps = 1e-3
    for name, t in (("q", q), ("k", k), ("v", v)):
        got = t.grad().numpy().reshape(-1)
        base = arrays[name].astype(np.float32)
        for i in range(base.size):
            plus = dict(arrays)
            minus = dict(arrays)
            p, m = base.reshape(-1).copy(), base.reshape(-1).copy()
            p[i] += eps
            m[i] -= eps
            plus[name], minus[name] = p.reshape(base.shape), m.reshape(base.shape)
            fd = (value(plus) - value(minus)) / (2 * eps)
            assert abs(got[i] - fd) <= 2e-2 * (1 + abs(fd)), (name, i, got[i], fd)
