"""In-tree escape hatch: names below the named-axis facade.

``fucina.internal.RawTensor`` is the tag-less raw tensor. User code should
not need it; loaders and interop code may. ``threading_layer()`` reports the
Numba threading layer kernels run on (the benchmark prints it).
"""

from .kernels.threads import threading_layer
from .runtime.raw import RawTensor, contiguous_strides
from .runtime.storage import Storage

__all__ = ["RawTensor", "Storage", "contiguous_strides", "threading_layer"]
