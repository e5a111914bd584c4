"""fucina.compile: results that require grad are compiled too (no eager fallback),
nested compiled functions inline, and ir()/kernels() always describe a program."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from test_compile import _SIZES, _program, _run_program

import fucina as F

T = F.Tensor("d")


def test_a_result_that_requires_grad_backpropagates_through_the_compiled_vjp(ctx):
    traces = itertools.count()

    def f(w):
        next(traces)
        return w.mul(w).sin().sum_all()

    fast = F.compile(f)
    for k in range(3):
        w = T.variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0 + k])
        loss = fast(w)
        assert loss.requires_grad
        loss.backward()
        v = np.array([1.0, 2.0, 3.0 + k])
        np.testing.assert_allclose(w.grad().numpy(), 2 * v * np.cos(v * v), rtol=1e-5)
    assert next(traces) == 1  # traced once, never run eagerly
    text = fast.ir(w)
    assert "kernel" in text
    assert isinstance(fast.kernels(w), list)


def test_compiled_outputs_feed_eager_graphs_both_ways(ctx):
    w = T.variable_from_slice(ctx, (3,), [0.5, -1.0, 2.0])
    b = T.variable_from_slice(ctx, (3,), [1.0, 1.0, 1.0])
    fast = F.compile(lambda h, b: (h.tanh().mul(b), h.exp()))

    def run(f):
        w.zero_grad()
        b.zero_grad()
        h = w.scale(3.0)  # eager graph below the compiled function
        y, z = f(h, b)
        y.mul(z).sum_all().add(y.sum_all()).backward()
        return w.grad().numpy(), b.grad().numpy()

    def eager(h, b):
        return h.tanh().mul(b), h.exp()

    gw_e, gb_e = run(eager)
    gw_c, gb_c = run(fast)
    np.testing.assert_allclose(gw_c, gw_e, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb_c, gb_e, rtol=1e-5, atol=1e-6)


def test_captured_variables_receive_gradients_of_compiled_results(ctx):
    w = T.variable_from_slice(ctx, (2,), [2.0, 3.0])
    fast = F.compile(lambda x: x.mul(w).mul(x.mul(w)))
    x = T.from_slice(ctx, (2,), [1.0, 2.0])
    fast(x).sum_all().backward()  # d/dw sum (x w)^2 = 2 x^2 w
    np.testing.assert_allclose(w.grad().numpy(), [2 * 1 * 2, 2 * 4 * 3])


def test_no_grad_results_do_not_require_grad(ctx):
    w = T.variable_from_slice(ctx, (2,), [2.0, 3.0])
    fast = F.compile(lambda w: w.scale(2.0))
    with F.no_grad():
        y = fast(w)
    assert not y.requires_grad
    assert fast(w).requires_grad


@settings(max_examples=30, deadline=None)
@given(_program())
def test_compiled_vjp_equals_eager_on_random_programs(prog):
    inputs, ops, seed = prog
    ctx = F.ExecContext()

    def variables():
        return [F.Tensor(*tags).variable(ctx, F.Tensor(*tags).randn(
            ctx, tuple(_SIZES[t] for t in tags), k).as_raw_tensor())
            for k, tags in enumerate(inputs)]

    ev, cv = variables(), variables()
    fast = F.compile(lambda *xs: _run_program(xs, ops, seed))
    want, got = _run_program(ev, ops, seed), fast(*cv)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert got.requires_grad == want.requires_grad
    if not want.requires_grad:
        return
    want.mul(want).sum_all().backward()
    got.mul(got).sum_all().backward()
    for a, b in zip(ev, cv):
        ga, gb = a.grad(), b.grad()
        assert (ga is None) == (gb is None)
        if ga is not None:
            np.testing.assert_allclose(gb.numpy(), ga.numpy(), rtol=1e-3, atol=1e-4)


# -- nested compile ---------------------------------------------------------------------


def test_a_compiled_function_inlines_into_an_outer_trace(ctx):
    inner = F.compile(lambda x: x.tanh().mul(x))
    outer = F.compile(lambda x: inner(x).add_scalar(1.0).scale(2.0))
    x = T.from_slice(ctx, (4,), [0.5, -1.0, 2.0, 0.0])
    want = (np.tanh(x.numpy()) * x.numpy() + 1.0) * 2.0
    np.testing.assert_allclose(outer(x).numpy(), want, rtol=1e-6)
    assert len(outer.kernels(x)) == 1  # one fused kernel across both functions
    assert inner.cache_size() == 0  # the inner function was never traced on its own


def test_captures_of_an_inlined_function_stay_live(ctx):
    w = T.from_slice(ctx, (2,), [1.0, 2.0])
    inner = F.compile(lambda x: x.mul(w))
    holder = {"inner": inner}
    outer = F.compile(lambda x: holder["inner"](x).sum_all())
    x = T.from_slice(ctx, (2,), [1.0, 1.0])
    assert outer(x).item() == 3.0
    w = T.from_slice(ctx, (2,), [10.0, 20.0])  # read through inner's closure
    assert outer(x).item() == 30.0
    assert outer.cache_size() == 1


def test_an_inlined_function_checks_its_annotations(ctx):
    def inner(x: F.Tensor("e")) -> F.Tensor("e"):
        return x.scale(2.0)

    outer = F.compile(lambda x: F.compile(inner)(x))
    with pytest.raises(F.TagError, match="parameter 'x'"):
        outer(T.from_slice(ctx, (2,), [1.0, 2.0]))


def test_ir_and_kernels_work_for_every_signature(ctx):
    w = T.variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    fast = F.compile(lambda w: w.mul(w))
    assert "program:" in fast.ir(w)  # a result that requires grad: still a program
    assert len(fast.kernels(w)) == 1
    with pytest.raises(TypeError, match="concrete arguments"):
        F.compile(lambda x: fast.ir(x))(w)


def test_grad_read_inside_a_compiled_function_is_the_calls_own(ctx):
    # Regression: p.grad() inside fucina.compile read the host's gradient at trace time,
    # so it returned None on the first call and then the first call's gradient forever.
    def make():
        p = T.variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
        q = T.variable_from_slice(ctx, (3,), [0.0, 0.0, 0.0])
        opt = F.optim.SGD([p], lr=0.1)

        def f(x):
            before = q.grad()  # q gets no gradient here: None on every call
            p.mul(x).sum_all().backward()  # no zero_grad: the gradient accumulates
            opt.step()
            g = p.grad()
            return g, before is None
        return f, p

    (fe, pe), (fc, pc) = make(), make()
    fast = F.compile(fc)
    for v in ([4.0, 5.0, 6.0], [1.0, 1.0, 1.0], [0.0, 0.0, 2.0], [3.0, 3.0, 3.0]):
        x = T.from_slice(ctx, (3,), v)
        (ge, ne), (gc, nc) = fe(x), fast(x)
        np.testing.assert_array_equal(gc.numpy(), ge.numpy())
        assert ne and nc
        np.testing.assert_array_equal(pc.grad().numpy(), pe.grad().numpy())
        np.testing.assert_array_equal(pc.numpy(), pe.numpy())
    np.testing.assert_array_equal(ge.numpy(), [8.0, 9.0, 12.0])
    gc.numpy()[0] = 99.0  # an owned copy, as eager's: the live gradient is untouched
    assert pc.grad().numpy()[0] == 8.0


def test_grad_view_inside_a_compiled_function_is_refused(ctx):
    p = T.variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])

    def f(x):
        p.mul(x).sum_all().backward()
        return p.grad_view()

    with pytest.raises(TypeError, match=r"grad_view\(\) inside fucina.compile"):
        F.compile(f)(T.from_slice(ctx, (3,), [1.0, 1.0, 1.0]))
