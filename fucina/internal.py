"""In-tree escape hatch: names below the named-axis facade.

``fucina.internal.RawTensor`` is the tag-less raw tensor. User code should
not need it; loaders and interop code may.
"""

from .runtime.raw import RawTensor, contiguous_strides
from .runtime.storage import Storage

__all__ = ["RawTensor", "Storage", "contiguous_strides"]
