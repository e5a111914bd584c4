"""The threads that run a parallel generated kernel.

A parallel generated kernel shares out its own outer loop: each thread that
calls it takes chunks from a ticket counter and counts the chunks it finishes,
with atomic adds in native code (:mod:`fucina.kernels.atomics`,
:func:`fucina.kernels.codegen.chunk_plan`). :func:`run` posts the call to the
pool's sleeping workers, then calls the kernel itself; a worker that wakes late
finds fewer chunks (or none) left, and the caller waits only for chunks already
taken, spinning in native code without the GIL. Each thread touches the GIL
once per kernel call, never between chunks: Python threads handing the GIL
back and forth between chunks measured 3x slower than one thread on a busy
2-core machine.

Numba's own ``parallel=True`` would lower the same loop through its parfor
pipeline, which took 3-4x the compile time of the serial kernel. The thread
count is Numba's (``numba.get_num_threads()``), so ``numba.set_num_threads``
applies to these kernels as to Numba's own. Chunks never change a value: each
output is computed by the same code whichever thread takes its chunk.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba.np.ufunc import parallel as _parallel

from .atomics import wait_done

__all__ = ["CHUNKS_PER_THREAD", "run"]

#: Chunks per thread: a late or descheduled thread is balanced out by the others.
CHUNKS_PER_THREAD = 8
#: Counter reads per native wait before the caller checks for a worker's error.
_SPINS = 1 << 16


class _Job:
    __slots__ = ("entry", "ctl", "nch", "args", "error")

    def __init__(self, entry: Callable[..., None], ctl: np.ndarray, nch: int,
                 args: Sequence[Any]) -> None:
        self.entry = entry
        self.ctl = ctl
        self.nch = nch
        self.args = args
        self.error: BaseException | None = None

    def work(self) -> None:
        try:
            self.entry(self.ctl, self.nch, *self.args)
        except BaseException as e:  # reported by the caller, never lost in a worker
            self.error = e


class _Pool:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.lock = threading.Lock()

    def ensure(self, n: int) -> None:
        """At least ``n`` worker threads are running."""
        if len(self.workers) >= n:
            return
        with self.lock:
            while len(self.workers) < n:
                t = threading.Thread(target=self._serve, name=f"fucina-kernel-{len(self.workers)}",
                                     daemon=True)
                t.start()
                self.workers.append(t)

    def _serve(self) -> None:
        while True:
            self.jobs.get().work()


_POOL = _Pool()


def _after_fork() -> None:
    # A forked child has none of the parent's threads: it starts its own when needed.
    global _POOL
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _num_threads() -> int:
    """``numba.get_num_threads()`` without its launch check, which takes a process-wide
    lock on every call (3.6 us, most of this module's cost per kernel call)."""
    get = getattr(_parallel, "_get_num_threads", None)
    n = get() if get is not None and getattr(_parallel, "_is_initialized", False) else 0
    return n if n > 0 else numba.get_num_threads()


def run(entry: Callable[..., None], n: int, args: Sequence[Any]) -> None:
    """Call ``entry(ctl, nch, *args)``, a kernel whose outer loop has ``n`` iterations,
    on up to ``numba.get_num_threads()`` threads; returns when every chunk is done."""
    threads = min(_num_threads(), n)
    ctl = np.zeros(2, np.int64)
    if threads <= 1:
        entry(ctl, 1, *args)
        return
    nch = min(n, threads * CHUNKS_PER_THREAD)
    job = _Job(entry, ctl, nch, args)
    pool = _POOL
    pool.ensure(threads - 1)
    for _ in range(threads - 1):
        pool.jobs.put(job)
    entry(ctl, nch, *args)
    while not wait_done(ctl, nch, _SPINS):  # a chunk still running on a worker
        if job.error is not None:
            raise job.error
        time.sleep(0)
    if job.error is not None:
        raise job.error
