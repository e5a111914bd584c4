"""fucina.compile: captured tensors are live inputs, captured Python values are guarded."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

T = F.Tensor("d")
I64 = F.Tensor("d", dtype="i64")


def _vec(ctx, values):
    return T.from_slice(ctx, (len(values),), values)


# Module-level state for the globals tests (rebound by the tests themselves).
GLOBAL_W = None
GLOBAL_SCALE = 2.0


def test_rebinding_a_closure_tensor_is_seen_without_a_retrace(ctx):
    # The case: 12.0 before, 60.0 after rebinding (eager gives 60.0).
    w = _vec(ctx, [1.0, 2.0, 3.0])
    x = _vec(ctx, [2.0, 2.0, 2.0])
    fast = F.compile(lambda x: x.mul(w).sum_all())
    assert fast(x).item() == 12.0
    w = _vec(ctx, [5.0, 10.0, 15.0])  # read through the closure cell
    assert fast(x).item() == 60.0
    assert fast.cache_size() == 1  # no retrace: w is a program input
    assert "captured" in fast.ir(x)


def test_rebinding_a_global_tensor_is_seen(ctx):
    global GLOBAL_W
    GLOBAL_W = _vec(ctx, [1.0, 1.0, 1.0])

    def f(x):
        return x.add(GLOBAL_W)

    fast = F.compile(f)
    x = _vec(ctx, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(fast(x).numpy(), [2, 3, 4])
    GLOBAL_W = _vec(ctx, [10.0, 20.0, 30.0])
    np.testing.assert_array_equal(fast(x).numpy(), [11, 22, 33])
    assert fast.cache_size() == 1


def test_in_place_writes_to_a_captured_tensor_are_seen(ctx):
    w = _vec(ctx, [1.0, 2.0, 3.0])
    fast = F.compile(lambda x: x.mul(w))
    x = _vec(ctx, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(fast(x).numpy(), [1, 2, 3])
    w.data()[:] = [4.0, 5.0, 6.0]
    np.testing.assert_array_equal(fast(x).numpy(), [4, 5, 6])


def test_tensors_in_objects_lists_and_dicts_are_read_at_call_time(ctx):
    class Layer:
        def __init__(self, w, b):
            self.w, self.b = w, b

        def __call__(self, x):
            return x.mul(self.w).add(self.b)

    class Model:
        def __init__(self):
            self.layers = [Layer(_vec(ctx, [1.0, 1.0]), _vec(ctx, [0.0, 0.0]))
                           for _ in range(2)]
            self.extra = {"shift": _vec(ctx, [0.5, 0.5])}

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.add(self.extra["shift"])

    model = Model()
    fast = F.compile(lambda x: model.forward(x))
    x = _vec(ctx, [1.0, 2.0])
    np.testing.assert_allclose(fast(x).numpy(), [1.5, 2.5])
    model.layers[1].w = _vec(ctx, [3.0, 4.0])
    model.extra["shift"] = _vec(ctx, [0.0, 1.0])
    np.testing.assert_allclose(fast(x).numpy(), model.forward(x).numpy())
    np.testing.assert_allclose(fast(x).numpy(), [3.0, 9.0])
    assert fast.cache_size() == 1
    model.layers.append(Layer(_vec(ctx, [2.0, 2.0]), _vec(ctx, [0.0, 0.0])))
    np.testing.assert_allclose(fast(x).numpy(), [6.0, 17.0])  # a longer list: retraced
    assert fast.cache_size() == 2


def test_gradients_reach_the_current_captured_parameters(ctx):
    class Opt:  # an optimizer-like holder of parameters
        def __init__(self, params):
            self.params = params

    w1 = T.variable_from_slice(ctx, (2,), [1.0, 2.0])
    opt = Opt([w1])

    def step(x):
        loss = x.mul(opt.params[0]).sum_all()
        loss.backward()
        return loss

    fast = F.compile(step)
    x = _vec(ctx, [3.0, 4.0])
    assert fast(x).item() == 11.0
    np.testing.assert_array_equal(w1.grad().numpy(), [3, 4])
    w2 = T.variable_from_slice(ctx, (2,), [0.0, 1.0])
    opt.params[0] = w2
    assert fast(x).item() == 4.0
    np.testing.assert_array_equal(w2.grad().numpy(), [3, 4])
    np.testing.assert_array_equal(w1.grad().numpy(), [3, 4])  # untouched
    assert fast.cache_size() == 1


def test_captured_python_values_are_guarded(ctx):
    global GLOBAL_SCALE
    x = _vec(ctx, [1.0, 2.0])
    k = 2
    name = "add_scalar"
    shape = (2,)

    def f(x):
        y = getattr(x, name)(k * GLOBAL_SCALE)
        return y.reshape(("e",), shape)

    fast = F.compile(f)
    np.testing.assert_array_equal(fast(x).numpy(), [5, 6])
    k = 3
    np.testing.assert_array_equal(fast(x).numpy(), [7, 8])
    GLOBAL_SCALE = 1.0
    np.testing.assert_array_equal(fast(x).numpy(), [4, 5])
    name = "scale"
    np.testing.assert_array_equal(fast(x).numpy(), [3, 6])
    shape = (1, 2)  # a new static shape: retraced, and the shape check runs again
    with pytest.raises(F.InvalidShape):
        fast(x)
    GLOBAL_SCALE = 2.0


def test_a_mutated_captured_list_of_labels_is_not_stale(ctx):
    logits = F.Tensor("n", "c").from_slice(ctx, (2, 3), [[1.0, 2.0, 3.0], [3.0, 1.0, 0.0]])
    labels = [2, 0]
    fast = F.compile(lambda x: x.cross_entropy("c", labels))
    want = logits.cross_entropy("c", labels).item()
    np.testing.assert_allclose(fast(logits).item(), want, rtol=1e-6)
    labels[0] = 0
    want = logits.cross_entropy("c", labels).item()
    np.testing.assert_allclose(fast(logits).item(), want, rtol=1e-6)


def test_captured_values_read_by_host_code_are_guarded(ctx):
    x = _vec(ctx, [1.0, 2.0, 3.0, 4.0])
    mask = F.Tensor("d", dtype="bool").from_slice(ctx, (4,), [True, False, True, False])
    fast = F.compile(lambda x: x.masked_select(mask, "m").sum_all())
    assert fast(x).item() == 4.0
    mask.data()[:] = [False, True, True, True]  # the selection (and its size) changes
    assert fast(x).item() == 9.0


@pytest.mark.parametrize("op", ["masked_select", "masked_scatter"])
def test_a_mask_passed_as_an_argument_names_the_op(ctx, op):
    x = _vec(ctx, [1.0, 2.0, 3.0, 4.0])
    mask = F.Tensor("d", dtype="bool").from_slice(ctx, (4,), [True, False, True, False])
    vals = F.Tensor("v").from_slice(ctx, (2,), [9.0, 8.0])

    def fn(x, m):
        return x.masked_select(m, "k") if op == "masked_select" else x.masked_scatter(m, "v", vals)

    want = [1.0, 3.0] if op == "masked_select" else [9.0, 2.0, 8.0, 4.0]
    np.testing.assert_array_equal(fn(x, mask).numpy(), want)
    with pytest.raises(F.UnsupportedView, match=f"{op}: the mask's values.*capture"):
        F.compile(fn)(x, mask)
    captured = F.compile(lambda x: fn(x, mask))  # the supported form
    np.testing.assert_array_equal(captured(x).numpy(), want)


def test_integer_tensor_indices_are_traced_inputs(ctx):
    x = F.Tensor("r", "c").from_slice(ctx, (3, 2), [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    fast = F.compile(lambda x, i: x.index_select("r", i, "k"))
    i1 = I64.from_slice(ctx, (2,), [2, 0])
    np.testing.assert_array_equal(fast(x, i1).numpy(), [[5, 6], [1, 2]])
    i2 = I64.from_slice(ctx, (2,), [1, 1])
    np.testing.assert_array_equal(fast(x, i2).numpy(), [[3, 4], [3, 4]])
    assert fast.cache_size() == 1
    gather = F.compile(lambda x, i: x.gather("r", i, "k"))
    np.testing.assert_array_equal(gather(x, i1).numpy(), [[5, 6], [1, 2]])
    np.testing.assert_array_equal(gather(x, i2).numpy(), [[3, 4], [3, 4]])
    assert gather.cache_size() == 1
    idx = F.Tensor("r", "c", dtype="i64").from_slice(ctx, (1, 2), [[2, 0]])
    take = F.compile(lambda x: x.take_along_axis("r", idx))  # a captured index tensor
    np.testing.assert_array_equal(take(x).numpy(), [[5, 2]])
    idx.data()[:] = [1, 2]
    np.testing.assert_array_equal(take(x).numpy(), [[3, 6]])
    assert take.cache_size() == 1


def test_static_containers_and_tensors_inside_them(ctx):
    a, b = _vec(ctx, [1.0, 2.0]), _vec(ctx, [3.0, 4.0])
    fast = F.compile(lambda pair, opts: pair[0].mul(pair[1]).scale(opts["k"]))
    np.testing.assert_array_equal(fast((a, b), {"k": 2.0}).numpy(), [6, 16])
    np.testing.assert_array_equal(fast([b, a], {"k": 1.0}).numpy(), [3, 8])
    with pytest.raises(TypeError, match="set"):
        fast((a, b), {1, 2})


def test_a_deinit_captured_tensor_raises_as_eager(ctx):
    w = _vec(ctx, [1.0, 2.0])
    fast = F.compile(lambda x: x.mul(w))
    x = _vec(ctx, [1.0, 1.0])
    fast(x)
    w.deinit()
    with pytest.raises(F.Deinitialized):
        fast(x)


def test_outputs_live_on_the_context_of_their_inputs():
    c1, c2 = F.ExecContext(), F.ExecContext()
    fast = F.compile(lambda x: x.scale(2.0))
    for c in (c1, c2):
        y = fast(_vec(c, [1.0]))
        assert y._ctx is c
    assert fast.cache_size() == 1


def test_temporary_views_of_captures_never_alias_a_later_capture(ctx):
    # Regression: lifted captures were memoized by id(node); a view made while tracing
    # (pos.narrow(...)) was freed and its id reused by a later view, which then got the
    # stale lifted node ((16, 8) instead of a broadcast to (1, 16, 8)).
    x0 = np.arange(16 * 8, dtype=np.float32).reshape(1, 16, 8)
    p0 = np.arange(32 * 8, dtype=np.float32).reshape(32, 8) / 7
    t0 = np.arange(2 * 8, dtype=np.float32).reshape(2, 8) / 3
    x = F.Tensor("b", "s", "d").from_numpy(ctx, x0)
    p = F.Tensor("pos", "d").from_numpy(ctx, p0)
    t = F.Tensor("type", "d").from_numpy(ctx, t0).select("type", 0)
    fast = F.compile(lambda x: x.add(p.narrow("pos", 0, 16).with_tags("s", "d")).add(t))
    np.testing.assert_allclose(fast(x).numpy(), x0 + p0[:16] + t0[0], rtol=1e-6)


# Module-level constant a method reads (rebound by the test below).
METHOD_SCALE = 2.0


def _stays_equal_to_eager(ctx, fn, change, expect_before, expect_after):
    x = _vec(ctx, [1.0, -2.0, 3.0])
    fast = F.compile(fn)
    np.testing.assert_array_equal(fast(x).numpy(), expect_before)
    change()
    np.testing.assert_array_equal(fn(x).numpy(), expect_after)  # eager
    np.testing.assert_array_equal(fast(x).numpy(), expect_after)


def test_class_attributes_and_what_methods_read_are_not_stale(ctx):
    # Each of these returned the value seen at trace time after the change: the walk
    # stopped at classes, and never read the globals of an instance's methods.
    global METHOD_SCALE

    class Model:
        k = 2.0

        def __call__(self, t):
            return t * self.k

        def scaled(self, t):
            return t * METHOD_SCALE

        @classmethod
        def by_class(cls, t):
            return t * cls.k

        @property
        def triple(self):
            return Model.k * 3

    class Derived(Model):
        pass

    m, d = Model(), Derived()
    _stays_equal_to_eager(ctx, m, lambda: setattr(Model, "k", 5.0), [2, -4, 6], [5, -10, 15])
    _stays_equal_to_eager(ctx, lambda t: Model.by_class(t), lambda: setattr(Model, "k", 3.0),
                          [5, -10, 15], [3, -6, 9])
    _stays_equal_to_eager(ctx, lambda t: t * m.triple, lambda: setattr(Model, "k", 1.0),
                          [9, -18, 27], [3, -6, 9])
    _stays_equal_to_eager(ctx, lambda t: d(t), lambda: setattr(Model, "k", 4.0),
                          [1, -2, 3], [4, -8, 12])

    def rebind() -> None:
        global METHOD_SCALE
        METHOD_SCALE = 7.0

    _stays_equal_to_eager(ctx, lambda t: m.scaled(t), rebind, [2, -4, 6], [7, -14, 21])
    METHOD_SCALE = 2.0


def test_attributes_read_by_a_computed_name_are_not_stale(ctx):
    # getattr(m, "w"), vars(m)[name] and m.__dict__[name] read attributes no code names.
    class Holder:
        pass

    for read in (lambda h, t: t * getattr(h, "w"),  # noqa: B009 (the case under test)
                 lambda h, t: t * vars(h)["w"],
                 lambda h, t: t * h.__dict__["w"]):
        h = Holder()
        h.w = _vec(ctx, [1.0, 2.0, 3.0])
        _stays_equal_to_eager(ctx, lambda t, h=h, read=read: read(h, t),
                              lambda h=h: setattr(h, "w", _vec(ctx, [2.0, 2.0, 2.0])),
                              [1, -4, 9], [2, -4, 6])


def test_namespaces_deques_and_library_values_are_not_stale(ctx):
    import collections
    import decimal
    import types

    ns = types.SimpleNamespace(k=2.0, w=_vec(ctx, [1.0, 1.0, 1.0]))
    _stays_equal_to_eager(ctx, lambda t: t * ns.k * ns.w, lambda: setattr(ns, "k", 3.0),
                          [2, -4, 6], [3, -6, 9])
    _stays_equal_to_eager(ctx, lambda t: t * ns.k * ns.w,
                          lambda: setattr(ns, "w", _vec(ctx, [0.0, 1.0, 2.0])),
                          [3, -6, 9], [0, -6, 18])
    dq = collections.deque([_vec(ctx, [1.0, 1.0, 1.0])])
    _stays_equal_to_eager(ctx, lambda t: t * dq[0],
                          lambda: dq.__setitem__(0, _vec(ctx, [2.0, 2.0, 2.0])),
                          [1, -2, 3], [2, -4, 6])
    box = [decimal.Decimal("2")]
    _stays_equal_to_eager(ctx, lambda t: t * float(box[0]),
                          lambda: box.__setitem__(0, decimal.Decimal("3")),
                          [2, -4, 6], [3, -6, 9])


def test_an_object_whose_getattr_raises_key_error_can_be_captured(ctx):
    # The walk's probe for a compiled function (getattr(obj, name, None)) let the
    # object's own KeyError escape from fucina.compile.
    class Config:
        def __init__(self):
            self._d = {"k": 2.0}

        def __getattr__(self, key):
            return self._d[key]

    cfg = Config()
    _stays_equal_to_eager(ctx, lambda t: t * cfg.k, lambda: cfg._d.__setitem__("k", 3.0),
                          [2, -4, 6], [3, -6, 9])


# A module-level table only an uncalled method reads (rebound by the test below).
PLOT_TABLE = np.zeros(3)


def test_a_method_nothing_calls_adds_no_guards(ctx):
    # The class walk follows the methods reachable code names (and special methods): a
    # plot() beside __call__ must not make its globals guards (a retrace when they change).
    global PLOT_TABLE

    class Model:
        def __call__(self, t):
            return t * 2.0

        def plot(self):
            return float(PLOT_TABLE.sum())

    m = Model()
    fast = F.compile(lambda t: m(t))
    x = _vec(ctx, [1.0, 2.0])
    np.testing.assert_array_equal(fast(x).numpy(), [2, 4])
    PLOT_TABLE = np.ones(3)
    np.testing.assert_array_equal(fast(x).numpy(), [2, 4])
    assert fast.cache_size() == 1
    PLOT_TABLE = np.zeros(3)


# A module-level setting a constructor reads (rebound by the test below).
INIT_SCALE = 2.0


def test_a_class_built_while_tracing_reads_its_constructors_globals_again(ctx):
    # The traced function builds the object, so __init__ runs in the trace: what it reads
    # is guarded (the first class walk skipped constructors everywhere: a stale 2.0).
    global INIT_SCALE

    class Scale:
        def __init__(self):
            self.k = INIT_SCALE

        def __call__(self, t):
            return t * self.k

    x = _vec(ctx, [1.0, 2.0])
    fast = F.compile(lambda t: Scale()(t))
    np.testing.assert_array_equal(fast(x).numpy(), [2, 4])
    INIT_SCALE = 3.0
    np.testing.assert_array_equal(fast(x).numpy(), [3, 6])
    INIT_SCALE = 2.0


def test_the_sign_of_a_zero_static_or_captured_float_retraces(ctx):
    # Regression: 0.0 == -0.0, so a static argument or a captured float changing sign
    # kept the trace of the other sign (code branching on copysign was stale); and a NaN
    # static argument never matched its own trace (each call traced again).
    import math

    x = F.Tensor("d").from_slice(ctx, (2,), [1.0, 2.0])

    def f(t, k):
        return t.scale(math.copysign(1.0, k))

    fast = F.compile(f)
    for k in (0.0, -0.0, 0.0, -0.0):
        np.testing.assert_array_equal(fast(x, k).numpy(), f(x, k).numpy())
    assert fast.cache_size() == 2
    nan = F.compile(lambda t, k: t.scale(k))
    for _ in range(3):
        nan(x, float("nan"))
    assert nan.cache_size() == 1
    box = {"k": 0.0, "ks": [0.0, 1.0]}

    def g(t):
        return t.scale(math.copysign(1.0, box["k"]) * math.copysign(1.0, box["ks"][0]))

    fg = F.compile(g)
    for k, ks in ((0.0, 0.0), (-0.0, 0.0), (-0.0, -0.0), (0.0, -0.0)):
        box["k"], box["ks"][0] = k, ks
        np.testing.assert_array_equal(fg(x).numpy(), g(x).numpy())


def test_tensors_and_values_inside_library_containers_are_read_at_each_call(ctx):
    # Regression: a threading.local, a ChainMap, a MappingProxyType, a weak-value dict and
    # a bytearray were guarded by identity only, so a compiled function kept the value of
    # its first trace (for every thread, for threading.local) after their contents changed.
    import collections
    import threading
    import types
    import weakref

    T = F.Tensor("d")

    def v(a):
        return T.from_slice(ctx, (3,), [float(a)] * 3)

    x = v(1)
    keep = [v(1), v(7)]
    wd = weakref.WeakValueDictionary(w=keep[0])
    cm = collections.ChainMap({"w": v(1)})
    mp = {"w": v(1)}
    px = types.MappingProxyType(mp)
    ba = bytearray(b"\x02")
    cases = [(lambda t: t.mul(wd["w"]).sum_all(), lambda: wd.__setitem__("w", keep[1])),
             (lambda t: t.mul(cm["w"]).sum_all(), lambda: cm.__setitem__("w", v(3))),
             (lambda t: t.mul(px["w"]).sum_all(), lambda: mp.__setitem__("w", v(8))),
             (lambda t: t.scale(float(ba[0])).sum_all(), lambda: ba.__setitem__(0, 5))]
    for fn, change in cases:
        fast = F.compile(fn)
        assert fast(x).item() == fn(x).item()
        change()
        assert fast(x).item() == fn(x).item()

    tl = threading.local()

    def h(t):
        return t.mul(tl.w).sum_all()

    fast = F.compile(h)
    got = {}

    def run(k):
        tl.w = v(k)
        got[k] = (fast(x).item(), h(x).item())

    threads = [threading.Thread(target=run, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
        t.join()
    assert got == {1: (3.0, 3.0), 2: (6.0, 6.0), 3: (9.0, 9.0)}
    tl.w = v(5)
    assert fast(x).item() == h(x).item() == 15.0
