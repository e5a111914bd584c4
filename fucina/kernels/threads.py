"""Numba's threading layer: TBB where the ``tbb`` wheel put it, never an unsafe fallback.

The ``tbb`` wheel installs ``libtbb.so.12`` into ``<prefix>/lib``, which the
dynamic loader does not search in a plain virtual environment, so Numba
silently falls back to OpenMP (much slower under load: measured 8-11 ms
against 0.11-0.16 ms for the 5-op chain on a busy machine) or to its
workqueue, which aborts the process when two threads launch parallel kernels
at once. Before any kernel is compiled this module loads the wheel's library
by its path (``RTLD_GLOBAL``): the loader then resolves Numba's own
``libtbb.so.12`` dependency to it. If no thread-safe layer (TBB or OpenMP)
can load, generated kernels are built serial, so concurrent calls stay safe.
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


TBB_LIBRARY = preload_tbb()
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
