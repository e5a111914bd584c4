"""A bounded native wait for the kernel pool's next post (:mod:`fucina.kernels.pool`).

A sleeping worker started a kernel a median 26-34 us after it was posted (a
2-vCPU Zen 5 guest: the futex wake of an idle vCPU, then the GIL), a quarter of
a 130 us reduction. A worker that has just finished a job may instead watch the
pool's post counter here, without the GIL, for a short budget of time-stamp
counter ticks; it gives up early when the counter shows it was descheduled (a
gap between two reads: another process wants the core) and never spins unless
the pool judged the machine quiet (:func:`fucina.kernels.pool.quiet`).

Once it sees a post it waits, still here, until the caller has taken its first
chunk, that is, until the caller is inside its kernel and has let the GIL go:
asking for the GIL earlier would put the worker to sleep on it again.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .atomics import load

__all__ = ["POSTED", "PREEMPTED", "TIMED_OUT", "cycles", "read_cycles", "wait_post"]

#: Results of :func:`wait_post`.
POSTED, TIMED_OUT, PREEMPTED = 1, 0, -1


@intrinsic
def cycles(typingctx: Any) -> Any:
    """The CPU's time-stamp counter (``llvm.readcyclecounter``; constant-rate on x86-64)."""
    sig = types.int64()

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True, nogil=True)
def read_cycles() -> int:
    """:func:`cycles` for Python callers."""
    return cycles()  # type: ignore[call-arg]  # an intrinsic: typed by Numba


@intrinsic
def _relax(typingctx: Any) -> Any:
    """A spin-loop hint (x86 ``pause``; nothing on other targets)."""
    sig = types.void()

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        if builder.module.triple.startswith(("x86_64", "i686", "i386")):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def _until_changed(arr: np.ndarray, i: int, value: int, box: np.ndarray, budget: int,
                   gap: int) -> int:
    """Spin while ``arr[i] == value``: :data:`POSTED` once it differs, :data:`TIMED_OUT`
    after ``budget`` ticks or once ``box[2]`` is non-zero, :data:`PREEMPTED` when two
    reads of the time-stamp counter lie more than ``gap`` ticks apart."""
    t0: int = cycles()  # type: ignore[call-arg]  # an intrinsic: typed by Numba
    last = t0
    while load(arr, i) == value:
        if load(box, 2) != 0:  # the caller lent the cores out
            return TIMED_OUT
        now = cycles()
        if now - last > gap:
            return PREEMPTED
        if now - t0 > budget:
            return TIMED_OUT
        last = now
        _relax()
    return POSTED


@njit(cache=True, nogil=True)
def wait_post(box: np.ndarray, ring: np.ndarray, seen: int, budget: int, gap: int) -> int:
    """Spin until ``box[0]`` differs from ``seen`` (a post), at most ``budget`` ticks,
    and not once ``box[2]`` is non-zero (the caller runs work on threads of its own).

    ``box[1]`` names the posted job's chunk counter, ``ring[2 * box[1]]`` (the
    pool's own array, so a stale slot number reads a valid, merely unrelated
    counter); after a post the wait goes on, within the same budget again, until
    that counter is non-zero. Returns :data:`POSTED`, :data:`TIMED_OUT`, or
    :data:`PREEMPTED` when two reads of the time-stamp counter lie more than
    ``gap`` ticks apart (this thread lost its core meanwhile).
    """
    got = _until_changed(box, 0, seen, box, budget, gap)
    if got != POSTED:
        return got
    slot: int = load(box, 1)  # type: ignore[call-arg]
    if slot < 0 or 2 * slot >= ring.size:
        return POSTED
    # a post either way; only a lost core is worth reporting
    got = _until_changed(ring, 2 * slot, 0, box, budget, gap)
    return PREEMPTED if got == PREEMPTED else POSTED
