"""Native spinning for the kernel pool's workers (:mod:`fucina.kernels.pool`).

A sleeping worker started a kernel a median 26-34 us after it was posted (a
2-vCPU Zen 5 guest: the futex wake of an idle vCPU, then the GIL), a quarter of
a 130 us reduction. A worker that has just finished a job may instead watch for
the next post without the GIL (:func:`fucina.kernels.native_jobs.serve`) for a
short budget of time-stamp counter ticks (:func:`cycles`), with the CPU's
spin-loop hint between reads (:func:`_relax`); it gives up early when two reads
lie far apart (it was descheduled: another process wants the core) and never
spins unless the pool judged the machine quiet (:func:`fucina.kernels.pool.quiet`).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["POSTED", "PREEMPTED", "TIMED_OUT", "cycles", "read_cycles"]

#: Outcomes of a worker's native wait (:func:`fucina.kernels.native_jobs.serve`).
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
