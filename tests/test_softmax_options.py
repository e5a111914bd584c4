"""softmax's fused options (REFERENCE §4.10) without torch: the reference's snippet,
hand-computed values, eager == compiled, and every option check."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F


def test_snippet_softmax_and_the_fused_causal_extension(ctx):
    """REFERENCE §4.10: query 0 attends source 0 only; the masked-out tail is exactly 0."""
    x = F.Tensor("seq", "src").zeros(ctx, (2, 2))
    np.testing.assert_array_equal(x.softmax("src").data_const(), [0.5, 0.5, 0.5, 0.5])
    c = x.softmax("src", causal={"query_tag": "seq"})
    np.testing.assert_array_equal(c.data_const(), [1, 0, 0.5, 0.5])


def test_causal_source_offset(ctx):
    x = F.Tensor("q", "s").zeros(ctx, (2, 4))
    y = x.softmax("s", causal={"query_tag": "q", "source_offset": 2}).numpy()
    np.testing.assert_allclose(y, [[1 / 3, 1 / 3, 1 / 3, 0], [0.25] * 4], rtol=1e-6)
    assert y[0, 3] == 0.0


def test_sinks_absorb_probability_mass(ctx):
    x = F.Tensor("h", "s").zeros(ctx, (2, 3))
    y = x.softmax("s", head_tag="h", sinks=[0.0, np.log(3.0)]).numpy()
    # head 0: three zeros and a zero sink -> 1/4 each; head 1: sink weight 3 -> 1/6 each
    np.testing.assert_allclose(y, [[0.25] * 3, [1 / 6] * 3], rtol=1e-6)
    one = F.Tensor("s").zeros(ctx, (3,)).softmax("s", sinks=[0.0]).numpy()
    np.testing.assert_allclose(one, [0.25] * 3, rtol=1e-6)


def test_alibi_slopes_follow_ggml():
    from fucina.tensor.softmax import alibi_slopes

    # 8 heads (a power of two), max_bias 8: slope_h = 2**(-(h + 1))
    np.testing.assert_allclose(alibi_slopes(8, 8.0), 2.0 ** -np.arange(1, 9), rtol=1e-7)
    # 6 heads: 4 from m0 = 2**-2, then odd powers of m1 = 2**-1
    want = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    np.testing.assert_allclose(alibi_slopes(6, 8.0), want, rtol=1e-7)
    np.testing.assert_array_equal(alibi_slopes(3, 0.0), [1, 1, 1])


def test_alibi_scales_the_mask_per_head(ctx):
    mask0 = np.array([[0.0, -1.0, -2.0]], np.float32)
    x = F.Tensor("h", "q", "s").zeros(ctx, (2, 1, 3))
    mask = F.Tensor("q", "s").from_slice(ctx, (1, 3), mask0)
    y = x.softmax("s", mask=mask, max_bias=2.0, head_tag="h").numpy()
    for h, slope in enumerate([2.0 ** -1, 2.0 ** -2]):  # 2 heads, max_bias 2
        e = np.exp(slope * mask0[0])
        np.testing.assert_allclose(y[h, 0], e / e.sum(), rtol=1e-6)


def test_all_options_compiled_equal_eager_and_gradient(ctx):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((3, 5, 7)).astype(np.float32)
    m0 = rng.standard_normal((5, 7)).astype(np.float32)
    T = F.Tensor("head", "q", "s")
    m = F.Tensor("q", "s").from_slice(ctx, m0.shape, m0)
    opts = {"max_bias": 4.0, "head_tag": "head", "sinks": [0.5, -1.0, 2.0],
            "causal": {"query_tag": "q", "source_offset": 2}}

    def loss(x, m):
        y = x.softmax("s", 0.7, m, **opts)
        total = y.mul(y).sum_all()
        total.backward()
        return y

    xe = T.variable_from_slice(ctx, x0.shape, x0)
    xc = T.variable_from_slice(ctx, x0.shape, x0)
    ye = loss(xe, m)
    yc = F.compile(loss)(xc, m)
    np.testing.assert_allclose(yc.numpy(), ye.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(xc.grad().numpy(), xe.grad().numpy(), rtol=1e-5, atol=1e-7)
    assert (ye.numpy()[:, 0, 3:] == 0).all()  # query 0 sees sources 0..2 only
    # finite differences of the loss agree with the gradient
    eps = 1e-2
    g = xe.grad().numpy()
    for idx in [(0, 0, 0), (1, 4, 6), (2, 2, 3)]:
        xp, xm = x0.copy(), x0.copy()
        xp[idx] += eps
        xm[idx] -= eps
        lp = T.from_slice(ctx, x0.shape, xp).softmax("s", 0.7, m, **opts)
        lm = T.from_slice(ctx, x0.shape, xm).softmax("s", 0.7, m, **opts)
        fd = (float((lp.numpy() ** 2).sum()) - float((lm.numpy() ** 2).sum())) / (2 * eps)
        assert abs(fd - g[idx]) < 2e-3, (idx, fd, g[idx])


def test_option_errors(ctx):
    x = F.Tensor("h", "q", "s").zeros(ctx, (2, 3, 4))
    m = F.Tensor("q", "s").zeros(ctx, (3, 4))
    with pytest.raises(F.InvalidShape, match="mask"):
        x.softmax("s", max_bias=1.0, head_tag="h")
    with pytest.raises(F.InvalidShape, match="head_tag"):
        x.softmax("s", mask=m, max_bias=1.0)
    with pytest.raises(F.InvalidShape, match="head_tag"):
        x.softmax("s", sinks=[0.0, 1.0])
    with pytest.raises(F.InvalidDataLength, match="heads"):
        x.softmax("s", head_tag="h", sinks=[0.0, 1.0, 2.0])
    with pytest.raises(F.TagError):
        x.softmax("s", head_tag="nope", sinks=[0.0, 1.0])
    with pytest.raises(F.TagError):
        x.softmax("s", head_tag="s", sinks=[0.0])
    with pytest.raises(F.InvalidShape, match="source_offset"):
        x.softmax("s", causal={"query_tag": "q", "source_offset": 2})
    with pytest.raises(F.InvalidShape):
        x.softmax("s", causal={"query_tag": "q", "source_offset": -1})
    with pytest.raises(F.TagError):
        x.softmax("s", causal={"query_tag": "s"})
    with pytest.raises(F.TagError):
        x.softmax("s", causal={"query_tag": "t"})
    with pytest.raises(TypeError, match="unknown"):
        x.softmax("s", causal={"query_tag": "q", "offset": 0})
    with pytest.raises(TypeError):
        x.softmax("s", causal="q")
    with pytest.raises(TypeError):
        x.softmax("s", causal={"source_offset": 0})
    with pytest.raises(TypeError):
        x.softmax("s", windowed=True)  # misspelled option
    with pytest.raises(TypeError, match="max_bias"):
        x.softmax("s", mask=m, max_bias="8", head_tag="h")
