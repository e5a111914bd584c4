"""The facade: ``Tensor(spec)`` types, their dtype branches and op-family mixins."""

from .base import Tensor, tensor_type
from .branches import (
    BoolTensor,
    F8Tensor,
    F32Tensor,
    F64Tensor,
    HalfTensor,
    I64Tensor,
    IntTensor,
    QuantTensor,
)
from .contract import einsum_many
from .views import SliceRange

__all__ = [
    "BoolTensor",
    "F8Tensor",
    "F32Tensor",
    "F64Tensor",
    "HalfTensor",
    "I64Tensor",
    "IntTensor",
    "QuantTensor",
    "SliceRange",
    "Tensor",
    "einsum_many",
    "tensor_type",
]
