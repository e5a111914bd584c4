"""The inference helpers: bias_add, in-place axis-vector and scaled adds, and the
storage-consuming take_* ops (no torch needed; values against numpy)."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

X0 = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
B0 = np.array([10.0, -1.0, 0.5], np.float32)


def _x(ctx, values=X0, tags=("r", "c")):
    return F.Tensor(*tags).from_slice(ctx, values.shape, values)


def test_add_axis_vector_in_place_mutates_every_view(ctx):
    x = _x(ctx)
    view = x.data_const()  # a numpy view of the same storage
    want = x.add(F.Tensor("c").from_slice(ctx, (3,), B0)).numpy()
    assert x.add_axis_vector_in_place(B0, "c") is None
    np.testing.assert_array_equal(x.numpy(), want)
    np.testing.assert_array_equal(view.reshape(2, 3), want)


def test_add_axis_vector_in_place_accepts_a_tensor_and_a_strided_target(ctx):
    base = _x(ctx, np.zeros((3, 2), np.float32), ("c", "r"))
    x = base.permute_to(("r", "c"))  # a transposed view: the update lands in base
    x.add_axis_vector_in_place(F.Tensor("c").from_slice(ctx, (3,), B0), "c")
    np.testing.assert_array_equal(base.numpy(), np.tile(B0[:, None], (1, 2)))


def test_add_axis_vector_unary_in_place(ctx):
    x = _x(ctx)
    want = x.add(F.Tensor("c").from_slice(ctx, (3,), B0)).gelu().numpy()
    x.add_axis_vector_unary_in_place("gelu", B0, "c")
    np.testing.assert_array_equal(x.numpy(), want)
    y = _x(ctx)
    y.add_axis_vector_unary_in_place("relu", [-3.0, 0.0, 3.0], "c")
    np.testing.assert_array_equal(y.numpy(), np.maximum(X0 + [-3.0, 0.0, 3.0], 0))


def test_add_scaled_in_place(ctx):
    x = _x(ctx)
    other = _x(ctx, (X0.T * 2).copy(), ("c", "r"))  # same tags, other order
    x.add_scaled_in_place(other, -0.5)
    np.testing.assert_array_equal(x.numpy(), X0 - 0.5 * 2 * X0)


def test_in_place_errors(ctx):
    x = _x(ctx)
    with pytest.raises(F.TagError, match="last axis"):
        x.add_axis_vector_in_place([1.0, 2.0], "r")
    with pytest.raises(F.ShapeMismatch):
        x.add_axis_vector_in_place([1.0, 2.0], "c")
    with pytest.raises(F.TagError):
        x.add_axis_vector_unary_in_place("nope", B0, "c")
    with pytest.raises(TypeError):
        x.add_axis_vector_in_place("abc", "c")
    v = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), X0)
    with pytest.raises(F.UnsupportedGradient):
        v.add_axis_vector_in_place(B0, "c")
    with pytest.raises(F.UnsupportedGradient):
        x.add_scaled_in_place(v, 1.0)
    with pytest.raises(F.UnsupportedGradient):
        x.add_axis_vector_in_place(F.Tensor("c").variable_from_slice(ctx, (3,), B0), "c")
    ro = F.Tensor("r", "c").from_borrowed_const_slice(ctx, (2, 3), X0.copy())
    with pytest.raises(F.UnsupportedView, match="read-only"):
        ro.add_axis_vector_in_place(B0, "c")
    bc = F.Tensor("c").from_slice(ctx, (3,), B0).broadcast_to(("r", "c"), (2, 3))
    with pytest.raises(F.UnsupportedView, match="broadcast"):
        bc.add_scaled_in_place(x, 1.0)
    with pytest.raises(F.ShapeMismatch):
        x.add_scaled_in_place(_x(ctx, np.zeros((2, 2), np.float32)), 1.0)
    np.testing.assert_array_equal(x.numpy(), X0)  # nothing was written by failed calls


def _pair(ctx, values=X0):
    """The same values twice: one tensor for eager, one for the compiled call."""
    return _x(ctx, values), _x(ctx, values)


def test_in_place_helpers_compile_like_eager(ctx):
    def f(x, o):
        v = x.permute_to(("c", "r"))  # a view made before the updates reads the new values
        before = x.sum_all()          # ... and a value computed before them the old ones
        x.add_axis_vector_in_place(B0, "c")
        x.add_scaled_in_place(o, -0.5)
        x.add_axis_vector_unary_in_place("gelu", B0, "c")
        return before, v.scale(2.0), x.mul(x)

    fast = F.compile(f)
    for trial in range(3):  # every call updates its own argument: never stale
        xe, xc = _pair(ctx, X0 + trial)
        oe, oc = _pair(ctx, X0 * 3)
        want = f(xe, oe)
        got = fast(xc, oc)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(xc.numpy(), xe.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(oc.numpy(), X0 * 3)
    # numpy oracle for the last call
    x64 = X0 + 2 + B0 - 0.5 * X0 * 3 + B0
    gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    np.testing.assert_allclose(xc.numpy(), gelu, rtol=1e-5, atol=1e-5)


def test_in_place_compiled_returns_none_and_writes_through_the_argument(ctx):
    fast = F.compile(lambda x: x.add_axis_vector_in_place(B0, "c"))
    xe, xc = _pair(ctx)
    held = xc.data_const()  # a numpy view of the argument's buffer sees the write
    assert xe.add_axis_vector_in_place(B0, "c") is None
    assert fast(xc) is None
    np.testing.assert_array_equal(xc.numpy(), xe.numpy())
    np.testing.assert_array_equal(held.reshape(2, 3), X0 + B0)
    assert fast(xc) is None  # a second call adds again, as eager would
    np.testing.assert_array_equal(xc.numpy(), X0 + 2 * B0)
    # a strided argument (a transposed view) is written through its strides
    base = _x(ctx)
    fast2 = F.compile(lambda t: t.add_axis_vector_in_place([1.0, 2.0], "r"))
    fast2(base.permute_to(("c", "r")))
    np.testing.assert_array_equal(base.numpy(), X0 + [[1.0], [2.0]])


def test_in_place_on_captured_and_local_tensors_under_compile(ctx):
    acc = F.Tensor("r", "c").zeros(ctx, (2, 3))

    def accumulate(x):  # a captured buffer: updated by every call
        acc.add_scaled_in_place(x, 2.0)
        return acc.scale(1.0)

    fast = F.compile(accumulate)
    x = _x(ctx)
    np.testing.assert_array_equal(fast(x).numpy(), 2 * X0)
    np.testing.assert_array_equal(fast(x).numpy(), 4 * X0)
    np.testing.assert_array_equal(acc.numpy(), 4 * X0)

    def local(x):  # made inside the function: fresh per call in eager, so here too
        t = F.Tensor("r", "c").ones(ctx, (2, 3))
        t.add_scaled_in_place(x, 1.0)
        return t

    fast_local = F.compile(local)
    for _ in range(3):
        np.testing.assert_array_equal(fast_local(x).numpy(), X0 + 1)
    h = F.compile(lambda x: _update_and_read(x.scale(2.0)))  # a computed value
    np.testing.assert_array_equal(h(x).numpy(), _update_and_read(x.scale(2.0)).numpy())


def _update_and_read(y):
    y.add_axis_vector_unary_in_place("relu", B0, "c")
    return y.sum("r")


def test_in_place_compiled_errors_match_eager(ctx):
    fast = F.compile(lambda x: x.add_axis_vector_in_place(B0, "c"))
    ro = F.Tensor("r", "c").from_borrowed_const_slice(ctx, (2, 3), X0.copy())
    for call in (lambda t: t.add_axis_vector_in_place(B0, "c"), fast):
        with pytest.raises(F.UnsupportedView, match="read-only"):
            call(ro)
    np.testing.assert_array_equal(ro.numpy(), X0)
    xc = _x(ctx)
    fast(xc)  # traced with a writable tensor, then called with a read-only one
    with pytest.raises(F.UnsupportedView, match="read-only"):
        fast(ro)
    bc = F.Tensor("c").from_slice(ctx, (3,), B0).broadcast_to(("r", "c"), (2, 3))
    for call in (lambda t: t.add_axis_vector_in_place(B0, "c"), fast):
        with pytest.raises(F.UnsupportedView, match="broadcast"):
            call(bc)
    v = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), X0)
    for call in (lambda t: t.add_axis_vector_in_place(B0, "c"), fast):
        with pytest.raises(F.UnsupportedGradient):
            call(v)
        with F.no_grad(), pytest.raises(F.UnsupportedGradient):
            call(v)  # still a variable: traced under no_grad, refused as in eager
    np.testing.assert_array_equal(v.detach().numpy(), X0)
    bad_op = F.compile(lambda t: t.add_axis_vector_unary_in_place("nope", B0, "c"))
    bad_size = F.compile(lambda t: t.add_axis_vector_in_place([1.0, 2.0], "c"))
    bad_axis = F.compile(lambda t: t.add_axis_vector_in_place([1.0, 2.0], "r"))
    for call, err in ((bad_op, F.TagError), (bad_size, F.ShapeMismatch),
                      (bad_axis, F.TagError)):
        with pytest.raises(err):
            call(_x(ctx))


def test_in_place_compiled_refusals(ctx):
    # a view made inside the function: eager writes through it; a program cannot
    fast = F.compile(lambda x: x.permute_to(("c", "r")).add_scaled_in_place(
        x.permute_to(("c", "r")), 1.0))
    with pytest.raises(TypeError, match="not a view made inside"):
        fast(_x(ctx))
    # an argument written in place whose storage another argument (a view of it) shares;
    # the same tensor object passed twice is one input and runs (test below)
    both = F.compile(lambda x, y: (x.add_scaled_in_place(y, 1.0), y.scale(1.0))[1])
    x = _x(ctx)
    with pytest.raises(TypeError, match="shares"):
        both(x, x.permute_to(("c", "r")))
    np.testing.assert_array_equal(x.numpy(), X0)  # refused before anything ran
    y = _x(ctx)
    np.testing.assert_array_equal(both(x, y).numpy(), X0)
    np.testing.assert_array_equal(x.numpy(), 2 * X0)


def test_in_place_compiled_refuses_aliases_through_memory(ctx):
    # Regression: the alias guard compared storage objects, so two borrows of one numpy
    # array (or of x.data()) ran, and the program read the argument as it was at the call
    # (compiled [0, 1, 2, ...] where eager gives [0, 2, 4, ...]).
    both = F.compile(lambda x, y: (x.add_scaled_in_place(y, 1.0), y.scale(1.0))[1])
    T = F.Tensor("r", "c")
    arr = np.arange(9, dtype=np.float32)
    for y_of in (lambda: arr[:6], lambda: arr[3:]):  # the same memory, and an overlap
        x = T.from_borrowed_slice(ctx, (2, 3), arr[:6])
        with pytest.raises(TypeError, match="argument 1 shares"):
            both(x, T.from_borrowed_slice(ctx, (2, 3), y_of()))
    np.testing.assert_array_equal(arr, np.arange(9))  # refused before anything ran
    x = _x(ctx)
    with pytest.raises(TypeError, match="argument 1 shares"):
        both(x, T.from_borrowed_slice(ctx, (2, 3), x.data()))
    apart = T.from_borrowed_slice(ctx, (2, 3), np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(both(apart, _x(ctx)).numpy(), X0)  # apart: runs
    # a captured tensor the program writes, and an argument over its memory
    cap = _x(ctx)

    def doubled(y):
        cap.add_scaled_in_place(cap, 1.0)
        return y.scale(1.0)

    eager = _x(ctx)
    want = (lambda y: (eager.add_scaled_in_place(eager, 1.0), y.scale(1.0))[1])(
        eager.slice(r=slice(0, 1))).numpy()
    np.testing.assert_array_equal(want, 2 * X0[:1])
    fast = F.compile(doubled)
    with pytest.raises(TypeError, match="captured tensor whose memory argument 0 shares"):
        fast(cap.slice(r=slice(0, 1)))
    np.testing.assert_array_equal(cap.numpy(), X0)
    np.testing.assert_array_equal(fast(_x(ctx)).numpy(), X0)
    np.testing.assert_array_equal(cap.numpy(), 2 * X0)


def test_take_add_no_grad_reuses_an_exclusive_buffer(ctx):
    x = _x(ctx).scale(1.0)  # a kernel's result: nothing else holds its buffer
    storage = x.as_raw_tensor().storage
    y = x.take_add_no_grad(F.Tensor("c").from_slice(ctx, (3,), B0))
    assert y.as_raw_tensor().storage is storage
    np.testing.assert_array_equal(y.numpy(), X0 + B0)
    with pytest.raises(F.Deinitialized):
        x.numpy()


def test_take_add_no_grad_copies_when_the_buffer_is_shared(ctx):
    x = _x(ctx).scale(1.0)
    held = x.data_const()  # someone still reads the buffer
    y = x.take_add_no_grad(_x(ctx))
    np.testing.assert_array_equal(y.numpy(), 2 * X0)
    np.testing.assert_array_equal(held.reshape(2, 3), X0)  # untouched
    x2 = _x(ctx).scale(1.0)
    t = x2.permute_to(("c", "r"))  # a view retains the storage
    z = x2.take_scale_no_grad(3.0)
    np.testing.assert_array_equal(z.numpy(), 3 * X0)
    np.testing.assert_array_equal(t.numpy(), X0.T)
    with pytest.raises(F.Deinitialized):
        x2.shape  # noqa: B018


def test_take_scale_no_grad_matches_scale_bitwise(ctx):
    x = F.Tensor("r", "c").randn(ctx, (4, 5), 0)
    want = x.scale(0.1).numpy()
    np.testing.assert_array_equal(x.take_scale_no_grad(0.1).numpy(), want)


def test_take_ops_errors(ctx):
    with ctx.exec_scope():
        s = _x(ctx).scale(1.0)  # an op result: the scope owns it
        with pytest.raises(F.ActiveExecScopeUnsupported):
            s.take_scale_no_grad(2.0)
        np.testing.assert_array_equal(s.numpy(), X0)  # still alive
    v = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), X0)
    with pytest.raises(F.UnsupportedGradient):
        v.take_scale_no_grad(2.0)
    x = _x(ctx)
    with pytest.raises(F.TagError):
        x.take_add_no_grad(F.Tensor("k").zeros(ctx, (3,)))
    with pytest.raises(F.ShapeMismatch):
        x.take_add_no_grad(F.Tensor("c").zeros(ctx, (4,)))
    with pytest.raises(TypeError):
        x.take_scale_no_grad("2")
    assert issubclass(F.ActiveExecScopeUnsupported, F.TensorError)


def test_take_ops_compile_to_their_values(ctx):
    x = _x(ctx)
    b = F.Tensor("c").from_slice(ctx, (3,), B0)
    fast = F.compile(lambda x, b: x.scale(1.0).take_add_no_grad(b).take_scale_no_grad(2.0))
    np.testing.assert_array_equal(fast(x, b).numpy(), (X0 + B0) * 2)
    np.testing.assert_array_equal(x.numpy(), X0)


def test_take_ops_consume_a_compiled_argument_like_eager(ctx):
    f = F.compile(lambda x, b: x.take_add_no_grad(b).take_scale_no_grad(2.0))
    b = F.Tensor("c").from_slice(ctx, (3,), B0)
    for _ in range(2):
        xe, xc = _pair(ctx)
        want = xe.take_add_no_grad(b).take_scale_no_grad(2.0)
        np.testing.assert_array_equal(f(xc, b).numpy(), want.numpy())
        for t in (xe, xc):  # both consumed
            with pytest.raises(F.Deinitialized):
                t.numpy()
    np.testing.assert_array_equal(b.numpy(), B0)
    g = F.compile(lambda x: x.take_scale_no_grad(2.0))
    with ctx.exec_scope():
        s = _x(ctx).scale(1.0)  # an op result: the scope owns it
        for call in (lambda t: t.take_scale_no_grad(2.0), g):
            with pytest.raises(F.ActiveExecScopeUnsupported):
                call(s)
        np.testing.assert_array_equal(s.numpy(), X0)  # still alive
    v = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), X0)
    with F.no_grad(), pytest.raises(F.UnsupportedGradient):
        g(v)


def test_bias_add(ctx):
    x = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), X0)
    y = x.bias_add(B0, "c")
    np.testing.assert_array_equal(y.numpy(), X0 + B0)
    y.mul(y).sum_all().backward()  # gradient passes through to x
    np.testing.assert_allclose(x.grad().numpy(), 2 * (X0 + B0))
    np.testing.assert_array_equal(x.bias_add([1.0, 2.0], "r").numpy(), X0 + [[1.0], [2.0]])
    fast = F.compile(lambda x, b: x.bias_add(b, "c"))
    xc = _x(ctx)
    np.testing.assert_array_equal(fast(xc, F.Tensor("c").from_slice(ctx, (3,), B0)).numpy(),
                                  X0 + B0)
    with pytest.raises(F.UnsupportedGradient, match="add"):
        xc.bias_add(F.Tensor("c").variable_from_slice(ctx, (3,), B0), "c")
    with pytest.raises(F.ShapeMismatch):
        xc.bias_add([1.0], "c")


def test_take_never_writes_a_borrowed_buffer(ctx):
    arr = X0.copy()
    x = F.Tensor("r", "c").from_borrowed_slice(ctx, (2, 3), arr)
    y = x.take_scale_no_grad(2.0)
    np.testing.assert_array_equal(y.numpy(), 2 * X0)
    np.testing.assert_array_equal(arr, X0)


def _update_then_read(x, y):
    x.add_scaled_in_place(y, 1.0)
    return y.scale(1.0)


def test_one_tensor_passed_twice_is_one_program_input(ctx):
    # Regression: each argument position became its own program input, so the read through
    # the second position missed the in-place update made through the first.
    fast = F.compile(_update_then_read)
    for _ in range(2):  # traced call, then the cached program
        xe, xc = _x(ctx), _x(ctx)
        want = _update_then_read(xe, xe).numpy()
        np.testing.assert_array_equal(fast(xc, xc).numpy(), want)
        np.testing.assert_array_equal(xc.numpy(), xe.numpy())
        np.testing.assert_array_equal(want, 2 * X0)
    # two distinct tensors with equal values keep their own program inputs
    xd, yd = _x(ctx), _x(ctx)
    np.testing.assert_array_equal(fast(xd, yd).numpy(), X0)
    np.testing.assert_array_equal(xd.numpy(), 2 * X0)
    # the same tensor in a nested structure and a keyword is the same input too
    g = F.compile(lambda xs, y: (xs[0].add_scaled_in_place(y, 2.0), y.scale(1.0))[1])
    t = _x(ctx)
    np.testing.assert_array_equal(g([t], y=t).numpy(), 3 * X0)


def test_one_tensor_consumed_through_one_position_is_gone_in_the_other(ctx):
    # Regression: compiled ran take_add_no_grad(x, x) on two program inputs and returned
    # a value, where eager raises Deinitialized for the second use of the consumed tensor.
    def f(x, y):
        return x.take_scale_no_grad(2.0).add(y)

    fast = F.compile(f)
    for call in (f, fast):
        t = _x(ctx)
        with pytest.raises(F.Deinitialized):
            call(t, t)


def test_a_refused_capture_alias_runs_no_optimizer_bookkeeping(ctx):
    # The alias check runs before the call's optimizer prologue: a refused call must not
    # advance Adam's step count (its bias correction would then differ from eager's).
    def make():
        w = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), X0)
        opt = F.optim.Adam([w], lr=0.1)

        def step(x):
            opt.zero_grad()
            w.mul(x).sum_all().backward()
            opt.step()
            return x.scale(1.0)
        return w, step

    (we, eager), (wc, comp) = make(), make()
    fast = F.compile(comp)
    with pytest.raises(TypeError, match="captured tensor whose memory argument 0 shares"):
        fast(F.Tensor("r", "c").from_borrowed_slice(ctx, (2, 3), wc.detach().data()))
    x = _x(ctx)
    eager(x)
    fast(x)
    np.testing.assert_array_equal(wc.numpy(), we.numpy())
