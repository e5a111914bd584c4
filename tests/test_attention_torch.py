"""grouped_attention against torch's scaled_dot_product_attention (explicit masks).

Forward values and the gradients of a random-weighted sum with respect to q,
k and v, eager and compiled, over GQA maps, causal offsets (more kv positions
than queries), windows, bidirectional attention with a bias, f16 caches,
strided operands and sizes that are not multiples of the kernel's blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

torch = pytest.importorskip("torch")

Q = F.Tensor("seq", "head", "d")
KV = F.Tensor("seq", "kv_head", "d")


def torch_attention(q, k, v, kvmap, scale, causal, window=0, bias=None):
    """Reference: SDPA over kv heads gathered per query head, masks built explicitly."""
    S, KVn = q.shape[0], k.shape[0]
    kk = k[:, list(kvmap), :].permute(1, 0, 2)
    vv = v[:, list(kvmap), :].permute(1, 0, 2)
    mask = torch.zeros(S, KVn)
    if causal:
        p = torch.arange(S)[:, None] + (KVn - S)
        j = torch.arange(KVn)[None, :]
        ok = j <= p
        if window:
            ok &= j >= p - window + 1
        mask = torch.where(ok, 0.0, float("-inf"))
    if bias is not None:
        mask = mask + bias
    out = torch.nn.functional.scaled_dot_product_attention(
        q.permute(1, 0, 2), kk, vv, attn_mask=mask, scale=scale)
    return out.permute(1, 0, 2).reshape(S, -1)


CASES = [
    # S, KV, H, KH, D, mask, window
    (5, 5, 1, 1, 2, "causal", 0),
    (70, 70, 2, 2, 8, "causal", 0),
    (33, 100, 4, 2, 7, "causal", 0),      # GQA, decode-style offset, odd d
    (130, 130, 3, 1, 64, "causal", 17),   # multi-query, window
    (1, 150, 4, 1, 16, "causal", 0),      # one decode step over a cache
    (65, 129, 2, 2, 5, "bidirectional", 0),
    (90, 90, 4, 2, 12, "causal", 64),     # window equal to a block
    (1, 1100, 4, 1, 16, "causal", 0),     # few tasks over a long cache: keys split
    (3, 2100, 2, 2, 8, "causal", 700),    # split keys with a window
    (2, 1500, 3, 3, 8, "bidirectional", 0),
]


def _data(rng, S, KVn, H, KH, D):
    q = rng.standard_normal((S, H, D)).astype(np.float32)
    k = rng.standard_normal((KVn, KH, D)).astype(np.float32)
    v = rng.standard_normal((KVn, KH, D)).astype(np.float32)
    w = rng.standard_normal((S, H * D)).astype(np.float32)
    return q, k, v, w


def _kvmap(H, KH):
    return [h * KH // H for h in range(H)]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_grouped_attention_matches_torch(case, compiled, ctx):
    S, KVn, H, KH, D, mask, window = case
    rng = np.random.default_rng(S * 7 + KVn)
    q0, k0, v0, w0 = _data(rng, S, KVn, H, KH, D)
    kvmap = _kvmap(H, KH)
    scale = 1.0 / np.sqrt(D)
    q = Q.variable_from_slice(ctx, q0.shape, q0)
    k = KV.variable_from_slice(ctx, k0.shape, k0)
    v = KV.variable_from_slice(ctx, v0.shape, v0)
    w = F.Tensor("seq", "out").from_slice(ctx, w0.shape, w0)

    def step(q, k, v, w):
        y = q.grouped_attention(k, v, kvmap, "out", scale, mask=mask, window=window)
        y.mul(w).sum_all().backward()
        return y

    y = (F.compile(step) if compiled else step)(q, k, v, w)
    assert y.axis_tags == ("seq", "out")
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q0, k0, v0))
    yt = torch_attention(tq, tk, tv, kvmap, scale, mask == "causal", window)
    (yt * torch.tensor(w0)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=2e-5)
    for mine, ref in ((q, tq), (k, tk), (v, tv)):
        np.testing.assert_allclose(mine.grad().numpy(), ref.grad.numpy(), rtol=1e-4, atol=5e-5)


def test_compiled_equals_eager_and_is_not_stale(ctx):
    rng = np.random.default_rng(3)
    q0, k0, v0, _ = _data(rng, 40, 40, 4, 2, 16)
    fast = F.compile(lambda q, k, v: q.grouped_attention(k, v, [0, 0, 1, 1], "o", 0.25))
    for shift in (0.0, 1.5):
        q = Q.from_slice(ctx, q0.shape, q0 + shift)
        k = KV.from_slice(ctx, k0.shape, k0)
        v = KV.from_slice(ctx, v0.shape, v0 - shift)
        want = q.grouped_attention(k, v, [0, 0, 1, 1], "o", 0.25).numpy()
        np.testing.assert_allclose(fast(q, k, v).numpy(), want, rtol=1e-6, atol=1e-6)


def test_bias_bidirectional_inference(ctx):
    rng = np.random.default_rng(4)
    S, KVn, H, KH, D = 6, 1100, 2, 2, 16  # few tasks over many keys: split key ranges
    q0, k0, v0, _ = _data(rng, S, KVn, H, KH, D)
    b0 = rng.standard_normal((S, KVn)).astype(np.float32)
    b0[3, :] = -np.inf  # a row masked out entirely by the bias
    b0[3, 7] = 0.0
    q, k, v = Q.from_slice(ctx, q0.shape, q0), KV.from_slice(ctx, k0.shape, k0), \
        KV.from_slice(ctx, v0.shape, v0)
    b = F.Tensor("seq", "src").from_slice(ctx, b0.shape, b0)
    want = torch_attention(torch.tensor(q0), torch.tensor(k0), torch.tensor(v0), [0, 1], 0.3,
                           False, bias=torch.tensor(b0)).numpy()

    def f(q, k, v, b):
        return q.grouped_attention(k, v, [0, 1], "o", 0.3, mask="bidirectional", bias=b)

    np.testing.assert_allclose(f(q, k, v, b).numpy(), want, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(F.compile(f)(q, k, v, b).numpy(), want, rtol=1e-4, atol=2e-5)
    qg = Q.variable_from_slice(ctx, q0.shape, q0)
    with pytest.raises(F.UnsupportedGradient):
        f(qg, k, v, b)
    with F.no_grad():
        np.testing.assert_allclose(f(qg, k, v, b).numpy(), want, rtol=1e-4, atol=2e-5)


def test_f16_cache_gives_q_gradient_only(ctx):
    rng = np.random.default_rng(5)
    S, KVn, H, KH, D = 3, 50, 4, 2, 32
    q0, k0, v0, w0 = _data(rng, S, KVn, H, KH, D)
    k16, v16 = k0.astype(np.float16), v0.astype(np.float16)
    K16 = F.Tensor("seq", "kv_head", "d", dtype="f16")
    q = Q.variable_from_slice(ctx, q0.shape, q0)
    k, v = K16.from_slice(ctx, k16.shape, k16), K16.from_slice(ctx, v16.shape, v16)
    y = q.grouped_attention(k, v, [0, 0, 1, 1], "o", 0.2)
    y.mul(F.Tensor("seq", "o").from_slice(ctx, w0.shape, w0)).sum_all().backward()
    tq = torch.tensor(q0, requires_grad=True)
    yt = torch_attention(tq, torch.tensor(k16.astype(np.float32)),
                         torch.tensor(v16.astype(np.float32)), [0, 0, 1, 1], 0.2, True)
    (yt * torch.tensor(w0)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(q.grad().numpy(), tq.grad.numpy(), rtol=1e-4, atol=5e-5)


def test_strided_operands(ctx):
    """q/k/v that are permuted or sliced views reach the kernel without a wrong stride."""
    rng = np.random.default_rng(6)
    S, H, D = 37, 3, 8
    base = rng.standard_normal((H, S, 2 * D)).astype(np.float32)
    hsd = F.Tensor("head", "seq", "d").variable_from_slice(ctx, base.shape, base)
    q = hsd.narrow("d", 0, D).permute_to(("seq", "head", "d"))
    kv = hsd.narrow("d", D, D).permute_to(("seq", "head", "d")).with_tags(
        ("seq", "kv_head", "d"))
    assert not q.is_contiguous()
    y = q.grouped_attention(kv, kv, [0, 1, 2], "o", 0.5)
    w0 = rng.standard_normal((S, H * D)).astype(np.float32)
    y.mul(F.Tensor("seq", "o").from_slice(ctx, w0.shape, w0)).sum_all().backward()
    tb = torch.tensor(base, requires_grad=True)
    tq = tb[:, :, :D].permute(1, 0, 2)
    tkv = tb[:, :, D:].permute(1, 0, 2)
    yt = torch_attention(tq, tkv, tkv, [0, 1, 2], 0.5, True)
    (yt * torch.tensor(w0)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(hsd.grad().numpy(), tb.grad.numpy(), rtol=1e-4, atol=5e-5)


def test_kv_map_as_tensor_eager_and_compiled(ctx):
    rng = np.random.default_rng(7)
    q0, k0, v0, _ = _data(rng, 9, 12, 3, 2, 4)
    q, k, v = Q.from_slice(ctx, q0.shape, q0), KV.from_slice(ctx, k0.shape, k0), \
        KV.from_slice(ctx, v0.shape, v0)
    M = F.Tensor("h", dtype="i32")

    def f(q, k, v, m):
        return q.grouped_attention(k, v, m, "o", 0.5)

    fast = F.compile(f)
    for kvmap in ([1, 0, 1], [0, 0, 0]):
        m = M.from_slice(ctx, (3,), kvmap)
        want = torch_attention(torch.tensor(q0), torch.tensor(k0), torch.tensor(v0), kvmap,
                               0.5, True).numpy()
        np.testing.assert_allclose(f(q, k, v, m).numpy(), want, rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(fast(q, k, v, m).numpy(), want, rtol=1e-4, atol=2e-5)
    bad = M.from_slice(ctx, (3,), [0, 2, 1])
    with pytest.raises(F.IndexOutOfBounds, match="kv_head"):
        f(q, k, v, bad)
    with pytest.raises(F.IndexOutOfBounds, match="kv_head"):
        fast(q, k, v, bad)


def test_gqa_gradient_sums_over_grouped_heads_and_unused_heads_get_zero(ctx):
    rng = np.random.default_rng(8)
    q0, k0, v0, w0 = _data(rng, 20, 20, 3, 3, 8)
    q = Q.variable_from_slice(ctx, q0.shape, q0)
    k = KV.variable_from_slice(ctx, k0.shape, k0)
    v = KV.variable_from_slice(ctx, v0.shape, v0)
    kvmap = [2, 0, 2]  # kv head 1 unused, kv head 2 shared
    y = q.grouped_attention(k, v, kvmap, "o", 0.35)
    y.mul(F.Tensor("seq", "o").from_slice(ctx, w0.shape, w0)).sum_all().backward()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q0, k0, v0))
    (torch_attention(tq, tk, tv, kvmap, 0.35, True) * torch.tensor(w0)).sum().backward()
    for mine, ref in ((q, tq), (k, tk), (v, tv)):
        np.testing.assert_allclose(mine.grad().numpy(), ref.grad.numpy(), rtol=1e-4, atol=5e-5)
    assert not k.grad().numpy()[:, 1].any()
