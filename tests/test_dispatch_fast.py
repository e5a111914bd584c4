"""The eager fast path (fucina/tensor/fast.py) and the compiled plain lane give what the
normal paths give: the same values, the same exceptions, fresh results every call."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fucina as F
from fucina.tensor import fast

RNG = np.random.default_rng(7)
R, C = F.Tensor("r", "c"), F.Tensor("c", "r")


def arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def twice(fn):  # the first call learns the signature, the second takes the fast path
    first = fn().numpy()
    second = fn()
    return first, second


@pytest.fixture()
def ctx():
    c = F.ExecContext()
    yield c
    c.deinit()


def test_binary_unary_reduce_values_and_fast_signature(ctx):
    x, y = arr(3, 4), arr(3, 4)
    a, b = R.from_numpy(ctx, x), R.from_numpy(ctx, y)
    n_before = len(fast._FAST)
    for fn, want in [(lambda: a.add(b), x + y), (lambda: a.mul(b), x * y),
                     (lambda: a - b, x - y), (lambda: a.exp(), np.exp(x)),
                     (lambda: a.sum("c"), x.sum(1)), (lambda: a.sum("r"), x.sum(0))]:
        first, second = twice(fn)
        np.testing.assert_allclose(first, want, rtol=2e-6, atol=1e-6)
        np.testing.assert_array_equal(second.numpy(), first)
        assert not second.requires_grad
    assert len(fast._FAST) >= n_before + 5 or len(fast._FAST) >= fast.FAST_CACHE_SIZE // 2
    # every call writes a fresh buffer: earlier results keep their values
    r1, r2 = a.add(b), a.add(b)
    assert r1.as_raw_tensor().storage.buf is not r2.as_raw_tensor().storage.buf
    assert type(r1) is R and r1.axis_tags == ("r", "c")


def test_fast_path_is_taken_and_reads_current_data(ctx):
    x = arr(8)
    a = F.Tensor("d").from_numpy(ctx, x)
    a.add(a)
    hit = fast._FAST.get(("add", type(a), type(a), (8,), (1,), (8,), (1,)))
    assert hit is not None and hit.entry is not None
    a.data()[:] = 2.0  # an in-place write between calls is seen
    np.testing.assert_array_equal(a.add(a).numpy(), np.full(8, 4.0, np.float32))


def test_offsets_of_views_are_read_per_call(ctx):
    x = arr(10)
    a = F.Tensor("d").from_numpy(ctx, x)
    for start in (0, 2, 5, 2, 0):  # same shape and strides, different offsets
        v = a.slice(d=slice(start, start + 4))
        w = a.slice(d=slice(1, 5))
        np.testing.assert_allclose(v.add(w).numpy(), x[start:start + 4] + x[1:5])
        np.testing.assert_allclose(v.exp().numpy(), np.exp(x[start:start + 4]), rtol=2e-6)
        np.testing.assert_allclose(v.sum("d").numpy(), x[start:start + 4].sum(), rtol=1e-5)


def test_broadcast_and_non_contiguous_operands(ctx):
    x, y, z = arr(3, 4), arr(4), arr(4, 3)
    a = R.from_numpy(ctx, x)
    bias = F.Tensor("c").from_numpy(ctx, y)
    t = C.from_numpy(ctx, z).permute_to(("r", "c"))  # a transposed view
    for _ in range(3):
        np.testing.assert_allclose(a.add(bias).numpy(), x + y)
        np.testing.assert_allclose(a.mul(t).numpy(), x * z.T)
        np.testing.assert_allclose(t.exp().numpy(), np.exp(z.T), rtol=2e-6)
        np.testing.assert_allclose(t.sum("c").numpy(), z.T.sum(1), rtol=1e-5)


def test_same_exceptions_after_the_signature_is_known(ctx):
    a = R.from_numpy(ctx, arr(2, 3))
    b = R.from_numpy(ctx, arr(2, 3))
    a.add(b)
    a.add(b)  # learned
    other = F.ExecContext()
    c = R.from_numpy(other, arr(2, 3))
    for _ in range(2):
        with pytest.raises(F.ContextMismatch):
            a.add(c)
        with pytest.raises(TypeError):
            a.add("x")
        # a tensor type where a tensor belongs: TypeError naming the argument (regression:
        # binary ops reported ContextMismatch), never an AttributeError from the fast path
        with pytest.raises(TypeError, match="argument 'other' expects a fucina tensor"):
            a.add(R)
        with pytest.raises(TypeError):
            a.dot(R, "c")
        with pytest.raises(F.ShapeMismatch):
            a.add(R.from_numpy(ctx, arr(3, 3)))
        with pytest.raises(F.TagError):
            a.add(R.from_numpy(ctx, arr(2, 3)).to("f64"))
        with pytest.raises(F.TagError):
            a.sum("nope")
        with pytest.raises(TypeError):
            a.sum(["c"])
    b.deinit()
    with pytest.raises(F.Deinitialized):
        a.add(b)
    other.deinit()
    with pytest.raises(F.Deinitialized):
        c.add(c)
    d = R.from_numpy(ctx, arr(2, 3))
    d.exp()
    ctx.deinit()
    with pytest.raises(F.Deinitialized):
        d.exp()
    with pytest.raises(F.Deinitialized):
        d.sum("c")


def test_requires_grad_takes_the_graph_path(ctx):
    x, y = arr(2, 3), arr(2, 3)
    c = R.from_numpy(ctx, y)
    plain = R.from_numpy(ctx, x)
    plain.mul(c)
    plain.mul(c)  # the signature (same types, shapes, strides) is known
    w = R.variable_from_slice(ctx, (2, 3), x)
    out = w.mul(c)
    assert out.requires_grad
    out.exp().sum("c").sum("r").backward()
    np.testing.assert_allclose(w.grad().numpy(), np.exp(x * y) * y, rtol=1e-5)
    with F.no_grad():
        assert not w.mul(c).requires_grad


def test_results_join_exec_scopes(ctx):
    a = R.from_numpy(ctx, arr(2, 3))
    a.add(a)
    with ctx.exec_scope():
        inner = a.add(a)
        assert inner.numpy().shape == (2, 3)
    with pytest.raises(F.Deinitialized):
        inner.numpy()


def test_tracing_does_not_take_the_fast_path(ctx):
    x, y = arr(2, 3), arr(2, 3)
    a, b = R.from_numpy(ctx, x), R.from_numpy(ctx, y)
    a.add(b).exp()
    a.add(b).exp()
    f = F.compile(lambda p, q: p.add(q).exp().sum("c"))
    for _ in range(3):
        np.testing.assert_allclose(f(a, b).numpy(), np.exp(x + y).sum(1), rtol=1e-5)


def test_other_dtypes_and_threads(ctx):
    i = F.Tensor("d", dtype="i32").from_slice(ctx, (4,), [1, 2, 3, 2**31 - 1])
    for _ in range(2):
        np.testing.assert_array_equal(i.add(i).numpy(),
                                      np.array([2, 4, 6, -2], np.int32))
    zero = F.Tensor("d", dtype="i32").from_slice(ctx, (4,), [1, 0, 1, 1])
    one = F.Tensor("d", dtype="i32").from_slice(ctx, (4,), [1, 1, 1, 1])
    for _ in range(2):  # integer division checks its divisor on every call
        np.testing.assert_array_equal(i.div_trunc(one).numpy(), i.numpy())
        with pytest.raises(F.DivisionByZero):
            i.div_trunc(zero)
    d = F.Tensor("d", dtype="f64").from_slice(ctx, (3,), [0.5, 1.0, 2.0])
    for _ in range(2):
        np.testing.assert_array_equal(d.mul(d).numpy(), np.array([0.25, 1.0, 4.0]))
        assert d.sum("d").item() == 3.5
    h = F.Tensor("d", dtype="f16").from_slice(ctx, (3,), [0.0, 1.0, 2.0])
    for _ in range(2):  # cast -> exp -> cast: the normal path
        np.testing.assert_allclose(h.exp().numpy(), np.exp([0.0, 1.0, 2.0]), rtol=1e-3)
    e = F.Tensor("d").from_slice(ctx, (3,), [0.0, 1.0, 2.0])
    e.exp()
    got = []
    th = threading.Thread(target=lambda: got.append(e.exp().numpy()))  # no tracer state yet
    th.start()
    th.join()
    np.testing.assert_allclose(got[0], np.exp([0.0, 1.0, 2.0]), rtol=2e-6)


def test_dot_layouts(ctx):
    K = F.Tensor("k", "n")
    x, w, wt = arr(3, 5), arr(5, 4), arr(4, 5)
    a = F.Tensor("m", "k").from_numpy(ctx, x)
    b = K.from_numpy(ctx, w)
    bt = F.Tensor("n", "k").from_numpy(ctx, wt)  # read transposed, no copy
    for _ in range(3):
        np.testing.assert_allclose(a.dot(b, "k").numpy(), x @ w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a.dot(bt, "k").numpy(), x @ wt.T, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.dot(a, "k").numpy(), w.T @ x.T, rtol=1e-5, atol=1e-6)
    big = arr(6, 5)
    full = F.Tensor("m", "k").from_numpy(ctx, big)
    for start in (0, 2, 3, 0):  # same layout at different offsets
        v = full.slice(m=slice(start, start + 3))
        np.testing.assert_allclose(v.dot(b, "k").numpy(), big[start:start + 3] @ w,
                                   rtol=1e-5, atol=1e-6)
    ba = F.Tensor("b", "m", "k").from_numpy(ctx, arr(2, 3, 5))
    bb = F.Tensor("b", "k", "n").from_numpy(ctx, arr(2, 5, 4))
    for _ in range(2):
        np.testing.assert_allclose(ba.dot(bb, "k").numpy(), ba.numpy() @ bb.numpy(),
                                   rtol=1e-5, atol=1e-6)
    b.data()[:] = 1.0  # an in-place write to a weight between calls is seen
    np.testing.assert_allclose(a.dot(b, "k").numpy(), x @ np.ones((5, 4), np.float32),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(F.ShapeMismatch):
        a.dot(F.Tensor("k", "n").from_numpy(ctx, arr(4, 4)), "k")
    with pytest.raises(F.TagError):
        a.dot(b, "zz")
    v = F.Tensor("m", "k").variable_from_slice(ctx, (3, 5), x)
    v.dot(b, "k").sum("n").sum("m").backward()
    np.testing.assert_allclose(v.grad().numpy(), np.full((3, 5), 4.0), rtol=1e-5)


def test_compiled_plain_lane_matches_eager(ctx):
    f = F.compile(lambda p, q: p.add(q))
    x, y = arr(2, 3), arr(2, 3)
    a, b = R.from_numpy(ctx, x), R.from_numpy(ctx, y)
    outs = [f(a, b) for _ in range(3)]
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), a.add(b).numpy())
    assert outs[0].as_raw_tensor().storage.buf is not outs[1].as_raw_tensor().storage.buf
    # the same tensor in both positions, a variable, another context, a transposed view
    np.testing.assert_array_equal(f(a, a).numpy(), x + x)
    v = R.variable_from_slice(ctx, (2, 3), x)
    out = f(v, b)
    assert out.requires_grad
    out.sum("c").sum("r").backward()
    np.testing.assert_array_equal(v.grad().numpy(), np.ones((2, 3), np.float32))
    other = F.ExecContext()
    with pytest.raises(F.ContextMismatch):
        f(a, R.from_numpy(other, y))
    t = C.from_numpy(ctx, arr(3, 2)).permute_to(("r", "c"))
    np.testing.assert_array_equal(f(a, t).numpy(), x + t.numpy())
    b.deinit()
    with pytest.raises(F.Deinitialized):
        f(a, b)


def test_plain_lane_signatures_and_fallbacks(ctx):
    f = F.compile(lambda p, q: p.mul(q))
    x, y = arr(2, 3), arr(2, 3)
    a, b = R.from_numpy(ctx, x), R.from_numpy(ctx, y)
    f(a, b)
    assert len(f._lane.table) == 1
    np.testing.assert_array_equal(f(a, b).numpy(), x * y)
    # the same tensor twice, and two views of one storage, take the general path
    np.testing.assert_array_equal(f(a, a).numpy(), x * x)
    whole = F.Tensor("d").from_numpy(ctx, np.arange(12, dtype=np.float32))
    lo, hi = whole.slice(d=slice(0, 6)), whole.slice(d=slice(6, 12))
    g = F.compile(lambda p, q: p.add(q))
    for _ in range(3):
        np.testing.assert_array_equal(g(lo, hi).numpy(), np.arange(6) * 2.0 + 6)
    assert len(g._lane.table) == 0
    with F.no_grad():  # grad mode is part of the signature
        np.testing.assert_array_equal(f(a, b).numpy(), x * y)
    with ctx.exec_scope():
        inner = f(a, b)
    with pytest.raises(F.Deinitialized):
        inner.numpy()


def test_plain_lane_skips_programs_with_captures(ctx):
    x, y = arr(3), arr(3)
    T1 = F.Tensor("d")
    box = {"w": T1.from_numpy(ctx, y)}
    f = F.compile(lambda p: p.add(box["w"]))
    a = T1.from_numpy(ctx, x)
    np.testing.assert_array_equal(f(a).numpy(), x + y)
    assert len(f._lane.table) == 0
    box["w"] = T1.from_numpy(ctx, 2 * y)  # rebinding a captured tensor takes effect
    np.testing.assert_array_equal(f(a).numpy(), x + 2 * y)
    h = F.compile(lambda p: (p.exp(), p.sum("d")))
    for _ in range(3):
        e, s = h(a)
        np.testing.assert_allclose(e.numpy(), np.exp(x), rtol=2e-6)
        np.testing.assert_allclose(s.numpy(), x.sum(), rtol=1e-5)


_TAG = "d"
_SCALE = 2.0


def test_plain_lane_checks_guards_on_every_call(ctx):
    # A program that read Python values (a global tag and scale, a closure's function
    # name) runs in the lane, with every guard re-read per call: a changed value
    # retraces, a restored one runs the first trace again, never a stale value.
    global _TAG, _SCALE
    x, y = arr(3, 4), arr(3, 4)
    P = F.Tensor("b", "d")
    a, b = P.from_numpy(ctx, x), P.from_numpy(ctx, y)
    name = "sum"
    one = F.compile(lambda p: getattr(p, name)(_TAG))
    two = F.compile(lambda p, q: p.add(q).scale(_SCALE))
    dot = F.compile(lambda p, q: p.dot(q, _TAG))
    try:
        for _ in range(3):
            np.testing.assert_allclose(one(a).numpy(), x.sum(1), rtol=1e-6)
            np.testing.assert_array_equal(two(a, b).numpy(), (x + y) * np.float32(2))
            np.testing.assert_allclose(dot(a, b).numpy(), (x * y).sum(1), rtol=1e-5)
        for f in (one, two, dot):
            (route,) = f._lane.table.values()
            assert route.caps is not None and route.caps.guards >= 1
        assert one._lane.table[one._lane.last[0]].kernel is not None  # the inline run
        _TAG, _SCALE, name = "b", 3.0, "max"
        r = one(a)
        assert type(r).axis_tags == ("d",)
        np.testing.assert_array_equal(r.numpy(), x.max(0))
        np.testing.assert_array_equal(two(a, b).numpy(), (x + y) * np.float32(3))
        np.testing.assert_allclose(dot(a, b).numpy(), (x * y).sum(0), rtol=1e-5)
        _TAG, _SCALE, name = "d", 2.0, "sum"
        np.testing.assert_allclose(one(a).numpy(), x.sum(1), rtol=1e-6)
        np.testing.assert_array_equal(two(a, b).numpy(), (x + y) * np.float32(2))
        _TAG = 5  # a bad tag now: the same error as eager
        with pytest.raises(F.TagError):
            one(a)
    finally:
        _TAG, _SCALE = "d", 2.0


def _error(fn):
    try:
        fn()
    except Exception as e:  # the type and message, for comparing two paths
        return type(e), str(e)
    return None


def test_plain_lane_one_argument_inline_matches_eager(ctx):
    x = arr(3, 4)
    a = R.from_numpy(ctx, x)
    f = F.compile(lambda p: p.exp())
    g = F.compile(lambda p: p.sum("c"))
    for fn, eager in ((f, lambda t: t.exp()), (g, lambda t: t.sum("c"))):
        outs = [fn(a) for _ in range(4)]  # trace, learn, first lane run, inline runs
        (route,) = fn._lane.table.values()
        assert route.kernel is not None  # the inline run is in use
        for o in outs:
            assert type(o) is type(eager(a))
            np.testing.assert_array_equal(o.numpy(), eager(a).numpy())
        bufs = {id(o.as_raw_tensor().storage.buf) for o in outs}
        assert len(bufs) == len(outs)  # a fresh buffer per call
    a.data()[:] = 0.5  # in-place writes between calls are seen
    np.testing.assert_array_equal(f(a).numpy(), np.exp(np.full((3, 4), 0.5, np.float32)))
    np.testing.assert_array_equal(g(a).numpy(), np.full(3, 2.0, np.float32))
    # same layout at another offset: read per call
    whole = F.Tensor("d").from_numpy(ctx, arr(10))
    h = F.compile(lambda p: p.exp())
    for start in (0, 3, 1, 0, 5):
        v = whole.slice(d=slice(start, start + 4))
        np.testing.assert_array_equal(h(v).numpy(), v.exp().numpy())
    with ctx.exec_scope():
        inner = f(a)
    with pytest.raises(F.Deinitialized):
        inner.numpy()


def test_plain_lane_bad_inputs_raise_as_eager(ctx):
    """Every input the inline lane could see wrongly raises what the eager op raises."""
    x, y = arr(2, 3), arr(2, 3)
    add = F.compile(lambda p, q: p.add(q))
    ex = F.compile(lambda p: p.exp())
    a, b = R.from_numpy(ctx, x), R.from_numpy(ctx, y)
    for _ in range(4):  # the signatures are in the lane with inline runners
        add(a, b)
        ex(a)
    assert all(r.kernel is not None for r in add._lane.table.values())
    assert all(r.kernel is not None for r in ex._lane.table.values())
    other = F.ExecContext()
    bad = {
        "wrong shape": R.from_numpy(ctx, arr(3, 3)),
        "wrong dtype": R.from_numpy(ctx, y).to("f64"),
        "swapped tags": C.from_numpy(ctx, y),
        "another context": R.from_numpy(other, y),
        "tensor type": R,
        "string": "x",
    }
    for name, v in bad.items():
        want = _error(lambda v=v: a.add(v))
        assert want is not None, name
        assert _error(lambda v=v: add(a, v)) == want, name
    dead = R.from_numpy(ctx, y)
    dead.deinit()
    assert _error(lambda: add(a, dead))[0] is _error(lambda: a.add(dead))[0] is F.Deinitialized
    assert _error(lambda: ex(dead))[0] is _error(lambda: dead.exp())[0] is F.Deinitialized
    d = R.from_numpy(other, x)
    ex(d), ex(d), ex(d)
    other.deinit()  # a closed context: both raise Deinitialized
    assert _error(lambda: ex(d))[0] is _error(lambda: d.exp())[0] is F.Deinitialized
    # the lane still works for good inputs afterwards
    np.testing.assert_array_equal(add(a, b).numpy(), a.add(b).numpy())


def test_numpy_dot_and_matmul_make_the_same_blas_call():
    """The premise of the fast dot's ``np.dot``: on whole C/F-contiguous matrices with
    every dimension above 1 it gives matmul's bits (gemm, or syrk for X.X^T)."""
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        for m, k, n in ((2, 2, 2), (8, 8, 8), (3, 17, 5), (33, 9, 64), (70, 130, 20)):
            x = rng.standard_normal((m, k)).astype(dt)
            w = rng.standard_normal((k, n)).astype(dt)
            for A in (x, np.asfortranarray(x)):
                for B in (w, np.asfortranarray(w)):
                    np.testing.assert_array_equal(np.dot(A, B), np.matmul(A, B))
            np.testing.assert_array_equal(np.dot(x, x.T), np.matmul(x, x.T))


def test_fast_dot_gives_the_normal_paths_bits(ctx):
    """Every fast-dot call equals the first (normal-path) call and the compiled program
    bit for bit: 2-D products of several layouts (np.dot), strided views (np.matmul),
    stacks (the stacked kernel)."""
    rng = np.random.default_rng(11)
    f = F.compile(lambda p, q: p.dot(q, "k"))

    def check(a, b):
        first = a.dot(b, "k").numpy()
        for _ in range(3):
            np.testing.assert_array_equal(a.dot(b, "k").numpy(), first)
        for _ in range(3):
            np.testing.assert_array_equal(f(a, b).numpy(), first)

    def t(tags, shape, dtype=np.float32):
        return F.Tensor(*tags, dtype="f32" if dtype == np.float32 else "f64").from_numpy(
            ctx, rng.standard_normal(shape).astype(dtype))

    for dtype in (np.float32, np.float64):
        for m, k, n in ((8, 8, 8), (3, 17, 5), (40, 33, 70), (1, 8, 8), (8, 1, 8), (8, 8, 1)):
            x, w = t(("m", "k"), (m, k), dtype), t(("k", "n"), (k, n), dtype)
            wt = t(("n", "k"), (n, k), dtype)  # a transposed weight: F-contiguous view
            check(x, w)
            check(x, wt)
            check(w, x)
    big = t(("m", "k"), (12, 20))
    w = t(("k", "n"), (10, 6))
    check(big.slice(m=slice(2, 9), k=slice(0, 10)), w)  # rows of a wider matrix
    check(big.slice(k=slice(3, 13)), w)
    sa = t(("b", "m", "k"), (4, 32, 16))
    sb = t(("b", "k", "n"), (4, 16, 32))
    check(sa, sb)  # a stack the stacked kernel serves
    check(t(("b", "m", "k"), (2, 3, 4)), t(("b", "k", "n"), (2, 4, 5)))
    routes = list(f._lane.table.values())
    assert routes and all(r.gemm is not None for r in routes)
    assert all(r.fast is not None for r in routes)  # the compiled calls ran inline


def test_compiled_one_gemm_lane_matches_eager(ctx):
    x, w = arr(3, 5), arr(5, 4)
    a = F.Tensor("m", "k").from_numpy(ctx, x)
    b = F.Tensor("k", "n").from_numpy(ctx, w)
    f = F.compile(lambda p, q: p.dot(q, "k"))
    outs = [f(a, b) for _ in range(4)]
    (route,) = f._lane.table.values()
    assert route.fast is not None
    want = a.dot(b, "k").numpy()
    for o in outs:
        assert type(o) is type(a.dot(b, "k"))
        np.testing.assert_array_equal(o.numpy(), want)
    assert len({id(o.as_raw_tensor().storage.buf) for o in outs}) == len(outs)
    b.data()[:] = 1.0  # an in-place write to the weight between calls is seen
    np.testing.assert_array_equal(f(a, b).numpy(), a.dot(b, "k").numpy())
    big = F.Tensor("m", "k").from_numpy(ctx, arr(7, 5))
    for start in (0, 2, 4, 0):  # same layout at other offsets
        v = big.slice(m=slice(start, start + 3))
        np.testing.assert_array_equal(f(v, b).numpy(), v.dot(b, "k").numpy())
    other = F.ExecContext()
    bad = {
        "wrong shape": F.Tensor("k", "n").from_numpy(ctx, arr(4, 4)),
        "wrong dtype": F.Tensor("k", "n").from_numpy(ctx, w).to("f64"),
        "another context": F.Tensor("k", "n").from_numpy(other, w),
        "tensor type": F.Tensor("k", "n"),
        "string": "x",
    }
    for name, v in bad.items():
        want_err = _error(lambda v=v: a.dot(v, "k"))
        assert want_err is not None, name
        assert _error(lambda v=v: f(a, v)) == want_err, name
    dead = F.Tensor("k", "n").from_numpy(ctx, w)
    f(a, dead), f(a, dead)
    dead.deinit()
    assert _error(lambda: f(a, dead))[0] is _error(lambda: a.dot(dead, "k"))[0] \
        is F.Deinitialized
    c = F.Tensor("m", "k").from_numpy(other, x)
    d = F.Tensor("k", "n").from_numpy(other, w)
    f(c, d), f(c, d), f(c, d)
    other.deinit()
    assert _error(lambda: f(c, d))[0] is _error(lambda: c.dot(d, "k"))[0] is F.Deinitialized
    np.testing.assert_array_equal(f(a, b).numpy(), a.dot(b, "k").numpy())


def test_compiled_call_forms_through_the_lane_entry(ctx):
    """``Compiled.__call__`` takes two positional-only slots before ``*rest``: keyword
    calls (even ones named like those slots), three or no arguments, and a mix of
    positional and keyword arguments reach the function as given."""
    x, y, z = arr(2, 3), arr(2, 3), arr(2, 3)
    a, b, c = (R.from_numpy(ctx, v) for v in (x, y, z))
    f = F.compile(lambda a, b: a.sub(b))  # parameters named like enter's slots
    for _ in range(3):
        np.testing.assert_array_equal(f(a, b).numpy(), x - y)
        np.testing.assert_array_equal(f(a=a, b=b).numpy(), x - y)
        np.testing.assert_array_equal(f(b=a, a=b).numpy(), y - x)
        np.testing.assert_array_equal(f(a, b=b).numpy(), x - y)
    three = F.compile(lambda p, q, r: p.add(q).mul(r))
    for _ in range(3):
        np.testing.assert_allclose(three(a, b, c).numpy(), (x + y) * z, rtol=1e-6)
    none = F.compile(lambda: R.from_numpy(ctx, x).exp())
    for _ in range(2):
        np.testing.assert_allclose(none().numpy(), np.exp(x), rtol=2e-6)
    one = F.compile(lambda p, scale=2.0: p.scale(scale))
    for _ in range(3):
        np.testing.assert_array_equal(one(a).numpy(), x * 2)
        np.testing.assert_array_equal(one(a, scale=3.0).numpy(), x * 3)
        np.testing.assert_array_equal(one(a, 4.0).numpy(), x * 4)
    for bad in (lambda: f(a), lambda: f(a, b, c), lambda: f(a, b, b=b), lambda: f(a, d=b)):
        with pytest.raises(TypeError):
            bad()


def test_open_counters_track_blocks_across_threads(ctx):
    """The global counters hot paths read before a thread-local (no_grad blocks, exec
    scopes, tracers) rise while a block is open on any thread and fall back after it
    closes, also when it raises; each thread still sees only its own state."""
    from fucina.ir.execute import TRACING
    from fucina.runtime.context import SCOPES_OPEN
    from fucina.runtime.gradmode import NO_GRAD_OPEN, enable_grad

    base = NO_GRAD_OPEN[0], SCOPES_OPEN[0], TRACING[0]
    with pytest.raises(ValueError):
        with F.no_grad():
            assert NO_GRAD_OPEN[0] == base[0] + 1 and not F.is_grad_enabled()
            with enable_grad():
                assert F.is_grad_enabled()
            raise ValueError
    with pytest.raises(ValueError):
        with ctx.exec_scope():
            assert SCOPES_OPEN[0] == base[1] + 1
            raise ValueError
    seen = []

    def traced(p):
        seen.append(TRACING[0])
        return p.exp()

    def failing(p):
        raise ValueError("in the trace")

    a = R.from_numpy(ctx, arr(2, 3))
    F.compile(traced)(a)
    with pytest.raises(ValueError):
        F.compile(failing)(a)
    assert seen == [base[2] + 1]
    assert (NO_GRAD_OPEN[0], SCOPES_OPEN[0], TRACING[0]) == base

    # Another thread holds no_grad and an exec scope open: this thread's grad mode,
    # its results (not adopted by that scope) and its compiled lane are unaffected.
    f = F.compile(lambda p, q: p.mul(q))
    b = R.from_numpy(ctx, arr(2, 3))
    want = a.numpy() * b.numpy()
    opened, done = threading.Event(), threading.Event()
    theirs: dict[str, object] = {}

    def other():
        with F.no_grad(), ctx.exec_scope():
            theirs["grad"] = F.is_grad_enabled()
            theirs["out"] = f(a, b)
            opened.set()
            done.wait(10)
        theirs["after"] = F.is_grad_enabled()

    t = threading.Thread(target=other)
    t.start()
    assert opened.wait(10)
    assert NO_GRAD_OPEN[0] == base[0] + 1 and SCOPES_OPEN[0] == base[1] + 1
    assert F.is_grad_enabled()
    mine = [f(a, b) for _ in range(3)] + [a.mul(b) for _ in range(3)]
    done.set()
    t.join()
    assert theirs["grad"] is False and theirs["after"] is True
    with pytest.raises(F.Deinitialized):  # adopted by the other thread's scope
        theirs["out"].numpy()  # type: ignore[attr-defined]
    for o in mine:  # never adopted by it
        np.testing.assert_array_equal(o.numpy(), want)
    assert {k[0] for k in f._lane.table} == {True, False}  # grad mode keys the lane
    assert (NO_GRAD_OPEN[0], SCOPES_OPEN[0], TRACING[0]) == base


def test_plain_lane_last_signature_and_result_storage(ctx, monkeypatch):
    """The lane's remembered last signature never serves another one (shape, strides,
    grad mode, arity), survives the table being emptied, and an inline run's result is
    built as the eager op builds it (pooled storage for a large result, a fresh buffer
    every call)."""
    from fucina import plain_lane

    x, y = arr(2, 3), arr(2, 3)
    a, b = R.from_numpy(ctx, x), R.from_numpy(ctx, y)
    a4, b4 = R.from_numpy(ctx, arr(4, 3)), R.from_numpy(ctx, arr(4, 3))
    t = C.from_numpy(ctx, arr(3, 2)).permute_to(("r", "c"))  # same shape, other strides
    f = F.compile(lambda p, q: p.mul(q))
    calls = [(a, b), (a4, b4), (a, t), (t, b)] * 3
    for p, q in calls:  # alternating signatures: each call its own
        np.testing.assert_array_equal(f(p, q).numpy(), p.numpy() * q.numpy())
    # an equal key made of other tuple objects still finds the route
    a_again = R.from_numpy(ctx, x.copy())
    assert a_again.as_raw_tensor().shape is not a.as_raw_tensor().shape
    f(a, b)
    np.testing.assert_array_equal(f(a_again, b).numpy(), x * y)
    assert f._lane.last[0] == (True, R, (2, 3), (3, 1), R, (2, 3), (3, 1))
    with F.no_grad():  # (the first call traces, the next ones find the route)
        for _ in range(3):
            np.testing.assert_array_equal(f(a, b).numpy(), x * y)
        assert f._lane.last[0][0] is False
    np.testing.assert_array_equal(f(a, b).numpy(), x * y)
    assert f._lane.last[0][0] is True

    monkeypatch.setattr(plain_lane, "LANE_SIZE", 2)
    g = F.compile(lambda p, q: p.add(q))
    for p, q in [(a, b), (a, b), (a4, b4), (a4, b4), (a, t), (a, t)]:
        np.testing.assert_array_equal(g(p, q).numpy(), p.numpy() + q.numpy())
    assert len(g._lane.table) <= 2 and g._lane.last[1] in g._lane.table.values()

    big = arr(128, 256)  # well above the pool threshold
    u, v = R.from_numpy(ctx, big), R.from_numpy(ctx, big[::-1].copy())
    h = F.compile(lambda p, q: p.sub(q))
    e = F.compile(lambda p: p.exp())
    outs = [h(u, v) for _ in range(4)]
    exps = [e(u) for _ in range(4)]
    assert h._lane.last[1].kernel is not None and e._lane.last[1].kernel is not None
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), u.sub(v).numpy())
        assert type(o.as_raw_tensor().storage) is type(u.sub(v).as_raw_tensor().storage)
    for o in exps:
        np.testing.assert_array_equal(o.numpy(), u.exp().numpy())
    assert len({id(o.as_raw_tensor().storage.buf) for o in outs + exps}) == 8


def _all_slots(cls):
    return {s for k in cls.__mro__ for s in getattr(k, "__slots__", ()) if s != "__weakref__"}


def test_both_result_builders_set_every_slot():
    """``fast.result`` and the plain lane's inline copy build Storage/RawTensor/Node
    without their constructors: a slot either forgets reads as AttributeError later."""
    ctx = F.ExecContext()
    x = F.Tensor("a").from_slice(ctx, (4,), np.arange(4, dtype=np.float32))
    y = F.Tensor("a").from_slice(ctx, (4,), np.ones(4, dtype=np.float32))
    f = F.compile(lambda a, b: a.add(b))
    for t in (x.add(y), x.add(y), f(x, y), f(x, y), f(x, y)):  # first calls and fast paths
        node = t._node_
        for obj in (node, node.value, node.value.storage):
            missing = [s for s in _all_slots(type(obj)) if not hasattr(obj, s)]
            assert not missing, f"{type(obj).__name__} built without {missing}"
        np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_one_gemm_lane_only_for_a_lone_product(ctx):
    """``Program.one_gemm_node`` takes a program that is one product of its two
    arguments, and nothing more: a product followed by another op runs through the
    program."""
    a = F.Tensor("m", "k").from_numpy(ctx, arr(3, 5))
    b = F.Tensor("k", "n").from_numpy(ctx, arr(5, 4))
    cases = [
        (lambda p, q: p.dot(q, "k"), (a, b), True),
        (lambda p, q: p.dot(q, "k").exp(), (a, b), False),
        (lambda p, q: p.dot(q, "k").scale(2.0), (a, b), False),
    ]
    for fn, args, lone in cases:
        f = F.compile(fn)
        for _ in range(3):
            np.testing.assert_array_equal(f(*args).numpy(), fn(*args).numpy())
        (route,) = f._lane.table.values()
        assert (route.gemm is not None) is lone


@pytest.mark.parametrize("shape", [(8, 8, 8), (3, 1, 5), (40, 70, 30)])
def test_fast_dots_give_ieee_results_without_numpy_errors(ctx, shape):
    # An inf times a zero is NaN, a defined value here as in a program: the eager fast
    # dot and the compiled one-GEMM lane made numpy warn ("invalid value encountered in
    # dot"), and raise under np.seterr(all="raise"), where the normal paths did neither.
    m, k, n = shape
    x, w = arr(m, k), np.zeros((k, n), np.float32)
    x[0, 0], x[-1, -1] = np.inf, np.nan
    a = F.Tensor("m", "k").from_numpy(ctx, x)
    b = F.Tensor("k", "n").from_numpy(ctx, w)
    f = F.compile(lambda p, q: p.dot(q, "k"))
    with np.errstate(all="ignore"):
        want = x.astype(np.float64) @ w.astype(np.float64)
    before = np.geterr()
    with np.errstate(all="raise"):
        eager = [a.dot(b, "k").numpy() for _ in range(3)]  # normal path, then the fast one
        compiled = [f(a, b).numpy() for _ in range(3)]
        assert np.geterr()["invalid"] == "raise"  # the caller's state comes back
    assert np.geterr() == before
    for got in eager + compiled:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6)
    assert np.isnan(eager[-1][0]).all() and np.isnan(compiled[-1][-1]).all()


@pytest.mark.parametrize("shape", [(2, 8, 8, 8), (2, 3, 1, 5)])
def test_stacked_fast_dots_give_ieee_results_without_numpy_errors(ctx, shape):
    # Stacks go to fucina's matmul, which hands small ones to numpy's BLAS: its call
    # was the one product call the fast dots did not wrap (FloatingPointError under
    # np.seterr(all="raise") from the second eager call and the compiled lane).
    s, m, k, n = shape
    x, w = arr(s * m, k).reshape(s, m, k), np.zeros((s, k, n), np.float32)
    x[0, 0, 0], x[-1, -1, -1] = np.inf, np.nan
    a = F.Tensor("s", "m", "k").from_numpy(ctx, x)
    b = F.Tensor("s", "k", "n").from_numpy(ctx, w)
    f = F.compile(lambda p, q: p.dot(q, "k"))
    with np.errstate(all="ignore"):
        want = x.astype(np.float64) @ w.astype(np.float64)
    with np.errstate(all="raise"):
        got = [a.dot(b, "k").numpy() for _ in range(3)] + [f(a, b).numpy() for _ in range(3)]
    for g in got:
        np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
        np.testing.assert_array_equal(g[~np.isnan(want)], want[~np.isnan(want)])
    assert np.isnan(got[-1][0, 0]).all() and np.isnan(got[-1][-1, -1]).all()


def test_error_state_switch_restores_the_callers_state():
    from fucina.runtime import ieee

    def divide():
        assert set(np.geterr().values()) == {"ignore"}
        return np.float32(1.0) / np.float32(0.0)  # no FloatingPointError, no warning

    for call in (ieee.quiet(divide), ieee._quiet(divide, ieee._Seterr(), None)):
        with np.errstate(divide="raise", over="warn", invalid="call", under="ignore"):
            np.seterrcall(lambda *a: None)
            before = np.geterr()
            assert call() == np.inf
            assert np.geterr() == before
