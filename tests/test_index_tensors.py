"""Host index data accepts a sequence, numpy integers or an integer tensor (API.md §8).

For every op taking row indices: the three forms give the same values; under
``compile`` a tensor is a traced input (new values, new results, no retrace);
a bad index raises the same ``IndexOutOfBounds`` eager and compiled.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

X = F.Tensor("r", "c")
M = F.Tensor("n", "c")
I64 = F.Tensor("k", dtype="i64")
I32 = F.Tensor("k", dtype="i32")

BASE = np.arange(8, dtype=np.float32).reshape(4, 2)
UPD = np.array([[10.0, 20.0], [30.0, 40.0]], dtype=np.float32)


def _x(ctx):
    return X.from_slice(ctx, (4, 2), BASE)


def _u(ctx):
    return X.from_slice(ctx, (2, 2), UPD)


def _set_rows(idx):
    out = BASE.copy()
    out[idx] = UPD
    return out


def _index_add(idx):
    out = BASE.copy()
    np.add.at(out, idx, UPD)
    return out


def _zero_rows(idx):
    out = BASE.copy()
    out[idx] = 0
    return out


# op name -> (f(x, indices, update), numpy expectation over int64 indices)
OPS = {
    "gather": (lambda x, i, u: x.gather("r", i, "k"), lambda idx: BASE[idx]),
    "set_rows": (lambda x, i, u: x.set_rows("r", i, u), _set_rows),
    "index_add": (lambda x, i, u: x.index_add("r", i, u), _index_add),
    "zero_rows": (lambda x, i, u: x.zero_rows("r", i), _zero_rows),
}


def _forms(ctx, values):
    """The same indices as a list, numpy ints, an i64 tensor and an i32 tensor."""
    return [list(values), np.array(values, dtype=np.int32),
            I64.from_slice(ctx, (len(values),), values),
            I32.from_slice(ctx, (len(values),), values)]


@pytest.mark.parametrize("op", list(OPS))
def test_every_index_form_gives_the_same_values(ctx, op):
    fn, want = OPS[op]
    x, u = _x(ctx), _u(ctx)
    values = [3, 1]
    for idx in _forms(ctx, values):
        np.testing.assert_array_equal(fn(x, idx, u).numpy(), want(np.array(values)))


@pytest.mark.parametrize("op", list(OPS))
def test_a_tensor_index_is_a_traced_input(ctx, op):
    fn, want = OPS[op]
    x, u = _x(ctx), _u(ctx)
    fast = F.compile(fn)
    for values in ([3, 1], [0, 2], [2, 1]):
        idx = I64.from_slice(ctx, (2,), values)
        got = fast(x, idx, u).numpy()
        np.testing.assert_array_equal(got, want(np.array(values)))
        np.testing.assert_array_equal(got, fn(x, idx, u).numpy())
    assert fast.cache_size() == 1  # new index values never retrace


def test_a_captured_index_tensor_is_read_at_call_time(ctx):
    x, u = _x(ctx), _u(ctx)
    idx = I64.from_slice(ctx, (2,), [3, 1])
    fast = F.compile(lambda x: x.index_add("r", idx, u))
    np.testing.assert_array_equal(fast(x).numpy(), _index_add([3, 1]))
    idx.data()[:] = [1, 1]  # duplicates accumulate
    np.testing.assert_array_equal(fast(x).numpy(), _index_add([1, 1]))
    assert fast.cache_size() == 1


def _errors(fn, x, bad, u):
    """Errors of the host list, the eager tensor and the compiled tensor (trace, cached)."""
    errors = []
    with pytest.raises(F.TensorError) as info:
        fn(x, list(bad), u)
    errors.append(info.value)
    idx = I64.from_slice(x._ctx, (len(bad),), bad)
    for f in (fn, F.compile(fn)):
        for _ in range(1 if f is fn else 2):
            with pytest.raises(F.TensorError) as info:
                f(x, idx, u)
            errors.append(info.value)
    return errors


@pytest.mark.parametrize("bad", [-1, 4, 2**40])
@pytest.mark.parametrize("op", list(OPS))
def test_bad_indices_raise_the_same_error_eager_and_compiled(ctx, op, bad):
    fn, _ = OPS[op]
    x, u = _x(ctx), _u(ctx)
    errors = _errors(fn, x, [0, bad], u)
    assert len(errors) == 4
    for e in errors:
        assert type(e) is F.IndexOutOfBounds
        assert str(e) == f"index {bad} out of range for 'r' of size 4"


def test_duplicate_set_rows_indices_raise_the_same_error(ctx):
    fn, _ = OPS["set_rows"]
    x, u = _x(ctx), _u(ctx)
    for e in _errors(fn, x, [2, 2], u):
        assert type(e) is F.InvalidShape
        assert str(e) == "set_rows: duplicate indices in [2, 2]"


def test_zero_rows_accepts_repeated_tensor_indices(ctx):
    x = _x(ctx)
    idx = I64.from_slice(ctx, (3,), [1, 1, 3])
    for f in (lambda x, i: x.zero_rows("r", i), F.compile(lambda x, i: x.zero_rows("r", i))):
        np.testing.assert_array_equal(f(x, idx).numpy(), _zero_rows([1, 3]))


@pytest.mark.parametrize("op", ["set_rows", "index_add"])
def test_gradients_through_a_traced_index(ctx, op):
    # d/dx and d/du of sum(out * w) with w = [[1, 2]] * row number: x keeps its gradient
    # where rows are not overwritten; u reads w at its target rows.
    fn, _ = OPS[op]
    w = np.array([[1.0, 2.0]], dtype=np.float32) * np.arange(1, 5, dtype=np.float32)[:, None]
    values = [3, 0]

    def loss(x, i, u):
        out = fn(x, i, u).mul(X.from_slice(ctx, (4, 2), w)).sum_all()
        out.backward()
        return out

    want_gx = w.copy()
    if op == "set_rows":
        want_gx[values] = 0
    want_gu = w[values]
    for f in (loss, F.compile(loss)):
        for _ in range(2):
            x = X.variable_from_slice(ctx, (4, 2), BASE)
            u = X.variable_from_slice(ctx, (2, 2), UPD)
            idx = I64.from_slice(ctx, (2,), values)
            want = (_set_rows if op == "set_rows" else _index_add)(np.array(values))
            np.testing.assert_allclose(f(x, idx, u).item(), float((want * w).sum()))
            np.testing.assert_array_equal(x.grad().numpy(), want_gx)
            np.testing.assert_array_equal(u.grad().numpy(), want_gu)


def test_one_hot_accepts_every_index_form(ctx):
    want = np.eye(3, dtype=np.float32)[[2, 0, 1, 2]]
    for idx in _forms(ctx, [2, 0, 1, 2]):
        np.testing.assert_array_equal(M.one_hot(ctx, idx, 3).numpy(), want)
    fast = F.compile(lambda i: M.one_hot(ctx, i, 3).scale(2.0))
    for values in ([2, 0, 1, 2], [1, 1, 0, 2]):
        idx = I64.from_slice(ctx, (4,), values)
        np.testing.assert_array_equal(fast(idx).numpy(), 2 * np.eye(3)[values])
    assert fast.cache_size() == 1


@pytest.mark.parametrize("bad", [-1, 3])
def test_one_hot_bad_indices_match_eager(ctx, bad):
    errors = []
    with pytest.raises(F.IndexOutOfBounds) as info:
        M.one_hot(ctx, [0, bad], 3)
    errors.append(info.value)
    idx = I64.from_slice(ctx, (2,), [0, bad])
    fast = F.compile(lambda i: M.one_hot(ctx, i, 3))
    for f in (lambda i: M.one_hot(ctx, i, 3), fast, fast):
        with pytest.raises(F.IndexOutOfBounds) as info:
            f(idx)
        errors.append(info.value)
    assert {str(e) for e in errors} == {f"index {bad} out of range for 'one_hot depth' of size 3"}


def test_one_hot_tensor_on_another_context_is_refused(ctx):
    other = F.ExecContext()
    idx = I64.from_slice(other, (2,), [0, 1])
    with pytest.raises(F.ContextMismatch):
        M.one_hot(ctx, idx, 3)


def _q8(ctx):
    Q = F.Tensor("out", "in", dtype="q8_0")
    blocks = np.zeros(3, dtype=F.BlockQ8_0)
    blocks["d"] = [np.float16(s).view(np.uint16) for s in (1, 2, 4)]
    blocks["qs"][:] = 1
    return Q.from_blocks(ctx, (3, F.q8_0_block_size), blocks)


def test_get_rows_accepts_every_index_form(ctx):
    q = _q8(ctx)
    want = np.repeat(np.array([[4.0], [1.0]], dtype=np.float32), F.q8_0_block_size, axis=1)
    for idx in _forms(ctx, [2, 0]):
        np.testing.assert_array_equal(q.get_rows("out", idx, "b").numpy(), want)
    fast = F.compile(lambda i: q.get_rows("out", i, "b"))
    np.testing.assert_array_equal(fast(I64.from_slice(ctx, (2,), [2, 0])).numpy(), want)
    np.testing.assert_array_equal(fast(I64.from_slice(ctx, (2,), [1, 1])).numpy(),
                                  np.full((2, F.q8_0_block_size), 2.0))
    assert fast.cache_size() == 1
    for bad in (-1, 3):
        idx = I64.from_slice(ctx, (1,), [bad])
        for f in (lambda i: q.get_rows("out", i, "b"), fast, fast):
            with pytest.raises(F.IndexOutOfBounds, match=f"index {bad} out of range for 'out'"):
                f(idx)


def test_bad_index_tensors_raise_type_errors(ctx):
    x, u = _x(ctx), _u(ctx)
    floats = F.Tensor("k").from_slice(ctx, (2,), [0.0, 1.0])
    matrix = F.Tensor("a", "b", dtype="i64").from_slice(ctx, (1, 2), [[0, 1]])
    elsewhere = I64.from_slice(F.ExecContext(), (2,), [0, 1])
    for fn, _ in OPS.values():
        with pytest.raises(F.TagError, match="integer tensor"):
            fn(x, floats, u)
        with pytest.raises(F.TagError, match="rank-1"):
            fn(x, matrix, u)
        with pytest.raises(F.ContextMismatch):
            fn(x, elsewhere, u)
    with pytest.raises(F.InvalidShape, match="3 indices given"):
        x.index_add("r", I64.from_slice(ctx, (3,), [0, 1, 2]), u)


def test_rope_positions_accept_every_form(ctx):
    x0 = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    x = F.Tensor("seq", "d").from_slice(ctx, x0.shape, x0)
    P = F.Tensor("seq", dtype="i64")

    def rotate(x, p):
        return x.rope("seq", "d", F.RopeTheta(positions=p, theta_base=100.0), "half")

    fast = F.compile(rotate)
    for pos in ([0, 1, 2], [7, 3, 40]):
        # cos/sin of p * 100**(-2i/8) over the 4 pairs (features i and i + 4)
        ang = np.array(pos, np.float32)[:, None] * (100.0 ** (-np.arange(4) / 4.0))[None, :]
        c, s = np.cos(ang), np.sin(ang)
        a, b = x0[:, :4], x0[:, 4:]
        want = np.concatenate([a * c - b * s, a * s + b * c], axis=1)
        table = ctx.prepare_rope_table(P.from_slice(ctx, (3,), pos), 8, 100.0)
        np.testing.assert_allclose(table.cos, c, atol=2e-6)
        np.testing.assert_allclose(x.rope("seq", "d", table, "half").numpy(), want, atol=2e-5)
        for p in (pos, np.array(pos), P.from_slice(ctx, (3,), pos)):
            np.testing.assert_allclose(rotate(x, p).numpy(), want, atol=2e-5)
        np.testing.assert_allclose(fast(x, P.from_slice(ctx, (3,), pos)).numpy(), want,
                                   atol=2e-5)
    assert fast.cache_size() == 1


def test_a_rope_table_from_a_traced_tensor_names_the_alternative(ctx):
    fast = F.compile(lambda p: ctx.prepare_rope_table(p, 8, 100.0))
    with pytest.raises(F.UnsupportedView, match=r"prepare_rope_table.*RopeTheta"):
        fast(F.Tensor("seq", dtype="i64").from_slice(ctx, (3,), [0, 1, 2]))


SEC = np.arange(24, dtype=np.float32).reshape(2, 4, 3)  # sections: the 6 (a, b) pairs
S3 = F.Tensor("a", "t", "b")


def _shifted_ref(offsets, circular, fill):
    """Per-section roll/shift along axis 1, by hand (Python ints: no overflow)."""
    out = np.empty_like(SEC)
    for s, off in enumerate(offsets):
        a, b = divmod(s, 3)
        for j in range(4):
            src = j - off
            if circular:
                out[a, j, b] = SEC[a, src % 4, b]
            else:
                out[a, j, b] = SEC[a, src, b] if 0 <= src < 4 else fill
    return out


@pytest.mark.parametrize("circular", [True, False])
def test_roll_by_and_shift_by_accept_offset_tensors(ctx, circular):
    def op(x, o):
        return x.roll_by("t", o) if circular else x.shift_by("t", o, fill=-7.0)

    x = S3.from_slice(ctx, SEC.shape, SEC)
    fast = F.compile(op)
    S6 = F.Tensor("s", dtype="i64")
    for offs in ([1, -2, 5, 0, -9, 2**62], [0, 1, 2, 3, 4, -1], [-2**63, 2**63 - 1, 3, -3, 1, 1]):
        want = _shifted_ref(offs, circular, -7.0)
        forms = [offs, np.array(offs, dtype=np.int64), S6.from_slice(ctx, (6,), offs)]
        for o in forms:
            np.testing.assert_array_equal(op(x, o).numpy(), want)
        np.testing.assert_array_equal(fast(x, forms[-1]).numpy(), want)
    small = F.Tensor("s", dtype="i8").from_slice(ctx, (6,), [1, 2, 3, -1, -2, -3])
    np.testing.assert_array_equal(fast(x, small).numpy(),
                                  _shifted_ref([1, 2, 3, -1, -2, -3], circular, -7.0))
    assert fast.cache_size() == 2  # one program per offsets dtype, none per value
    with pytest.raises(F.InvalidShape, match="expected 6 integer offsets"):
        op(x, S6.from_slice(ctx, (5,), [0, 0, 0, 0, 0]))
    with pytest.raises(F.TagError, match="integer tensor"):
        op(x, F.Tensor("s").from_slice(ctx, (6,), np.zeros(6, np.float32)))


@pytest.mark.parametrize("circular", [True, False])
def test_offset_tensor_gradients_match_host_offsets(ctx, circular):
    offs = [1, -2, 5, 0, 9, 3]
    w = np.random.default_rng(2).standard_normal(SEC.shape).astype(np.float32)

    def loss(x, o):
        y = x.roll_by("t", o) if circular else x.shift_by("t", o, fill=2.0)
        out = y.mul(S3.from_slice(ctx, SEC.shape, w)).sum_all()
        out.backward()
        return out

    grads = []
    for f, o in ((loss, offs), (loss, F.Tensor("s", dtype="i64").from_slice(ctx, (6,), offs)),
                 (F.compile(loss), F.Tensor("s", dtype="i64").from_slice(ctx, (6,), offs))):
        x = S3.variable_from_slice(ctx, SEC.shape, SEC)
        val = f(x, o).item()
        np.testing.assert_allclose(val, float((_shifted_ref(offs, circular, 2.0) * w).sum()),
                                   rtol=1e-5)
        grads.append(x.grad().numpy())
    for g in grads[1:]:
        np.testing.assert_allclose(g, grads[0], rtol=1e-6)
    assert np.count_nonzero(grads[0]) > 0


@pytest.mark.parametrize("dtype", ["i32", "u8", "i16"])
def test_element_indices_of_any_integer_dtype(ctx, dtype):
    x = X.from_slice(ctx, (4, 2), BASE)
    values = [[3, 0], [1, 1], [0, 2], [2, 3]]
    want_take = np.take_along_axis(BASE, np.array(values), axis=0)
    want_add = BASE.copy()
    np.add.at(want_add, (np.array(values), np.arange(2)[None, :]), 2 * BASE)
    idx = F.Tensor("r", "c", dtype=dtype).from_slice(ctx, (4, 2), values)
    for f in (lambda x, i: (x.take_along_axis("r", i), x.scatter_add("r", i, x.scale(2.0))),):
        for g in (f, F.compile(f)):
            took, added = g(x, idx)
            np.testing.assert_array_equal(took.numpy(), want_take)
            np.testing.assert_array_equal(added.numpy(), want_add)
    bad = F.Tensor("r", "c", dtype=dtype).from_slice(ctx, (4, 2), [[0, 0], [0, 4], [0, 0], [0, 0]])
    fast = F.compile(lambda x, i: x.take_along_axis("r", i))
    for g in (lambda x, i: x.take_along_axis("r", i), fast, fast):
        with pytest.raises(F.IndexOutOfBounds, match="index 4 out of range for 'r' of size 4"):
            g(x, bad)
