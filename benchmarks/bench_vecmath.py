"""Benchmarks: vectorized ``fucina.kernels.vecmath`` functions against numpy.

Run with ``python -m pytest benchmarks/bench_vecmath.py`` (pytest-benchmark).
Each group times one function over the same 4M float32 values written into a
preallocated output: a Numba loop calling the vecmath scalar function, numpy's
own ufunc, and (for tanh) a Numba loop calling ``np.tanh``, which lowers to
scalar libm and does not vectorize. No timing is asserted.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from fucina.kernels import vecmath as vm

N = 4_000_000


@numba.njit(fastmath=True, error_model="numpy", cache=True)
def _tanh_vecmath(x, out):
    for i in range(x.size):
        out[i] = vm.tanh_f32(x[i])


@numba.njit(fastmath=True, error_model="numpy", cache=True)
def _tanh_libm(x, out):
    for i in range(x.size):
        out[i] = np.tanh(x[i])


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    """4M float32 values, N(0, 3^2), and an output buffer."""
    x = (np.random.default_rng(0).standard_normal(N) * 3.0).astype(np.float32)
    return x, np.empty_like(x)


def test_tanh_vecmath_loop(benchmark, data):
    benchmark.group = "tanh 4M f32"
    x, out = data
    _tanh_vecmath(x, out)  # compile (or load from cache) outside the timing
    benchmark(_tanh_vecmath, x, out)
    np.testing.assert_allclose(out, np.tanh(x), rtol=1e-6, atol=1e-7)


def test_tanh_numpy(benchmark, data):
    benchmark.group = "tanh 4M f32"
    x, out = data
    benchmark(np.tanh, x, out=out)


def test_tanh_numba_libm_loop(benchmark, data):
    benchmark.group = "tanh 4M f32"
    x, out = data
    _tanh_libm(x, out)
    benchmark(_tanh_libm, x, out)


# Other functions numpy has, through the vecmath array wrappers' loop kernels.
_PAIRS = {
    "exp": (vm.vexp, np.exp),
    "log": (vm.vlog, np.log),
    "sin": (vm.vsin, np.sin),
    "cos": (vm.vcos, np.cos),
}


@pytest.mark.parametrize("impl", ["vecmath", "numpy"])
@pytest.mark.parametrize("name", sorted(_PAIRS))
def test_other_functions(benchmark, data, name, impl):
    benchmark.group = f"{name} 4M f32"
    x, out = data
    if name == "log":
        x = np.abs(x) + np.float32(1e-3)
    wrapper, ufunc = _PAIRS[name]
    if impl == "numpy":
        benchmark(ufunc, x, out=out)
    else:
        wrapper.kernel(x, out)
        benchmark(wrapper.kernel, x, out)
