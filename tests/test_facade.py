"""The facade's classes: exact per-branch method sets, real signatures and docs, help().

``OLD_*`` below are the branch method lists of the string-list facade this
class facade replaced, frozen: every name in them keeps exactly the branches
it had (the absent-method rule of API.md), and the classes add only the
interop surface listed in ``ADDED``.
"""

import inspect
import pydoc

import numpy as np
import pytest

import fucina as F
from fucina.tensor import branches as B
from fucina.tensor.base import Tensor

# -- the string lists of the previous facade, verbatim --------------------------------

OLD_COMMON = (
    "deinit __enter__ __exit__ axis has_tag dim shape is_contiguous as_raw_tensor data "
    "data_const copy_to numpy requires_grad materialize with_tags to constant from_tensor"
)
OLD_SCALAR_CONST = (
    "from_slice from_borrowed_const_slice empty zeros ones empty_like zeros_like ones_like item "
    "align_to permute_to transpose insert_axis squeeze broadcast_to gather narrow concat "
    "set_slice set_rows"
)
OLD_INT_MATH = (
    "add sub mul maximum minimum div_trunc div_floor rem mod bit_and bit_or bit_xor sum "
    "sum_all compare __lt__ __le__ __gt__ __ge__"
)
OLD_BOOL = "sum sum_all logical_and logical_or logical_xor logical_not band_mask"
OLD_TYPED_FLOAT = (
    "zero_grad detach add sub mul div sum mean sum_all dot scale div_scalar split merge "
    "flatten reshape slice_step flip roll stack repeat_axis __add__ __radd__ __sub__ __rsub__ "
    "__mul__ __rmul__ __truediv__ __rtruediv__"
)
OLD_HALF = (
    "variable variable_from_slice grad grad_view add_scalar sub_scalar maximum minimum compare "
    "logical_and logical_or logical_xor logical_not pad einsum neg __neg__ __pow__ "
    "__lt__ __le__ __gt__ __ge__ "
    # the widened forward set (compute through f32, narrow once; reductions -> f32)
    "unary relu exp sqrt rsqrt sigmoid silu log log1p abs __abs__ sin cos tanh fast_tanh "
    "softcap30 softcap15 gelu quick_gelu elu gelu_erf floor ceil round sign reciprocal "
    "leaky_relu clamp pow_scalar cumsum cumprod where masked_fill max min prod variance "
    "logsumexp argmax softmax log_softmax"
)
OLD_F32 = (
    "variable variable_from_slice from_slice from_borrowed_slice from_borrowed_const_slice "
    "empty zeros ones full scalar empty_like zeros_like ones_like full_like arange linspace "
    "one_hot eye rand uniform randn normal bernoulli gumbel item detach contiguous zero_grad "
    "backward backward_with_grad grad grad_view view_with_strides align_to permute_to "
    "transpose insert_axis squeeze split merge reshape broadcast_to narrow select slice "
    "slice_step flatten gather index_select masked_select masked_scatter nonzero flip roll "
    "roll_by shift_by concat stack unbind unbind_into repeat_axis pad zero_pad2d "
    "constant_pad2d set_slice set_rows index_add take_along_axis scatter_add scatter "
    "zero_slice zero_rows diagonal diag diag_embed trace "
    "add sub mul div maximum minimum scale add_scalar sub_scalar div_scalar neg compare "
    "logical_and logical_or logical_xor logical_not sum mean sum_all sum_many dot einsum "
    "matmul add_dot cross_entropy softmax log_softmax "
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __neg__ "
    "__pow__ __lt__ __le__ __gt__ __ge__ "
    # unary / parameterized elementwise (§4.3, §4.4)
    "pow pow_scalar unary relu leaky_relu exp sqrt rsqrt sigmoid silu log log1p abs __abs__ "
    "sin cos tanh fast_tanh softcap30 softcap15 gelu quick_gelu elu gelu_erf floor ceil round "
    "sign reciprocal clamp clamp_min clamp_max dropout "
    # masks and conditionals (§4.6)
    "where masked_fill isnan isinf isfinite band_part tril triu "
    # reductions and scans (§4.7, argmax §4.16)
    "max min prod variance norm norm_all logsumexp any all any_all all_all cumsum cumprod "
    "argmax"
)
OLD_QUANT = "from_blocks from_storage_slice from_borrowed_blocks concat get_rows"


def _names(*groups: str) -> set[str]:
    return {n for g in groups for n in g.split()}


OLD = {
    B.F32Tensor: _names(OLD_COMMON, OLD_F32),
    B.HalfTensor: _names(OLD_COMMON, OLD_SCALAR_CONST, OLD_TYPED_FLOAT, OLD_HALF),
    B.F64Tensor: _names(OLD_COMMON, OLD_SCALAR_CONST, OLD_TYPED_FLOAT),
    B.IntTensor: _names(OLD_COMMON, OLD_SCALAR_CONST, OLD_INT_MATH),
    B.I64Tensor: _names(OLD_COMMON, OLD_SCALAR_CONST, OLD_INT_MATH, "randint randperm"),
    B.BoolTensor: _names(OLD_COMMON, OLD_SCALAR_CONST, OLD_BOOL),
    B.F8Tensor: _names(OLD_COMMON, OLD_SCALAR_CONST),
    B.QuantTensor: _names(OLD_COMMON, OLD_QUANT),
}

# What the class facade adds (issue 7, API.md section 7): numpy/Python interop on every
# branch, from_numpy where from_slice exists, operators on the integer and bool branches.
_INTEROP = ("ndim size __len__ __array__ __array_ufunc__ __array_function__ __bool__ __float__ "
            "__int__")
_INT_OPS = "__add__ __sub__ __mul__ __floordiv__ __mod__ __and__ __or__ __xor__"
# Reflected operators (issue 8): ``1 + i`` raises the same TypeError as ``i + 1``.
_INT_ROPS = "__radd__ __rsub__ __rmul__ __rfloordiv__ __rmod__ __rand__ __ror__ __rxor__"
# Quantized weights (issue 11): packed RHS on f32/f16/bf16/block weights, ternary STE.
_PACK = "pack_rhs pack_rhs_layout"
ADDED = {
    B.F32Tensor: _names(_INTEROP, "from_numpy", _PACK, "dot_packed dot_ternary_ste"),
    B.HalfTensor: _names(_INTEROP, "from_numpy", _PACK),
    B.F64Tensor: _names(_INTEROP, "from_numpy"),
    B.IntTensor: _names(_INTEROP, "from_numpy", _INT_OPS, _INT_ROPS),
    B.I64Tensor: _names(_INTEROP, "from_numpy", _INT_OPS, _INT_ROPS),
    B.BoolTensor: _names(_INTEROP, "from_numpy", "__invert__ __and__ __or__ __xor__",
                         "__rand__ __ror__ __rxor__"),
    B.F8Tensor: _names(_INTEROP, "from_numpy"),
    B.QuantTensor: _names(_INTEROP, _PACK),
}
# Issue 9's NN families: norms and gated units (f32, and forward-only on f16/bf16), the
# f32-only snake/prelu, elemental ops, scans and inference helpers.
_NN_HALF = "rms_norm rms_norm_mul layer_norm gated glu swiglu geglu"
_NN_F32 = (
    "rms_norm_mul_add group_norm standardize_axis l2_normalize situ split_gated snake prelu "
    "elemental_unary elemental_binary linear_recurrence segment_sum bias_add "
    "add_axis_vector_in_place add_axis_vector_unary_in_place add_scaled_in_place "
    "take_add_no_grad take_scale_no_grad"
)
_NN_CONV = (
    "avg_pool2d causal_conv1d causal_depthwise_conv1d channel_affine conv1d conv2d "
    "conv2d_prepared conv2d_prepared_relu conv2d_relu conv_transpose1d fold "
    "grouped_causal_conv1d max_pool2d prepare_conv2d_weights relpos_shift unfold "
    "upsample2x_nearest"
)
_NN_ATTN = "grouped_attention rope rms_norm_mul_rope_half_prepared"  # attention, RoPE (f32)
ADDED[B.F32Tensor] |= _names(_NN_HALF, _NN_F32, _NN_CONV, _NN_ATTN)
ADDED[B.HalfTensor] |= _names(_NN_HALF)
# Issue 9 op families on the f32 branch (REFERENCE §4.15 losses, §4.16 selection).
ADDED[B.F32Tensor] |= _names(
    "cross_entropy_ext linear_cross_entropy linear_cross_entropy_ext linear_distill "
    "linear_distill_ext mse_loss huber_loss bce_loss kl_div_loss nll_loss cosine_similarity "
    "top_k sort argsort multinomial router_top_k")
# The reference's fields (§3.10): value on every branch, grad_state and scope_owned on
# the branches with gradient machinery (f32 and the typed floats).
for _b in ADDED:
    ADDED[_b] |= {"value"}
for _b in (B.F32Tensor, B.HalfTensor, B.F64Tensor):
    ADDED[_b] |= {"grad_state", "scope_owned"}
# REFERENCE §4.9's fused packed entries (f32 only).
ADDED[B.F32Tensor] |= _names(
    "rms_norm_mul_dot_packed split_swi_glu_dot_packed geglu_quant_dot_packed")
UNIVERSE = set().union(*OLD.values(), *ADDED.values())
BRANCH_OF = {
    "f32": B.F32Tensor, "f16": B.HalfTensor, "bf16": B.HalfTensor, "f64": B.F64Tensor,
    "i32": B.IntTensor, "u8": B.IntTensor, "i64": B.I64Tensor, "bool": B.BoolTensor,
    "f8_e4m3": B.F8Tensor, "q8_0": B.QuantTensor, "q4_k": B.QuantTensor,
}


def _has(cls: type, name: str) -> bool:
    """``hasattr`` on the class's own MRO: dunders such as ``__or__`` also live on
    ``type`` itself (``int | str``) and ``object`` (``__lt__``), which a plain
    ``hasattr(cls, ...)`` would find."""
    if name.startswith("__"):
        return any(name in vars(k) for k in cls.__mro__ if k is not object)
    return hasattr(cls, name)


def _defined_names(cls: type) -> set[str]:
    """Every attribute the facade's classes define for ``cls`` (not object's)."""
    out: set[str] = set()
    for k in cls.__mro__:
        if k.__module__.startswith("fucina"):
            out.update(n for n in vars(k) if not n.startswith("_") or
                       (n.startswith("__") and n.endswith("__")))
    return out - {"__slots__", "__module__", "__doc__", "__qualname__", "__weakref__",
                  "__dict__", "__annotations__", "__firstlineno__", "__static_attributes__",
                  "__new__"}


@pytest.mark.parametrize("branch", list(OLD), ids=lambda b: b.__name__)
def test_branch_method_sets_match_the_old_lists_exactly(branch):
    expected = OLD[branch] | ADDED[branch]
    for name in sorted(UNIVERSE):
        assert _has(branch, name) == (name in expected), (branch.__name__, name)


@pytest.mark.parametrize("branch", list(OLD), ids=lambda b: b.__name__)
def test_branches_have_nothing_beyond_the_surface(branch):
    # root plumbing every tensor has (repr, the '@' guard)
    root = {"__repr__", "__matmul__", "__rmatmul__", "axis_tags", "tag_count", "tensor_rank",
            "dtype"}
    extra = _defined_names(branch) - (OLD[branch] | ADDED[branch]) - root
    assert not extra, (branch.__name__, sorted(extra))


@pytest.mark.parametrize("dtype", list(BRANCH_OF))
def test_tensor_types_derive_from_their_branch(dtype):
    T = F.Tensor("a", "b", dtype=dtype)
    assert T.__mro__[1] is BRANCH_OF[dtype]
    for name in sorted(UNIVERSE):
        assert _has(T, name) == _has(BRANCH_OF[dtype], name), (dtype, name)


def test_absent_methods_raise_attribute_error(ctx):
    i = F.Tensor("d", dtype="i32").from_slice(ctx, (2,), [1, 2])
    with pytest.raises(AttributeError, match="softmax"):
        i.softmax("d")
    assert not hasattr(i, "div") and hasattr(i, "div_trunc")
    q = F.Tensor("r", "c", dtype="q8_0")
    assert not hasattr(q, "item") and not hasattr(q, "from_numpy") and hasattr(q, "get_rows")


def test_no_registry_or_name_lists_remain():
    import fucina.tensor.base as base
    import fucina.tensor.branches as branches

    assert not hasattr(base, "POOL") and not hasattr(base, "method")
    for name, value in vars(branches).items():
        assert not (name.startswith("_") and not name.startswith("__")
                    and isinstance(value, str)), name


def test_every_method_is_defined_in_a_class_body_with_docs_and_hints():
    for branch in OLD:
        for name in _defined_names(branch):
            attr = inspect.getattr_static(branch, name)
            fn = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
            if not callable(fn):
                continue  # class attributes such as __array_ufunc__ = None
            owner = next(k for k in branch.__mro__ if name in vars(k))
            assert fn.__qualname__ == f"{owner.__name__}.{name}", (branch.__name__, name)
            if not name.startswith("__"):
                assert fn.__doc__ and fn.__doc__.strip(), (owner.__name__, name)
            sig = inspect.signature(fn)
            assert sig.return_annotation is not inspect.Signature.empty, (owner.__name__, name)
            for p in list(sig.parameters.values())[1:]:
                assert p.annotation is not inspect.Parameter.empty, (owner.__name__, name, p)


def test_tag_arguments_are_annotated_str():
    for branch in OLD:
        for name in _defined_names(branch):
            fn = getattr(branch, name)
            if not callable(fn) or isinstance(inspect.getattr_static(branch, name), property):
                continue
            for p in inspect.signature(fn).parameters.values():
                if p.name == "tag" or p.name.endswith("_tag") or p.name in ("contract",):
                    # an optional tag option (softmax's head_tag) may be None
                    assert p.annotation in ("str", "str | None"), (branch.__name__, name, p)


def test_help_lists_the_f32_surface():
    text = pydoc.render_doc(F.Tensor("a", "b"), renderer=pydoc.plaintext)
    for name in ("softmax", "cross_entropy", "dot", "from_slice", "backward", "sum",
                 "permute_to", "relu", "numpy", "from_numpy"):
        assert f" {name}(" in text, name
    assert "Losses" in text and "UnaryMath" in text


def test_mixins_and_branches_are_not_type_constructors():
    with pytest.raises(TypeError, match="facade class"):
        B.F32Tensor("a")
    with pytest.raises(TypeError, match="tensor type"):
        F.Tensor("a")("b")
    assert F.Tensor(2) is F.Tensor("_0", "_1")
    assert issubclass(F.Tensor("a"), Tensor) and repr(B.F32Tensor).endswith("F32Tensor'>")


def test_py_typed_marker_ships():
    import importlib.resources

    assert importlib.resources.files("fucina").joinpath("py.typed").is_file()


def test_slots_keep_tensors_small(ctx):
    x = F.Tensor("d").from_slice(ctx, (2,), [1, 2])
    with pytest.raises(AttributeError):
        x.extra = 1
    assert np.array_equal(x.numpy(), [1, 2])


# -- a tensor where a tag is expected, a tag where a tensor is expected -----------------

_TYPE = "a tensor of type fucina.Tensor('a', 'b')"


@pytest.mark.parametrize("call,message", [
    (lambda x: x.concat(x, "s"), "concat(): argument 'tag' expects a tag name (str), got " + _TYPE),
    (lambda x: x.sum(x), "sum(): argument 'tag' expects a tag name (str), got " + _TYPE),
    (lambda x: x.dot(x, x), "dot(): argument 'contract' expects a tag name (str), got " + _TYPE),
    (lambda x: x.gather("a", [0], x), "gather(): argument 'out_tag' expects a tag name"),
    (lambda x: x.softmax(3), "softmax(): argument 'tag' expects a tag name (str), got int 3"),
    (lambda x: x.permute_to(x), "permute_to(): argument 'target' (an element) expects a tag "
                                "tuple or a rank, got " + _TYPE),
    (lambda x: x.split("a", x, (1, 2)), "split(): argument 'parts' expects a tag tuple"),
    (lambda x: x.reshape(x, (6,)), "reshape(): argument 'new_tags' expects a tag tuple"),
    (lambda x: x.with_tags(x, "c"), "with_tags(): argument 'new_tags' (an element)"),
    (lambda x: x.matmul(x, "plain", x), "matmul(): argument 'out_tags' expects a tag tuple"),
    (lambda x: F.Tensor(x), "argument 'spec' (an element) expects a tag tuple or a rank"),
])
def test_tensor_passed_as_tag_names_the_argument(ctx, call, message):
    x = F.Tensor("a", "b").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    with pytest.raises(F.TagError) as info:
        call(x)
    assert isinstance(info.value, TypeError)
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)
    assert "[[" not in str(info.value)  # never a whole tensor repr as a "tag"


@pytest.mark.parametrize("call,message", [
    (lambda x: x.add("a"), "add(): argument 'other' expects a fucina tensor (operand), "
                           "got str 'a'"),
    (lambda x: x.dot("b", x), "dot(): argument 'other' expects a fucina tensor"),
    (lambda x: x.concat("a", x), "concat(): argument 'others' expects a sequence of fucina "
                                 "tensors (concat operands), got " + _TYPE),
    (lambda x: x.concat("a", ["b"]), "concat(): argument 'others' (an element) expects a "
                                     "fucina tensor"),
    (lambda x: x.where(x > 1, 0.0), "where(): argument 'other' expects a fucina tensor"),
    (lambda x: x.masked_fill("b", 0.0), "masked_fill(): argument 'mask' expects a fucina "
                                        "tensor"),
    (lambda x: F.einsum_many(("a",), x), "einsum_many(): argument 'operands' expects a "
                                         "sequence of fucina tensors"),
    (lambda x: x.compare("lt", "b"), "compare(): argument 'other' expects a fucina tensor"),
    (lambda x: type(x).from_slice([1], (2, 3), [0] * 6), "from_slice(): argument 'ctx' "
                                                        "expects an ExecContext"),
])
def test_tag_passed_as_tensor_names_the_argument(ctx, call, message):
    x = F.Tensor("a", "b").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    with pytest.raises(TypeError) as info:
        call(x)
    assert message in str(info.value), str(info.value)


def test_argument_naming_works_under_compile(ctx):
    x = F.Tensor("a", "b").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    with pytest.raises(F.TagError, match="sum\\(\\): argument 'tag' expects a tag name"):
        F.compile(lambda t: t.sum(t))(x)


@pytest.mark.parametrize("step", [1, 7, 10**18, 10**400])
def test_slice_step_of_one_element_takes_any_step(step):
    """One element: the step never applies. A step too large for a stride (found by the
    API fuzzer: 10**400) gave a view numpy could not express."""
    ctx = F.ExecContext()
    v = np.arange(12, dtype=np.float64).reshape(3, 4)
    x = F.Tensor("a", "b", dtype="f64").from_slice(ctx, (3, 4), v)
    np.testing.assert_array_equal(x.slice_step("b", 2, 1, step).numpy(), v[:, 2:3])
    f = F.compile(lambda t: t.slice_step("b", 2, 1, step).scale(2.0))
    np.testing.assert_array_equal(f(x).numpy(), 2.0 * v[:, 2:3])
    if step > 1:
        with pytest.raises(F.IndexOutOfBounds):
            x.slice_step("b", 2, 2, step)  # two elements: the step does apply
