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

A job whose kernel was compiled for its argument types (the runner passes
``native``) is written into a row of the pool's ring
(:mod:`fucina.kernels.native_jobs`), and the threads run it from there in native
code. A worker that finishes a job on a quiet machine (:func:`quiet`) then
watches for the next post natively for up to :data:`SPIN_US` and runs it without
returning to Python: a worker that went back to Python for each job had to take
the GIL while the caller held it between kernels, and slept on it (2-vCPU Zen 5
guest, sum over [64, 256, 256]: worker start a median 24-31 us after the post
even while spinning). It never spins while more threads are runnable than the
process may use cores (another process wants them: a worker spinning after every
job took the caller's core there and made short reductions 1.2-1.6x slower, same
guest, one core taken), nor once it finds it was descheduled mid-spin.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numba
import numpy as np
from numba.core.compiler_lock import global_compiler_lock
from numba.np.ufunc import parallel as _parallel

from .atomics import wait_done
from .native_jobs import ROW, STATUS, close, count, drive, publish, run_row, serve
from .spin import POSTED, PREEMPTED, read_cycles

__all__ = ["CHUNKS_PER_THREAD", "SPIN_US", "lend_cores", "quiet", "run"]


def _spin_setting(environ: Mapping[str, str]) -> float:
    """``FUCINA_POOL_SPIN_US`` as a number of microseconds (50 when unset)."""
    raw = environ.get("FUCINA_POOL_SPIN_US", "50")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1e6:
        raise ValueError(f"FUCINA_POOL_SPIN_US must be a number of microseconds from 0 to "
                         f"1000000, got {raw!r}")
    return value


#: Chunks per thread: a late or descheduled thread is balanced out by the others.
CHUNKS_PER_THREAD = 8
#: Counter reads per native wait before the caller checks for a worker's error.
_SPINS = 1 << 16
#: How long a worker that finished a job watches for the next post on a quiet
#: machine, in microseconds (0: never; it then sleeps at once). The environment's
#: ``FUCINA_POOL_SPIN_US`` sets it.
SPIN_US = _spin_setting(os.environ)
#: A gap between two reads of the time-stamp counter in the spin that means the
#: worker lost its core meanwhile (microseconds).
_GAP_US = 200.0
#: How often :func:`quiet` re-reads the run queue (seconds), over how many readings
#: it judges, and how long a preempted spin keeps the workers from spinning (seconds).
_QUIET_EVERY, _READINGS, _BUSY_HOLD = 0.01, 4, 0.05
#: Whether jobs with a ``native`` entry run as rows (:mod:`.native_jobs`); measurements
#: switch it off to compare against the Python path in one process.
NATIVE_JOBS = True
#: Chunk counters of the running jobs live in one array of this many pairs (so a
#: spinning worker can watch a job's counter by slot number, never by address); a
#: job takes a free pair and gives it back when the last thread lets go of the job.
_RING_SLOTS = 64


class _Ring:
    """The pairs of chunk counters (``ctl``) jobs take, and the pool's post box."""

    def __init__(self) -> None:
        self.counters = np.zeros(2 * _RING_SLOTS, np.int64)
        self.views = [self.counters[2 * i:2 * i + 2] for i in range(_RING_SLOTS)]
        self.rows = np.zeros((_RING_SLOTS, ROW), np.int64)  # native jobs (native_jobs)
        self.free = list(range(_RING_SLOTS))
        # box[0]: posts so far; box[1]: the last native post (number << 8 | slot); box[2]:
        # non-zero while the caller runs work on other threads (lend_cores); box[3]: workers
        # serving natively now
        self.box = np.zeros(4, np.int64)


_RING = _Ring()


class _Job:
    """One parallel kernel call: every thread that takes it runs ``entry`` over chunks
    from the counter pair ``ctl`` (a ring slot while one is free)."""

    __slots__ = ("entry", "ctl", "nch", "args", "error", "slot", "ring", "row", "seq")

    def __init__(self, entry: Callable[..., None], nch: int, args: Sequence[Any]) -> None:
        ring = _RING
        self.ring = ring
        try:  # (pop, not a test then a pop: another thread may take the last pair between)
            self.slot = ring.free.pop()
        except IndexError:
            self.slot = -1
        if self.slot >= 0:
            self.ctl = ring.views[self.slot]
            self.ctl.fill(0)
        else:  # more jobs alive than slots: a counter of its own, not watched
            self.ctl = np.zeros(2, np.int64)
        self.entry = entry
        self.nch = nch
        self.args = args
        self.error: BaseException | None = None
        self.row: np.ndarray | None = None  # the ring row of a native job
        self.seq = 0  # its post number

    def __del__(self) -> None:
        # No Python thread holds the job any more, and once the row is closed no native
        # worker is inside it either: no late worker can take one of its chunks from
        # this counter, and the pair and row may serve another job.
        if self.slot >= 0:
            if self.row is not None:
                close(self.row)
            self.ring.free.append(self.slot)

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
            if not self.workers:
                _load_native()
            while len(self.workers) < n:
                t = threading.Thread(target=self._serve, name=f"fucina-kernel-{len(self.workers)}",
                                     daemon=True)
                t.start()
                self.workers.append(t)

    def _serve(self) -> None:
        ring = _RING
        box = ring.box
        last = 0  # the newest native post this worker has run (or skipped as over)
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                if SPIN_US > 0 and quiet():
                    budget, gap, cap = _ticks()
                    count(box, 1)
                    got, last = serve(box, ring.rows, last, budget, gap, cap)
                    count(box, -1)
                    # a post between the caller's count of serving workers and ours
                    _, last = serve(box, ring.rows, last, 0, gap, cap)
                    if got == PREEMPTED:
                        _QUIET.hold()
                    if got == POSTED:  # it ran jobs for a while: judge the machine again
                        continue
                job = self.jobs.get()
            if job.row is None:
                job.work()
            elif job.seq > last:  # (a copy of a job it already ran natively is skipped)
                last = job.seq
                run_row(job.row)
            del job  # the job's counter pair is free once every thread let go


def _load_native() -> None:
    """Compile (or load) the native functions the workers call, here in the thread that
    starts them: a worker doing it itself would hold Numba's compiler lock for a while,
    and a process forked meanwhile would inherit the lock held, for good."""
    ring = _RING
    typeof = numba.typeof
    serve.compile(tuple(typeof(a) for a in (ring.box, ring.rows, 0, 0, 0, 0)))
    count.compile((typeof(ring.box), typeof(0)))
    run_row.compile((typeof(ring.rows[0]),))


def _runnable() -> int:
    """Threads runnable system-wide now (``/proc/loadavg``), or -1 where unreadable."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return -1


class _Quiet:
    """Whether the machine looks quiet: in at most one of the last :data:`_READINGS`
    readings of ``/proc/loadavg``'s run-queue count (re-read every :data:`_QUIET_EVERY`
    s) were more threads runnable, system-wide, than this process may use cores. A
    process spinning on a core shows in every reading; a kernel thread passing by in
    few. A spin that finds itself descheduled holds the workers still for
    :data:`_BUSY_HOLD` s. Where the count cannot be read, never quiet."""

    def __init__(self, read: Callable[[], int] | None = None, cores: int | None = None) -> None:
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.cores = cores
        self.read = _runnable if read is None else read
        self.next_read = 0.0
        self.busy_until = 0.0
        self.over: deque[bool] = deque([True] * _READINGS, maxlen=_READINGS)
        self.state = False

    def hold(self) -> None:
        self.busy_until = time.monotonic() + _BUSY_HOLD
        self.state = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self.next_read:
            return self.state
        self.next_read = now + _QUIET_EVERY
        running = self.read()
        self.over.append(running < 0 or running > self.cores)
        self.state = sum(self.over) <= 1 and now >= self.busy_until
        return self.state


_QUIET = _Quiet()


def lend_cores() -> None:
    """Tell spinning workers to sleep now: the caller is about to run work on threads
    of their own (Numba's parallel kernels, BLAS), which want the cores a spinning
    worker would share with them. The next post lets them spin again."""
    _RING.box[2] = 1


def quiet() -> bool:
    """Whether pool workers may spin for the next post now (see :class:`_Quiet`)."""
    return _QUIET()


_RATE: list[float] = []


def _ticks() -> tuple[int, int, int]:
    """(spin budget, preemption gap, time between judgements of the machine) in
    time-stamp counter ticks (the counter's rate is measured once, by the first worker
    that spins: 2 ms asleep)."""
    if not _RATE:
        c0, t0 = read_cycles(), time.perf_counter()
        time.sleep(0.002)
        _RATE.append((read_cycles() - c0) / (time.perf_counter() - t0))  # ticks per second
    rate = _RATE[0]
    return int(SPIN_US * 1e-6 * rate), int(_GAP_US * 1e-6 * rate), int(_QUIET_EVERY * rate)


_POOL = _Pool()


def _before_fork() -> None:
    # No thread may be inside Numba's compiler when the process forks: the child would
    # inherit the compiler lock held by a thread it does not have, and wait on it for
    # good at its first compile (a CI run hung in test_a_forked_child_runs_parallel_kernels).
    global_compiler_lock.acquire()


def _after_fork_in_parent() -> None:
    global_compiler_lock.release()


def _after_fork() -> None:
    global_compiler_lock.release()  # (the forking thread's hold, which the child keeps)
    # A forked child has none of the parent's threads: it starts its own when needed.
    global _POOL, _RING
    _POOL = _Pool()
    _RING = _Ring()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork)


def _num_threads() -> int:
    """``numba.get_num_threads()`` without its launch check, which takes a process-wide
    lock on every call (3.6 us, most of this module's cost per kernel call)."""
    get = getattr(_parallel, "_get_num_threads", None)
    n = get() if get is not None and getattr(_parallel, "_is_initialized", False) else 0
    return n if n > 0 else numba.get_num_threads()


def run(entry: Callable[..., None], n: int, args: Sequence[Any],
        native: tuple[int, int] | None = None) -> None:
    """Call ``entry(ctl, nch, *args)``, a kernel whose outer loop has ``n`` iterations,
    on up to ``numba.get_num_threads()`` threads; returns when every chunk is done.

    ``native`` (the address of the kernel's native function compiled for these
    argument types, and a trampoline for them: :mod:`fucina.kernels.native_jobs`)
    lets the threads run it without the GIL."""
    threads = min(_num_threads(), n)
    if threads <= 1:
        entry(np.zeros(2, np.int64), 1, *args)
        return
    nch = min(n, threads * CHUNKS_PER_THREAD)
    job = _Job(entry, nch, args)
    ctl = job.ctl
    pool = _POOL
    pool.ensure(threads - 1)
    if native is not None and job.slot >= 0 and NATIVE_JOBS:
        ring = job.ring
        row = ring.rows[job.slot]
        job.row = row
        job.seq = publish(ring.box, row, job.slot, native[1], native[0], ctl, nch, *args)
        for _ in range(threads - 1 - int(ring.box[3])):  # workers asleep: wake them
            pool.jobs.put(job)
        while not drive(row, ctl, nch, _SPINS):  # a chunk still running on a worker
            time.sleep(0)
        if row[STATUS] != 0:
            # The kernel reported an error on some thread: run it here alone, which
            # raises that error as an eager call would.
            entry(np.zeros(2, np.int64), 1, *args)
            raise RuntimeError("a parallel kernel reported an error on a pool thread")
        return
    for _ in range(threads - 1):
        pool.jobs.put(job)
    entry(ctl, nch, *args)
    while not wait_done(ctl, nch, _SPINS):  # a chunk still running on a worker
        if job.error is not None:
            raise job.error
        time.sleep(0)
    if job.error is not None:
        raise job.error
