"""The facade: ``Tensor(spec)`` types, their branches and methods."""

from .base import Tensor, tensor_type
from .contract import einsum_many
from .views import SliceRange

__all__ = ["Tensor", "tensor_type", "einsum_many", "SliceRange"]
