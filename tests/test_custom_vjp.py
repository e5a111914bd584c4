"""custom_vjp: user-written backward rules, their checks, eager and compiled."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

D = F.Tensor("d")


class ScaledSquare:
    """y = extra * x^2 (the reference's example)."""

    Output = F.Tensor("d")

    @staticmethod
    def forward(extra, x):
        return x.mul(x).scale(extra)

    @staticmethod
    def backward(extra, inputs, output, grad_output):
        return grad_output.mul(inputs[0].scale(2 * extra))


def test_scaled_square_values_and_gradient(ctx):
    x = D.variable_from_slice(ctx, (3,), [1, -2, 3])
    y = F.custom_vjp(ScaledSquare, 0.5, (x,))
    assert type(y) is D and y.requires_grad
    np.testing.assert_array_equal(y.numpy(), [0.5, 2.0, 4.5])
    y.backward_with_grad(D.from_slice(ctx, (3,), [1, 10, 100]))
    np.testing.assert_array_equal(x.grad().numpy(), [1, -20, 300])  # g * 2 * 0.5 * x


def test_reference_custom_vjp_validated_by_gradcheck(ctx):
    x = D.variable_from_slice(ctx, (3,), [1, -2, 3])
    res = F.gradcheck(lambda x: F.custom_vjp(ScaledSquare, 0.5, (x,)).sum_all(), (x,))
    assert res.checked == 3 and res.passed
    assert res.max_abs_error < 1e-2


class StraightThroughRound:
    """round(x) forward, identity backward (a straight-through estimator)."""

    @staticmethod
    def forward(extra, x):
        return x.round()

    @staticmethod
    def backward(extra, inputs, output, grad_output):
        return (grad_output,)


def test_straight_through_estimator(ctx):
    x = D.variable_from_slice(ctx, (4,), [0.2, 1.7, -2.4, 3.5])
    y = F.custom_vjp(StraightThroughRound, None, [x])
    np.testing.assert_array_equal(y.numpy(), [0, 2, -2, 4])
    y.scale(3.0).sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [3, 3, 3, 3])  # round's own VJP is 0


class WeightedSum:
    """out[b] = scale * sum_i x[b, i] * w[i]; ``extra`` carries the scale and a log."""

    @staticmethod
    def forward(extra, x, w):
        extra["seen"].append((x.requires_grad, x.mul(w).requires_grad))
        return x.mul(w).sum("i").scale(extra["scale"])

    @staticmethod
    def backward(extra, inputs, output, grad_output):
        x, w = inputs
        assert not x.requires_grad and not grad_output.requires_grad
        gx = grad_output.mul(w).scale(extra["scale"])  # tags (b, i)
        gw = x.mul(grad_output).sum("b").scale(extra["scale"]) if extra["w_grad"] else None
        return gx, gw


def test_two_inputs_forward_records_nothing_and_constant_gets_none(ctx):
    extra = {"scale": 2.0, "seen": [], "w_grad": False}
    x = F.Tensor("b", "i").variable_from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    w = F.Tensor("i").from_slice(ctx, (3,), [1, 0, -1])
    y = F.custom_vjp(WeightedSum, extra, (x, w))
    assert extra["seen"] == [(True, False)]  # inputs keep requiring grad; nothing records
    np.testing.assert_array_equal(y.numpy(), [-4, -4])
    y.backward_with_grad(F.Tensor("b").from_slice(ctx, (2,), [1, 10]))
    np.testing.assert_array_equal(x.grad().numpy(), [[2, 0, -2], [20, 0, -20]])

    extra["w_grad"] = True
    wv = F.Tensor("i").variable_from_slice(ctx, (3,), [1, 0, -1])
    x2 = F.Tensor("b", "i").variable_from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    F.custom_vjp(WeightedSum, extra, (x2, wv)).backward_with_grad(
        F.Tensor("b").from_slice(ctx, (2,), [1, 10]))
    np.testing.assert_array_equal(wv.grad().numpy(), [2 * 41, 2 * 52, 2 * 63])


def test_no_grad_and_constant_inputs_never_call_backward(ctx):
    class Boom:
        @staticmethod
        def forward(extra, x):
            return x.scale(2.0)

        @staticmethod
        def backward(extra, inputs, output, grad_output):
            raise AssertionError("backward must not run")

    x = D.variable_from_slice(ctx, (2,), [1, 2])
    with F.no_grad():
        y = F.custom_vjp(Boom, None, (x,))
    assert not y.requires_grad
    y2 = F.custom_vjp(Boom, None, (D.from_slice(ctx, (2,), [1, 2]),))
    assert not y2.requires_grad
    np.testing.assert_array_equal(y2.numpy(), [2, 4])


def _spec(backward, output=None):
    attrs = {"forward": staticmethod(lambda extra, x: x.scale(2.0)),
             "backward": staticmethod(backward)}
    if output is not None:
        attrs["Output"] = output
    return type("Spec", (), attrs)


def test_backward_results_are_checked(ctx):
    def run(backward):
        x = D.variable_from_slice(ctx, (2,), [1, 2])
        F.custom_vjp(_spec(backward), None, (x,)).sum_all().backward()
        return x

    with pytest.raises(F.MissingBackwardGradient, match="input 0"):
        run(lambda e, ins, out, g: None)
    with pytest.raises(F.ShapeMismatch, match="gradient 0"):
        run(lambda e, ins, out, g: D.from_slice(ctx, (3,), [1, 2, 3]))
    with pytest.raises(F.TagError, match="gradient 0"):
        run(lambda e, ins, out, g: F.Tensor("e").from_slice(ctx, (2,), [1, 2]))
    with pytest.raises(TypeError, match="1 gradient"):
        run(lambda e, ins, out, g: (g, g))
    with pytest.raises(TypeError, match="fucina tensor or None"):
        run(lambda e, ins, out, g: [np.ones(2)])


def test_permuted_gradient_tags_are_aligned(ctx):
    class Transposed:
        @staticmethod
        def forward(extra, x):
            return x.scale(1.0)

        @staticmethod
        def backward(extra, inputs, output, grad_output):
            return grad_output.permute_to(("c", "r")).materialize()

    x = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), np.arange(6))
    F.custom_vjp(Transposed, None, (x,)).backward_with_grad(
        F.Tensor("r", "c").from_slice(ctx, (2, 3), np.arange(6) * 10))
    np.testing.assert_array_equal(x.grad().numpy(), np.arange(6).reshape(2, 3) * 10)


def test_spec_and_output_type_are_checked(ctx):
    x = D.variable_from_slice(ctx, (2,), [1, 2])
    with pytest.raises(F.TagError, match="Output"):
        F.custom_vjp(_spec(lambda *a: None, output=F.Tensor("e")), None, (x,))
    with pytest.raises(TypeError, match="Output must be a tensor type"):
        F.custom_vjp(_spec(lambda *a: None, output=int), None, (x,))
    with pytest.raises(TypeError, match="no callable backward"):
        F.custom_vjp(type("S", (), {"forward": staticmethod(lambda e, x: x)}), None, (x,))
    bad_forward = type("S", (), {"forward": staticmethod(lambda e, x: 3.0),
                                 "backward": staticmethod(lambda *a: None)})
    with pytest.raises(TypeError, match="forward must return one fucina tensor"):
        F.custom_vjp(bad_forward, None, (x,))
    with pytest.raises(TypeError, match="tuple or list"):
        F.custom_vjp(ScaledSquare, 0.5, x)


def test_compiled_custom_vjp_equals_eager(ctx):
    def step(x, w):
        h = F.custom_vjp(ScaledSquare, 0.25, (x.mul(w),))
        loss = h.tanh().sum_all()
        loss.backward()
        return loss

    vals = np.linspace(-2, 2, 8)

    def make():
        return (D.variable_from_slice(ctx, (8,), vals),
                D.variable_from_slice(ctx, (8,), vals[::-1]))

    eager, comp = make(), make()
    want = step(*eager).item()
    got = F.compile(step)(*comp).item()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(eager, comp):
        np.testing.assert_allclose(b.grad().numpy(), a.grad().numpy(), rtol=1e-5, atol=1e-7)


def test_compiled_custom_vjp_over_a_captured_weight(ctx):
    def make():
        w = D.variable_from_slice(ctx, (8,), np.linspace(-1, 1, 8))

        def step(x):
            loss = F.custom_vjp(ScaledSquare, 0.5, (x.mul(w),)).sum_all()
            loss.backward()
            return loss

        return w, step

    x = D.from_slice(ctx, (8,), np.linspace(0.5, 4, 8))
    w_eager, eager = make()
    w_comp, comp = make()
    fast = F.compile(comp)
    for _ in range(2):
        np.testing.assert_allclose(fast(x).item(), eager(x).item(), rtol=1e-6)
    # d/dw sum(0.5 (x w)^2) = x^2 w, accumulated over two calls
    want = 2 * np.linspace(0.5, 4, 8) ** 2 * np.linspace(-1, 1, 8)
    np.testing.assert_allclose(w_eager.grad().numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(w_comp.grad().numpy(), want, rtol=1e-5)
