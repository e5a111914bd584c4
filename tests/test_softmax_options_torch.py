"""softmax's fused options against torch: causal masks, ALiBi, sinks (the gpt-oss
formulation: an extra logit column dropped after the softmax), values and gradients,
eager and compiled, on f32 and through the f16 branch."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

torch = pytest.importorskip("torch")


def torch_softmax(x, scale, mask, slopes, sinks, causal_offset):
    """x: [head, q, s] torch tensor."""
    H, Q, S = x.shape
    z = x * scale
    if mask is not None:
        z = z + torch.tensor(slopes)[:, None, None] * mask[None]
    if causal_offset is not None:
        ok = torch.arange(S)[None, :] <= torch.arange(Q)[:, None] + causal_offset
        z = z.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        col = torch.tensor(sinks, dtype=torch.float32)[:, None, None].expand(H, Q, 1)
        return torch.softmax(torch.cat((z, col), dim=-1), dim=-1)[..., :S]
    return torch.softmax(z, dim=-1)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("opts", [
    {"causal": 0}, {"causal": 3}, {"alibi": 8.0}, {"sinks": True},
    {"alibi": 5.0, "sinks": True, "causal": 1},
])
def test_softmax_options_match_torch(opts, compiled, ctx):
    from fucina.tensor.softmax import alibi_slopes

    rng = np.random.default_rng(len(opts) + 7 * opts.get("causal", 0))
    H, Q, S = 6, 5, 9
    x0 = rng.standard_normal((H, Q, S)).astype(np.float32) * 2
    m0 = rng.standard_normal((Q, S)).astype(np.float32)
    w0 = rng.standard_normal((H, Q, S)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32) if opts.get("sinks") else None
    kw = {}
    mask = None
    slopes = np.ones(H, np.float32)
    if "alibi" in opts:
        mask = F.Tensor("q", "s").from_slice(ctx, m0.shape, m0)
        kw.update(max_bias=opts["alibi"], head_tag="head")
        slopes = alibi_slopes(H, opts["alibi"])
    if sinks is not None:
        kw.update(head_tag="head", sinks=sinks)
    if "causal" in opts:
        kw["causal"] = {"query_tag": "q", "source_offset": opts["causal"]}
    T = F.Tensor("head", "q", "s")
    x = T.variable_from_slice(ctx, x0.shape, x0)
    w = T.from_slice(ctx, w0.shape, w0)

    def step(x, w, mask):
        y = x.softmax("s", 0.8, mask, **kw)
        y.mul(w).sum_all().backward()
        return y

    y = (F.compile(step) if compiled else step)(x, w, mask)
    xt = torch.tensor(x0, requires_grad=True)
    yt = torch_softmax(xt, 0.8, torch.tensor(m0) if mask is not None else None, slopes, sinks,
                       opts.get("causal"))
    (yt * torch.tensor(w0)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_half_branch_options(ctx):
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((2, 3, 4)).astype(np.float16)
    x = F.Tensor("head", "q", "s", dtype="f16").from_slice(ctx, x0.shape, x0)
    y = x.softmax("s", causal={"query_tag": "q", "source_offset": 1}, head_tag="head",
                  sinks=[0.0, 1.0])
    assert y.dtype is F.f16
    want = torch_softmax(torch.tensor(x0.astype(np.float32)), 1.0, None, None, [0.0, 1.0], 1)
    np.testing.assert_allclose(y.numpy().astype(np.float32), want.numpy(), atol=1e-3)
