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


def test_in_place_refuses_tracing(ctx):
    x = _x(ctx)
    fast = F.compile(lambda x: x.add_axis_vector_in_place(B0, "c"))
    with pytest.raises(TypeError, match="in place"):
        fast(x)


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
