"""OpenBLAS's idle workers: fucina shortens their busy wait at import (kernels/blas_threads),
restarts them safely, and leaves a user's own OPENBLAS_THREAD_TIMEOUT alone."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np

import fucina  # noqa: F401 - the import shortens the wait
from fucina.kernels import blas_threads


def _timeouts() -> list[int]:
    return [ctypes.CDLL(p).openblas_thread_timeout() for p in blas_threads.SHORTENED]


def test_loaded_openblas_waits_briefly_and_still_multiplies():
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        assert blas_threads.SHORTENED == []
        return
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ  # set only while OpenBLAS read it
    assert _timeouts() == [blas_threads.THREAD_TIMEOUT] * len(blas_threads.SHORTENED)
    # the restarted workers compute: a GEMM large enough to be split across threads
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 400))
    b = rng.standard_normal((400, 500))
    want = np.einsum("ik,kj->ij", a, b)
    for _ in range(3):
        np.testing.assert_allclose(a @ b, want, rtol=1e-10, atol=1e-10)


_CHILD = """
import ctypes, os, numpy as np
import fucina
from fucina.kernels import blas_threads, threads
print("shortened", blas_threads.SHORTENED)
print("omp", threads.OMP_LOADED, "OMP_WAIT_POLICY" in os.environ, os.environ.get("OMP_WAIT_POLICY"))
"""


_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY",
            "OPENBLAS_THREAD_TIMEOUT", "NUMBA_THREADING_LAYER")


def _child(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in _CHOICES} | env
    return subprocess.run([sys.executable, "-c", _CHILD], env=full, capture_output=True,
                          text=True, timeout=300, check=True)


def test_user_settings_are_left_alone_and_openmp_waits_passively():
    # No wait policy from the user: Numba's OpenMP layer loads with a passive wait
    # (GNU OpenMP prints what it read with OMP_DISPLAY_ENV), and the variable does
    # not stay behind; the user's own OpenBLAS wait is kept.
    r = _child({"NUMBA_THREADING_LAYER": "omp", "OMP_DISPLAY_ENV": "TRUE",
                "OPENBLAS_THREAD_TIMEOUT": "10"})
    assert "shortened []" in r.stdout
    if "omp True" in r.stdout:
        assert "omp True False None" in r.stdout
        if "OMP_WAIT_POLICY = " in r.stderr:  # GNU OpenMP
            assert "OMP_WAIT_POLICY = 'PASSIVE'" in r.stderr
    # The user's own policy wins.
    r = _child({"NUMBA_THREADING_LAYER": "omp", "OMP_DISPLAY_ENV": "TRUE",
                "OMP_WAIT_POLICY": "ACTIVE"})
    assert "omp True True ACTIVE" in r.stdout or "omp False" in r.stdout
    if "OMP_WAIT_POLICY = " in r.stderr:
        assert "OMP_WAIT_POLICY = 'ACTIVE'" in r.stderr
