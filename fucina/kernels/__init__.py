"""Numpy/Numba kernels behind the Fucina tensor operations."""

