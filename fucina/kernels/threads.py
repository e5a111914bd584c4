"""Numba's threading layer: TBB where the ``tbb`` wheel put it, never an unsafe fallback.

The ``tbb`` wheel installs ``libtbb.so.12`` into ``<prefix>/lib``, which the
dynamic loader does not search in a plain virtual environment, so Numba
silently falls back to OpenMP (much slower under load: measured 8-11 ms
against 0.11-0.16 ms for the 5-op chain on a busy machine) or to its
workqueue, which aborts the process when two threads launch parallel kernels
at once. Before any kernel is compiled this module loads the wheel's library
by its path (``RTLD_GLOBAL``): the loader then resolves Numba's own
``libtbb.so.12`` dependency to it. If no thread-safe layer (TBB or OpenMP)
can load, the stacked GEMM kernel is not used, so concurrent calls stay safe.
(Generated kernels never use Numba's layer: see :mod:`fucina.kernels.pool`.)

Where Numba will run on OpenMP (no TBB, or the user asked for ``omp``), its
OpenMP runtime is loaded here with ``OMP_WAIT_POLICY=PASSIVE`` unless the user
set a wait policy: GNU OpenMP's idle threads otherwise spin after every
parallel kernel, taking the cores OpenBLAS and the next kernel need (under
load: 64 ms against 20-28 ms for a transformer block). GNU OpenMP reads the
variable when it loads, so it is restored right after and OpenMP runtimes
loaded later (torch's own copy) keep their defaults.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import os
import sys
from pathlib import Path

import numba
import numpy as np

_TBB_NAMES = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}


def _tbb_candidates() -> list[Path]:
    """Where the tbb package may have put its runtime library, most specific first."""
    name = _TBB_NAMES.get(sys.platform)
    if name is None:
        return []
    found: list[Path] = []
    try:
        dist = importlib.metadata.distribution("tbb")
        for f in dist.files or ():
            if f.name == name:
                found.append(Path(str(dist.locate_file(f))).resolve())
    except importlib.metadata.PackageNotFoundError:
        pass
    for prefix in dict.fromkeys((sys.prefix, sys.exec_prefix, sys.base_prefix)):
        found.append(Path(prefix) / ("Library/bin" if sys.platform == "win32" else "lib") / name)
    return found


def preload_tbb() -> str | None:
    """Make ``libtbb`` loadable for Numba; returns the file loaded (None: not available)."""
    name = _TBB_NAMES.get(sys.platform)
    if name is None:
        return None
    for path in _tbb_candidates():
        if path.is_file():
            try:
                ctypes.CDLL(str(path), mode=getattr(os, "RTLD_GLOBAL", 0))
            except OSError:
                continue
            return str(path)
    try:  # already on the loader's path (a system or conda TBB)
        ctypes.CDLL(name)
    except OSError:
        return None
    return name


def _layer_loads(module: str) -> bool:
    try:
        if module == "tbbpool":
            from numba.np.ufunc import parallel

            parallel._check_tbb_version_compatible()
        importlib.import_module(f"numba.np.ufunc.{module}")
    except (ImportError, OSError):
        return False
    return True


#: Variables with which a user chose how OpenMP threads wait (then left alone).
_OMP_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY")


def _omp_first() -> bool:
    """Whether Numba, as configured, will try OpenMP before TBB."""
    layer = str(getattr(numba.config, "THREADING_LAYER", "default")).lower()
    if layer in ("omp", "threadsafe", "forksafe"):
        return layer == "omp" or not _layer_loads("tbbpool")
    if layer != "default":
        return False
    order = [str(b) for b in getattr(numba.config, "THREADING_LAYER_PRIORITY", ["tbb", "omp"])]
    if "omp" in order and "tbb" in order and order.index("omp") < order.index("tbb"):
        return True
    return not _layer_loads("tbbpool")


def load_omp_passive() -> bool:
    """Load Numba's OpenMP layer with passive waiting (unless the user chose a wait
    policy, or it is loaded already); returns whether it loads."""
    if "numba.np.ufunc.omppool" in sys.modules or any(v in os.environ for v in _OMP_WAIT_VARS):
        return _layer_loads("omppool")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        return _layer_loads("omppool")
    finally:
        del os.environ["OMP_WAIT_POLICY"]


TBB_LIBRARY = preload_tbb()
#: Whether Numba's OpenMP layer was loaded here, with passive waiting if the user set none.
OMP_LOADED = _omp_first() and load_omp_passive()
#: Whether a thread-safe layer (TBB or OpenMP) can run parallel kernels in this process.
THREAD_SAFE = str(getattr(numba.config, "THREADING_LAYER", "default")).lower() != "workqueue" and (
    _layer_loads("tbbpool") or _layer_loads("omppool"))


def intended_layer() -> str:
    """The layer this machine should get: TBB when its library is available."""
    return "tbb" if TBB_LIBRARY is not None and _layer_loads("tbbpool") else "omp"


@numba.njit(parallel=True, cache=True)
def _probe(a):
    for i in numba.prange(a.size):
        a[i] = i
    return a


def threading_layer() -> str:
    """The threading layer Numba runs parallel kernels on (launching it if needed)."""
    if not THREAD_SAFE:
        return "serial (no thread-safe layer: parallel kernels disabled)"
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        _probe(np.zeros(4, dtype=np.int64))
        return numba.threading_layer()
