"""The dtype branches: each tensor type gets exactly its branch's method set.

An op a branch lacks is absent from the class (``hasattr`` is False), the
Python form of the seeds' compile-time method sets.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import DType
from . import (  # noqa: F401 - fill POOL
    autograd,
    construct,
    contract,
    losses,
    masks,
    math,
    reductions,
    softmax,
    structural,
    unary,
    views,
)
from .base import POOL, Tensor

_COMMON = (
    "deinit __enter__ __exit__ axis has_tag dim shape is_contiguous as_raw_tensor data "
    "data_const copy_to numpy requires_grad materialize with_tags to constant from_tensor"
)
_SCALAR_CONST = (
    "from_slice from_borrowed_const_slice empty zeros ones empty_like zeros_like ones_like item "
    "align_to permute_to transpose insert_axis squeeze broadcast_to gather narrow concat "
    "set_slice set_rows"
)
_INT_MATH = (
    "add sub mul maximum minimum div_trunc div_floor rem mod bit_and bit_or bit_xor sum "
    "sum_all compare __lt__ __le__ __gt__ __ge__"
)
_BOOL = "sum sum_all logical_and logical_or logical_xor logical_not band_mask"
_TYPED_FLOAT = (
    "zero_grad detach add sub mul div sum mean sum_all dot scale div_scalar split merge "
    "flatten reshape slice_step flip roll stack repeat_axis __add__ __radd__ __sub__ __rsub__ "
    "__mul__ __rmul__ __truediv__ __rtruediv__"
)
_HALF = (
    "variable variable_from_slice grad grad_view add_scalar sub_scalar maximum minimum compare "
    "logical_and logical_or logical_xor logical_not pad einsum neg __neg__ __pow__ "
    "__lt__ __le__ __gt__ __ge__ "
    # the widened forward set (compute through f32, narrow once; reductions -> f32)
    "unary relu exp sqrt rsqrt sigmoid silu log log1p abs __abs__ sin cos tanh fast_tanh "
    "softcap30 softcap15 gelu quick_gelu elu gelu_erf floor ceil round sign reciprocal "
    "leaky_relu clamp pow_scalar cumsum cumprod where masked_fill max min prod variance "
    "logsumexp argmax softmax log_softmax"
)
_F32 = (
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
_QUANT = "from_blocks from_storage_slice from_borrowed_blocks concat get_rows"


def _names(*groups: str) -> list[str]:
    out: list[str] = []
    for g in groups:
        for n in g.split():
            if n not in out:
                out.append(n)
    return out


def _branch(name: str, *groups: str, mixins: tuple[type, ...] = ()) -> type:
    ns: dict[str, Any] = {"__slots__": (), "__module__": "fucina"}
    for n in _names(*groups):
        ns[n] = POOL[n]
    return type(Tensor)(name, (*mixins, Tensor), ns)


# Interim wiring (until the facade lands as mixin classes): the NN op mixins.
from .attention import AttentionOps  # noqa: E402
from .rope import RopeOps  # noqa: E402

F32Tensor = _branch("F32Tensor", _COMMON, _F32, mixins=(AttentionOps, RopeOps))
HalfTensor = _branch("HalfTensor", _COMMON, _SCALAR_CONST, _TYPED_FLOAT, _HALF)
F64Tensor = _branch("F64Tensor", _COMMON, _SCALAR_CONST, _TYPED_FLOAT)
IntTensor = _branch("IntTensor", _COMMON, _SCALAR_CONST, _INT_MATH)
I64Tensor = _branch("I64Tensor", _COMMON, _SCALAR_CONST, _INT_MATH, "randint randperm")
BoolTensor = _branch("BoolTensor", _COMMON, _SCALAR_CONST, _BOOL)
F8Tensor = _branch("F8Tensor", _COMMON, _SCALAR_CONST)
QuantTensor = _branch("QuantTensor", _COMMON, _QUANT)


def branch_for(dtype: DType) -> type:
    """The branch class a dtype's tensor types derive from."""
    if dtype is DType.f32:
        return F32Tensor
    if dtype in (DType.f16, DType.bf16):
        return HalfTensor
    if dtype is DType.f64:
        return F64Tensor
    if dtype is DType.i64:
        return I64Tensor
    if dtype is DType.bool:
        return BoolTensor
    if dtype.is_integer:
        return IntTensor
    if dtype.is_f8:
        return F8Tensor
    return QuantTensor
