"""Unary and parameterized elementwise ops against PyTorch: forward values, input
gradients, edge values (skipped when torch is absent)."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import check_against_torch
from test_ops_unary import NON_FINITE

import fucina as F

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)


TF = torch.nn.functional


def _check(ctx, data, fu_op, torch_op, *, rtol=1e-5, atol=1e-6, tags=("a", "b")):
    """Forward values and the input gradient of fu_op vs torch_op on ``data``."""
    check_against_torch(ctx, tags, data, fu_op, torch_op, rng=RNG, rtol=rtol, atol=atol)


ANY = (RNG.standard_normal((3, 5)) * 2.5).astype(np.float32)
POS = (np.abs(RNG.standard_normal((3, 5))) * 2 + 0.2).astype(np.float32)

_TORCH_UNARY = {
    "relu": (ANY, torch.relu),
    "exp": (ANY, torch.exp),
    "sqrt": (POS, torch.sqrt),
    "rsqrt": (POS, torch.rsqrt),
    "sigmoid": (ANY, torch.sigmoid),
    "silu": (ANY, TF.silu),
    "log": (POS, torch.log),
    "log1p": (POS - 0.9, torch.log1p),
    "abs": (ANY, torch.abs),
    "sin": (ANY, torch.sin),
    "cos": (ANY, torch.cos),
    "tanh": (ANY, torch.tanh),
    "softcap30": (ANY * 20, lambda t: 30 * torch.tanh(t / 30)),
    "softcap15": (ANY * 10, lambda t: 15 * torch.tanh(t / 15)),
    "gelu": (ANY, lambda t: TF.gelu(t, approximate="tanh")),
    "quick_gelu": (ANY, lambda t: t * torch.sigmoid(1.702 * t)),
    "elu": (ANY, TF.elu),
    "gelu_erf": (ANY, TF.gelu),
    "floor": (ANY, torch.floor),
    "ceil": (ANY, torch.ceil),
    "round": (ANY, torch.round),
    "sign": (ANY, torch.sign),
    "reciprocal": (POS, torch.reciprocal),
    "neg": (ANY, torch.neg),
}


@pytest.mark.parametrize("name", sorted(_TORCH_UNARY))
def test_unary_forward_and_gradient_vs_torch(ctx, name):
    data, top = _TORCH_UNARY[name]
    _check(ctx, data, lambda x: getattr(x, name)(), top)


def test_unary_op_enum_forms_vs_torch(ctx):
    _check(ctx, ANY * 3, lambda x: x.unary("softplus"), TF.softplus)
    _check(ctx, ANY, lambda x: x.unary("softcap_30"), lambda t: 30 * torch.tanh(t / 30))
    _check(ctx, ANY, lambda x: x.unary("quick_gelu"), lambda t: t * torch.sigmoid(1.702 * t))

    def fast_tanh(t):
        a, b, c, d, e = 2.45550750702956, 0.893229853513558, 0.821226666969744, \
            2.44506634652299, 0.814642734961073
        at = t.abs()
        return t * (a + a * at + (b + c * at) * t * t) / (d + (d + t * t) * (t + e * t * at).abs())

    _check(ctx, ANY, lambda x: x.fast_tanh(), fast_tanh)
    # gelu_quant differentiates like the exact tanh gelu (forward is f16-rounded)
    x = F.Tensor("d").variable_from_slice(ctx, (5,), [-2.0, -0.5, 0.3, 1.7, 12.0])
    xt = torch.tensor([-2.0, -0.5, 0.3, 1.7, 12.0], requires_grad=True)
    with ctx.exec_scope():
        x.unary("gelu_quant").sum_all().backward()
    TF.gelu(xt, approximate="tanh").sum().backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_unary_edge_values_vs_torch(ctx):
    # Finite edge values against torch; non-finite ones against NON_FINITE.
    v = np.array([0.0, -0.0, 1e30, -1e30, 1e-40, -100.0, 100.0], dtype=np.float32)
    x = F.Tensor("d").from_slice(ctx, (v.size,), v)
    t = torch.tensor(v)
    pairs = {
        "relu": torch.relu, "exp": torch.exp, "sigmoid": torch.sigmoid, "silu": TF.silu,
        "tanh": torch.tanh, "gelu": lambda u: TF.gelu(u, approximate="tanh"),
        "gelu_erf": TF.gelu, "elu": TF.elu, "floor": torch.floor, "ceil": torch.ceil,
        "round": torch.round, "abs": torch.abs, "reciprocal": torch.reciprocal,
        "rsqrt": torch.rsqrt, "log1p": torch.log1p, "sqrt": torch.sqrt, "log": torch.log,
        "softcap30": lambda u: 30 * torch.tanh(u / 30),
    }
    assert set(pairs) == set(NON_FINITE)
    for name, top in pairs.items():
        np.testing.assert_allclose(getattr(x, name)().numpy(), top(t).numpy(), rtol=1e-5,
                                   atol=1e-30, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(x.unary("softplus").numpy(), TF.softplus(t).numpy(), rtol=1e-5,
                               atol=1e-30, equal_nan=True)
    np.testing.assert_allclose(x.clamp(-1, 1).numpy(), t.clamp(-1, 1).numpy(), equal_nan=True)
    np.testing.assert_allclose(x.leaky_relu(0.1).numpy(), TF.leaky_relu(t, 0.1).numpy(),
                               rtol=1e-6, equal_nan=True)


def test_parameterized_ops_vs_torch(ctx):
    data = np.array([[-2.0, -1.0, -0.5, 0.0, 0.5], [1.0, 1.5, 2.0, 3.0, -3.0]], np.float32)
    _check(ctx, data, lambda x: x.leaky_relu(0.2), lambda t: TF.leaky_relu(t, 0.2))
    # bounds hit exactly: torch passes the gradient at the bounds (inclusive)
    _check(ctx, data, lambda x: x.clamp(-1.0, 1.5), lambda t: t.clamp(-1.0, 1.5))
    _check(ctx, data, lambda x: x.clamp_min(0.5), lambda t: t.clamp_min(0.5))
    _check(ctx, data, lambda x: x.clamp_max(-0.5), lambda t: t.clamp_max(-0.5))


def test_pow_forward_and_both_gradients_vs_torch(ctx):
    a0 = POS
    b0 = RNG.standard_normal((5,)).astype(np.float32)
    a = F.Tensor("r", "c").variable_from_slice(ctx, a0.shape, a0)
    b = F.Tensor("c").variable_from_slice(ctx, b0.shape, b0)
    at = torch.tensor(a0, requires_grad=True)
    bt = torch.tensor(b0, requires_grad=True)
    with ctx.exec_scope():
        y = a.pow(b)
        np.testing.assert_allclose(y.numpy(), (at ** bt).detach().numpy(), rtol=1e-5)
        y.sum_all().backward()
    (at ** bt).sum().backward()
    np.testing.assert_allclose(a.grad().numpy(), at.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b.grad().numpy(), bt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_pow_domain_and_zero_conventions(ctx):
    av = np.array([-2.0, -2.0, 0.0, 0.0, 0.0, 3.0, 0.0], np.float32)
    bv = np.array([0.5, 2.0, 0.0, 2.0, -1.0, 0.0, 0.5], np.float32)
    a = F.Tensor("d").variable_from_slice(ctx, (7,), av)
    b = F.Tensor("d").variable_from_slice(ctx, (7,), bv)
    at = torch.tensor(av, requires_grad=True)
    bt = torch.tensor(bv, requires_grad=True)
    with ctx.exec_scope():
        y = a.pow(b)
        np.testing.assert_allclose(y.numpy(), (at ** bt).detach().numpy(), equal_nan=True)
        assert np.isnan(y.numpy()[0]) and y.numpy()[2] == 1.0
        y.sum_all().backward()
    (at ** bt).sum().backward()
    np.testing.assert_allclose(a.grad().numpy(), at.grad.numpy(), equal_nan=True, rtol=1e-6)
    np.testing.assert_allclose(b.grad().numpy(), bt.grad.numpy(), equal_nan=True, rtol=1e-6)


def test_pow_scalar_named_and_zero_exponent(ctx):
    _check(ctx, POS, lambda x: x.pow_scalar(2.5), lambda t: t ** 2.5, rtol=1e-4)
    _check(ctx, ANY, lambda x: x.pow_scalar(3), lambda t: t ** 3, rtol=1e-4, atol=1e-5)
    data = np.array([[0.0, 1.0, -2.0]], np.float32)
    _check(ctx, data, lambda x: x.pow_scalar(0), lambda t: t ** 0)
    _check(ctx, data, lambda x: x ** 0, lambda t: t ** 0)
    _check(ctx, POS, lambda x: x.pow(1.5), lambda t: t.pow(1.5), rtol=1e-4)
    with pytest.raises(TypeError):
        F.Tensor("d").from_slice(ctx, (1,), [1.0]).pow("2")
