"""Masks, comparisons and conditionals against PyTorch: forward values and gradients
(skipped when torch is absent)."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import tensor

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)
_t = tensor


def test_where_gradients_vs_torch(ctx):
    a0 = RNG.standard_normal((3, 4)).astype(np.float32)
    b0 = RNG.standard_normal((3, 4)).astype(np.float32)
    m0 = RNG.random((3, 4)) > 0.5
    a = _t(ctx, ("r", "c"), a0, variable=True)
    b = _t(ctx, ("c", "r"), b0.T.copy(), variable=True)  # other in another tag order
    m = _t(ctx, ("r", "c"), m0, "bool")
    at = torch.tensor(a0, requires_grad=True)
    bt = torch.tensor(b0, requires_grad=True)
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    with ctx.exec_scope():
        y = a.where(m, b)
        yt = torch.where(torch.tensor(m0), at, bt)
        np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())
        y.mul(_t(ctx, ("r", "c"), w)).sum_all().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(a.grad().numpy(), at.grad.numpy())
    np.testing.assert_array_equal(b.grad().numpy(), bt.grad.numpy().T)


def test_masked_fill_gradient_vs_torch(ctx):
    x0 = RNG.standard_normal((3, 4)).astype(np.float32)
    m0 = RNG.random((3, 4)) > 0.5
    x = _t(ctx, ("r", "c"), x0, variable=True)
    xt = torch.tensor(x0, requires_grad=True)
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    with ctx.exec_scope():
        y = x.masked_fill(_t(ctx, ("r", "c"), m0, "bool"), -1e9)
        yt = xt.masked_fill(torch.tensor(m0), -1e9)
        np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())
        y.mul(_t(ctx, ("r", "c"), w)).sum_all().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(x.grad().numpy(), xt.grad.numpy())


def test_predicates_vs_torch(ctx):
    v = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -3e38, 1e-45], np.float32)
    x = _t(ctx, ("d",), v)
    t = torch.tensor(v)
    np.testing.assert_array_equal(x.isnan().numpy(), torch.isnan(t).numpy())
    np.testing.assert_array_equal(x.isinf().numpy(), torch.isinf(t).numpy())
    np.testing.assert_array_equal(x.isfinite().numpy(), torch.isfinite(t).numpy())


@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 3])
def test_tril_triu_vs_torch(ctx, offset):
    x0 = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    w = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    for name in ("tril", "triu"):
        x = _t(ctx, ("b", "i", "j"), x0, variable=True)
        xt = torch.tensor(x0, requires_grad=True)
        with ctx.exec_scope():
            y = getattr(x, name)("i", "j", offset)
            yt = getattr(torch, name)(xt, offset)
            np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())
            y.mul(_t(ctx, ("b", "i", "j"), w)).sum_all().backward()
        (yt * torch.tensor(w)).sum().backward()
        np.testing.assert_array_equal(x.grad().numpy(), xt.grad.numpy())
