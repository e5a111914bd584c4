"""The threads that run a parallel generated kernel's outer loop in chunks.

A parallel generated kernel is serial, ``nogil`` code over a chunk ``[c0, c1)``
of its outer loop (:func:`fucina.kernels.codegen.chunk_plan`). Numba's own
``parallel=True`` would lower the same loop through its parfor pipeline, which
took 3-4x the compile time of the serial kernel; the chunks need no compiler.

:func:`run` cuts the outer loop into a few chunks per thread. The calling thread
and the pool's workers take chunks from one shared ticket counter until none is
left, so a worker that wakes late (a busy machine) just takes fewer chunks, and
the caller never waits for a thread that has not started: it waits only for
chunks already taken. Workers sleep on a queue (no spinning that would take a
core from BLAS or another process). The thread count is Numba's
(``numba.get_num_threads()``, so ``numba.set_num_threads`` applies to these
kernels as to Numba's own). Chunks never change a value: each output is
computed by the same code whichever thread takes its chunk.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numba

__all__ = ["CHUNKS_PER_THREAD", "run"]

#: Chunks per thread: enough for a late or descheduled thread to be balanced out,
#: few enough that the per-chunk call (argument unboxing, ~1-2 us) stays small.
CHUNKS_PER_THREAD = 4


class _Job:
    """One kernel call cut into chunks: any thread calls :meth:`work` to help."""

    __slots__ = ("entry", "args", "bounds", "ticket", "lock", "left", "done", "error")

    def __init__(self, entry: Callable[..., None], args: Sequence[Any], n: int,
                 nchunks: int) -> None:
        self.entry = entry
        self.args = args
        self.bounds = [n * c // nchunks for c in range(nchunks + 1)]
        self.ticket = itertools.count()  # next() is atomic under the GIL
        self.lock = threading.Lock()
        self.left = nchunks
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        bounds, nchunks = self.bounds, len(self.bounds) - 1
        while True:
            c = next(self.ticket)
            if c >= nchunks:
                return
            try:
                self.entry(bounds[c], bounds[c + 1], *self.args)
            except BaseException as e:  # reported by the caller, never lost in a worker
                self.error = e
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


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
    # A forked child has none of the parent's threads: start its own when needed.
    global _POOL
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def run(entry: Callable[..., None], n: int, args: Sequence[Any]) -> None:
    """Call ``entry(c0, c1, *args)`` over chunks covering ``range(n)``, in parallel."""
    threads = min(numba.get_num_threads(), n)
    if threads <= 1:
        entry(0, n, *args)
        return
    job = _Job(entry, args, n, min(n, threads * CHUNKS_PER_THREAD))
    pool = _POOL
    pool.ensure(threads - 1)
    for _ in range(threads - 1):
        pool.jobs.put(job)
    job.work()
    job.done.wait()
    if job.error is not None:
        raise job.error
