"""The dtype branches: each is declared as the capability mixins it has.

A tensor type ``Tensor(spec)`` derives from exactly one branch class, chosen
by its dtype (:func:`branch_for`). A branch has the methods of its mixins and
nothing else: an op a branch lacks is absent from the class (``hasattr`` is
False), the Python form of the seeds' compile-time method sets. To give a
branch a new op family, add the family's mixin to its bases (see
docs/ARCHITECTURE.md, "The facade").

Mixins are listed most specific family first; every list ends with the
families shared by all branches and the root :class:`Tensor`.
"""

from __future__ import annotations

from ..dtypes import DType
from .activations import ParamActivations
from .attention import Attention
from .autograd import Backward, Cast, Detach, GradAccess, GradFields
from .base import ItemAccess, Tensor
from .construct import (
    BlockConstructors,
    F32Constructors,
    Filled,
    IndexConstructors,
    MaskConstructors,
    Variables,
    Wrap,
)
from .contract import Dot, Einsum, Matmul
from .conv import ConvOps
from .elemental import Elemental
from .gated import Gated, GatedF32
from .inplace import InPlace
from .losses import Losses
from .masks import MaskOps, Select
from .math import (
    Arithmetic,
    BoolOperators,
    FloatArithmetic,
    IntegerMath,
    Logic,
    Ordering,
    ScalarMath,
)
from .norms import Norms, NormsF32
from .quantized import PackRhs, QuantizedMatmul
from .reductions import CountSum, F32Reductions, FloatReductions, HalfSum, Sum
from .rope import Rope
from .scans import Scans
from .selection import Selection
from .softmax import Softmax
from .structural import BlockRows, Concat, IndexedOps, Padding, Rearrange, RowEdits
from .unary import UnaryF32, UnaryMath
from .views import AxisViews, Retag, SplitMerge, StridedViews

__all__ = [
    "BoolTensor",
    "F32Tensor",
    "F64Tensor",
    "F8Tensor",
    "HalfTensor",
    "I64Tensor",
    "IntTensor",
    "QuantTensor",
    "branch_for",
]


class F32Tensor(
    Attention, Rope,
    QuantizedMatmul, PackRhs,
    NormsF32, Norms, GatedF32, Gated, ParamActivations, Scans, Elemental, InPlace,
    ConvOps, Losses, Selection, Softmax, Matmul, Einsum, Dot,
    F32Reductions, FloatReductions, Sum,
    MaskOps, Select, UnaryF32, UnaryMath,
    Logic, Ordering, ScalarMath, FloatArithmetic, Arithmetic,
    Backward, GradAccess, GradFields, Detach, Cast,
    F32Constructors, Variables, Filled, Wrap,
    IndexedOps, Padding, Rearrange, RowEdits, Concat,
    StridedViews, SplitMerge, AxisViews, Retag, ItemAccess,
    Tensor,
):
    """An f32 tensor: the full, differentiable surface."""

    __slots__ = ()


class HalfTensor(
    PackRhs,
    Norms, Gated,
    Softmax, Einsum, Dot,
    FloatReductions, HalfSum,
    Select, UnaryMath,
    Logic, Ordering, ScalarMath, FloatArithmetic, Arithmetic,
    GradAccess, GradFields, Detach, Cast,
    Variables, Filled, Wrap,
    Padding, Rearrange, RowEdits, Concat,
    SplitMerge, AxisViews, Retag, ItemAccess,
    Tensor,
):
    """An f16 or bf16 tensor: forward math computed through f32 and rounded once
    (reductions return f32); variables receive f32 gradients."""

    __slots__ = ()


class F64Tensor(
    Dot, Sum,
    FloatArithmetic, Arithmetic,
    GradFields, Detach, Cast,
    Filled, Wrap,
    Rearrange, RowEdits, Concat,
    SplitMerge, AxisViews, Retag, ItemAccess,
    Tensor,
):
    """An f64 tensor: constants, structure and forward arithmetic."""

    __slots__ = ()


class IntTensor(
    IntegerMath, Ordering, Arithmetic, CountSum,
    Cast,
    Filled, Wrap,
    RowEdits, Concat,
    AxisViews, Retag, ItemAccess,
    Tensor,
):
    """A u8/u16/i8/i16/i32 tensor: constants, basic structure, wrapping integer math."""

    __slots__ = ()


class I64Tensor(
    IndexConstructors,
    IntegerMath, Ordering, Arithmetic, CountSum,
    Cast,
    Filled, Wrap,
    RowEdits, Concat,
    AxisViews, Retag, ItemAccess,
    Tensor,
):
    """An i64 tensor: the integer surface plus random integers and permutations."""

    __slots__ = ()


class BoolTensor(
    BoolOperators, Logic, CountSum,
    Cast,
    MaskConstructors, Filled, Wrap,
    RowEdits, Concat,
    AxisViews, Retag, ItemAccess,
    Tensor,
):
    """A bool tensor (a mask): constants, basic structure, logic, counts."""

    __slots__ = ()


class F8Tensor(
    Cast,
    Filled, Wrap,
    RowEdits, Concat,
    AxisViews, Retag, ItemAccess,
    Tensor,
):
    """An FP8 (f8_e4m3, f8_e5m2) tensor: storage only; convert with ``to``."""

    __slots__ = ()


class QuantTensor(
    PackRhs,
    BlockRows, BlockConstructors,
    Cast, Wrap,
    Concat, Retag,
    Tensor,
):
    """A block-quantized tensor (GGML formats): blocks, dequantization, row access."""

    __slots__ = ()


def branch_for(dtype: DType) -> type[Tensor]:
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
