"""Kernel calls a pool worker can start without the GIL: a job as a row of int64s.

A pool worker that ran a kernel through Python had to take the GIL back each
time its part was done, while the caller held it between kernels; then it slept
on the GIL, and the futex wake that followed started its next kernel a median 24-31
us late even while it spun for the post (a sum over [64, 256, 256], 2-vCPU Zen 5
guest). Here a job is written into a row of the pool's ring instead, so a worker
spinning in native code (:func:`serve`) runs one kernel after another without
ever returning to Python:

* ``row[FN]``: the address of the kernel's compiled native function (Numba's
  calling convention), ``row[TRAMP]``: a trampoline for its argument types,
  ``row[ARGS:]``: the arguments flattened the way that convention passes them
  (:func:`publish`; an array is its size, item size, data pointer, shape and strides,
  with its meminfo and parent null: the caller's Python objects own the buffers,
  and holds them until every taken chunk is done);
* ``row[GEN]``: the post number of the job the row holds (-1 once it is over) and
  ``row[HOLDERS]``: workers inside it. A worker counts itself in before it checks
  the post number, the job's owner marks the row over before it waits for that
  count to reach zero (:func:`close`), so no worker runs a row that has since
  been reused for another job;
* ``row[STATUS]``: non-zero when the kernel reported an error on some thread.

The trampoline is a few lines of LLVM built per argument-type list
(:func:`trampoline`): it loads the flattened values, converts them to the
native types and calls the kernel. This leans on Numba's native calling
convention (``context.call_conv``, ``get_arg_packer``), the one its own
compiled functions call each other by; a kernel whose arguments are not arrays
and plain scalars keeps the Python path (:func:`entry_of`, :func:`flat_kind`). A kernel's value
never depends on which thread or which path ran a chunk.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import cpu_target
from numba.extending import intrinsic

from .atomics import fetch_add, load, store
from .spin import POSTED, PREEMPTED, TIMED_OUT, _relax, cycles

__all__ = ["ARGS", "FN", "GEN", "HOLDERS", "ROW", "STATUS", "TRAMP", "close", "count", "drive",
           "entry_of", "flat_kind", "post", "publish", "run_row", "serve", "trampoline"]

#: int64s per job row, and where each field sits in it.
ROW = 256
TRAMP, FN, GEN, HOLDERS, STATUS, ARGS = 0, 1, 2, 3, 4, 8
#: Status codes a Numba native function returns on success (``RETCODE_OK``, and
#: ``RETCODE_NONE`` for a function returning None).
_OK, _OK_NONE = 0, -2

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_TRAMP_TY = ir.FunctionType(_I32, [_I64.as_pointer()])


def _to_i64(builder: ir.IRBuilder, v: Any) -> Any:
    t = v.type
    if isinstance(t, ir.PointerType):
        return builder.ptrtoint(v, _I64)
    if isinstance(t, ir.IntType):
        return v if t.width == 64 else builder.zext(v, _I64)
    if isinstance(t, ir.FloatType):
        return builder.zext(builder.bitcast(v, _I32), _I64)
    if isinstance(t, ir.DoubleType):
        return builder.bitcast(v, _I64)
    raise TypeError(f"a kernel argument of LLVM type {t} has no int64 form")


def _from_i64(builder: ir.IRBuilder, v: Any, t: Any) -> Any:
    if isinstance(t, ir.PointerType):
        return builder.inttoptr(v, t)
    if isinstance(t, ir.IntType):
        return v if t.width == 64 else builder.trunc(v, t)
    if isinstance(t, ir.FloatType):
        return builder.bitcast(builder.trunc(v, _I32), t)
    if isinstance(t, ir.DoubleType):
        return builder.bitcast(v, t)
    raise TypeError(f"a kernel argument of LLVM type {t} has no int64 form")


def _fits(count: int) -> None:
    if ARGS + count > ROW:
        raise TypeError(f"{count} flattened kernel arguments do not fit a job row")


def flat_kind(ty: Any) -> bool:
    """Whether a kernel argument of Numba type ``ty`` can travel in a job row: arrays
    (their buffer stays owned by the caller) and plain scalars."""
    return isinstance(ty, (types.Array, types.Integer, types.Float, types.Boolean))


@intrinsic
def _store_flat(typingctx: Any, row: Any, args: Any) -> Any:
    """Write ``args`` flattened (Numba's native argument form) to ``row[ARGS:]``; their count."""
    if not (isinstance(row, types.Array) and row.ndim == 1 and row.dtype == types.int64
            and isinstance(args, types.BaseTuple)):
        return None
    sig = types.int64(row, args)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, a: Any) -> Any:
        rowty, tupty = signature.args
        vals = list(cgutils.unpack_tuple(builder, a[1], len(tupty)))
        for i, ty in enumerate(tupty.types):
            if not flat_kind(ty):
                raise TypeError(f"a kernel argument of type {ty} has no flat int64 form")
            if isinstance(ty, types.Array):
                # The meminfo and parent came from this call's unboxing and die with it:
                # the row keeps neither (a kernel never needs them; NRT skips null).
                ary = context.make_array(ty)(context, builder, vals[i])
                ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
                ary.parent = cgutils.get_null_value(ary.parent.type)
                vals[i] = ary._getvalue()
        flat = context.get_arg_packer(tupty.types).as_arguments(builder, vals)
        _fits(len(flat))
        arr = context.make_array(rowty)(context, builder, a[0])
        base = builder.gep(arr.data, [ir.Constant(_I64, ARGS)])
        for i, v in enumerate(flat):
            builder.store(_to_i64(builder, v), builder.gep(base, [ir.Constant(_I64, i)]))
        return ir.Constant(_I64, len(flat))

    return sig, codegen


@intrinsic
def _call(typingctx: Any, addr: Any, row: Any) -> Any:
    """Call the trampoline at ``addr`` on ``row``; the kernel's status code."""
    if not (isinstance(addr, types.Integer) and isinstance(row, types.Array)
            and row.dtype == types.int64):
        return None
    sig = types.int64(addr, row)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, a: Any) -> Any:
        arr = context.make_array(signature.args[1])(context, builder, a[1])
        fn = builder.inttoptr(a[0], _TRAMP_TY.as_pointer())
        return builder.sext(builder.call(fn, [arr.data]), _I64)

    return sig, codegen


@njit(cache=True, nogil=True)
def run_row(row: np.ndarray) -> None:
    """Run the job in ``row`` on this thread (its chunks left); a failure is counted in
    ``row[STATUS]``."""
    st: int = _call(row[TRAMP], row)  # type: ignore[call-arg]
    if st != _OK and st != _OK_NONE:
        fetch_add(row, STATUS, 1)


@njit(cache=True, nogil=True)
def post(box: np.ndarray, row: np.ndarray, slot: int, tramp: int, fn: int) -> int:
    """Publish the packed job in ``row`` (ring slot ``slot``): a new post number in
    ``box[0]``, the row marked with it, then ``box[1] = number << 8 | slot`` (a
    sequentially consistent store: the workers' count in ``box[3]``, read after it,
    is current). Returns the post number."""
    seq = fetch_add(box, 0, 1) + 1  # type: ignore[call-arg]
    row[TRAMP] = tramp
    row[FN] = fn
    row[STATUS] = 0
    store(row, GEN, seq)
    box[2] = 0  # the cores are the pool's again
    store(box, 1, (seq << 8) | slot)
    return seq


@njit(cache=True, nogil=True)
def publish(box: np.ndarray, row: np.ndarray, slot: int, tramp: int, fn: int,
            *args: Any) -> int:
    """Flatten a kernel's arguments into ``row[ARGS:]``, then :func:`post` the job, in
    one native call (the pool's per-kernel path); returns the post number."""
    _store_flat(row, args)  # type: ignore[call-arg]  # an intrinsic: typed by Numba
    return post(box, row, slot, tramp, fn)


@njit(cache=True, nogil=True)
def drive(row: np.ndarray, ctl: np.ndarray, nch: int, spins: int) -> bool:
    """The caller's part: run the job's chunks here, then wait (at most ``spins``
    reads) until every taken chunk is done or some thread reported an error (a failed
    chunk is never counted done); whether that happened."""
    run_row(row)
    for _ in range(spins + 1):
        if load(ctl, 1) >= nch or load(row, STATUS) != 0:  # type: ignore[call-arg]
            return True
    return False


@njit(cache=True, nogil=True)
def count(box: np.ndarray, delta: int) -> None:
    """Add ``delta`` to ``box[3]``, the count of workers serving natively (atomically)."""
    fetch_add(box, 3, delta)  # type: ignore[call-arg]


@njit(cache=True, nogil=True)
def close(row: np.ndarray) -> None:
    """Mark the row's job over and wait until no worker is inside it."""
    store(row, GEN, -1)  # type: ignore[call-arg]
    while load(row, HOLDERS) != 0:
        _relax()


@njit(cache=True, nogil=True)
def serve(box: np.ndarray, rows: np.ndarray, last: int, budget: int, gap: int,
          cap: int) -> tuple[int, int]:
    """A worker's native loop: run each job posted after post number ``last``, and
    between jobs spin for the next one for up to ``budget`` time-stamp ticks.

    Returns ``(outcome, last)``: :data:`TIMED_OUT` when the budget ran out or the
    caller lent the cores out (``box[2]``), :data:`POSTED` after a job once ``cap``
    ticks have passed since entry (the pool then judges the machine again),
    :data:`PREEMPTED` when two reads of the counter lay more than ``gap`` ticks
    apart (this thread lost its core).
    """
    t_in: int = cycles()  # type: ignore[call-arg]
    t0 = t_in
    prev = t0
    while True:
        word = load(box, 1)
        seq = word >> 8
        if seq > last:
            last = seq
            row = rows[word & 255]
            fetch_add(row, HOLDERS, 1)
            if load(row, GEN) == seq:
                run_row(row)
            fetch_add(row, HOLDERS, -1)
            t0 = cycles()
            prev = t0
            if t0 - t_in > cap:
                return POSTED, last
            continue
        if load(box, 2) != 0:
            return TIMED_OUT, last
        now = cycles()
        if now - prev > gap:
            return PREEMPTED, last
        if now - t0 > budget:
            return TIMED_OUT, last
        prev = now
        _relax()


def entry_of(cres: Any) -> tuple[int, int] | None:
    """(native function address, trampoline address) of a compiled parallel kernel (a
    Numba compile result), for the pool to run it as a row; None where it returns a
    value or takes an argument that has no flat int64 form."""
    if cres.signature.return_type != types.none or not all(
            flat_kind(t) for t in cres.signature.args):
        return None
    try:
        tramp = trampoline(tuple(cres.signature.args))
    except TypeError:
        return None
    return int(cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)), tramp


_TRAMPS: dict[tuple[Any, ...], tuple[Any, int]] = {}
_TRAMP_LOCK = threading.Lock()


def trampoline(argtypes: tuple[Any, ...]) -> int:
    """Address of ``i32 tramp(i64* row)``, which calls ``row[FN]`` (a Numba native
    function returning None with these Numba argument types) on the flattened
    arguments in ``row[ARGS:]`` and returns its status code."""
    got = _TRAMPS.get(argtypes)
    if got is not None:
        return got[1]
    with _TRAMP_LOCK, global_compiler_lock:
        got = _TRAMPS.get(argtypes)
        if got is not None:
            return got[1]
        ctx = cpu_target.target_context
        flat = list(ctx.get_arg_packer(argtypes).argument_types)
        _fits(len(flat))
        fnty = ctx.call_conv.get_function_type(types.none, argtypes)
        name = f"fucina_job_tramp_{len(_TRAMPS)}"
        lib = ctx.codegen().create_library(name)
        mod = lib.create_ir_module(name)
        f = ir.Function(mod, _TRAMP_TY, name=name)
        b = ir.IRBuilder(f.append_basic_block())
        row = f.args[0]
        fn = b.inttoptr(b.load(b.gep(row, [ir.Constant(_I64, FN)])), fnty.as_pointer())
        vals = [_from_i64(b, b.load(b.gep(row, [ir.Constant(_I64, ARGS + i)])), t)
                for i, t in enumerate(flat)]
        ret = cgutils.alloca_once(b, fnty.args[0].pointee)
        b.store(cgutils.get_null_value(fnty.args[0].pointee), ret)
        exc = cgutils.alloca_once(b, fnty.args[1].pointee)
        b.store(cgutils.get_null_value(fnty.args[1].pointee), exc)
        b.ret(b.call(fn, [ret, exc, *vals]))
        lib.add_ir_module(mod)
        lib.finalize()
        addr = int(lib.get_pointer_to_function(name))
        _TRAMPS[argtypes] = (lib, addr)
        return addr

