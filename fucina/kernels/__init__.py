"""Numpy/Numba kernels behind the Fucina tensor operations."""

from . import threads  # noqa: F401 - makes TBB loadable before Numba picks a threading layer
