"""linear_recurrence and segment_sum: the reference's values, determinism contracts,
offsets as traced tensors, and bad input (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F


def _t(ctx, tags, values, dtype=None):
    v = np.asarray(values)
    T = F.Tensor(*tags, dtype=dtype) if dtype else F.Tensor(*tags)
    return T.from_slice(ctx, v.shape, v)


def test_reference_snippet_linear_recurrence(ctx):
    b = _t(ctx, ("t", "d"), np.ones((3, 2)))
    a = _t(ctx, ("d",), [0.5, 0.0])
    np.testing.assert_array_equal(b.linear_recurrence("t", a).data_const(),
                                  [1, 1, 1.5, 1, 1.75, 1])
    h0 = _t(ctx, ("d",), [8, 8])
    np.testing.assert_array_equal(b.linear_recurrence("t", a, initial=h0).data_const(),
                                  [5, 1, 3.5, 1, 2.75, 1])


def test_linear_recurrence_is_multiply_then_add_per_step(ctx):
    rng = np.random.default_rng(0)
    b0 = rng.standard_normal((50, 3)).astype(np.float32)
    a0 = rng.uniform(0.5, 1.0, (50, 3)).astype(np.float32)
    h = np.zeros(3, np.float32)
    want = np.empty_like(b0)
    for t in range(50):
        h = a0[t] * h + b0[t]  # f32 multiply, then f32 add
        want[t] = h
    got = _t(ctx, ("t", "d"), b0).linear_recurrence("t", _t(ctx, ("t", "d"), a0))
    np.testing.assert_array_equal(got.numpy(), want)


def test_chunked_recurrence_continues_bit_for_bit(ctx):
    rng = np.random.default_rng(1)
    b0 = rng.standard_normal((4, 40)).astype(np.float32)
    a0 = rng.uniform(0.3, 1.0, (4, 40)).astype(np.float32)
    full = _t(ctx, ("d", "t"), b0).linear_recurrence("t", _t(ctx, ("d", "t"), a0)).numpy()
    first = _t(ctx, ("d", "t"), b0[:, :25]).linear_recurrence(
        "t", _t(ctx, ("d", "t"), a0[:, :25]))
    seam = first.select("t", -1)
    second = _t(ctx, ("d", "t"), b0[:, 25:]).linear_recurrence(
        "t", _t(ctx, ("d", "t"), a0[:, 25:]), initial=seam)
    np.testing.assert_array_equal(np.concatenate([first.numpy(), second.numpy()], 1), full)


def test_unit_decay_is_cumsum_bitwise(ctx):
    x = F.Tensor("r", "t").randn(ctx, (3, 33), 4)
    ones = F.Tensor("t").ones(ctx, (33,))
    np.testing.assert_array_equal(x.linear_recurrence("t", ones).numpy(),
                                  x.cumsum("t").numpy())


def test_linear_recurrence_compiled_equals_eager(ctx):
    b = F.Tensor("t", "d").randn(ctx, (16, 5), 2)
    a = F.Tensor("d").uniform(ctx, (5,), 3, 0.1, 0.9)
    h0 = F.Tensor("d").randn(ctx, (5,), 4)

    def f(b, a, h0):
        return b.linear_recurrence("t", a, initial=h0).scale(2.0)

    np.testing.assert_array_equal(F.compile(f)(b, a, h0).numpy(), f(b, a, h0).numpy())


def test_linear_recurrence_gradient_hand_values(ctx):
    # h0 = b0, h1 = a h0 + b1: d(h0 + h1)/db = [1 + a, 1], d/da = h0, d/dinit = 0 here
    b = F.Tensor("t").variable_from_slice(ctx, (2,), [2.0, 3.0])
    a = F.Tensor().variable_from_slice(ctx, (1,), [0.5])
    b.linear_recurrence("t", a).sum_all().backward()
    np.testing.assert_allclose(b.grad().numpy(), [1.5, 1.0])
    np.testing.assert_allclose(a.grad().numpy(), [2.0])


def test_linear_recurrence_bad_operands(ctx):
    b = F.Tensor("t", "d").zeros(ctx, (4, 3))
    with pytest.raises(F.TagError, match="subset"):
        b.linear_recurrence("t", F.Tensor("e").ones(ctx, (3,)))
    with pytest.raises(F.ShapeMismatch):
        b.linear_recurrence("t", F.Tensor("d").ones(ctx, (2,)))
    with pytest.raises(F.TagError):
        b.linear_recurrence("x", F.Tensor("d").ones(ctx, (3,)))
    a = F.Tensor("d").ones(ctx, (3,))
    with pytest.raises(F.TagError, match="initial"):
        b.linear_recurrence("t", a, initial=F.Tensor("t", "d").zeros(ctx, (4, 3)))
    with pytest.raises(F.ShapeMismatch, match="initial"):
        b.linear_recurrence("t", a, initial=F.Tensor("d").zeros(ctx, (4,)))
    with pytest.raises(TypeError):
        b.linear_recurrence("t", [1.0, 2.0, 3.0])


def test_reference_snippet_segment_sum(ctx):
    x = _t(ctx, ("row", "col"), np.arange(10, dtype=np.float32).reshape(2, 5))
    s = x.segment_sum("col", [0, 2, 2, 5])
    assert type(s) is F.Tensor("row", "col")
    np.testing.assert_array_equal(s.numpy(), [[1, 0, 9], [11, 0, 24]])


def test_segment_sum_gradient_repeats_rows(ctx):
    x = F.Tensor("n").variable_from_slice(ctx, (5,), [1, 2, 3, 4, 5])
    w = _t(ctx, ("n",), [10.0, 20.0, 30.0])
    x.segment_sum("n", [0, 1, 1, 5]).mul(w).sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [10, 30, 30, 30, 30])


def test_segment_offsets_as_a_traced_tensor_do_not_retrace(ctx):
    x = F.Tensor("n", "d").randn(ctx, (6, 2), 0)
    fast = F.compile(lambda x, off: x.segment_sum("n", off))
    for offs in ([0, 2, 6], [0, 5, 6], [0, 0, 6]):
        off = _t(ctx, ("s",), offs, "i64")
        np.testing.assert_allclose(fast(x, off).numpy(),
                                   x.segment_sum("n", offs).numpy(), rtol=0, atol=0)
    assert len(fast._cache) == 1
    bad = _t(ctx, ("s",), [0, 7, 6], "i64")
    with pytest.raises(F.InvalidShape, match="non-decreasing"):
        fast(x, bad)
    with pytest.raises(F.InvalidShape, match="non-decreasing"):
        x.segment_sum("n", bad)


@pytest.mark.parametrize("offsets, match", [
    ([1, 6], "start at 0"),
    ([0, 5], "end at the axis size 6"),
    ([0, 4, 2, 6], "offsets\\[2\\] = 2 < offsets\\[1\\] = 4"),
    ([0], "at least two"),
    ([[0, 6]], "one-dimensional"),
])
def test_segment_sum_bad_offsets(ctx, offsets, match):
    x = F.Tensor("n").zeros(ctx, (6,))
    with pytest.raises(F.InvalidShape, match=match):
        x.segment_sum("n", offsets)


def test_segment_sum_offsets_types(ctx):
    x = F.Tensor("n").from_slice(ctx, (4,), [1, 2, 3, 4])
    for off in (np.array([0, 1, 4], np.int32), _t(ctx, ("s",), [0, 1, 4], "i32")):
        np.testing.assert_array_equal(x.segment_sum("n", off).numpy(), [1, 9])
    with pytest.raises(TypeError):
        x.segment_sum("n", [0.0, 4.0])
    with pytest.raises(F.TagError):
        x.segment_sum("n", _t(ctx, ("s",), [0.0, 4.0]))


class _Cube:
    @staticmethod
    def forward(x, extra):
        return x * x * x * extra

    @staticmethod
    def backward(x, y, grad_y, extra):
        return 3 * x * x * grad_y * extra


def test_compiled_result_that_requires_grad_differentiates_like_eager(ctx):
    """A compiled function's result differentiated later: its backward program runs the
    same rules (elemental, recurrence, segment sum, norm, gated) as the eager graph."""
    rng = np.random.default_rng(0)
    x0, a0 = rng.standard_normal((5, 4)), rng.uniform(0.1, 0.9, 4)

    def f(x, a):
        y = x.elemental_unary(_Cube, 0.5).linear_recurrence("t", a)
        y = y.segment_sum("t", [0, 2, 5]).layer_norm("d", 1e-5)
        return y.swiglu(y)

    def make():
        return (F.Tensor("t", "d").variable_from_slice(ctx, (5, 4), x0),
                F.Tensor("d").variable_from_slice(ctx, (4,), a0))

    xe, ae = make()
    ye = f(xe, ae)
    ye.sum_all().backward()
    xc, ac = make()
    yc = F.compile(f)(xc, ac)
    assert yc.requires_grad
    yc.sum_all().backward()
    np.testing.assert_allclose(yc.numpy(), ye.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(xc.grad().numpy(), xe.grad().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ac.grad().numpy(), ae.grad().numpy(), rtol=1e-5, atol=1e-6)
