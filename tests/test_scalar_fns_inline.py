"""Kernels inline the scalar helpers they call, however large (``scalar_fns``).

LLVM's heuristics left gelu_erf, gelu_erf_grad and softplus as scalar calls in a
generated kernel's loop, which then never vectorized (2-5x slower). Each single-argument
helper is now reached through an ``alwaysinline`` call site; these loops are written as
the generated kernels are (flags, uint64 indexing) and checked in their LLVM IR and
assembly, and against the helper called from Python.
"""

import re

import numba
import numpy as np
import pytest

from fucina.kernels import scalar_fns as sf

_SF_CALL = re.compile(r"\bcall\b[^\n]*@\"?_ZN6fucina7kernels10scalar_fns")
_PACKED = re.compile(r"\bv\w+ps\s[^\n]*%[yz]mm")


def _kernel_like_loop(fn):
    @numba.njit(fastmath={"nsz", "afn"}, error_model="numpy", nogil=True)
    def loop(x, out, n):
        for i in range(n):
            v = np.float32(x[np.uint64(i)])
            out[np.uint64(i)] = np.float32(fn(v))

    return loop


@pytest.mark.parametrize("name", ["gelu_erf", "gelu_erf_grad", "softplus", "tanh", "exp",
                                  "sin", "silu_grad"])
def test_helper_is_inlined_and_the_loop_vectorizes(name):
    fn = getattr(sf, name)
    loop = _kernel_like_loop(fn)
    x = np.linspace(-6, 6, 203, dtype=np.float32)
    out = np.empty_like(x)
    loop(x, out, x.size)
    want = np.array([fn(v) for v in x], dtype=np.float32)
    np.testing.assert_array_equal(out, want)
    sig = loop.signatures[0]
    assert not _SF_CALL.search(loop.inspect_llvm(sig)), f"sf.{name} was not inlined"
    assert _PACKED.search(loop.inspect_asm(sig)), f"the loop over sf.{name} did not vectorize"
