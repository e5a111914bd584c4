"""Eager and compiled raise the same errors for the same bad input.

Index values are checked by the IR before a kernel reads them (a step of the
compiled program), contexts are checked per signature, strided views are
checked against their storage when the argument is bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

X = F.Tensor("r", "c")
IDX = F.Tensor("r", "c", dtype="i64")


def _x(ctx):
    return X.from_slice(ctx, (2, 3), np.arange(6, dtype=np.float32))


def _both(fn, *args):
    """The eager error and the compiled error (twice: first trace and cached program)."""
    errors = []
    for f in (fn, F.compile(fn)):
        for _ in range(2 if f is not fn else 1):
            with pytest.raises(F.TensorError) as info:
                f(*args)
            errors.append(info.value)
    return errors


@pytest.mark.parametrize("bad", [-1, 3, 9])
@pytest.mark.parametrize("op", ["take_along_axis", "scatter", "scatter_add"])
def test_element_index_errors_match_eager(ctx, op, bad):
    x = _x(ctx)
    idx = IDX.from_slice(ctx, (2, 3), [[0, 1, 2], [2, bad, 0]])
    if op == "take_along_axis":
        def fn(x, i):
            return x.take_along_axis("c", i)
    else:
        def fn(x, i):
            return getattr(x, op)("c", i, x.scale(2.0))
    errors = _both(fn, x, idx)
    for e in errors:
        assert type(e) is F.IndexOutOfBounds
        assert str(e) == f"index {bad} out of range for 'c' of size 3"
    good = IDX.from_slice(ctx, (2, 3), [[0, 1, 2], [2, 1, 0]])
    np.testing.assert_array_equal(F.compile(fn)(x, good).numpy(), fn(x, good).numpy())


def test_the_check_is_a_step_of_the_program(ctx):
    x = _x(ctx)
    idx = IDX.from_slice(ctx, (2, 1), [[2], [0]])
    fast = F.compile(lambda x, i: x.take_along_axis("c", i).exp())
    text = fast.ir(x, idx)
    assert "check %in1: index values in range" in text
    np.testing.assert_allclose(fast(x, idx).numpy(), np.exp([[2.0], [3.0]]), rtol=1e-6)
    # Other value checks say what they check (an integer division's read "index values").
    a, b = (F.Tensor("c", dtype="i32").from_slice(ctx, (2,), v) for v in ([4, 5], [1, 2]))
    text = F.compile(lambda a, b: a.div_floor(b)).ir(a, b)
    assert "check %in1: no zero divisor for %2 = binary (DivisionByZero" in text


@pytest.mark.parametrize("bad", [-1, 2])
def test_index_select_errors_match_eager(ctx, bad):
    x = _x(ctx)
    idx = F.Tensor("k", dtype="i64").from_slice(ctx, (2,), [0, bad])
    for e in _both(lambda x, i: x.index_select("r", i, "k"), x, idx):
        assert type(e) is F.IndexOutOfBounds
        assert str(e) == f"index {bad} out of range for 'r' of size 2"


def test_index_select_gradient_flows_through_a_traced_index(ctx):
    idx = F.Tensor("k", dtype="i64").from_slice(ctx, (3,), [1, 1, 0])

    def loss(x, i):
        out = x.index_select("r", i, "k").sum_all()
        out.backward()
        return out

    xe = X.variable_from_slice(ctx, (2, 3), np.arange(6, dtype=np.float32))
    xc = X.variable_from_slice(ctx, (2, 3), np.arange(6, dtype=np.float32))
    assert loss(xe, idx).item() == F.compile(loss)(xc, idx).item() == 12 + 12 + 3
    np.testing.assert_array_equal(xc.grad().numpy(), [[1, 1, 1], [2, 2, 2]])
    np.testing.assert_array_equal(xc.grad().numpy(), xe.grad().numpy())


@pytest.mark.parametrize("idx", [[0, -1], [0, 5]])
def test_host_index_lists_are_checked_the_same_way(ctx, idx):
    x = _x(ctx)
    for e in _both(lambda x: x.gather("c", idx, "k"), x):
        assert type(e) is F.IndexOutOfBounds
        assert str(e) == f"index {idx[1]} out of range for 'c' of size 3"


def test_contexts_are_checked_like_eager():
    c1, c2 = F.ExecContext(), F.ExecContext()
    a, b = _x(c1), _x(c2)
    fast = F.compile(lambda a, b: a.add(b))
    np.testing.assert_array_equal(fast(a, _x(c1)).numpy(), 2 * a.numpy())  # cached: one ctx
    for f in (lambda a, b: a.add(b), fast, fast):
        with pytest.raises(F.ContextMismatch):
            f(a, b)
    # Two contexts never combined by one op: eager accepts it, so compiled does too.
    apart = F.compile(lambda a, b: (a.scale(2.0), b.scale(3.0)))
    ya, yb = apart(a, b)
    assert ya._ctx is c1 and yb._ctx is c2
    w = _x(c2)
    captured = F.compile(lambda a: a.add(w))
    np.testing.assert_array_equal(captured(b).numpy(), 2 * b.numpy())
    with pytest.raises(F.ContextMismatch):
        captured(a)


@pytest.mark.parametrize("reach", [10**9, 100])
def test_view_with_strides_past_the_storage_is_invalid_data_length(ctx, reach):
    x = F.Tensor("a").from_slice(ctx, (12,), np.arange(12, dtype=np.float32))

    def fn(x):
        return x.view_with_strides(("z",), (2,), (reach,)).sum("z")

    errors = _both(fn, x)
    for e in errors:
        assert type(e) is F.InvalidDataLength
        assert str(e) == f"view_with_strides: the view reaches element {reach}, storage holds 12"
    ok = F.compile(lambda x: x.view_with_strides(("z",), (3,), (5,)).sum("z"))
    assert ok(x).item() == 0 + 5 + 10


def test_a_cached_strided_program_checks_each_arguments_storage(ctx):
    # Views may read past their own elements into the storage behind them; the same
    # signature bound to a tensor with less storage behind it must fail, not read out.
    def fn(x):
        return x.view_with_strides(("z",), (2,), (13,)).sum("z")

    base = F.Tensor("a").from_slice(ctx, (30,), np.arange(30, dtype=np.float32))
    window = base.narrow("a", 0, 12)
    fast = F.compile(fn)
    assert fast(window).item() == fn(window).item() == 13.0
    own = F.Tensor("a").from_slice(ctx, (12,), np.arange(12, dtype=np.float32))
    for f in (fn, fast):
        with pytest.raises(F.InvalidDataLength,
                           match="reaches element 13, storage holds 12"):
            f(own)
    assert fast.cache_size() == 1


def test_integer_division_by_zero_matches_eager(ctx):
    a = F.Tensor("d", dtype="i32").from_slice(ctx, (3,), [4, 5, 6])
    b = F.Tensor("d", dtype="i32").from_slice(ctx, (3,), [2, 0, 3])
    for e in _both(lambda a, b: a.div_trunc(b), a, b):
        assert type(e) is F.DivisionByZero
