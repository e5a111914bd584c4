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

It also runs mid-size products on one OpenBLAS thread (:func:`gemm_call`): OpenBLAS
splits any product above 2**19 multiply-adds over every thread, and on a busy
machine each such call waits for its second thread to get a core.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .pool import lend_cores

#: log2 of the cycles an idle OpenBLAS worker spins before it sleeps (OpenBLAS
#: clamps it to 4..30; its own default is 28). 2**16 cycles is some 20 us:
#: back-to-back products still find the workers awake (measured alike to 2**22),
#: while the kernels between two products get both cores. Measured on a Zen 4
#: (docs/BENCHMARKS.md, stop 23) with a second process spinning on one core:
#: 2**22 let the spinning worker take the core fucina's next kernel wanted (the
#: 784-512-10 SGD step 6.9-8.5 ms, the encoder block 47-58 ms; 2**16: 6.2-6.7 and
#: 42-48); quiet, no difference.
THREAD_TIMEOUT = 16

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


def shorten_thread_wait(timeout: int = THREAD_TIMEOUT,
                        paths: list[str] | None = None) -> list[str]:
    """Make the loaded OpenBLAS libraries' idle workers sleep after ``2**timeout``
    cycles; returns the libraries changed (none when the user set the variable).

    Call it only while no BLAS call runs on another thread (fucina does, once,
    at import): the workers are stopped and restarted. ``paths``: the libraries
    (default: those loaded now, :func:`_loaded_openblas`).
    """
    if _ENV in os.environ:
        return []
    changed = []
    for path in _loaded_openblas() if paths is None else paths:
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


#: The OpenBLAS libraries loaded when fucina was imported (read once).
_LOADED = _loaded_openblas()
#: The OpenBLAS libraries whose idle wait fucina shortened at import.
SHORTENED = shorten_thread_wait(paths=_LOADED)


#: Products of at most this many multiply-adds (per matrix) run on one OpenBLAS
#: thread. Measured (docs/BENCHMARKS.md, stop 23; 2-core Zen 4, OpenBLAS-SkylakeX):
#: with a second process spinning on one core, the compiled spirals step (its
#: products [256, 64] x [64, 64]) averaged 0.75-7.4 ms split over two threads
#: against 0.34-0.57 on one; quiet, 0.32-0.40 against 0.34-0.41 (the second
#: thread's spin after each product takes the core the next kernel wants).
ONE_THREAD_WORK = 2**22

#: OpenBLAS gives a product a second thread only when each thread gets more than
#: SMP_THRESHOLD_MIN x GEMM_MULTITHREAD_THRESHOLD = 65536 x 4 multiply-adds, so up to
#: this much work it runs on one thread by itself and needs no limit.
_OPENBLAS_ONE_THREAD = 2**19

_NAMES = (("openblas_set_num_threads", "openblas_get_num_threads"),
          ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
          ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
          ("openblas_set_num_threads64_", "openblas_get_num_threads64_"))


def _thread_controls(paths: list[str]) -> list[tuple[Any, Any]]:
    """(set, get) of the thread count of numpy's OpenBLAS among ``paths`` (the wheel's
    own copy, or every one of them when numpy brought none), where it exports them."""
    base = Path(np.__file__).parent
    own = {os.path.realpath(d) for d in (base.parent / "numpy.libs", base / ".dylibs")}
    found = []
    for path in [p for p in paths if os.path.dirname(p) in own] or paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _NAMES:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                getter.argtypes, getter.restype = [], ctypes.c_int
                found.append((setter, getter))
                break
    return found


class _OneThread:
    """While any thread is inside, every controlled OpenBLAS runs on one thread.

    OpenBLAS's count is process-wide: a depth count under a lock sets it on the first
    entry and restores what it was on the last exit, so overlapping callers on
    several Python threads never leave it at one. A product that another Python
    thread starts meanwhile runs on one thread too: slower, and for a large product
    possibly different in its last bits (a 1000^3 product rounded differently on one
    thread; the products this section is for measured bit-identical).
    """

    def __init__(self, controls: list[tuple[Any, Any]]) -> None:
        self._controls = controls
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: list[int] = []

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._saved = [get() for _, get in self._controls]
                for setter, _ in self._controls:
                    setter(1)
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for (setter, _), count in zip(self._controls, self._saved):
                    setter(count)


#: The (set, get) thread-count functions of the loaded OpenBLAS libraries.
CONTROLS = _thread_controls(_LOADED)
_ONE = _OneThread(CONTROLS)
_NARROWED: dict[Any, Callable[..., Any]] = {}


def _after_fork() -> None:
    """In a forked child: a fresh section (another thread of the parent may have held
    the lock, and no thread of the parent is inside any more), and the saved counts
    back if the fork came while one was inside."""
    global _ONE
    old = _ONE
    if old._depth:
        for (setter, _), count in zip(old._controls, old._saved):
            setter(count)
    _ONE = _OneThread(CONTROLS)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _memo(table: dict[Any, Callable[..., Any]], fn: Callable[..., Any],
          make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """``table``'s wrapper of ``fn``, made by ``make`` on first use (plans keep the
    wrapper, so the same function always gets the same wrapper)."""
    wrapped = table.get(fn)
    if wrapped is None:
        wrapped = table[fn] = make(fn)
        wrapped.__name__ = f"{make.__name__.strip('_')}_{getattr(fn, '__name__', 'gemm')}"
    return wrapped


def _one_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with _ONE:
            return fn(*args, **kwargs)
    return run


def _lending(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        lend_cores()
        return fn(*args, **kwargs)
    return run


_LENDING: dict[Any, Callable[..., Any]] = {}


def one_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a BLAS product such as ``np.matmul``) made to run on one OpenBLAS
    thread; ``fn`` itself when no loaded OpenBLAS lets fucina set its thread count."""
    return _memo(_NARROWED, fn, _one_thread) if CONTROLS else fn


def gemm_call(fn: Callable[..., Any], m: int, n: int, k: int) -> Callable[..., Any]:
    """The BLAS product ``fn`` for matrices ``[m, k] x [k, n]``: run on one OpenBLAS
    thread when OpenBLAS would split it yet it has at most :data:`ONE_THREAD_WORK`
    multiply-adds; one that BLAS splits over its threads first sends fucina's
    spinning pool workers to sleep (:func:`fucina.kernels.pool.lend_cores`)."""
    work = m * n * k
    if work <= _OPENBLAS_ONE_THREAD:
        return fn
    return one_thread(fn) if work <= ONE_THREAD_WORK else _memo(_LENDING, fn, _lending)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` for matrices or stacks, on one OpenBLAS thread where
    :func:`gemm_call` says so: for the products a kernel plans as it runs (panels,
    tiles, fallbacks); a planned route picks its call once with :func:`gemm_call`."""
    gemm = gemm_call(np.matmul, a.shape[-2], b.shape[-1], a.shape[-1])
    return gemm(a, b) if out is None else gemm(a, b, out=out)
