"""Float sums and products in a fixed order: L lanes, combined by one fixed tree.

A generated kernel's float sum used to be a reassociating scalar accumulator
that LLVM vectorized as it saw fit: the lane count and interleave it picked
depend on the loop body, so a sum fed by a fused producer (compiled) added in
another order than the same sum over a materialized tensor (eager). Here the
order is part of the definition instead: element ``t`` of a reduction (``t``
the flat index over its reduced axes, in loop order) goes to lane ``t % L``
(``L`` = :data:`LANES` of the dtype), each lane adds its elements in
increasing ``t``, and the lanes combine by the halving tree of
:func:`total_add`. Every kernel shape (a direct run over a unit-stride row, a
scratch row of fused producer values, the swapped accumulator rows) computes
exactly that, so eager and compiled agree bit for bit.

The lanes are an LLVM ``<L x T>`` vector (four ymm registers on AVX2, two
zmm on AVX-512) added without fast-math flags, so no target reorders them. A
:class:`Lanes` value is that vector itself, so a loop carries it in registers.
"""

from __future__ import annotations

from typing import Any

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from .stack_rows import emit_row

#: Lanes per reduction, by dtype: element t adds into lane ``t % LANES[dtype]``. Four
#: independent ymm chains on AVX2 (two zmm on AVX-512) hide most of the add latency,
#: while a swapped kernel (one lane row per lane) stays small.
LANES = {"float32": 32, "float64": 16}
#: Elements in a scratch row of producer values (a multiple of every lane count).
SCRATCH = 256

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


class Lanes(types.Type):
    """The lanes of one float reduction: an LLVM ``<L x T>`` vector value."""

    def __init__(self, dtype: types.Float) -> None:
        self.dtype = dtype
        self.count = LANES[str(dtype)]
        super().__init__(name=f"Lanes({dtype} x {self.count})")


@register_model(Lanes)
class _LanesModel(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Lanes) -> None:
        fty = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(fty, fe_type.count))


def _has_lanes(ty: Any) -> bool:
    return isinstance(ty, types.Float) and str(ty) in LANES


@intrinsic
def splat(typingctx: Any, x: Any) -> Any:
    """Every lane holding ``x`` (a float): the starting lanes of a sum (0) or product (1)."""
    if not _has_lanes(x):
        return None
    sig = Lanes(x)(x)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        n = signature.return_type.count
        vec = ir.Constant(ir.VectorType(args[0].type, n), ir.Undefined)
        for i in range(n):
            vec = builder.insert_element(vec, args[0], ir.Constant(_I32, i))
        return vec

    return sig, codegen


@intrinsic
def start_add(typingctx: Any, x: Any) -> Any:
    """``+0 + x`` (-0 becomes +0), done on the bits: a kernel compiled with ``nsz`` folds a
    float ``0 + x`` (or a select on ``x == 0``) to ``x``. Lanes start at +0, so no sum
    is -0; a kernel whose lanes start from their first element instead gets the same
    bits but for the sign of a zero total, which this mends."""
    if not _has_lanes(x):
        return None
    sig = x(x)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        fty = args[0].type
        ity = ir.IntType(32 if isinstance(fty, ir.FloatType) else 64)
        bits = builder.bitcast(args[0], ity)
        neg_zero = builder.icmp_unsigned("==", bits, ir.Constant(ity, 1 << (ity.width - 1)))
        return builder.bitcast(builder.select(neg_zero, ir.Constant(ity, 0), bits), fty)

    return sig, codegen


#: Whether the LLVM under llvmlite names the masked-load intrinsic by an opaque pointer
#: (LLVM 17 and later; earlier llvmlite builds keep typed pointers).
_MASKED_LOADS = llvm.llvm_version_info[0] >= 17


def _tail_mask(builder: ir.IRBuilder, tail: Any, nl: int) -> Any:
    """The ``<nl x i1>`` mask of lanes ``j < tail`` (``tail`` an i64 below ``nl``)."""
    ivec = ir.VectorType(_I32, nl)
    count = builder.insert_element(ir.Constant(ivec, None), builder.trunc(tail, _I32),
                                   ir.Constant(_I32, 0))
    count = builder.shuffle_vector(count, count, ir.Constant(ivec, [0] * nl))
    return builder.icmp_unsigned("<", ir.Constant(ivec, list(range(nl))), count)


def _masked(builder: ir.IRBuilder, kind: str, vty: ir.VectorType, mask: Any) -> Any:
    """LLVM's ``llvm.masked.load`` or ``llvm.masked.store`` for vectors ``vty``: the
    lanes off in the mask are neither read nor written."""
    args: list[Any] = [vty.as_pointer(), _I32, mask.type, vty]
    fnty = ir.FunctionType(vty, args) if kind == "load" else \
        ir.FunctionType(ir.VoidType(), [vty, *args[:3]])
    return cgutils.get_or_insert_function(
        builder.module, fnty, f"llvm.masked.{kind}.v{vty.count}{vty.element.intrinsic_name}.p0")


def _masked_tail(builder: ir.IRBuilder, which: str, lanes: Any, start: Any, tail: Any,
                 vty: ir.VectorType, align: int) -> None:
    """Add (or multiply) the ``tail`` < L elements at ``start`` into lanes 0..tail-1.

    A masked vector load reads those elements and nothing past them, one vector op
    combines them, and a select keeps the result only in lanes j < tail, so every
    other lane keeps its bits (-0 and NaN payloads included): the same values as
    adding them one by one. That took a variable-index insert per element, which
    went through memory: on Zen 5, a row of 31 float32 cost 132 ns against 1.3 ns
    for a row of 32 (now 1.3 ns both).
    """
    with builder.if_then(builder.icmp_signed(">", tail, ir.Constant(_I64, 0))):
        keep = _tail_mask(builder, tail, vty.count)
        neutral = ir.Constant(vty, [0.0 if which == "add" else 1.0] * vty.count)
        x = builder.call(_masked(builder, "load", vty, keep),
                         [builder.bitcast(start, vty.as_pointer()),
                          ir.Constant(_I32, align), keep, neutral])
        cur = builder.load(lanes)
        combined = builder.fadd(cur, x) if which == "add" else builder.fmul(cur, x)
        builder.store(builder.select(keep, combined, cur), lanes)


def _is_run(acc: Any, arr: Any, start: Any, n: Any) -> bool:
    """Whether ``(acc, arr, start, n)`` type as a run of ``arr`` into lanes ``acc``."""
    return (isinstance(acc, Lanes) and isinstance(arr, types.Array) and arr.ndim == 1
            and arr.dtype == acc.dtype and isinstance(start, types.Integer)
            and isinstance(n, types.Integer))


def _run_operands(context: Any, builder: ir.IRBuilder, signature: Any,
                  args: Any) -> tuple[Any, Any, Any, Any, Any]:
    """(lanes value, the array's data pointer, start and count as i64, element type)."""
    accv, aryv, start_v, n_v = args
    aryty = signature.args[1]
    start_v = context.cast(builder, start_v, signature.args[2], types.int64)
    n_v = context.cast(builder, n_v, signature.args[3], types.int64)
    ary = context.make_array(aryty)(context, builder, aryv)
    return accv, ary.data, start_v, n_v, context.get_value_type(aryty.dtype)


def _run(which: str) -> Any:
    def typer(typingctx: Any, acc: Any, arr: Any, start: Any, n: Any) -> Any:
        if not _is_run(acc, arr, start, n):
            return None
        sig = acc(acc, arr, start, n)

        def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
            accv, data, start_v, n_v, fty = _run_operands(context, builder, signature, args)
            nl = signature.args[0].count
            vty = ir.VectorType(fty, nl)
            align = context.get_abi_sizeof(fty)
            base = builder.gep(data, [start_v])
            lanes = cgutils.alloca_once_value(builder, accv)
            op = builder.fadd if which == "add" else builder.fmul
            nv = builder.udiv(n_v, ir.Constant(_I64, nl))
            # Whole groups of lanes: one vector op per group, no fast-math flags, so no
            # target reorders the adds.
            with cgutils.for_range(builder, nv) as loop:
                p = builder.gep(base, [builder.mul(loop.index, ir.Constant(_I64, nl))])
                x = builder.load(builder.bitcast(p, vty.as_pointer()), align=align)
                builder.store(op(builder.load(lanes), x), lanes)
            done = builder.mul(nv, ir.Constant(_I64, nl))
            # The tail: element done + j goes to lane j.
            tail = builder.sub(n_v, done)
            if _MASKED_LOADS:
                _masked_tail(builder, which, lanes, builder.gep(base, [done]), tail, vty, align)
            else:  # one element at a time
                with cgutils.for_range(builder, tail) as loop:
                    j = loop.index
                    x = builder.load(builder.gep(base, [builder.add(done, j)]))
                    cur = builder.load(lanes)
                    lane = builder.extract_element(cur, j)
                    builder.store(builder.insert_element(cur, op(lane, x), j), lanes)
            return builder.load(lanes)

        return sig, codegen

    return intrinsic(typer)


#: ``add_run(lanes, arr, start, n)``: add ``arr[start + i]`` into lane ``i % L``, for i < n
#: (L the dtype's lane count). ``start`` must be where the reduction's flat index is a
#: multiple of L (or the run's end).
add_run = _run("add")
#: ``mul_run(lanes, arr, start, n)``: the product form of :data:`add_run`.
mul_run = _run("mul")


def _last(which: str) -> Any:
    def typer(typingctx: Any, acc: Any, arr: Any, start: Any, tail: Any) -> Any:
        if not _is_run(acc, arr, start, tail):
            return None
        sig = acc(acc, arr, start, tail)

        def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
            accv, data, start_v, tail_v, fty = _run_operands(context, builder, signature, args)
            nl = signature.args[0].count
            vty = ir.VectorType(fty, nl)
            p = builder.bitcast(builder.gep(data, [start_v]), vty.as_pointer())
            # One whole-vector load, the same width as the stores that wrote the window, so
            # the store buffer forwards it (a narrower or shifted load waits for them).
            win = builder.load(p, align=context.get_abi_sizeof(fty))
            # Rotate left by L - tail lanes: bit by bit, a constant shuffle kept or not.
            shift = builder.sub(ir.Constant(_I64, nl), tail_v)
            b = nl // 2
            while b >= 1:
                rot = builder.shuffle_vector(win, win, ir.Constant(
                    ir.VectorType(_I32, nl), [(i + b) % nl for i in range(nl)]))
                on = builder.icmp_unsigned("!=", builder.and_(shift, ir.Constant(_I64, b)),
                                           ir.Constant(_I64, 0))
                win = builder.select(on, rot, win)
                b //= 2
            keep = _tail_mask(builder, tail_v, nl)
            combined = builder.fadd(accv, win) if which == "add" else builder.fmul(accv, win)
            return builder.select(keep, combined, accv)

        return sig, codegen

    return intrinsic(typer)


#: ``add_last(lanes, arr, start, tail)``: add the last ``tail`` (1..L-1) elements of a
#: reduction into lanes 0..tail-1, where ``arr[start:start + L]`` holds the reduction's
#: last L elements (a window ending at its end, ``start`` aligned like the scratch row's
#: groups). A kernel fills that window with a loop over ``range(hidden(L))``, which LLVM
#: stores as whole vectors; adding the tail from there costs no store-forwarding stall,
#: where the masked load of :data:`add_run` over a scalar remainder's stores waits for
#: them to reach the cache (about 10 ns per row on Zen 4). Same lanes, same bits.
add_last = _last("add")
#: ``mul_last(lanes, arr, start, tail)``: the product form of :data:`add_last`.
mul_last = _last("mul")


def _into(which: str) -> Any:
    def typer(typingctx: Any, dst: Any, dst_start: Any, src: Any, src_start: Any,
              n: Any) -> Any:
        if not (isinstance(dst, types.Array) and dst.ndim == 1 and _has_lanes(dst.dtype)
                and isinstance(src, types.Array) and src.ndim == 1
                and src.dtype == dst.dtype and all(isinstance(v, types.Integer)
                                                   for v in (dst_start, src_start, n))):
            return None
        sig = types.none(dst, dst_start, src, src_start, n)

        def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
            dty, dst_start_t, sty, src_start_t, n_t = signature.args
            dv, ds, sv, ss, nv = args
            ds = context.cast(builder, ds, dst_start_t, types.int64)
            ss = context.cast(builder, ss, src_start_t, types.int64)
            nv = context.cast(builder, nv, n_t, types.int64)
            fty = context.get_value_type(dty.dtype)
            nl = LANES[str(dty.dtype)]
            vty = ir.VectorType(fty, nl)
            align = context.get_abi_sizeof(fty)
            dbase = builder.gep(context.make_array(dty)(context, builder, dv).data, [ds])
            sbase = builder.gep(context.make_array(sty)(context, builder, sv).data, [ss])

            def combine(dp: Any, x: Any, load_dst: Any) -> Any:
                if which == "copy":  # (dst is not read)
                    return x
                y = load_dst(dp)
                return builder.fadd(y, x) if which == "add" else builder.fmul(y, x)

            groups = builder.udiv(nv, ir.Constant(_I64, nl))
            with cgutils.for_range(builder, groups) as loop:
                at = builder.mul(loop.index, ir.Constant(_I64, nl))
                dp = builder.bitcast(builder.gep(dbase, [at]), vty.as_pointer())
                x = builder.load(builder.bitcast(builder.gep(sbase, [at]), vty.as_pointer()),
                                 align=align)
                builder.store(combine(dp, x, lambda p: builder.load(p, align=align)), dp,
                              align=align)
            done = builder.mul(groups, ir.Constant(_I64, nl))
            tail = builder.sub(nv, done)
            if _MASKED_LOADS:
                with builder.if_then(builder.icmp_signed(">", tail, ir.Constant(_I64, 0))):
                    keep = _tail_mask(builder, tail, nl)
                    load = _masked(builder, "load", vty, keep)
                    a = ir.Constant(_I32, align)
                    off = ir.Constant(vty, None)
                    dp = builder.bitcast(builder.gep(dbase, [done]), vty.as_pointer())
                    sp = builder.bitcast(builder.gep(sbase, [done]), vty.as_pointer())
                    x = builder.call(load, [sp, a, keep, off])
                    y = combine(dp, x, lambda p: builder.call(load, [p, a, keep, off]))
                    builder.call(_masked(builder, "store", vty, keep), [y, dp, a, keep])
            else:  # one element at a time
                with cgutils.for_range(builder, tail) as loop:
                    i = builder.add(done, loop.index)
                    dp = builder.gep(dbase, [i])
                    x = builder.load(builder.gep(sbase, [i]))
                    builder.store(combine(dp, x, builder.load), dp)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


#: ``add_into(dst, i, src, j, n)``: ``dst[i + k] += src[j + k]`` for k < n, in vectors
#: of the lane count with a masked tail: short runs (a few dozen elements) stay vector
#: code, where a loop LLVM vectorizes 32 wide (AVX-512: 16 lanes, interleaved twice)
#: runs scalar.
add_into = _into("add")
#: ``mul_into(dst, i, src, j, n)``: ``dst[i + k] *= src[j + k]``.
mul_into = _into("mul")
#: ``copy_into(dst, i, src, j, n)``: ``dst[i + k] = src[j + k]`` (the lanes' first
#: elements, sum or product: see :func:`start_add`).
copy_into = _into("copy")


def _total(which: str) -> Any:
    def typer(typingctx: Any, acc: Any) -> Any:
        if not isinstance(acc, Lanes):
            return None
        sig = acc.dtype(acc)

        def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
            n = signature.args[0].count
            vec = args[0]
            op = builder.fadd if which == "add" else builder.fmul
            # Halving tree: lane i combines with lane i + n/2, then i + n/4, ... (vector ops).
            while n > 1:
                n //= 2
                mask = ir.VectorType(_I32, n)
                lo = builder.shuffle_vector(vec, vec, ir.Constant(mask, list(range(n))))
                hi = builder.shuffle_vector(vec, vec, ir.Constant(mask, list(range(n, 2 * n))))
                vec = op(lo, hi)
            return builder.extract_element(vec, ir.Constant(_I32, 0))

        return sig, codegen

    return intrinsic(typer)


#: The sum of the lanes by a fixed halving tree (lane i + lane i + L/2, and so on).
total_add = _total("add")
#: The product of the lanes by the same tree.
total_mul = _total("mul")


@intrinsic
def hidden(typingctx: Any, n: Any) -> Any:
    """``n`` (an integer), through an empty inline asm the optimizer cannot see into.

    A loop of constant trip count L with a small body is fully unrolled before the
    loop vectorizer runs, and the unrolled copies stay scalar (a window of 32 ``x*x``
    became 32 ``vmulss`` and scalar stores). Over ``range(hidden(L))`` the vectorizer
    keeps the loop: one iteration of L/16 zmm (AVX-512) or L/8 ymm vectors.
    """
    if not isinstance(n, types.Integer):
        return None
    sig = types.int64(n)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        v = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.asm(ir.FunctionType(_I64, [_I64]), "", "=r,0", [v], False)

    return sig, codegen


@intrinsic
def scratch(typingctx: Any, proto: Any) -> Any:
    """A row of :data:`SCRATCH` elements of ``proto``'s float type on the stack.

    Allocated once in the calling function's entry block (a ``prange`` body is
    its own function, so each thread has its own), never on the heap.
    """
    if not isinstance(proto, types.Float):
        return None
    arrty = types.Array(proto, 1, "C")
    sig = arrty(proto)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        return emit_row(context, builder, arrty, SCRATCH, "lane_scratch")

    return sig, codegen
