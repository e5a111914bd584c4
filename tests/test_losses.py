"""cross_entropy against torch (values and gradients, every option)."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("ignore", [None, 1])
def test_cross_entropy_matches_torch(reduction, smoothing, ignore):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((4, 3, 5)).astype(np.float32)  # batch, class, seq
    labels = rng.integers(0, 3, (4, 5))
    ctx = F.ExecContext()
    x = F.Tensor("batch", "class", "seq").variable_from_slice(ctx, x0.shape, x0)
    loss = x.cross_entropy("class", labels.reshape(-1), reduction=reduction,
                           ignore_index=ignore, label_smoothing=smoothing)
    xt = torch.tensor(x0, requires_grad=True)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    if ignore is not None:
        kw["ignore_index"] = ignore
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(labels), **kw)
    np.testing.assert_allclose(loss.numpy().reshape(lt.shape), lt.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    if reduction == "none":
        assert loss.axis_tags == ("batch", "seq")
        g = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
        loss.backward_with_grad(type(loss).from_slice(ctx, (4, 5), g))
        lt.backward(torch.tensor(g))
    else:
        assert loss.axis_tags == ()
        loss.backward()
        lt.backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_softmax_family_matches_torch():
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((3, 4, 5)).astype(np.float32) * 3
    m0 = np.where(rng.random((4, 5)) < 0.3, -1e4, 0.0).astype(np.float32)
    ctx = F.ExecContext()
    x = F.Tensor("h", "q", "k").variable_from_slice(ctx, x0.shape, x0)
    mask = F.Tensor("q", "k").from_slice(ctx, m0.shape, m0)
    g0 = rng.standard_normal(x0.shape).astype(np.float32)
    for name, fu, tf in [
        ("softmax", lambda t: t.softmax("k"), lambda t: torch.softmax(t, -1)),
        ("scaled masked", lambda t: t.softmax("k", scale=0.5, mask=mask),
         lambda t: torch.softmax(t * 0.5 + torch.tensor(m0), -1)),
        ("over q", lambda t: t.softmax("q"), lambda t: torch.softmax(t, 1)),
        ("log_softmax", lambda t: t.log_softmax("k"), lambda t: torch.log_softmax(t, -1)),
    ]:
        x.zero_grad()
        y = fu(x)
        y.backward_with_grad(type(y).from_slice(ctx, y.shape, g0))
        xt = torch.tensor(x0, requires_grad=True)
        yt = tf(xt)
        yt.backward(torch.tensor(g0))
        np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    fast = F.compile(lambda t: t.softmax("k"))
    np.testing.assert_allclose(fast(x.detach()).numpy(), torch.softmax(torch.tensor(x0), -1),
                               rtol=1e-5, atol=1e-6)
    assert len(fast.kernels(x.detach())) == 1
    inf_row = F.Tensor("k").from_slice(ctx, (3,), [-np.inf, 0.0, np.inf])
    np.testing.assert_array_equal(inf_row.softmax("k").numpy()[:1], [0.0])
    half = x.detach().to("bf16").softmax("k")
    assert half.dtype is F.bf16
    widened = x.detach().to("bf16").to("f32")  # the same inputs, widened once
    np.testing.assert_array_equal(half.data_const(),
                                  widened.softmax("k").to("bf16").data_const())
