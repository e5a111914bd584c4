"""gradcheck: central differences against the analytical backward."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina as F

D = F.Tensor("d")


class WrongSquare:
    """y = x^2 with a backward that is off by a factor 1.5 (a bug to catch)."""

    @staticmethod
    def forward(extra, x):
        return x.mul(x)

    @staticmethod
    def backward(extra, inputs, output, grad_output):
        return grad_output.mul(inputs[0].scale(3.0))


def test_builtin_ops_pass_and_errors_are_small(ctx):
    rng = np.random.default_rng(0)
    x = F.Tensor("r", "c").variable_from_slice(ctx, (3, 4), rng.standard_normal((3, 4)))
    w = F.Tensor("c", "k").variable_from_slice(ctx, (4, 2), rng.standard_normal((4, 2)))
    bias = F.Tensor("k").from_slice(ctx, (2,), [0.5, -0.5])  # a constant: passed through

    def loss(x, w, bias):
        # (softmax weighted over k: unweighted, its sum over k is 1 and w's gradient 0,
        # which left max_rel_error measuring rounding noise over rounding noise)
        return x.dot(w, "c").add(bias).tanh().softmax("k").mul(bias).mul(x.sum("c")).sum_all()

    res = F.gradcheck(loss, (x, w, bias), eps=1e-2)
    assert isinstance(res, F.GradcheckResult)
    assert res.checked == 12 + 8 and res.passed
    assert 0 < res.max_abs_error < 5e-3 and res.max_rel_error < 5e-2

    def unweighted(x, w, bias):
        return x.dot(w, "c").add(bias).tanh().softmax("k").mul(x.sum("c")).sum_all()

    res = F.gradcheck(unweighted, (x, w, bias), eps=1e-2)
    assert res.passed and res.max_abs_error < 5e-3
    unweighted(x, w, bias).backward()  # d/dx is 1 everywhere, d/dw is 0 (up to rounding)
    np.testing.assert_allclose(x.grad().numpy(), np.ones((3, 4)), rtol=1e-6)
    np.testing.assert_allclose(w.grad().numpy(), np.zeros((4, 2)), atol=1e-6)


def test_mismatch_reports_passed_false_with_the_error_size(ctx):
    x = D.variable_from_slice(ctx, (3,), [1, -2, 3])
    res = F.gradcheck(lambda x: F.custom_vjp(WrongSquare, None, (x,)).sum_all(), (x,))
    assert res.checked == 3 and not res.passed
    # analytical 3x, numerical 2x: the worst absolute error is |x| = 3, relative 1/3
    assert res.max_abs_error == pytest.approx(3.0, rel=1e-3)
    assert res.max_rel_error == pytest.approx(1 / 3, rel=1e-3)
    loose = F.gradcheck(lambda x: F.custom_vjp(WrongSquare, None, (x,)).sum_all(), (x,),
                        atol=0.0, rtol=0.34)
    assert loose.passed  # |2x - 3x| <= 0.34 * |3x|


def test_inputs_and_gradients_are_left_as_found(ctx):
    vals = np.array([0.1, -0.7, 2.3, 1e-3], dtype=np.float32)
    x = D.variable_from_slice(ctx, (4,), vals)
    w = D.variable_from_slice(ctx, (4,), [1, 2, 3, 4])  # reached through the closure
    x.mul(x).sum_all().backward()  # an existing gradient on the checked input
    before = x.grad().numpy()
    res = F.gradcheck(lambda x: x.mul(w).exp().sum_all(), (x,))
    assert res.passed
    np.testing.assert_array_equal(x.numpy(), vals)  # bit for bit
    np.testing.assert_array_equal(x.grad().numpy(), before)
    assert w.grad() is None


def test_option_and_input_errors(ctx):
    x = D.variable_from_slice(ctx, (2,), [1, 2])
    c = D.from_slice(ctx, (2,), [1, 2])

    def f(x):
        return x.sum_all()

    for kw in ({"eps": 0.0}, {"eps": -1e-3}, {"eps": math.nan}, {"atol": -1.0},
               {"rtol": math.inf}, {"eps": "big"}):
        with pytest.raises(F.InvalidGradcheckOptions):
            F.gradcheck(f, (x,), **kw)
    with pytest.raises(F.NoVariableInputs):
        F.gradcheck(f, (c,))
    with pytest.raises(F.MissingAnalyticalGradient, match="no gradient graph"):
        F.gradcheck(lambda x: c.sum_all(), (x,))
    y = D.variable_from_slice(ctx, (2,), [3, 4])
    with pytest.raises(F.MissingAnalyticalGradient, match="input 1"):
        F.gradcheck(lambda x, y: x.sum_all(), (x, y))
    with pytest.raises(F.TagError, match="scalar"):
        F.gradcheck(lambda x: x.scale(2.0), (x,))
    with pytest.raises(TypeError, match="scalar tensor"):
        F.gradcheck(lambda x: 1.0, (x,))
    big = D.variable_from_slice(ctx, (1,), [1e6])
    with pytest.raises(F.InvalidGradcheckOptions, match="larger eps"):
        F.gradcheck(lambda x: x.sum_all(), (big,), eps=1e-3)
    assert big.numpy()[0] == 1e6
    strided = F.Tensor("r", "c").from_slice(ctx, (2, 2), [1, 2, 3, 4]).permute_to(("c", "r"))
    m = F.Tensor("c", "r").variable(ctx, strided.as_raw_tensor())
    assert not m.is_contiguous()
    with pytest.raises(F.UnsupportedView, match="not contiguous"):
        F.gradcheck(lambda t: t.sum_all(), (m,))


def test_gradcheck_refuses_to_run_inside_compile(ctx):
    x = D.variable_from_slice(ctx, (2,), [1, 2])

    def step(x):
        F.gradcheck(lambda t: t.sum_all(), (x,))
        return x.sum_all()

    with pytest.raises(TypeError, match="outside fucina.compile"):
        F.compile(step)(x)
