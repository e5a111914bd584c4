"""Atomic counters in an int64 array, for kernels that share out their own chunks.

A parallel generated kernel takes chunks of its outer loop from a ticket
counter (``fetch_add(ctl, 0, 1)``) and counts each finished chunk
(``fetch_add(ctl, 1, 1)``), all in native code: the threads running it never
touch Python's GIL between chunks (see :mod:`fucina.kernels.pool`). Numba has
no atomics on the CPU target, so these are LLVM's ``atomicrmw`` and atomic
loads, emitted directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["fetch_add", "load", "store", "wait_done"]


def _slot(context: Any, builder: ir.IRBuilder, aryty: Any, ary: Any, idxty: Any,
          idx: Any) -> Any:
    arr = context.make_array(aryty)(context, builder, ary)
    i = context.cast(builder, idx, idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, aryty, arr, [i], wraparound=False,
                                    boundscheck=False)


def _counter(arr: Any) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64


@intrinsic
def fetch_add(typingctx: Any, arr: Any, idx: Any, val: Any) -> Any:
    """``arr[idx] += val`` as one atomic step (sequentially consistent); the old value."""
    if not (_counter(arr) and isinstance(idx, types.Integer) and isinstance(val, types.Integer)):
        return None
    sig = types.int64(arr, idx, val)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        ptr = _slot(context, builder, signature.args[0], args[0], signature.args[1], args[1])
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, "seq_cst")

    return sig, codegen


@intrinsic
def load(typingctx: Any, arr: Any, idx: Any) -> Any:
    """``arr[idx]`` read atomically (acquire): never hoisted out of a waiting loop, and
    everything written before the matching :func:`fetch_add` is visible after it."""
    if not (_counter(arr) and isinstance(idx, types.Integer)):
        return None
    sig = types.int64(arr, idx)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        ptr = _slot(context, builder, signature.args[0], args[0], signature.args[1], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


@intrinsic
def store(typingctx: Any, arr: Any, idx: Any, val: Any) -> Any:
    """``arr[idx] = val`` as a sequentially consistent store (a full fence on x86): no
    later read of this thread is answered before other threads can see it."""
    if not (_counter(arr) and isinstance(idx, types.Integer) and isinstance(val, types.Integer)):
        return None
    sig = types.void(arr, idx, val)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        ptr = _slot(context, builder, signature.args[0], args[0], signature.args[1], args[1])
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(v, ptr, "seq_cst", 8)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def wait_done(ctl: np.ndarray, n: int, spins: int) -> bool:
    """Spin (without the GIL) until ``ctl[1]`` reaches ``n``, at most ``spins`` reads."""
    for _ in range(spins):
        if load(ctl, 1) >= n:  # type: ignore[call-arg]  # an intrinsic: typed by Numba
            return True
    return load(ctl, 1) >= n  # type: ignore[call-arg]
