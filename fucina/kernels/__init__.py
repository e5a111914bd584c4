"""Numpy/Numba kernels behind the Fucina tensor operations."""

# threads: makes TBB loadable before Numba picks a threading layer (OpenMP: passive wait);
# blas_threads: OpenBLAS's idle workers sleep soon after a call instead of spinning.
from . import blas_threads, threads  # noqa: F401
