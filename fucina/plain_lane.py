"""The plain lane of a compiled function: a repeated call on plain tensors, cheaply.

A call whose arguments are all tensors (positional, none requiring grad, all on
one open context, no two of them the same tensor or sharing storage) with a
signature the function has already traced, whose program captures no tensor and
writes no argument, needs little of the general call's work: no argument walk,
no gradient plumbing. The lane keys such calls on what the general signature key
holds for them (grad mode, and per argument its type, shape and strides) and
runs the traced program directly. A program that read Python values from outside
its arguments (a closure's axis tag, a global's size) has its guards checked on
every call first, as the general path does (:meth:`~fucina.captures.Captures.resolve`
re-reads each one); any that fails sends the call to the general path, which
traces again.

:func:`enter` is ``Compiled.__call__``: a call of one or two tensors whose
program is one kernel reading them (add, exp, sum...) runs inline there, after
the same checks, from the kernel's compiled entry point (a :data:`_Kernel` tuple
made after the signature's first lane run); a call whose program is one planned
GEMM of them (dot) runs through a runner made then (the GEMM's matrix views and
product call, shared with the eager fast dot). ``enter`` then builds the result
tensor itself (the body of :func:`fucina.tensor.fast.result`, written out). Any
other call takes :meth:`PlainLane.call`, then the general path, which decides and
raises as it always does.

Why written out, not called: a compiled one-op call pays for calling an instance
(``slot_tp_call``: an argument tuple, the ``__call__`` lookup, the ``self``
prepend, a keyword dict; about 0.1 us on Zen 3) where the eager op pays for a
bound-method call. The frames ``enter`` saves (the kernel's runner, ``result``,
``tensor_of``) are what keep the compiled one-op call no slower than the eager op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .ir.execute import TRACING, _local
from .ir.graph import Node
from .runtime.context import SCOPES_OPEN
from .runtime.gradmode import NO_GRAD_OPEN, is_grad_enabled
from .runtime.gradmode import _state as _grad
from .runtime.raw import RawTensor
from .runtime.storage import POOL, POOL_MIN_BYTES, PooledStorage, Storage
from .tensor.fast import gemm_route, returns_fresh, tensor_of

#: Signatures one compiled function keeps in its lane (emptied when it grows past this).
LANE_SIZE = 64

MISS = object()
_NO = object()  # a positional parameter of enter the call did not fill
_new = object.__new__
_empty = np.empty
_take = POOL.take


#: A one-kernel program's inline run (:func:`_kernel`): its compiled entry point, the
#: argument buffers' dtypes it was made for (one or two), the result buffer's length,
#: numpy dtype and smallness, and the entry's trailing arguments.
_Kernel = tuple[Any, ...]

#: The result of an inline run (:func:`_layout`): its tensor type, whether its buffer
#: is small (not pooled), its dtype, shape, strides, offset and tags.
_Layout = tuple[Any, ...]


class _Route:
    """How a plain call runs: the program runner, result types and where each lives;
    ``kernel`` once a one-kernel program's entry point is known (:func:`_kernel`), or
    ``fast`` after a one-GEMM program's first run (:func:`_gemm_fast`), each with the
    result's ``layout``."""

    __slots__ = ("run", "out_types", "structure", "rebuild", "one", "kernel", "fast", "gemm",
                 "layout", "caps")

    def __init__(self, program: Any, out_types: list[Any], structure: Any,
                 rebuild: Callable[[Any, list[Any]], Any], caps: Any = None):
        # The trace's captures when it has guards (checked before every run), else None.
        self.caps = caps
        one = program.one_kernel_runner()
        self.run: Callable[[list[RawTensor]], list[RawTensor]] = one or program.run
        self.out_types = out_types
        self.structure = structure
        self.rebuild = rebuild
        # A one-kernel program reading its arguments in order (one or two), with one
        # result returned as is and no extent checks: the call runs it inline.
        n_in = len(program.inputs)
        plain = (one is not None and n_in in (1, 2) and not one.input_need
                 and one.in_slots == tuple(range(n_in)) and len(one.results) == 1
                 and structure == ("t", 0))
        self.one = one if plain else None
        self.gemm = program.one_gemm_node() if structure == ("t", 0) else None
        self.kernel: _Kernel | None = None
        self.fast: Callable[[RawTensor, RawTensor], np.ndarray | None] | None = None
        self.layout: _Layout = ()

    def ready(self, raws: list[RawTensor]) -> None:
        """Make the inline run after a run on ``raws``: once the one-kernel program
        has its entry point, or from a one-GEMM program's plan and these layouts."""
        one = self.one
        typ = self.out_types[0]
        if one is not None:
            if one.entry is not None:
                v = one.result
                self.layout = _layout(typ, one.small, v, v.offset)
                self.kernel = _kernel(one)
        elif self.gemm is not None:
            v = self.gemm.value
            small = v.numel * np.dtype(v.dtype.storage).itemsize < POOL_MIN_BYTES
            self.layout = _layout(typ, small, v, 0)  # (the product's buffer is its own)
            self.fast = _gemm_fast(self.gemm, raws, small)
            if self.fast is None:
                self.gemm = None  # a layout the product cannot take as views


def enter(self: Any, a: Any = _NO, b: Any = _NO, /, *rest: Any, **kwargs: Any) -> Any:
    """``Compiled.__call__``: a one- or two-tensor call runs here when its signature is
    in the lane with an inline run (the checks of :meth:`PlainLane.call`, in one frame);
    any other call goes to :meth:`PlainLane.call`, then the general path.

    (The two leading positional-only parameters spare the common call building an
    ``args`` tuple; :data:`_NO`, private, marks one the call left unfilled. Keyword
    arguments, even ones named ``a`` or ``b``, land in ``kwargs``: :func:`_other`.)"""
    if rest or kwargs:
        return _other(self, a, b, rest, kwargs)
    out = None  # the result buffer, once an inline run made it
    route: Any = None
    if b is not _NO:
        # Only tensor types are keys of the table, so anything else misses there; an
        # object that is no tensor may fail any of these reads: the general path.
        try:
            na, nb = a._node_, b._node_
            ctx = a._ctx
            ra, rb = na.value, nb.value
            sa, sb = ra.storage, rb.storage
            if b._ctx is ctx and sa is not sb \
                    and not (na.requires_grad or nb.requires_grad or ctx.closed):
                key: tuple[Any, ...] = (not NO_GRAD_OPEN[0] or _grad.depth == 0, type(a),
                                        ra.shape, ra.strides, type(b), rb.shape, rb.strides)
                lane = self._lane
                last = lane.last
                route = last[1] if key == last[0] else lane.find(key)
        except Exception:
            route = None
        if route is not None and route.caps is not None \
                and route.caps.resolve(self.fn, ()) is None:
            route = None  # a guard failed: the general path traces again
        if route is not None and (not TRACING[0] or _local.tracer is None):
            k = route.kernel
            if k is not None:  # the one kernel (see _kernel)
                fn, d0, d1, count, dt, small, tail = k
                ba = sa.buf
                bb = sb.buf
                # Numba's dispatcher (the program's run) takes other dtypes and borrowed
                # storage; a buffer gone raises there.
                if ba is not None and bb is not None and ba.dtype is d0 and bb.dtype is d1 \
                        and not (sa.borrowed or sb.borrowed):
                    out = _empty(count, dt) if small else _take(dt, count)
                    oa = ra.offset
                    ob = rb.offset
                    fn(out, ba[oa:] if oa else ba, bb[ob:] if ob else bb, *tail)
            elif route.fast is not None:  # the one GEMM
                out = route.fast(ra, rb)
    elif a is not _NO:
        try:
            na = a._node_
            ctx = a._ctx
            ra = na.value
            if not (na.requires_grad or ctx.closed):
                key = (not NO_GRAD_OPEN[0] or _grad.depth == 0, type(a), ra.shape, ra.strides)
                lane = self._lane
                last = lane.last
                route = last[1] if key == last[0] else lane.find(key)
        except Exception:
            route = None
        if route is not None and route.caps is not None \
                and route.caps.resolve(self.fn, ()) is None:
            route = None
        if route is not None and (not TRACING[0] or _local.tracer is None):
            k = route.kernel
            if k is not None:
                fn, d0, count, dt, small, tail = k
                sa = ra.storage
                ba = sa.buf
                if ba is not None and ba.dtype is d0 and not sa.borrowed:
                    out = _empty(count, dt) if small else _take(dt, count)
                    oa = ra.offset
                    fn(out, ba[oa:] if oa else ba, *tail)
    if out is not None:
        # fucina.tensor.fast.result(typ, ctx, out, small, dtype, shape, strides, offset,
        # "const", {}, tags), written out (see the module docstring)
        typ, small, vdt, vshape, vstrides, voff, tags = route.layout
        st: Any = _new(Storage if small else PooledStorage)
        st.buf = out
        st.refs = 1
        st.readonly = False
        st.borrowed = False
        raw: Any = _new(RawTensor)
        raw.storage = st
        raw.dtype = vdt
        raw.shape = vshape
        raw.strides = vstrides
        raw.offset = voff
        node: Any = _new(Node)
        node.op = "const"
        node.inputs = ()
        node.attrs = {}
        node.value = raw
        node.tags = tags
        node.requires_grad = False
        node.grad = None
        if SCOPES_OPEN[0]:  # some exec scope is open: tensor_of decides on adoption
            return tensor_of(typ, node, ctx)
        obj: Any = _new(typ)
        obj._node_ = node
        obj._ctx = ctx
        obj._scoped = False
        return obj
    args: tuple[Any, ...] = (a, b) if b is not _NO else (a,) if a is not _NO else ()
    hit = self._lane.call(args, self.fn)
    if hit is not MISS:
        return hit
    return self._general(args, {})


def _other(self: Any, a: Any, b: Any, rest: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """:func:`enter` for a call of more than two positional arguments or with keyword
    arguments: the lane for the first (no keywords), then the general path."""
    args = (a, *rest) if b is _NO else (a, b, *rest)  # (a keyword-only call: a is _NO)
    if a is _NO:
        args = ()
    if not kwargs:
        hit = self._lane.call(args, self.fn)
        if hit is not MISS:
            return hit
    return self._general(args, kwargs)


class PlainLane:
    """The plain-call table of one compiled function."""

    __slots__ = ("table", "types", "last")

    def __init__(self) -> None:
        self.table: dict[Any, _Route] = {}
        self.types: set[type] = set()  # tensor types of the arguments seen in the table
        # The signature key :func:`enter` found last, and its route: a call repeating it
        # compares keys (no hashing of their shape and stride tuples, no table probe).
        self.last: tuple[tuple[Any, ...], _Route | None] = ((), None)

    def find(self, key: tuple[Any, ...]) -> _Route | None:
        """The route of signature ``key``, or None; remembered as :attr:`last`."""
        route = self.table.get(key)
        if route is not None:
            self.last = (key, route)
        return route

    def call(self, args: tuple[Any, ...], fn: Any) -> Any:
        """The call's result, or :data:`MISS` (take the general path). (A signature's
        inline run is :func:`enter`'s: a call that reaches here the program runs.)
        ``fn`` is the compiled function's Python function (the root of its guards)."""
        types = self.types
        n = len(args)
        if n == 2:  # the common cases, unrolled
            a, b = args
            ta, tb = type(a), type(b)
            if ta not in types or tb not in types:
                return MISS
            na, nb = a._node_, b._node_
            if na is None or nb is None or na.requires_grad or nb.requires_grad:
                return MISS
            ctx = a._ctx
            if b._ctx is not ctx or ctx.closed:
                return MISS
            ra, rb = na.value, nb.value
            if ra.storage is rb.storage:
                return MISS
            route = self.table.get((not NO_GRAD_OPEN[0] or _grad.depth == 0, ta, ra.shape,
                                    ra.strides, tb, rb.shape, rb.strides))
            if route is None or (TRACING[0] and _local.tracer is not None):
                return MISS
            if ra.storage.buf is None or rb.storage.buf is None:
                return MISS
            if route.caps is not None and route.caps.resolve(fn, ()) is None:
                return MISS
            return self.run(route, [ra, rb], ctx)
        if n == 1:
            a = args[0]
            if type(a) not in types:
                return MISS
            na = a._node_
            if na is None or na.requires_grad:
                return MISS
            ctx = a._ctx
            if ctx.closed:
                return MISS
            ra = na.value
            route = self.table.get((not NO_GRAD_OPEN[0] or _grad.depth == 0, type(a),
                                    ra.shape, ra.strides))
            if route is None or (TRACING[0] and _local.tracer is not None):
                return MISS
            if ra.storage.buf is None:
                return MISS
            if route.caps is not None and route.caps.resolve(fn, ()) is None:
                return MISS
            return self.run(route, [ra], ctx)
        key: list[Any] = [not NO_GRAD_OPEN[0] or _grad.depth == 0]
        raws = []
        storages: list[Any] = []
        ctx = None
        for a in args:
            t = type(a)
            if t not in types:
                return MISS
            node = a._node_
            if node is None or node.requires_grad:
                return MISS
            c = a._ctx
            if ctx is None:
                if c.closed:
                    return MISS
                ctx = c
            elif c is not ctx:
                return MISS
            raw = node.value
            st = raw.storage
            if st.buf is None:
                return MISS
            for s in storages:  # one tensor (or storage) in two positions: general path
                if s is st:
                    return MISS
            storages.append(st)
            raws.append(raw)
            key += (t, raw.shape, raw.strides)
        route = self.table.get(tuple(key))
        if route is None or (TRACING[0] and _local.tracer is not None):
            return MISS
        if route.caps is not None and route.caps.resolve(fn, ()) is None:
            return MISS
        return self.run(route, raws, ctx)

    @staticmethod
    def run(route: _Route, raws: list[RawTensor], ctx: Any) -> Any:
        """Run ``route``'s program on checked argument raws; its results on ``ctx``."""
        results = route.run(raws)
        if route.kernel is None and route.fast is None \
                and (route.one is not None or route.gemm is not None):
            route.ready(raws)
        outs = [_wrap(typ, r, ctx) for typ, r in zip(route.out_types, results)]
        if route.structure == ("t", 0):
            return outs[0]
        return route.rebuild(route.structure, outs)

    def learn(self, args: tuple[Any, ...], kwargs: dict[str, Any], entry: Any,
              rebuild: Callable[[Any, list[Any]], Any]) -> None:
        """After a general call traced or found ``entry`` for ``args``: add the signature
        when the call and its program qualify (see the module docstring)."""
        if kwargs or not args or _local.tracer is not None:
            return
        key: list[Any] = [is_grad_enabled()]
        ctx = None
        storages: list[Any] = []
        for a in args:
            node = getattr(a, "_node_", None)
            if node is None or getattr(type(a), "axis_tags", None) is None \
                    or node.requires_grad or (ctx is not None and a._ctx is not ctx):
                return
            ctx = a._ctx
            raw = node.value
            if raw.storage.buf is None or any(s is raw.storage for s in storages):
                return
            storages.append(raw.storage)
            key += (type(a), raw.shape, raw.strides)
        caps = entry.caps
        if caps.slots or entry.made_ctx or entry.arg_writes or entry.consumed \
                or entry.prologues or entry.clears or entry.grad_targets \
                or any(entry.out_rg) or entry.grad_presence or entry.diff:
            return
        if entry.bindings != [("arg", k) for k in range(len(args))]:
            return
        if any(kind != "arg" for kind, _ in entry.out_ctx):
            return  # every argument is on one context: results live there too
        if len(self.table) >= LANE_SIZE:
            self.table.clear()
            self.last = ((), None)
        self.types.update(type(a) for a in args)
        self.table[tuple(key)] = _Route(entry.program, list(entry.out_types), entry.structure,
                                        rebuild, caps if caps.guards else None)


def _kernel(one: Any) -> _Kernel:
    """The :data:`_Kernel` tuple :func:`enter` runs ``one`` (a
    :class:`~fucina.ir.program.OneKernel` whose entry point is known) from, inline on
    the argument raws: what ``one(raws)`` does, without its call and attribute reads.
    ``enter`` leaves to Numba's dispatcher (the program's run) another buffer dtype,
    borrowed storage and a buffer that is gone."""
    return (one.entry, *one.dtypes, one.count, one.dt, one.small, one.tail)


def _layout(typ: Any, small: bool, v: RawTensor, offset: int) -> _Layout:
    """The :data:`_Layout` of a ``typ`` result laid out as ``v`` (the program's) from
    ``offset`` in its buffer."""
    return (typ, small, v.dtype, v.shape, v.strides, offset, typ.axis_tags)


def _gemm_fast(n: Node, raws: list[RawTensor], small: bool
               ) -> Callable[[RawTensor, RawTensor], np.ndarray | None] | None:
    """The one-GEMM program of contract node ``n`` run inline on two argument raws: the
    matrix views rebuilt from the layouts of ``raws`` and the product call the program
    makes (:func:`fucina.tensor.fast.gemm_route`, shared with the eager fast dot); it
    returns the result's buffer (pooled unless ``small``), or None where a buffer is
    gone or of another dtype. None when the layouts need copies (the program's own
    run then)."""
    ra, rb = raws
    route = gemm_route(n.attrs["labels"], n.value, ra, rb)
    if route is None:
        return None
    a_side, b_side, swapped, gemm, out_shape = route
    d0, d1 = ra.storage.buf.dtype, rb.storage.buf.dtype  # type: ignore[union-attr]
    v = n.value
    count = v.numel
    dt = np.dtype(v.dtype.storage)
    fresh = small and returns_fresh(gemm)

    def run2(ra: RawTensor, rb: RawTensor) -> np.ndarray | None:
        ba = ra.storage.buf
        bb = rb.storage.buf
        if ba is None or bb is None or ba.dtype is not d0 or bb.dtype is not d1:
            return None
        if swapped:
            ba, bb, oa, ob = bb, ba, rb.offset, ra.offset
        else:
            oa, ob = ra.offset, rb.offset
        last = a_side.last  # _Matrix.view, inlined for the kept view of a small operand
        A = last[2] if last is not None and last[0] is ba and last[1] == oa \
            else a_side.view(ba, oa)
        last = b_side.last
        B = last[2] if last is not None and last[0] is bb and last[1] == ob \
            else b_side.view(bb, ob)
        if fresh:  # the product's own fresh result (the same BLAS call as with out=)
            return gemm(A, B).reshape(-1)
        out = np.empty(count, dt) if small else POOL.take(dt, count)
        gemm(A, B, out.reshape(out_shape))
        return out
    return run2


def _wrap(typ: Any, raw: RawTensor, ctx: Any) -> Any:
    """``typ._from_node(leaf(raw, typ.axis_tags, False), ctx, op_result=True)``, inlined."""
    node = _new(Node)  # Node("const", (), {}, raw, tags, False) without __init__'s call
    node.op = "const"
    node.inputs = ()
    node.attrs = {}
    node.value = raw
    node.tags = typ.axis_tags
    node.requires_grad = False
    node.grad = None
    return tensor_of(typ, node, ctx)
