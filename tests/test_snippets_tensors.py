"""Ports of the runnable snippets in seeds/000 (the seeds' section 3: tensors).

Each test keeps the original Zig test name in a comment and asserts the same
values (exact where the arithmetic is exact). Zig -> Python follows API.md:
snake_case names, string tags, exceptions for error unions, ``TagError`` for
compile errors, ``hasattr`` for ``@hasDecl``, ``None`` for a null optional.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina


def f16_bits(x: float) -> int:
    """The Zig helper ``bits``: @bitCast(@as(f16, @floatCast(x)))."""
    return int(np.array(x, dtype=np.float16).view(np.uint16))


# --- 3.1 ---------------------------------------------------------------------------------


# zig: test "Tensor spec forms and comptime introspection"
def test_tensor_spec_forms_and_comptime_introspection():
    A = fucina.Tensor("batch", "in")  # named tags, dtype defaults to f32
    B = fucina.Tensor(2)  # numeric rank: axes tagged _0, _1
    C = fucina.Tensor(dtype="i64", rank=2)  # typed, auto tags
    D = fucina.Tensor("seq", "d", dtype="f16")  # typed, named tags
    S = fucina.Tensor()  # scalar
    assert A.dtype == fucina.f32 and A.tag_count == 2 and A.tensor_rank == 2
    assert B.axis_tags[0] == "_0" and B.axis_tags[1] == "_1"
    assert C.dtype == fucina.i64 and D.dtype == fucina.f16
    assert S.tag_count == 0 and S.tensor_rank == 1  # scalars store rank-1 [1]
    # Specs that normalize to the same (dtype, tags) are the SAME type:
    assert B is fucina.Tensor("_0", "_1")
    assert A is fucina.Tensor(tags=("batch", "in"), dtype=fucina.f32)


# --- 3.3 ---------------------------------------------------------------------------------


# zig: test "arange linspace and seed-deterministic random constructors"
def test_arange_linspace_and_seed_deterministic_random_constructors(ctx):
    r = fucina.Tensor("d").arange(ctx, 0, 2, 0.5)  # end exclusive
    np.testing.assert_array_equal(r.data_const(), np.array([0, 0.5, 1, 1.5], np.float32))
    l = fucina.Tensor("d").linspace(ctx, 0, 1, 3)  # end INCLUSIVE
    np.testing.assert_array_equal(l.data_const(), np.array([0, 0.5, 1], np.float32))

    # Same seed -> the same tensor (the counter-stream contract).
    M = fucina.Tensor("row", "col")
    a = M.randn(ctx, (2, 4), 42)
    b = M.randn(ctx, (2, 4), 42)
    np.testing.assert_array_equal(a.data_const(), b.data_const())

    g = M.gumbel(ctx, (2, 4), 42)  # finite Gumbel(0, 1) noise
    assert all(math.isfinite(v) for v in g.data_const())

    identity = M.eye(ctx, 2)
    np.testing.assert_array_equal(identity.data_const(), np.array([1, 0, 0, 1], np.float32))

    # i64-branch seed-stream constructors: randint over [low, high),
    # randperm as a rank-1 permutation of 0..n-1.
    ints = fucina.Tensor("row", "col", dtype="i64").randint(ctx, (2, 4), 7, -3, 5)
    assert all(-3 <= v < 5 for v in ints.data_const())
    perm = fucina.Tensor("i", dtype="i64").randperm(ctx, 6, 7)
    total = 0
    for v in perm.data_const():
        total += int(v)
    assert total == 15  # 0+1+...+5


# zig: test "variable wraps a ctx-produced raw tensor"
def test_variable_wraps_a_ctx_produced_raw_tensor(ctx):
    x = fucina.Tensor("batch", "in").variable(ctx, ctx.from_slice((2, 3), [1, 2, 3, 4, 5, 6]))
    assert x.requires_grad
    assert x.dim("in") == 3
    assert x.shape == (2, 3)
    with pytest.raises(fucina.MutableDataRequiresNoGrad):
        x.data()
    np.testing.assert_array_equal(x.data_const(), np.array([1, 2, 3, 4, 5, 6], np.float32))


# zig: test "constant constructors"
def test_constant_constructors(ctx):
    T = fucina.Tensor("row", "col")
    a = T.from_slice(ctx, (2, 2), [1, 2, 3, 4])
    T.zeros(ctx, (2, 2))
    T.ones(ctx, (2, 2))
    T.full(ctx, (2, 2), 0.5)
    T.empty(ctx, (2, 2))  # uninitialized
    s = fucina.Tensor().scalar(ctx, 3.5)
    assert not a.requires_grad
    assert s.item() == 3.5
    assert s.shape == (1,)  # scalar = raw rank-1 [1]
    with pytest.raises(fucina.InvalidDataLength):
        fucina.Tensor("d").from_slice(ctx, (3,), [1, 2])

    # *_like: same type (tags + dtype), shape from the receiver.
    zl = a.zeros_like()
    mask = a.full_like(-math.inf)
    assert a.shape == zl.shape
    assert type(zl) is type(a) and type(mask) is type(a)
    v = mask.data_const()[0]
    assert math.isinf(v) and v < 0


# zig: test "borrowed-storage constructors"
def test_borrowed_storage_constructors(ctx):
    backing = np.array([1, 2, 3, 4], dtype=np.float32)
    t = fucina.Tensor("row", "col").from_borrowed_slice(ctx, (2, 2), backing)
    backing[0] = 42  # zero-copy: mutation is visible through the tensor
    assert t.data_const()[0] == 42

    frozen = np.array([5, 6], dtype=np.float32)  # read-only source
    frozen.setflags(write=False)
    c = fucina.Tensor("d").from_borrowed_const_slice(ctx, (2,), frozen)
    assert c.data_const()[1] == 6


# zig: test "q8_0 constants: fromBlocks, dequantize, getRows"
def test_q8_0_constants_from_blocks_dequantize_get_rows(ctx):
    Q = fucina.Tensor("out", "in", dtype="q8_0")
    bs = fucina.q8_0_block_size
    blocks = np.zeros(2, dtype=fucina.BlockQ8_0)
    blocks[0]["d"] = f16_bits(1)
    blocks[0]["qs"] = [1] * bs
    blocks[1]["d"] = f16_bits(2)
    blocks[1]["qs"] = [3] * bs
    q = Q.from_blocks(ctx, (2, bs), blocks)

    dense = q.to("f32")  # dequantize; f32 is the only target
    assert dense.data_const()[bs] == 6

    row = q.get_rows("out", [1], "batch")  # dequantizing row gather
    assert type(row).dtype == fucina.f32
    assert row.dim("batch") == 1


# --- 3.5 ---------------------------------------------------------------------------------


# zig: test "views, contiguity, materialize, copyTo"
def test_views_contiguity_materialize_copy_to(ctx):
    m = fucina.Tensor("row", "col").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    t = m.permute_to(("col", "row"))  # zero-copy strided view
    with pytest.raises(fucina.UnsupportedView):
        t.data_const()
    tm = t.materialize()  # contiguous copy in the new order
    np.testing.assert_array_equal(tm.data_const(), np.array([1, 4, 2, 5, 3, 6], np.float32))

    mid = m.narrow("col", 1, 2)  # view into m's storage
    buf = np.empty(4, dtype=np.float32)
    mid.copy_to(buf)  # stride-aware; works on non-contiguous views
    np.testing.assert_array_equal(buf, np.array([2, 3, 5, 6], np.float32))


# --- 3.7 ---------------------------------------------------------------------------------


# zig: test "split and merge"
def test_split_and_merge(ctx):
    x = fucina.Tensor("seq", "qkv").from_slice(ctx, (2, 6), list(range(12)))
    heads = x.split("qkv", ("head", "d"), (2, 3))  # [seq, head, d] view
    assert heads.shape == (2, 2, 3)
    back = heads.merge("qkv", ("head", "d"))  # [seq, qkv] again
    np.testing.assert_array_equal(x.data_const(), back.data_const())


# zig: test "tag-directed axis views"
def test_tag_directed_axis_views(ctx):
    row = fucina.Tensor("d").from_slice(ctx, (3,), [1, 2, 3])
    aligned = row.align_to(("batch", "d"))  # missing tag => size-1 axis
    assert aligned.shape == (1, 3)
    grid = row.broadcast_to(("batch", "d"), (2, 3))  # stride-0 view
    assert grid.dim("batch") == 2

    col = row.insert_axis("b", 0)  # [b=1, d]
    flat = col.squeeze("b")  # back to [d]
    renamed = flat.with_tags(("feature",))  # pure re-tag, same storage
    assert renamed.dim("feature") == 3


# zig: test "viewWithStrides escape hatch"
def test_view_with_strides_escape_hatch(ctx):
    v = fucina.Tensor("flat").from_slice(ctx, (4,), [1, 2, 3, 4])
    m = v.view_with_strides(("row", "col"), (2, 2), (2, 1))
    assert m.data_const()[2] == 3


# zig: test "maskedSelect no-match outcome: count first or catch EmptySelection"
def test_masked_select_no_match_outcome_count_first_or_catch_empty_selection(ctx):
    x = fucina.Tensor("d").from_slice(ctx, (3,), [1, -2, 3])
    mask = x.compare("gt", 10)  # nothing matches
    assert type(mask).dtype == fucina.bool_

    # Count-first idiom: the bool mask sums to the selection count (i64).
    count = mask.sum_all()
    assert type(count).dtype == fucina.i64
    assert count.item() == 0

    # Or catch the dedicated error: EmptySelection is the recoverable no-match outcome.
    try:
        picked = x.masked_select(mask, "m")
    except fucina.EmptySelection:
        picked = None
    assert picked is None


# zig: test "zeroPad2d follows the torch (left, right, top, bottom) order"
def test_zero_pad2d_follows_the_torch_left_right_top_bottom_order(ctx):
    x = fucina.Tensor("h", "w").from_slice(ctx, (2, 2), [1, 2, 3, 4])

    # nn.ZeroPad2d((1, 0, 0, 1)): one zero column left, one zero row below.
    padded = x.zero_pad2d("h", "w", (1, 0, 0, 1))
    np.testing.assert_array_equal(
        padded.data_const(),
        np.array([0, 1, 2,
                  0, 3, 4,
                  0, 0, 0], np.float32))

    # Negative padding crops (the F.pad constant-mode rule).
    cropped = x.zero_pad2d("h", "w", (-1, 0, 0, 0))
    np.testing.assert_array_equal(cropped.data_const(), np.array([2, 4], np.float32))


# zig: test "concat, gather, setSlice, setRows"
def test_concat_gather_set_slice_set_rows(ctx):
    T = fucina.Tensor("row", "col")
    a = T.from_slice(ctx, (2, 2), [1, 2, 3, 4])
    b = T.from_slice(ctx, (1, 2), [5, 6])
    cat = a.concat("row", [b])  # [3, 2]
    assert cat.dim("row") == 3

    picked = cat.gather("row", [2, 0], "sel")  # rows 2 and 0
    np.testing.assert_array_equal(picked.data_const(), np.array([5, 6, 1, 2], np.float32))

    patch = T.from_slice(ctx, (1, 2), [9, 9])
    replaced = cat.set_slice("row", 1, patch)  # overwrite row 1
    np.testing.assert_array_equal(replaced.data_const(),
                                  np.array([1, 2, 9, 9, 5, 6], np.float32))

    scattered = cat.set_rows("row", [2], patch)  # overwrite row 2
    np.testing.assert_array_equal(scattered.data_const(),
                                  np.array([1, 2, 3, 4, 9, 9], np.float32))


# zig: test "integer constants: structural ops only"
def test_integer_constants_structural_ops_only(ctx):
    ids = fucina.Tensor(dtype="i64", rank=2).from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    assert type(ids).axis_tags[0] == "_0"  # auto numeric tags
    named = ids.with_tags(("batch", "seq"))
    t = named.transpose(("seq", "batch"))
    out = np.empty(6, dtype=np.int64)
    t.copy_to(out)
    np.testing.assert_array_equal(out, np.array([1, 4, 2, 5, 3, 6], np.int64))
    assert hasattr(type(ids), "add")  # wrapping int math
    assert hasattr(type(ids), "softmax") is False  # float NN ops stay off ints


# --- 3.8 ---------------------------------------------------------------------------------


# zig: test "f16 constants: forward math, reductions widen"
def test_f16_constants_forward_math_reductions_widen(ctx):
    H = fucina.Tensor("m", "k", dtype="f16")
    a = H.from_slice(ctx, (2, 2), [1, 2, 3, 4])
    twice = a.add(a)
    assert type(twice).dtype == fucina.f16  # pointwise keeps dtype
    s = a.sum("k")
    assert type(s).dtype == fucina.f32  # reductions widen to f32
    dense = a.to("f32")
    np.testing.assert_array_equal(dense.data_const(), np.array([1, 2, 3, 4], np.float32))


# zig: test "detach and cast rules"
def test_detach_and_cast_rules(ctx):
    x = fucina.Tensor("d").variable(ctx, ctx.from_slice((2,), [1, 2]))
    frozen = x.detach()  # shares storage, drops grad tracking
    assert not frozen.requires_grad
    with pytest.raises(fucina.InvalidShape):  # not single-element
        frozen.item()
    with pytest.raises(fucina.GradientCastUnsupported):
        x.to("f64")
    narrowed = x.to("f16")  # differentiable narrow: stays in the graph
    assert narrowed.requires_grad
    half = frozen.to("f16")  # constants cast freely between floats
    assert type(half).dtype == fucina.f16


# --- 3.9 ---------------------------------------------------------------------------------


# zig: test "grad accessors on the facade"
def test_grad_accessors_on_the_facade(ctx):
    x = fucina.Tensor("d").variable(ctx, ctx.from_slice((3,), [1, 2, 3]))
    assert x.grad() is None  # no backward run yet
    loss = x.sum_all()
    loss.backward()
    g = x.grad()  # owned clone
    assert g is not None
    np.testing.assert_array_equal(g.data_const(), np.array([1, 1, 1], np.float32))
    x.zero_grad()  # drop the accumulated gradient
    assert x.grad() is None
