"""OpenBLAS's idle worker threads: put to sleep soon after a call instead of spinning.

numpy's OpenBLAS keeps its worker threads busy-waiting for 2**28 cycles (about
0.1 s) after every multithreaded call. fucina runs a Numba kernel right after
most GEMMs, so those spinning workers take the cores its kernel threads need;
with another process busy on the machine the two fight over what is left
(measured: the batched attention GEMMs 4.3x slower than quiet, docs/BENCHMARKS.md
"Issue 13: under load"). ``OPENBLAS_THREAD_TIMEOUT`` shortens the wait, but
OpenBLAS reads it once, when it loads: normally with numpy, before fucina is
imported. So at import, for each OpenBLAS already loaded that exports the
functions needed, fucina re-reads the setting (``openblas_read_env``) and
restarts the idle workers (``blas_thread_shutdown_``; the next call starts them
again with the new wait). A user's own ``OPENBLAS_THREAD_TIMEOUT`` is left
alone, and so is every other BLAS (MKL, Accelerate, OpenMP builds of OpenBLAS
that export none of these functions).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np

#: log2 of the cycles an idle OpenBLAS worker spins before it sleeps (OpenBLAS
#: clamps it to 4..30; its own default is 28). 2**22 cycles is about 1-2 ms:
#: back-to-back calls still find the workers awake, a kernel between two GEMMs
#: does not have to share its cores with them for long.
THREAD_TIMEOUT = 22

_ENV = "OPENBLAS_THREAD_TIMEOUT"


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries in this process (Linux), or bundled with numpy."""
    found: dict[str, None] = {}
    maps = Path("/proc/self/maps")
    if maps.exists():
        try:
            for line in maps.read_text().splitlines():
                fields = line.split(None, 5)  # address perms offset dev inode [path]
                path = fields[5] if len(fields) == 6 else ""
                if path.startswith("/") and "openblas" in os.path.basename(path).lower():
                    found[os.path.realpath(path)] = None
        except OSError:
            pass
    base = Path(np.__file__).parent
    for folder in (base.parent / "numpy.libs", base / ".dylibs"):
        if folder.is_dir():
            for f in folder.iterdir():
                if "openblas" in f.name.lower() and not sys.platform.startswith("linux"):
                    found[os.path.realpath(f)] = None  # /proc/self/maps has them on Linux
    return list(found)


def shorten_thread_wait(timeout: int = THREAD_TIMEOUT) -> list[str]:
    """Make the loaded OpenBLAS libraries' idle workers sleep after ``2**timeout``
    cycles; returns the libraries changed (none when the user set the variable).

    Call it only while no BLAS call runs on another thread (fucina does, once,
    at import): the workers are stopped and restarted.
    """
    if _ENV in os.environ:
        return []
    changed = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
            read_env, shutdown = lib.openblas_read_env, lib.blas_thread_shutdown_
        except (OSError, AttributeError):
            continue
        os.environ[_ENV] = str(timeout)
        try:
            read_env()  # OpenBLAS keeps what it read: restoring the variable is safe
        finally:
            del os.environ[_ENV]
        shutdown()
        changed.append(path)
    return changed


#: The OpenBLAS libraries whose idle wait fucina shortened at import.
SHORTENED = shorten_thread_wait()
