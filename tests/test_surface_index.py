"""REFERENCE §3.10 "Facade surface index", pinned per branch.

The lists below are the index's names, snake_cased by API.md §1 (``fromSlice`` ->
``from_slice``, ``splitSwiGluDotPacked`` -> ``split_swi_glu_dot_packed``), written
out here so the surface cannot regress; nothing is parsed at run time. Every
name must exist on every dtype of its branch, and the names the index excludes
from a dtype (f64's leaf autograd and the f16/bf16-only forward set; bool's
arithmetic) must be absent. The reference's fields (``value``, ``grad_state``,
``scope_owned``) are read-only properties; their values are checked below.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F
import fucina.gguf as G


def _names(text: str) -> list[str]:
    return text.split()


# -- f32 branch --------------------------------------------------------------------------

F32_S3 = _names("""
variable variable_from_slice constant from_tensor from_slice from_borrowed_slice
from_borrowed_const_slice empty zeros ones full scalar empty_like zeros_like ones_like
full_like arange linspace one_hot eye rand uniform randn normal bernoulli gumbel
deinit as_raw_tensor item data data_const copy_to detach materialize contiguous
is_contiguous requires_grad zero_grad backward backward_with_grad grad grad_view axis
has_tag dim shape to with_tags view_with_strides align_to permute_to transpose
insert_axis squeeze split merge reshape broadcast_to narrow select slice slice_step
flatten gather index_select masked_select masked_scatter nonzero flip roll roll_by
shift_by concat stack unbind_into repeat_axis pad zero_pad2d constant_pad2d set_slice
set_rows index_add take_along_axis scatter_add scatter zero_slice zero_rows diagonal
diag diag_embed trace
axis_tags tag_count tensor_rank dtype
value grad_state scope_owned
""")

F32_S4 = _names("""
add sub mul div scale add_scalar sub_scalar div_scalar pow_scalar log1p
take_add_no_grad take_scale_no_grad add_axis_vector_in_place
add_axis_vector_unary_in_place add_scaled_in_place bias_add where masked_fill compare
logical_and logical_or logical_xor logical_not unary elemental_unary elemental_binary
relu leaky_relu exp sqrt rsqrt sigmoid silu log neg abs sin cos tanh fast_tanh
softcap30 softcap15 gelu quick_gelu elu gelu_erf floor ceil round sign reciprocal clamp
clamp_min clamp_max maximum minimum pow isnan isinf isfinite dropout gated glu swiglu
geglu situ split_gated sum mean cumsum prod cumprod segment_sum linear_recurrence
variance standardize_axis sum_all sum_many any all any_all all_all norm norm_all
band_part tril triu logsumexp log_softmax argmax multinomial max min top_k sort argsort
router_top_k softmax rms_norm rms_norm_mul rms_norm_mul_add
rms_norm_mul_rope_half_prepared layer_norm group_norm cross_entropy
linear_cross_entropy linear_distill mse_loss huber_loss bce_loss kl_div_loss nll_loss
l2_normalize cosine_similarity rope matmul dot add_dot einsum dot_ternary_ste pack_rhs
dot_packed rms_norm_mul_dot_packed split_swi_glu_dot_packed geglu_quant_dot_packed
grouped_attention conv2d conv2d_relu prepare_conv2d_weights conv2d_prepared
conv2d_prepared_relu max_pool2d avg_pool2d upsample2x_nearest unfold fold prelu
channel_affine relpos_shift causal_depthwise_conv1d causal_conv1d
grouped_causal_conv1d conv1d conv_transpose1d snake
""")

# -- typed scalar-constant branch (bool / integers) -----------------------------------------

SCALAR_CONST_S3 = _names("""
constant from_tensor from_slice from_borrowed_const_slice empty zeros ones empty_like
zeros_like ones_like item data data_const copy_to axis has_tag deinit as_raw_tensor
requires_grad dim shape is_contiguous materialize with_tags align_to permute_to
transpose insert_axis squeeze broadcast_to gather narrow concat set_slice set_rows
to value
""")
# §4.19: integer forward math; on bool "the arithmetic entries are compile errors".
INT_ARITHMETIC = _names("""
add sub mul maximum minimum div_trunc div_floor rem mod bit_and bit_or bit_xor
""")
COUNTS = _names("sum sum_all")
INT_ONLY = _names("compare")
I64_ONLY = _names("randint randperm")
BOOL_ONLY = _names("band_mask logical_and logical_or logical_xor logical_not")

# -- typed float branch (f16 / bf16 / f64) ------------------------------------------------

TYPED_FLOAT = SCALAR_CONST_S3 + _names("""
requires_grad zero_grad detach grad_state scope_owned
add sub mul div sum mean sum_all dot scale div_scalar
split merge flatten reshape slice_step flip roll stack repeat_axis
""")
# Compile errors on f64: the leaf-autograd surface and the widened f16/bf16 forward set.
HALF_LEAF = _names("variable variable_from_slice grad grad_view")
HALF_ONLY = _names("""
unary relu exp sqrt rsqrt sigmoid silu log log1p neg abs sin cos tanh fast_tanh
softcap30 softcap15 gelu quick_gelu elu gelu_erf floor ceil round sign reciprocal
leaky_relu clamp add_scalar sub_scalar pow_scalar maximum minimum gated glu swiglu
geglu softmax log_softmax rms_norm rms_norm_mul layer_norm cumsum cumprod where
masked_fill compare pad einsum max min prod variance logsumexp argmax pack_rhs
""")

# -- block-quantized branch ----------------------------------------------------------------

QUANT = _names("""
constant from_tensor from_blocks from_storage_slice from_borrowed_blocks deinit
as_raw_tensor data data_const copy_to requires_grad axis has_tag dim shape
is_contiguous with_tags to materialize concat get_rows pack_rhs pack_rhs_layout value
""")

EXPECTED = {
    "f32": F32_S3 + F32_S4,
    "f16": TYPED_FLOAT + HALF_LEAF + HALF_ONLY,
    "bf16": TYPED_FLOAT + HALF_LEAF + HALF_ONLY,
    "f64": TYPED_FLOAT,
    "u8": SCALAR_CONST_S3 + INT_ARITHMETIC + COUNTS + INT_ONLY,
    "i32": SCALAR_CONST_S3 + INT_ARITHMETIC + COUNTS + INT_ONLY,
    "i64": SCALAR_CONST_S3 + INT_ARITHMETIC + COUNTS + INT_ONLY + I64_ONLY,
    "bool": SCALAR_CONST_S3 + COUNTS + BOOL_ONLY,
    "q8_0": QUANT,
    "q4_k": QUANT,
}
ABSENT = {
    "f64": HALF_LEAF + HALF_ONLY,
    "bool": INT_ARITHMETIC + I64_ONLY,
    "i32": BOOL_ONLY + I64_ONLY,
    "q8_0": _names("item from_slice dot_packed grad_state scope_owned sum"),
}


def test_the_lists_are_the_index():
    assert len(F32_S3) == 98 and len(F32_S4) == 145  # the index counts (§4 names once)
    assert len(set(F32_S4)) == 145 and len(set(QUANT)) == len(QUANT)
    assert not set(HALF_ONLY) & {"variable", "grad"}


@pytest.mark.parametrize("dtype", list(EXPECTED))
def test_every_index_name_exists_on_its_branch(dtype):
    T = F.Tensor("a", "b", dtype=dtype)
    missing = [n for n in EXPECTED[dtype] if not hasattr(T, n)]
    assert not missing, (dtype, missing)


@pytest.mark.parametrize("dtype", list(ABSENT))
def test_excluded_names_are_absent(dtype):
    T = F.Tensor("a", "b", dtype=dtype)
    present = [n for n in ABSENT[dtype] if hasattr(T, n)]
    assert not present, (dtype, present)


def test_f64_and_bool_refusals_raise_attribute_error(ctx):
    d = F.Tensor("a", dtype="f64").from_slice(ctx, (2,), [1.0, 2.0])
    with pytest.raises(AttributeError, match="variable_from_slice"):
        F.Tensor("a", dtype="f64").variable_from_slice(ctx, (2,), [1.0, 2.0])
    with pytest.raises(AttributeError, match="softmax"):
        d.softmax("a")
    np.testing.assert_array_equal(d.add(d).numpy(), [2.0, 4.0])
    b = F.Tensor("a", dtype="bool").from_slice(ctx, (2,), [True, False])
    with pytest.raises(AttributeError, match="add"):
        b.add(b)
    assert b.sum_all().item() == 1


def test_value_field_is_the_raw_tensor(ctx):
    x = F.Tensor("a", "b").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    assert x.value is x.as_raw_tensor()
    assert x.value.shape == (2, 2)
    q = F.Tensor("r", "c", dtype="q8_0").from_blocks(
        ctx, (1, 32), G.encode_f32("q8_0", np.ones((1, 32), np.float32)))
    assert q.value is q.as_raw_tensor()
    i = F.Tensor("a", dtype="i32").from_slice(ctx, (3,), [1, 2, 3])
    np.testing.assert_array_equal(i.value.array(), [1, 2, 3])


def test_scope_owned_field(ctx):
    x = F.Tensor("a").from_slice(ctx, (2,), [1.0, 2.0])
    assert x.scope_owned is False
    with ctx.exec_scope():
        y = x.scale(2.0)
        assert y.scope_owned is True and x.scope_owned is False
        y.deinit()  # a no-op on a scope-owned result
        np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])
    h = F.Tensor("a", dtype="f16").from_slice(ctx, (2,), [1.0, 2.0])
    assert h.scope_owned is False


def test_grad_state_field(ctx):
    c = F.Tensor("a").from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    assert c.grad_state is None
    assert F.Tensor("a", dtype="f64").from_slice(ctx, (1,), [1.0]).grad_state is None
    w = F.Tensor("a").variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    st = w.grad_state
    assert st is not None and st.grad_clone() is None and st.grad_view() is None
    w.mul(w).sum_all().backward()
    np.testing.assert_array_equal(st.grad_clone().numpy(), [2.0, 4.0, 6.0])
    view = st.grad_view()
    st.set_grad(F.Tensor("a").from_slice(ctx, (3,), [7.0, 8.0, 9.0]))
    np.testing.assert_array_equal(w.grad().numpy(), [7.0, 8.0, 9.0])
    np.testing.assert_array_equal(view.numpy(), [2.0, 4.0, 6.0])  # the old buffer
    w.mul(w).sum_all().backward()  # accumulates onto the replaced gradient
    np.testing.assert_array_equal(w.grad().numpy(), [9.0, 12.0, 15.0])
    st.zero_grad()
    assert w.grad() is None
    with pytest.raises(F.TagError):
        st.set_grad(F.Tensor("b").zeros(ctx, (3,)))
    with pytest.raises(F.ShapeMismatch):
        st.set_grad(F.Tensor("a").zeros(ctx, (2,)))
    h = F.Tensor("a", dtype="bf16").variable_from_slice(ctx, (2,), [1.0, 2.0])
    assert h.grad_state is not None
    h.to("f32").sum_all().backward()
    np.testing.assert_array_equal(h.grad_state.grad_clone().numpy(), [1.0, 1.0])


def test_grad_state_set_grad_under_compile(ctx):
    w = F.Tensor("a").variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])

    def step(x):
        w.mul(x).sum_all().backward()
        w.grad_state.set_grad(F.Tensor("a").from_slice(ctx, (3,), [5.0, 6.0, 7.0]))
        return x.scale(2.0)

    x = F.Tensor("a").from_slice(ctx, (3,), [1.0, 1.0, 1.0])
    fast = F.compile(step)
    for _ in range(2):
        np.testing.assert_array_equal(fast(x).numpy(), [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(w.grad().numpy(), [5.0, 6.0, 7.0])
        w.zero_grad()
    step(x)
    np.testing.assert_array_equal(w.grad().numpy(), [5.0, 6.0, 7.0])


def test_root_types_of_the_fields_and_packs(ctx):
    w = F.Tensor("out", "in").from_slice(ctx, (2, 2), [1.0, 2.0, 3.0, 4.0])
    packed = w.pack_rhs()
    assert isinstance(packed, F.PackedRhs) and (packed.n, packed.k) == (2, 2)
    v = F.Tensor("a").variable_from_slice(ctx, (2,), [1.0, 2.0])
    assert isinstance(v.grad_state, F.GradState)
