"""fucina.compile: tracing, fusion, kernel cache, eager/compiled agreement."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fucina as F


def _rand(ctx, tags, shape, seed=0):
    return F.Tensor(*tags).randn(ctx, shape, seed)


def test_pointwise_chain_is_one_kernel(ctx):
    x = _rand(ctx, ("b", "d"), (4, 8))
    w = _rand(ctx, ("d",), (8,), 1)

    def f(x, w):
        return x.mul(w).add_scalar(1.0).maximum(x).sub(w).scale(0.5)

    fast = F.compile(f)
    np.testing.assert_allclose(fast(x, w).numpy(), f(x, w).numpy(), rtol=1e-6)
    assert len(fast.kernels(x, w)) == 1
    text = fast.ir(x, w)
    assert "5 ops fused" in text and "kernel k_" in text and "'b'" not in text
    assert "f32[b=4, d=8]" in text


def test_row_program_is_one_kernel(ctx):
    x = _rand(ctx, ("row", "col"), (6, 10))

    def centered_scale(x):
        mu = x.mean("col")
        d = x.sub(mu)
        var = d.mul(d).mean("col")
        return d.div(var.add_scalar(1e-5))

    fast = F.compile(centered_scale)
    np.testing.assert_allclose(fast(x).numpy(), centered_scale(x).numpy(), rtol=1e-5,
                               atol=1e-6)
    assert len(fast.kernels(x)) == 1
    assert "row" in fast.ir(x)


def test_reduction_over_leading_axis_and_permuted_input(ctx):
    x = _rand(ctx, ("a", "b", "c"), (3, 4, 5))

    def f(x):
        y = x.permute_to(("c", "a", "b"))
        return y.mul(y).sum("a").add(x.sum_many(("a", "b")))

    fast = F.compile(f)
    np.testing.assert_allclose(fast(x).numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)


def test_views_fold_and_outputs_may_alias_inputs(ctx):
    x = _rand(ctx, ("a", "b"), (4, 6))

    def f(x):
        return x.permute_to(("b", "a")), x.narrow("b", 1, 3).scale(2.0), 3

    fast = F.compile(f)
    t, n, k = fast(x)
    assert k == 3
    np.testing.assert_array_equal(t.numpy(), x.numpy().T)
    np.testing.assert_allclose(n.numpy(), x.numpy()[:, 1:4] * 2)
    assert type(t) is F.Tensor("b", "a")


def test_no_fusion_through_a_contraction_that_reads_the_kernel(ctx):
    # h's kernel must not absorb h + z: z is a GEMM that reads h (a cycle).
    x = _rand(ctx, ("b", "d"), (3, 4), 1)
    w = _rand(ctx, ("d", "e"), (4, 4), 2)

    def f(x, w):
        h = x.tanh()
        z = h.dot(w, "d").with_tags(("b", "d"))
        return h.add(z).sigmoid()

    np.testing.assert_allclose(F.compile(f)(x, w).numpy(), f(x, w).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_attention_block_with_backward_matches_eager(ctx):
    """Layer norm, multi-head self-attention, residual and backward in one program.

    Pins buffer reuse: a broadcast view of a small buffer (the backward seed)
    must not free a slot under the size of the view.
    """
    rng = np.random.default_rng(0)
    B, T, D, H = 2, 5, 8, 2
    x = F.Tensor("b", "t", "d").from_slice(ctx, (B, T, D), rng.standard_normal((B, T, D)))
    w0 = (rng.standard_normal((D, D)) * 0.3).astype(np.float32)

    def params():
        return (F.Tensor("qkv", "d").variable_from_slice(ctx, (D, D), w0),
                F.Tensor("d").variable_from_slice(ctx, (D,), np.ones(D)))

    def block(x, wq, g):
        mu = x.mean("d")
        xc = x.sub(mu)
        xn = xc.div(xc.mul(xc).mean("d").add_scalar(1e-5).sqrt()).mul(g)
        q = xn.dot(wq, "d").split("qkv", ("h", "hd"), (H, D // H))
        k = q.with_tags(("b", "s", "h", "hd"))
        s = q.dot(k, "hd").scale(1 / np.sqrt(D // H))
        e = s.sub(s.max("s")).exp()
        p = e.div(e.sum("s"))
        o = p.dot(k, "s").permute_to(("b", "t", "h", "hd")).materialize()
        loss = o.merge("out", ("h", "hd")).add(x.with_tags(("b", "t", "out"))).tanh().sum_all()
        loss.backward()
        return loss

    wq1, g1 = params()
    wq2, g2 = params()
    want = block(x, wq1, g1).item()
    got = F.compile(block)(x, wq2, g2).item()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(wq2.grad().numpy(), wq1.grad().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g2.grad().numpy(), g1.grad().numpy(), rtol=1e-4, atol=1e-5)


def test_integer_division_by_zero_raises_when_compiled(ctx):
    a = F.Tensor("d", dtype="i32").from_slice(ctx, (3,), [4, 5, 6])
    b = F.Tensor("d", dtype="i32").from_slice(ctx, (3,), [2, 0, 3])
    fast = F.compile(lambda a, b: a.div_trunc(b))
    with pytest.raises(F.DivisionByZero):
        fast(a, b)
    np.testing.assert_array_equal(fast(a, b.add(b.ones_like())).numpy(), [1, 5, 1])


def test_static_arguments_and_signature_cache(ctx):
    x = _rand(ctx, ("a",), (5,))
    fast = F.compile(lambda x, k: x.scale(k))
    fast(x, 2.0)
    fast(x, 2.0)
    assert fast.cache_size() == 1  # traced once per signature
    fast(x, 3.0)
    assert fast.cache_size() == 2
    np.testing.assert_allclose(fast(x, 3.0).numpy(), x.numpy() * 3)
    np.testing.assert_allclose(fast(x, 2).numpy(), x.numpy() * 2)  # an int is its own key
    assert fast.cache_size() == 3


def test_keyword_tensors_bind_by_name(ctx):
    a = _rand(ctx, ("d",), (4,), 1)
    b = _rand(ctx, ("d",), (4,), 2)
    fast = F.compile(lambda *, x, y: x.sub(y))
    np.testing.assert_allclose(fast(x=a, y=b).numpy(), a.numpy() - b.numpy())
    np.testing.assert_allclose(fast(y=b, x=a).numpy(), a.numpy() - b.numpy())
    np.testing.assert_allclose(fast(y=a, x=b).numpy(), b.numpy() - a.numpy())


def test_tag_errors_surface_while_tracing(ctx):
    x = _rand(ctx, ("m", "k"), (2, 3))
    y = _rand(ctx, ("n", "j"), (3, 2))
    fast = F.compile(lambda x, y: x.dot(y, "k"))
    with pytest.raises(F.TagError, match="'k'"):
        fast(x, y)


X = F.Tensor("batch", "in")


def _annotated_ok(x: X) -> F.Tensor("batch", "in"):
    return x.scale(2.0)


def _annotated_bad_return(x: X) -> F.Tensor("batch", "out"):
    return x.scale(2.0)


def test_annotations_are_checked(ctx):
    f, g = _annotated_ok, _annotated_bad_return
    fast = F.compile(f)
    good = _rand(ctx, ("batch", "in"), (2, 3))
    assert type(fast(good)) is X
    with pytest.raises(F.TagError, match="parameter 'x'"):
        fast(_rand(ctx, ("in", "batch"), (3, 2)))
    with pytest.raises(F.TagError, match="return"):
        F.compile(g)(good)


def test_kernels_not_recompiled_for_new_sizes_or_tags(ctx):
    def f(x):
        return x.mul(x).add_scalar(1.0).sub(x)

    fast = F.compile(f)
    a = _rand(ctx, ("p", "q"), (3, 7))
    fast(a)
    b = _rand(ctx, ("u", "v"), (11, 5))  # other tags, other sizes: the same kernel
    want = f(b).numpy()
    before = F.cache_info()
    np.testing.assert_allclose(fast(b).numpy(), want, rtol=1e-6)
    after = F.cache_info()
    assert after.kernels == before.kernels
    assert after.compiled == before.compiled
    assert fast.kernels(a)[0] is fast.kernels(b)[0]


def test_compiled_training_step_matches_eager(ctx):
    rng = np.random.default_rng(3)
    x = F.Tensor("b", "in").from_slice(ctx, (4, 3), rng.standard_normal((4, 3)))
    y = F.Tensor("b", "out").from_slice(ctx, (4, 2), rng.standard_normal((4, 2)))
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    b0 = rng.standard_normal(2).astype(np.float32)

    def make():
        return (F.Tensor("in", "out").variable_from_slice(ctx, (3, 2), w0),
                F.Tensor("out").variable_from_slice(ctx, (2,), b0))

    def step(x, y, w, b):
        err = x.dot(w, "in").add(b).tanh().sub(y)
        loss = err.mul(err).mean("out").sum_all()
        loss.backward()
        return loss

    we, be = make()
    want = step(x, y, we, be).item()
    wc, bc = make()
    fast = F.compile(step)
    got = fast(x, y, wc, bc)
    assert got.requires_grad  # as eager: the loss is still in a graph after backward()
    np.testing.assert_allclose(got.item(), want, rtol=1e-5)
    np.testing.assert_allclose(wc.grad().numpy(), we.grad().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bc.grad().numpy(), be.grad().numpy(), rtol=1e-5, atol=1e-6)
    fast(x, y, wc, bc)  # gradients accumulate across calls, as in eager
    np.testing.assert_allclose(wc.grad().numpy(), 2 * we.grad().numpy(), rtol=1e-5, atol=1e-6)
    got.backward()  # a second backward through the compiled VJP, as eager allows
    np.testing.assert_allclose(wc.grad().numpy(), 3 * we.grad().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bc.grad().numpy(), 3 * be.grad().numpy(), rtol=1e-5, atol=1e-6)
    text = fast.ir(x, y, wc, bc)
    assert "gemm" in text and "kernel" in text


def test_compiled_backward_flows_into_an_eager_graph(ctx):
    w = F.Tensor("d").variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    h = w.mul(w)  # eager, requires grad: an argument that is not a leaf

    def f(h):
        loss = h.scale(3.0).sum_all()
        loss.backward()
        return loss

    F.compile(f)(h)
    np.testing.assert_allclose(w.grad().numpy(), [6.0, 12.0, 18.0])


def test_grad_recording_runs_eagerly(ctx):
    w = F.Tensor("d").variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    fast = F.compile(lambda w: w.mul(w).sum_all())
    loss = fast(w)
    loss.backward()
    np.testing.assert_array_equal(w.grad().numpy(), [2, 4, 6])


def test_disk_cache_survives_a_new_process(tmp_path):
    script = textwrap.dedent("""
        import fucina as F
        ctx = F.ExecContext()
        x = F.Tensor("a", "b").randn(ctx, (3, 5), 1)
        f = F.compile(lambda x: x.mul(x).add_scalar(0.25).sub(x).scale(3.0))
        f(x).numpy()
        info = F.cache_info()
        print(info.compiled, info.disk_hits)
    """)
    env = dict(os.environ, FUCINA_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, check=True).stdout.split()
    assert int(first[0]) >= 1 and int(first[1]) == 0
    assert int(second[0]) == 0 and int(second[1]) >= 1
    assert list(tmp_path.glob("k_*.py"))


def test_unwritable_cache_dir_falls_back(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    script = textwrap.dedent("""
        import fucina as F
        ctx = F.ExecContext()
        x = F.Tensor("a").randn(ctx, (5,), 1)
        print(F.compile(lambda x: x.mul(x).add_scalar(2.0))(x).numpy().min() >= 2.0)
    """)
    env = dict(os.environ, FUCINA_CACHE_DIR=str(blocked / "kernels"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True"]


# -- eager == compiled on random programs -------------------------------------------

_TAGS = ("a", "b", "c")
_SIZES = {"a": 3, "b": 4, "c": 2}


@st.composite
def _program(draw):
    """A random straight-line program over tensors with tag subsets of a, b, c."""
    n_inputs = draw(st.integers(1, 3))
    inputs = [tuple(draw(st.permutations(draw(st.lists(st.sampled_from(_TAGS), min_size=1,
                                                              max_size=3, unique=True)))))
              for _ in range(n_inputs)]
    ops = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["bin", "bin", "scalar", "unary", "reduce", "permute",
                                     "dot", "gather"]))
        if kind == "bin":
            ops.append(("bin", draw(st.sampled_from(["add", "sub", "mul", "maximum",
                                                      "minimum"]))))
        elif kind == "scalar":
            ops.append(("scalar", draw(st.sampled_from(["scale", "add_scalar"])),
                        draw(st.floats(-2, 2, allow_nan=False, width=32))))
        elif kind == "unary":
            ops.append(("unary", draw(st.sampled_from(["tanh", "sigmoid", "relu", "abs", "neg",
                                                        "silu", "gelu", "sin"]))))
        else:
            ops.append((kind,))
    return inputs, ops, draw(st.integers(0, 10**6))


def _run_program(xs, ops, seed):
    rng = np.random.default_rng(seed)
    vals = list(xs)
    for op in ops:
        if op[0] == "bin":
            a, b = vals[rng.integers(len(vals))], vals[rng.integers(len(vals))]
            vals.append(getattr(a, op[1])(b))
        elif op[0] == "scalar":
            vals.append(getattr(vals[-1], op[1])(op[2]))
        elif op[0] == "unary":
            vals.append(getattr(vals[-1], op[1])())
        elif op[0] == "dot":
            # A contraction (a reference step between kernels) over a shared tag.
            a, b = vals[rng.integers(len(vals))], vals[-1]
            shared = [t for t in a.axis_tags if t in b.axis_tags]
            if shared and len(set(a.axis_tags) | set(b.axis_tags)) - 1 <= 8:
                vals.append(a.dot(b, shared[rng.integers(len(shared))]))
        elif op[0] == "gather":
            v = vals[-1]
            if v.tag_count:
                t = v.axis_tags[rng.integers(v.tag_count)]
                idx = rng.integers(0, v.dim(t), size=v.dim(t))
                vals.append(v.gather(t, idx, t))
        elif op[0] == "reduce":
            v = vals[-1]
            if v.tag_count:
                t = v.axis_tags[rng.integers(v.tag_count)]
                vals.append([v.sum, v.mean, v.max, v.min][rng.integers(4)](t))
        else:
            v = vals[-1]
            perm = tuple(rng.permutation(list(v.axis_tags)))
            vals.append(v.permute_to(perm) if perm else v)
    return vals[-1]


@settings(max_examples=60, deadline=None)
@given(_program())
def test_eager_equals_compiled_on_random_programs(prog):
    inputs, ops, seed = prog
    ctx = F.ExecContext()
    xs = [F.Tensor(*tags).randn(ctx, tuple(_SIZES[t] for t in tags), k)
          for k, tags in enumerate(inputs)]
    want = _run_program(xs, ops, seed)
    fast = F.compile(lambda *xs: _run_program(xs, ops, seed))
    got = fast(*xs)
    assert type(got) is type(want)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(_program())
def test_compiled_backward_equals_eager_on_random_programs(prog):
    inputs, ops, seed = prog
    ctx = F.ExecContext()

    def variables():
        return [F.Tensor(*tags).variable(ctx, F.Tensor(*tags).randn(
            ctx, tuple(_SIZES[t] for t in tags), k).as_raw_tensor())
            for k, tags in enumerate(inputs)]

    def step(*xs):
        out = _run_program(xs, ops, seed)
        loss = out.mul(out).sum_all()  # a loss that depends on every element
        if not loss.requires_grad:
            return loss
        loss.backward()
        return loss

    eager_vars, compiled_vars = variables(), variables()
    want = step(*eager_vars)
    got = F.compile(step)(*compiled_vars)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    for a, b in zip(eager_vars, compiled_vars):
        ga, gb = a.grad(), b.grad()
        assert (ga is None) == (gb is None)
        if ga is not None:
            np.testing.assert_allclose(gb.numpy(), ga.numpy(), rtol=1e-3, atol=1e-4)


def test_captured_variable_first_read_under_no_grad_still_gets_its_gradient(ctx):
    # Regression: the lifted input kept the grad mode of its first read, so a later
    # backward through the same captured variable found no graph (eager: gradient 4, 5, 6).
    D = F.Tensor("d")

    def run(compiled: bool):
        w = D.variable_from_slice(ctx, (3,), [1, 2, 3])

        def f(x):
            with F.no_grad():
                a = x.mul(w)
            loss = w.mul(x).sum_all()
            loss.backward()
            return loss.add(a.sum_all())

        out = (F.compile(f) if compiled else f)(D.from_slice(ctx, (3,), [4, 5, 6]))
        return out.item(), w.grad().numpy()

    (want, gw), (got, gc) = run(False), run(True)
    assert got == want == 64.0
    np.testing.assert_array_equal(gc, gw)
    np.testing.assert_array_equal(gc, [4, 5, 6])


def test_views_of_one_captured_tensor_stay_distinct(ctx):
    # Regression: lifted views were cached by the id of a temporary broadcast view, so a
    # later temporary with the same id read the first view (every select read element 0).
    H = F.Tensor("hyper").from_slice(ctx, (3,), [2, 3, 5])
    x = F.Tensor("a").from_slice(ctx, (4,), [1, 1, 1, 1])

    def f(x):
        s = [H.select("hyper", j) for j in range(3)]
        return x * s[0] + x * s[1] * s[2]

    np.testing.assert_array_equal(f(x).numpy(), [17, 17, 17, 17])
    np.testing.assert_array_equal(F.compile(f)(x).numpy(), [17, 17, 17, 17])


def test_two_pointwise_chains_meeting_in_one_op_are_one_kernel(ctx):
    # Each chain starts from its own input, so placement opens a kernel per chain; the
    # chain read only by the other's kernel folds into it.
    rng = np.random.default_rng(3)
    x = F.Tensor("r", "c").from_slice(ctx, (64, 32), rng.standard_normal((64, 32)))
    v = F.Tensor("r", "c").from_slice(ctx, (64, 32), rng.standard_normal((64, 32)))

    def f(x, v):
        return (x.exp().scale(0.5) + v.scale(2.0).tanh()).sigmoid()

    fast = F.compile(f)
    np.testing.assert_allclose(fast(x, v).numpy(), f(x, v).numpy(), rtol=1e-6, atol=1e-7)
    assert len(fast.kernels(x, v)) == 1


def test_namedtuple_results_and_arguments_keep_their_type(ctx):
    # A compiled sort / top_k raised TypeError (TopKResult.__new__() missing 'indices'):
    # results were rebuilt as tuple(generator), which a namedtuple does not take.
    import collections

    x = F.Tensor("a", "b").from_slice(ctx, (2, 3), [3.0, 1.0, 2.0, 0.0, 5.0, 4.0])
    for fn in (lambda t: t.sort("b"), lambda t: t.top_k("b", 2, "k")):
        eager, compiled = fn(x), F.compile(fn)(x)
        assert type(compiled) is type(eager)
        np.testing.assert_array_equal(compiled.values.numpy(), eager.values.numpy())
        np.testing.assert_array_equal(compiled.indices.numpy(), eager.indices.numpy())
    Pair = collections.namedtuple("Pair", "x scale")
    fast = F.compile(lambda p: p.x * p.scale)
    np.testing.assert_array_equal(fast(Pair(x, 2.0)).numpy(), [[6, 2, 4], [0, 10, 8]])
