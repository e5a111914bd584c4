"""Ports of the snippets in seeds/002 (the named-axes chapter) that use the real
library. The chapter's "mini View" course code (tagEqual/tagIndex, View(...),
the @sizeOf test, the mini alignTo/dot) is a self-contained toy, not fucina,
and is not ported.

A few extra tests pin behaviour the chapter states about the real library
next to its snippets (the "two failure worlds" table in 4.4, the operand-order
gotcha in 4.6, the compile error reproduced in 4.7, exact-match dot batching);
each says where it comes from.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina

# --- 4.3 ---------------------------------------------------------------------------------


# zig: test "Tensor spec forms and comptime introspection"
def test_tensor_spec_forms_and_comptime_introspection():
    A = fucina.Tensor("batch", "in")
    B = fucina.Tensor(2)
    C = fucina.Tensor(dtype="i64", rank=2)
    D = fucina.Tensor(tags=("seq", "d"), dtype=fucina.f16)
    S = fucina.Tensor()
    assert A.dtype == fucina.f32 and A.tag_count == 2 and A.tensor_rank == 2
    assert B.axis_tags[0] == "_0" and B.axis_tags[1] == "_1"
    assert C.dtype == fucina.i64 and D.dtype == fucina.f16
    assert S.tag_count == 0 and S.tensor_rank == 1
    assert B is fucina.Tensor("_0", "_1")
    assert A is fucina.Tensor(tags=("batch", "in"), dtype="f32")


# chapter 4.3 prose: reordered tags are a different type.
def test_reordered_tags_are_a_different_type():
    assert fucina.Tensor("batch", "in") is not fucina.Tensor("in", "batch")
    assert fucina.Tensor("batch", "in") is fucina.Tensor(("batch", "in"))


# --- 4.4 ---------------------------------------------------------------------------------


# zig: test "incompatible dims fail with ShapeMismatch"
def test_incompatible_dims_fail_with_shape_mismatch(ctx):
    a = fucina.Tensor("d").from_slice(ctx, (3,), [1, 2, 3])
    b = fucina.Tensor("d").from_slice(ctx, (2,), [10, 20])
    with pytest.raises(fucina.ShapeMismatch):
        a.add(b)
    with pytest.raises(fucina.ShapeMismatch):
        a.dot(b, "d")


# chapter 4.4 table "two failure worlds": the tag-level rows are TagError (the Python
# form of a compile error), the size-level rows are runtime errors.
def test_two_failure_worlds_table(ctx):
    a = fucina.Tensor("m", "k").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    b = fucina.Tensor("n", "j").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    with pytest.raises(fucina.TagError):  # contract tag missing from an operand
        a.dot(b, "k")
    with pytest.raises(fucina.TagError):  # duplicate tag in a spec
        fucina.Tensor("d", "d")
    # rank overflow: pointwise union of 9 distinct tags
    left = fucina.Tensor("a", "b", "c", "d", "e").ones(ctx, (1, 1, 1, 1, 1))
    right = fucina.Tensor("f", "g", "h", "i").ones(ctx, (1, 1, 1, 1))
    with pytest.raises(fucina.TagError):
        left.add(right)
    ab = fucina.Tensor("a", "b").ones(ctx, (2, 3))
    with pytest.raises(fucina.TagError):  # permutation target with the wrong tag set
        ab.permute_to(("a", "z"))
    six = fucina.Tensor("x").ones(ctx, (6,))
    with pytest.raises(fucina.InvalidShape):  # split 6 into {4, 2}
        six.split("x", ("p", "q"), (4, 2))
    t = ab.permute_to(("b", "a"))
    with pytest.raises(fucina.UnsupportedView):  # merge across a transposed view
        t.merge("m", ("b", "a"))


# --- 4.6 ---------------------------------------------------------------------------------


# zig: test "pointwise broadcasts by tag"
def test_pointwise_broadcasts_by_tag(ctx):
    x = fucina.Tensor("batch", "d").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    bias = fucina.Tensor("d").from_slice(ctx, (3,), [10, 20, 30])
    y = x.add(bias)  # d aligns; missing batch broadcasts
    assert len(type(y).axis_tags) == 2  # tags {batch, d}
    np.testing.assert_array_equal(y.data_const(),
                                  np.array([11, 22, 33, 14, 25, 36], np.float32))


# chapter 4.6 "operand-order gotcha" (and exercise 2): {d} + {batch, d} is {d, batch}.
def test_pointwise_result_layout_depends_on_operand_order(ctx):
    x = fucina.Tensor("batch", "d").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    bias = fucina.Tensor("d").from_slice(ctx, (3,), [10, 20, 30])
    xb = x.add(bias)
    bx = bias.add(x)
    assert type(xb) is fucina.Tensor("batch", "d")
    assert type(bx) is fucina.Tensor("d", "batch")
    assert bx.shape == (3, 2)
    np.testing.assert_array_equal(bx.data_const(),
                                  np.array([11, 14, 22, 25, 33, 36], np.float32))


# --- 4.7 ---------------------------------------------------------------------------------


# chapter 4.7 "Watching it fail": a.dot(b, .k) with b lacking .k does not compile
# ("tensor tag not found"); in Python it is a TagError at call time.
def test_dot_over_a_tag_missing_from_the_rhs_is_a_tag_error(ctx):
    a = fucina.Tensor("m", "k").from_slice(ctx, (1, 2), [1, 2])
    b = fucina.Tensor("n", "j").from_slice(ctx, (1, 2), [3, 4])
    with pytest.raises(fucina.TagError):
        a.dot(b, "k")


# zig: test "dot contracts by tag regardless of physical axis order"
def test_dot_contracts_by_tag_regardless_of_physical_axis_order(ctx):
    a = fucina.Tensor("m", "k").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    b = fucina.Tensor("n", "k").from_slice(ctx, (2, 3), [7, 9, 11, 8, 10, 12])
    c = a.dot(b, "k")  # lowers to the trans-B matmul kernel
    np.testing.assert_array_equal(c.data_const(), np.array([58, 64, 139, 154], np.float32))


# chapter 4.7: dot batching is exact-match, batch dims do not broadcast.
def test_dot_batch_dims_do_not_broadcast(ctx):
    a = fucina.Tensor("b", "m", "k").ones(ctx, (1, 2, 3))
    b = fucina.Tensor("b", "k", "n").ones(ctx, (2, 3, 2))
    with pytest.raises(fucina.ShapeMismatch):
        a.dot(b, "k")


# --- 4.8 ---------------------------------------------------------------------------------


# zig: test "split and merge rename factor axes as views"
def test_split_and_merge_rename_factor_axes_as_views(ctx):
    x = fucina.Tensor("batch", "d_model").from_slice(ctx, (2, 6), list(range(1, 13)))
    heads = x.split("d_model", ("head", "head_dim"), (2, 3))
    assert heads.shape == (2, 2, 3)  # tags {batch, head, head_dim}
    assert type(heads).axis_tags == ("batch", "head", "head_dim")
    flat = heads.merge("features", ("head", "head_dim"))
    assert type(flat).axis_tags == ("batch", "features")  # shape {2, 6}
    np.testing.assert_array_equal(x.data_const(), flat.data_const())


# zig: test "merge rejects stride-incompatible layouts"
def test_merge_rejects_stride_incompatible_layouts(ctx):
    x = fucina.Tensor("a", "b").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    t = x.permute_to(("b", "a"))  # zero-copy transposed view
    # Tag-contiguous, but the transposed strides cannot collapse into one axis.
    with pytest.raises(fucina.UnsupportedView):
        t.merge("m", ("b", "a"))
