"""Regression tests for the bugs the API fuzz suite (test_fuzz_api.py) found.

Each test names the program the fuzzer reduced the failure to.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fucina as F


def test_einsum_many_takes_the_einsum_dtypes_only(ctx):
    # einsum_many(('c', 'a'), [i64, i64, i64]) ran an integer contraction through the float
    # GEMM and cast NaN/overflowed floats back to integers (garbage, plus a numpy warning).
    I = F.Tensor("a", "c", dtype="i64")
    x = I.from_slice(ctx, (2, 2), [1, 2, 3, 4])
    with pytest.raises(F.TagError, match="einsum_many takes f32, f16 or bf16 operands.*i64"):
        F.einsum_many(("c",), [x, x])
    y = F.Tensor("a", "c", dtype="f64").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    with pytest.raises(F.TagError, match="f64"):
        F.einsum_many(("c",), [y])
    a = F.Tensor("a", "c").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    h = F.Tensor("c", dtype="f16").from_slice(ctx, (2,), [1, 10])
    np.testing.assert_array_equal(F.einsum_many(("a",), [a, h]).numpy(), [21, 43])


def test_contractions_with_inf_and_nan_emit_no_numpy_warnings(ctx):
    # x.dot(w, 'e') with inf in x and 0 in w: "invalid value encountered in matmul"
    x = F.Tensor("r", "e").from_slice(ctx, (2, 2), [np.inf, 1.0, 3e38, 3e38])
    w = F.Tensor("e", "c").from_slice(ctx, (2, 1), [0.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = x.dot(w, "e").numpy()
    assert np.isnan(out[0, 0]) and out[1, 0] == np.inf  # inf * 0 and an f32 overflow


def test_linspace_to_infinity_emits_no_numpy_warnings(ctx):
    # linspace(0.001, inf, ...) warned "invalid value encountered in multiply"
    D = F.Tensor("d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = D.linspace(ctx, 0.001, float("inf"), 1).numpy()
        three = D.linspace(ctx, 0.0, float("inf"), 3).numpy()
    np.testing.assert_array_equal(one, np.float32([0.001]))
    np.testing.assert_array_equal(three, [np.nan, np.inf, np.inf])  # numpy's and torch's


def test_a_dead_operand_is_deinitialized_before_a_context_mismatch(ctx):
    # [in0.gather('a', in1, 'e')] with in0 on a closed context: eager said ContextMismatch,
    # the compiled call Deinitialized (it checks its arguments first).
    other = F.ExecContext()
    x = F.Tensor("a").from_slice(other, (3,), [1.0, 2.0, 3.0])
    idx = F.Tensor("e", dtype="i64").from_slice(ctx, (2,), [0, 2])
    other.deinit()
    with pytest.raises(F.Deinitialized):
        x.gather("a", idx, "e")
    with pytest.raises(F.Deinitialized):
        F.compile(lambda x, i: x.gather("a", i, "e"))(x, idx)
    live = F.Tensor("a").from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    idx3 = F.Tensor("a", dtype="i64").from_slice(ctx, (3,), [0, 1, 2])
    for use in (lambda: x.take_along_axis("a", idx3), lambda: x.concat("a", [live]),
                lambda: x.scatter("a", idx3, live)):
        with pytest.raises(F.Deinitialized):
            use()


def test_constants_made_while_tracing_keep_their_contexts():
    # [variable_from_slice on ctx 0, out0.masked_fill(in0, 0.0)] traced with in0 on ctx 0,
    # then called with in0 on ctx 1: the program ran, eager raises ContextMismatch.
    a, b = F.ExecContext(), F.ExecContext()
    D = F.Tensor("d")

    def mixes(x):
        return x.add(D.ones(a, (2,)))

    def apart(x):
        return x.scale(2.0), D.ones(a, (2,))

    fast_mixes, fast_apart = F.compile(mixes), F.compile(apart)
    xa = D.from_slice(a, (2,), [1.0, 2.0])
    xb = D.from_slice(b, (2,), [1.0, 2.0])
    np.testing.assert_array_equal(fast_mixes(xa).numpy(), [2.0, 3.0])
    for fn in (mixes, fast_mixes):
        with pytest.raises(F.ContextMismatch):
            fn(xb)
    np.testing.assert_array_equal(fast_mixes(xa).numpy(), [2.0, 3.0])
    # a constant that never meets the argument is fine on any context, as in eager
    doubled, ones = fast_apart(xb)
    np.testing.assert_array_equal(doubled.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(ones.numpy(), [1.0, 1.0])
    # a closed context refuses its constructors, compiled or not
    a.deinit()
    for fn in (apart, fast_apart):
        with pytest.raises(F.Deinitialized):
            fn(xb)


def test_detach_inside_compile_keeps_what_it_views(ctx):
    # [op:-(in0, in1), out0.detach()]: the detached result was a leaf the program never
    # computed ("'NoneType' object has no attribute 'nbytes'" at run time).
    D = F.Tensor("d")
    a = D.from_slice(ctx, (3,), [1.0, -2.0, 3.0])
    b = D.from_slice(ctx, (3,), [0.5, 0.5, 0.5])
    fast = F.compile(lambda a, b: (a - b, (a - b).detach()))
    diff, detached = fast(a, b)
    np.testing.assert_array_equal(detached.numpy(), [0.5, -2.5, 2.5])
    np.testing.assert_array_equal(diff.numpy(), detached.numpy())
    # it still cuts the gradient, as eagerly
    w = D.variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])

    def loss(w):
        return w.detach().mul(w).sum_all()

    loss(w).backward()
    eager_grad = w.grad().numpy()
    w.zero_grad()
    out = F.compile(loss)(w)
    assert out.requires_grad
    out.backward()
    np.testing.assert_array_equal(w.grad().numpy(), eager_grad)
    np.testing.assert_array_equal(eager_grad, [1.0, 2.0, 3.0])
    # a detached captured tensor is read at call time, like the tensor itself
    box = {"t": D.from_slice(ctx, (3,), [1.0, 1.0, 1.0])}
    read = F.compile(lambda x: x.add(box["t"].detach()))
    np.testing.assert_array_equal(read(a).numpy(), [2.0, -1.0, 4.0])
    box["t"] = D.from_slice(ctx, (3,), [10.0, 10.0, 10.0])
    np.testing.assert_array_equal(read(a).numpy(), [11.0, 8.0, 13.0])


def test_masked_scatter_rejects_a_non_tag_values_tag(ctx):
    # Found by test_fuzz_api: an array passed as values_tag reached a tuple comparison and
    # raised numpy's "truth value of an array is ambiguous" instead of naming the argument.
    D = F.Tensor("d")
    x = D.from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    mask = D.from_slice(ctx, (3,), [1.0, 0.0, 1.0])
    v = F.Tensor("v").from_slice(ctx, (2,), [7.0, 8.0])
    for bad in (np.array([1, 2]), 3, v):
        with pytest.raises(TypeError, match="values_tag"):
            x.masked_scatter(mask, bad, v)
    np.testing.assert_array_equal(x.masked_scatter(mask, "v", v).numpy(), [7.0, 2.0, 8.0])


@pytest.mark.parametrize("bad", [np.array([1, 2]), ["lt"], 3, None])
def test_string_choices_refuse_arrays_and_other_types_by_name(ctx, bad):
    # in0.compare(array([1, 2]), nan): `op not in ("eq", ...)` compared the array with each
    # string elementwise and escaped with numpy's "truth value of an array ... ambiguous"
    # ValueError. Every string choice now checks the type first (arguments.choice_arg).
    x = F.Tensor("a", "b").from_slice(ctx, (2, 2), [1.0, 2.0, 3.0, 4.0])
    calls = {
        "compare op": lambda: x.compare(bad, 1.0),
        "matmul kind": lambda: x.matmul(x, bad, ("a", "b")),
        "eps_mode": lambda: x.standardize_axis("b", eps_mode=bad),
        "accumulation": lambda: x.standardize_axis("b", accumulation=bad),
        "reduction": lambda: x.mse_loss(x, reduction=bad),
        "rope: mode": lambda: x.rope("a", "b", {"theta": 10000.0}, bad),
    }
    for what, call in calls.items():
        with pytest.raises(F.TagError, match=f"{what} must be one of"):
            call()
    with pytest.raises(F.TagError, match="ddof must be 0 or 1"):
        x.standardize_axis("b", ddof=bad)


def test_add_dot_refuses_an_array_for_its_contract_tag(ctx):
    # out1.add_dot(in5, in6, array([1, 2])): `a.axis_tags[1] != contract` compared a tag
    # with the array elementwise and escaped with numpy's ambiguous-truth ValueError.
    c = F.Tensor("b", "c").zeros(ctx, (2, 2))
    a = F.Tensor("b", "f").from_slice(ctx, (2, 2), [1.0, 2.0, 3.0, 4.0])
    b = F.Tensor("f", "c").from_slice(ctx, (2, 2), [1.0, 0.0, 0.0, 1.0])
    with pytest.raises(F.TagError, match="tag name"):
        c.add_dot(a, b, np.array([1, 2]))
    np.testing.assert_array_equal(c.add_dot(a, b, "f").numpy(), [[1, 2], [3, 4]])


def test_tag_and_layout_arguments_refuse_arrays_by_name(ctx):
    # The same ambiguous-truth escape, found by probing every str parameter of the tensor
    # methods with an array: has_tag, snake's channel tag (the rank-1 parameter check),
    # pack_rhs_layout's layout.
    x = F.Tensor("a", "b").from_slice(ctx, (2, 2), [1.0, 2.0, 3.0, 4.0])
    alpha = F.Tensor("b").from_slice(ctx, (2,), [1.0, 1.0])
    bad = np.array([1, 2])
    with pytest.raises(F.TagError, match="tag name"):
        x.has_tag(bad)
    assert x.has_tag("b") and not x.has_tag("c") and not x.has_tag("not a tag")
    with pytest.raises(F.TagError, match="tag name"):
        x.snake(bad, alpha, alpha)
    with pytest.raises(F.TagError, match="pack_rhs_layout: layout must be one of"):
        x.pack_rhs_layout(bad)


def test_block_size_functions_refuse_unhashable_dtypes_by_name():
    # F.block_size(np.array([1, 2])) escaped with Python's "unhashable type" TypeError.
    assert F.block_size("q4_k") == 256 and F.block_byte_size("q8_0") == 34
    for fn in (F.block_size, F.block_byte_size):
        for bad in (np.array([1, 2]), ["q8_0"], {}, "f32"):
            with pytest.raises(ValueError, match="is not a block-quantized dtype name"):
                fn(bad)


def test_flags_refuse_arrays_by_name(ctx):
    # sort(..., descending=array([1, 2])) and the other yes/no arguments tested the
    # array's truth value: numpy's ambiguous-truth ValueError escaped.
    x = F.Tensor("a", "b").from_slice(ctx, (2, 3), [3.0, 1.0, 2.0, 0.5, 0.25, 0.75])
    p = F.Tensor("a", "b").from_slice(ctx, (2, 3), [0.5, 0.25, 0.25, 0.2, 0.3, 0.5])
    bad = np.array([1, 2])
    calls = {
        "descending": [lambda: x.sort("b", descending=bad),
                       lambda: x.argsort("b", descending=bad)],
        "replacement": [lambda: p.multinomial("b", "s", 2, 0, bad)],
        "from_logits": [lambda: p.bce_loss(p, from_logits=bad)],
        "log_target": [lambda: p.log().kl_div_loss(p, log_target=bad)],
        "normalize_selected": [lambda: x.router_top_k("b", 2, normalize_selected=bad)],
    }
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(TypeError, match=f"argument '{name}' expects a bool"):
                fn()
    # bools, numpy bools and 0/1 still mean what they did
    np.testing.assert_array_equal(x.argsort("b", descending=np.bool_(True)).numpy(),
                                  [[0, 2, 1], [2, 0, 1]])
    np.testing.assert_array_equal(x.argsort("b", descending=0).numpy(), [[1, 2, 0], [1, 0, 2]])


def test_an_unused_index_op_is_still_checked_compiled(ctx):
    # A program that drops an index_select's result ran no check of its indices: eager
    # raised IndexOutOfBounds, compiled returned a result. Its checks now run whatever
    # reads the result, on the first (tracing) call and on cached calls alike.
    x = F.Tensor("b", "c").from_slice(ctx, (2, 2), [1.0, 2.0, 3.0, 4.0])
    I = F.Tensor("a", dtype="i64")
    good, bad = I.from_slice(ctx, (2,), [0, 1]), I.from_slice(ctx, (2,), [0, 5])

    def f(x, i):
        x.index_select("b", i, "a")
        return x.exp()

    fast = F.compile(f)
    np.testing.assert_allclose(fast(x, good).numpy(), f(x, good).numpy())
    for g in (f, fast, F.compile(f)):  # eager, a cached program, a first trace
        with pytest.raises(F.IndexOutOfBounds, match="index 5 out of range for 'b'"):
            g(x, bad)


def test_an_index_error_before_a_trace_error_wins_as_in_eager(ctx):
    # new shapes [in0.index_select('b', in1, 'a'), from_numpy(np.float64(nan))]: eager
    # raised IndexOutOfBounds at the first call, compiled the TypeError the second call
    # raises while tracing (the index values are only checked when the program runs).
    x = F.Tensor("b", "c").from_slice(ctx, (2, 2), [1.0, 2.0, 3.0, 4.0])
    I = F.Tensor("a", dtype="i64")
    good, bad = I.from_slice(ctx, (2,), [0, 1]), I.from_slice(ctx, (2,), [0, 5])

    def f(x, i):
        y = x.index_select("b", i, "a")
        F.Tensor("q").from_numpy(ctx, np.float64("nan"))
        return y

    for g in (f, F.compile(f)):
        with pytest.raises(F.IndexOutOfBounds, match="index 5"):
            g(x, bad)
        with pytest.raises(TypeError, match="expects a numpy array"):
            g(x, good)


def test_cross_entropy_refuses_an_ignore_index_beyond_int64(ctx):
    # in0.cross_entropy('b', [0], ignore_index=2**70): Python's OverflowError escaped.
    x = F.Tensor("a", "b").from_slice(ctx, (1, 2), [0.5, 1.5])
    with pytest.raises(F.InvalidShape, match="ignore_index must fit in int64"):
        x.cross_entropy("b", [0], ignore_index=2**70)
    with pytest.raises(F.InvalidShape, match="ignore_index must fit in int64"):
        x.cross_entropy("b", [0], ignore_index=-(2**63) - 1)
    want = np.log1p(np.exp(1.0))  # -log softmax([0.5, 1.5])[0]
    np.testing.assert_allclose(x.cross_entropy("b", [0], ignore_index=2**63 - 1).numpy(),
                               want, rtol=1e-6)


def test_a_strided_view_past_its_storage_is_the_same_error_compiled(ctx):
    # traced inputs [in0.view_with_strides(('f',), (2,), (1000000000,))] on a variable:
    # eager raised InvalidDataLength (the view's reach against the storage), compiled
    # UnsupportedGradient (the trace knew no storage size, so the gradient check came
    # first). The trace now checks the reach against the traced argument's storage.
    w = F.Tensor("a").variable_from_slice(ctx, (2,), [1.0, 2.0])

    def past(w):
        return w.view_with_strides(("f",), (2,), (10**9,))

    def inside(w):
        return w.view_with_strides(("f",), (2,), (1,)).exp()

    def past_a_view(w4):  # a view of the argument: its offset counts too
        return w4.narrow("a", 1, 2).view_with_strides(("f",), (2,), (3,))

    w4 = F.Tensor("a").variable_from_slice(ctx, (4,), [1.0, 2.0, 3.0, 4.0])
    for g in (past, F.compile(past)):
        with pytest.raises(F.InvalidDataLength, match="reaches element 1000000000, storage "
                                                        "holds 2"):
            g(w)
    for g in (past_a_view, F.compile(past_a_view)):
        with pytest.raises(F.InvalidDataLength, match="reaches element 4, storage holds 4"):
            g(w4)
    np.testing.assert_allclose(F.compile(inside)(w).numpy(), np.exp([1.0, 2.0]), rtol=1e-6)


def test_a_rank_0_strided_view_holds_one_element(ctx):
    # in0.view_with_strides([], (2,), (0,)) made a tensor with no tags and two elements,
    # whose numpy() then failed ("cannot reshape array of size 2 into shape ()").
    x = F.Tensor("a").from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    with pytest.raises(F.InvalidShape, match="no tags holds one element, got shape"):
        x.view_with_strides([], (2,), (0,))
    one = x.view_with_strides([], (1,), (0,))
    assert one.tag_count == 0 and float(one.numpy().reshape(-1)[0]) == 1.0


def test_an_unused_integer_division_still_checks_its_divisor_compiled(ctx):
    # [in0.sub(in1), in0.div_floor(in2), in3.log()]: eager raised DivisionByZero at the
    # division; compiled dropped the unused division (and its check) and raised the
    # trace error of the later bf16 log instead, or nothing at all.
    I = F.Tensor("a", dtype="i32")
    x = I.from_slice(ctx, (2,), [4, 5])
    zero = I.from_slice(ctx, (2,), [0, 1])
    ok = I.from_slice(ctx, (2,), [2, 1])

    def unused(a, b):
        a.div_floor(b)
        return a + b

    def then_trace_error(a, b):
        a % b
        return F.Tensor("a", dtype="bf16").from_slice(ctx, (2,), [1, 2]).log() + a

    for fn in (unused, then_trace_error):
        fast = F.compile(fn)
        for f in (fn, fast):
            with pytest.raises(F.DivisionByZero, match="the divisor holds a zero"):
                f(x, zero)
    np.testing.assert_array_equal(F.compile(unused)(x, ok).numpy(), [6, 6])


def test_vectors_holding_an_int_beyond_float_are_refused_by_name(ctx):
    # in0.bias_add(10**400, 'b'): numpy's OverflowError ("int too large to convert to
    # float") escaped from the bias conversion.
    x = F.Tensor("a", "b").ones(ctx, (2, 3))
    for bias in (10**400, [1, 2, 10**400]):
        with pytest.raises(ValueError, match="bias holds an integer beyond float32"):
            x.bias_add(bias, "b")
    with pytest.raises(F.InvalidDataLength, match="sinks must be a sequence of numbers"):
        x.softmax("b", sinks=[10**400])


def test_unused_multinomial_and_segment_sum_still_check_their_values_compiled(ctx):
    # Eager raised InvalidShape for negative multinomial weights and for bad traced
    # segment_sum offsets; a compiled function that dropped the result raised nothing.
    x = F.Tensor("a", "b").from_slice(ctx, (2, 3), [1.0, -1.0, 2.0, 0.0, 1.0, 0.0])
    offsets = F.Tensor("s", dtype="i64").from_slice(ctx, (3,), [0, 2, 1])

    def draws(t):
        t.multinomial("b", "s", 2, 3, True)
        return t * 2.0

    def segments(t, off):
        t.segment_sum("b", off)
        return t * 2.0

    for f in (draws, F.compile(draws)):
        with pytest.raises(F.InvalidShape, match="multinomial weights must be >= 0"):
            f(x)
    for f in (segments, F.compile(segments)):
        with pytest.raises(F.InvalidShape, match="offsets must end at the axis size 3"):
            f(x, offsets)
    ok = F.Tensor("s", dtype="i64").from_slice(ctx, (3,), [0, 2, 3])
    np.testing.assert_array_equal(F.compile(segments)(x, ok).numpy(), x.numpy() * 2)


def test_conv_window_arguments_beyond_int64_are_refused_by_name(ctx):
    # in0.causal_conv1d('b', 'c', 'e', 'f', in1, dilation=2**70): numpy's TypeError
    # ("`pad_width` must be of integral type") escaped from the padding.
    x = F.Tensor("b", "c").ones(ctx, (3, 2))
    w = F.Tensor("e", "c", "f").ones(ctx, (3, 2, 1))
    with pytest.raises(ValueError, match="dilation must be <= 2"):
        x.causal_conv1d("b", "c", "e", "f", w, dilation=2**70)
    with pytest.raises(ValueError, match="padding must be <= 2"):
        x.conv1d("b", "c", "e", "f", w, padding=2**70)
    with pytest.raises(F.InvalidShape, match="padding rows, a tensor larger than"):
        x.causal_conv1d("b", "c", "e", "f", w, dilation=2**58)
    np.testing.assert_array_equal(x.causal_conv1d("b", "c", "e", "f", w, dilation=1).numpy(),
                                  [[2.0], [4.0], [6.0]])


def test_a_result_beyond_the_element_limit_is_invalid_shape(ctx):
    # x.conv2d(w, None, 1, 2**40, 1, ...): a [1, 2**41, 2**41, 3] result reached np.empty,
    # whose "Maximum allowed dimension exceeded" ValueError escaped, eager and compiled.
    x = F.Tensor("b", "h", "w", "c").ones(ctx, (1, 4, 4, 2))
    w = F.Tensor("o", "kh", "kw", "c").ones(ctx, (3, 3, 3, 2))

    def conv(x, w, pad):
        return x.conv2d(w, None, 1, pad, 1, ("oh", "ow", "oc"))

    for pad in (2**40, 2**30):
        for run in (conv, F.compile(conv)):
            with pytest.raises(F.InvalidShape, match=r"conv2d: the result shape .* 2\*\*59"):
                run(x, w, pad)
    np.testing.assert_array_equal(conv(x, w, 1).numpy()[0, 1, 1], [18.0, 18.0, 18.0])


def test_a_rope_source_dict_missing_fields_is_refused_by_name(ctx):
    # in0.rope('c', 'd', {}, 'half'): RopeTheta(**{}) let Python's own TypeError escape.
    x = F.Tensor("a", "b").ones(ctx, (2, 4))
    with pytest.raises(TypeError, match=r"rope: the RopeTheta dict lacks \['positions', "
                                        r"'theta_base'\]"):
        x.rope("a", "b", {}, "half")
    with pytest.raises(TypeError, match="unknown RopeTheta fields"):
        x.rope("a", "b", {1: 2, "positions": [0, 1], "theta_base": 10.0}, "half")
    rotated = x.rope("a", "b", {"positions": [0, 1], "theta_base": 10.0}, "half").numpy()
    np.testing.assert_array_equal(rotated[0], [1, 1, 1, 1])  # position 0 turns by 0


def test_rope_tables_and_scales_given_ints_beyond_float_are_refused_by_name(ctx):
    # RopeTheta(theta_base=10**400), prepare_rope_table_inv_freqs_f64(pos0=10**400) and
    # take_scale_no_grad(10**400) let OverflowError escape; a count or dim of 10**400,
    # numpy's "Maximum allowed size exceeded".
    with pytest.raises(ValueError, match="theta_base must be within the float range"):
        F.RopeTheta(positions=[0, 1], theta_base=10**400)
    with pytest.raises(F.InvalidShape, match="reach beyond 2\\*\\*53"):
        ctx.prepare_rope_table_inv_freqs_f64(10**400, 2, [1.0])
    with pytest.raises(F.InvalidShape, match="count must be in"):
        ctx.prepare_rope_table_inv_freqs_f64(0, 10**400, [1.0])
    with pytest.raises(F.InvalidShape, match="feature_dim must be a positive even number"):
        ctx.yarn_blend_inv_freqs_f64(10**400, 10000.0, 4.0, 4096)
    with pytest.raises(ValueError, match="scale"):
        F.Tensor("a").ones(ctx, (2,)).take_scale_no_grad(10**400)
    table = ctx.prepare_rope_table_inv_freqs_f64(3, 2, [1.0])
    np.testing.assert_allclose(table.cos.reshape(-1), np.cos([3.0, 4.0]), rtol=1e-6)


@pytest.mark.parametrize("call, arg", [
    (lambda x, w, k: x.conv1d("b", "c", np.array([1, 2]), "f", w), "tap_tag"),
    (lambda x, w, k: x.causal_conv1d("b", "c", [1], "f", w), "tap_tag"),
    (lambda x, w, k: x.grouped_causal_conv1d("b", "c", "e", np.array([1, 2]), "f", w, 1, 1),
     "in_per_group_tag"),
    (lambda x, w, k: x.causal_depthwise_conv1d("b", "c", np.array([1, 2]), k), "tap_tag"),
])
def test_conv_weight_tags_that_are_not_strings_raise_tag_error(ctx, call, arg):
    # in2.conv1d('b', 'c', array([1, 2]), 'f', in3): the weight's tags were compared with a
    # tuple holding the array, and numpy's "truth value of an array is ambiguous"
    # ValueError escaped instead of a TagError naming the argument.
    x = F.Tensor("a", "b", "c").from_numpy(ctx, np.ones((1, 3, 2), np.float32))
    w = F.Tensor("e", "c", "f").from_numpy(ctx, np.ones((1, 2, 4), np.float32))
    k = F.Tensor("c", "e").from_numpy(ctx, np.ones((2, 1), np.float32))
    with pytest.raises(F.TagError, match=f"argument '{arg}' expects a tag name"):
        call(x, w, k)
    with pytest.raises(F.TagError, match=f"argument '{arg}' expects a tag name"):
        F.compile(lambda x, w, k: call(x, w, k))(x, w, k)


def test_diag_keeps_exact_zeros_off_a_nan_or_inf_diagonal(ctx):
    # Regression: diag multiplied by an identity matrix, so NaN/inf entries put NaN off
    # the diagonal (0 * inf); torch.diag and the reference keep exact zeros there.
    v = F.Tensor("d").from_slice(ctx, (3,), [np.inf, np.nan, 2.0])
    want = np.diag(np.array([np.inf, np.nan, 2.0], np.float32))
    for run in (lambda t: t.diag(("r", "c")), F.compile(lambda t: t.diag(("r", "c")))):
        np.testing.assert_array_equal(run(v).numpy(), want)
    b = F.Tensor("b", "d").from_slice(ctx, (2, 2), [np.nan, 1.0, -np.inf, 0.0])
    got = b.diag_embed("d", ("r", "c")).numpy()
    np.testing.assert_array_equal(got, [np.diag([np.nan, 1.0]), np.diag([-np.inf, 0.0])])


def test_a_slice_step_beyond_any_stride_takes_one_element(ctx):
    # Regression: slice(c=slice(None, None, 2**62)) became a 2**62-element stride and
    # numpy's "Maximum allowed dimension exceeded" ValueError escaped; numpy gives [:, :1].
    x = F.Tensor("r", "c").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    for step in (2**62, 2**63, 2**65):
        f = lambda t, s=step: t.slice(c=slice(None, None, s))  # noqa: E731
        for run in (f, F.compile(f)):
            np.testing.assert_array_equal(run(x).numpy(), [[1.0], [4.0]])


def _pad_model(x: np.ndarray, lo: int, hi: int, fill: float) -> np.ndarray:
    """torch's constant pad along the last axis: out[j] = x[j - lo] inside x, else fill."""
    n = x.shape[-1] + lo + hi
    out = np.full(x.shape[:-1] + (n,), fill, np.float32)
    for j in range(n):
        if 0 <= j - lo < x.shape[-1]:
            out[..., j] = x[..., j - lo]
    return out


def test_pad2d_crop_past_the_other_edge_keeps_the_fill(ctx):
    # Regression: (2, -1) on width 1 and (-3, 2) on width 3 raised InvalidShape; their
    # results have width 2, all fill (torch's ZeroPad2d gives [[0, 0]]).
    for width in (1, 2, 3):
        x0 = np.arange(1, 2 * width + 1, dtype=np.float32).reshape(2, width)
        x = F.Tensor("h", "w").from_slice(ctx, x0.shape, x0)
        for lo in range(-4, 4):
            for hi in range(-4, 4):
                pad = (lo, hi, 0, 0)
                f = lambda t, p=pad: t.constant_pad2d("h", "w", p, 7.0)  # noqa: E731
                if width + lo + hi <= 0:
                    with pytest.raises(F.InvalidShape, match="to nothing"):
                        f(x)
                    continue
                np.testing.assert_array_equal(f(x).numpy(), _pad_model(x0, lo, hi, 7.0))
    x = F.Tensor("h", "w").from_slice(ctx, (1, 1), [5.0])
    fast = F.compile(lambda t: t.zero_pad2d("h", "w", (2, -1, 0, 0)))
    np.testing.assert_array_equal(fast(x).numpy(), [[0.0, 0.0]])


@pytest.mark.parametrize("first", ["mod", "div_floor"])
def test_the_first_bad_divisor_in_trace_order_names_the_error(ctx, first):
    # Regression: a program ran its value checks in the order its outputs reached them, so
    # x.mod(z) then x.div_floor(z) (combined as b.rem(a)) raised "div_floor: ..." compiled
    # where eager raises at mod, the first op to meet the zero.
    second = "div_floor" if first == "mod" else "mod"
    T = F.Tensor("a", dtype="i32")
    x = T.from_slice(ctx, (3,), [7, 8, 9])
    z = T.from_slice(ctx, (3,), [1, 0, 2])

    def f(x, z):
        a = getattr(x, first)(z)
        b = getattr(x, second)(z)
        return b.rem(a)

    for run in (f, F.compile(f)):
        with pytest.raises(F.DivisionByZero, match=f"^{first}: the divisor holds a zero"):
            run(x, z)


def test_minus_a_numpy_integer_scalar_does_not_wrap(ctx):
    # Regression: x - s negated s as given, so -np.uint8(3) wrapped to 253 and
    # -np.int32(-2**31) stayed negative; x.sub_scalar(s) and s - x were right.
    x = F.Tensor("a").from_slice(ctx, (2,), [1.0, 2.0])
    for s, want in ((np.uint8(3), [-2.0, -1.0]), (np.int32(-2**31), [2.0**31 + 1, 2.0**31 + 2]),
                    (np.uint64(2**64 - 1), [1.0 - 2.0**64, 2.0 - 2.0**64])):
        for run in (lambda t, s=s: t - s, F.compile(lambda t, s=s: t - s)):
            np.testing.assert_array_equal(run(x).numpy(), np.float32(want))


@pytest.mark.parametrize("op", ["&", "|", "^"])
def test_mask_operators_take_masks_only(ctx, op):
    # Regression: m & i (| ^) read an integer tensor's truthiness, while i & m refused;
    # the operators combine masks with masks (logical_and still reads truthiness).
    import operator

    fn = {"&": operator.and_, "|": operator.or_, "^": operator.xor}[op]
    m = F.Tensor("k", dtype="bool").from_slice(ctx, (3,), [True, True, False])
    n = F.Tensor("k", dtype="bool").from_slice(ctx, (3,), [True, False, False])
    for other in (F.Tensor("k", dtype="i8").from_slice(ctx, (3,), [2, 4, 1]),
                  F.Tensor("k").from_slice(ctx, (3,), [2.0, 0.0, 1.0])):
        for run in (fn, F.compile(fn)):
            with pytest.raises(F.TagError, match="requires matching dtypes"):
                run(m, other)
    want = fn(np.array([True, True, False]), np.array([True, False, False]))
    np.testing.assert_array_equal(fn(m, n).numpy(), want)
    np.testing.assert_array_equal(m.logical_and(F.Tensor("k").from_slice(
        ctx, (3,), [2.0, 0.0, 1.0])).numpy(), [True, False, False])
