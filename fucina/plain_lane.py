"""The plain lane of a compiled function: a repeated call on plain tensors, cheaply.

A call whose arguments are all tensors (positional, none requiring grad, all on
one open context, no two of them the same tensor or sharing storage) with a
signature the function has already traced, whose program captures nothing,
guards nothing and writes no argument, needs none of the general call's work:
no argument walk, no guard checks, no gradient plumbing. The lane keys such
calls on what the general signature key holds for them (grad mode, and per
argument its type, shape and strides) and runs the traced program directly (a
one-kernel program through its lean runner). Any other call takes the general
path, which decides and raises as it always does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .ir.execute import _local
from .ir.graph import Node
from .runtime.gradmode import _state as _grad
from .runtime.gradmode import is_grad_enabled
from .runtime.raw import RawTensor
from .runtime.storage import POOL, PooledStorage, Storage
from .tensor.fast import tensor_of

#: Signatures one compiled function keeps in its lane (emptied when it grows past this).
LANE_SIZE = 64

MISS = object()
_new = object.__new__


class _Route:
    """How a plain call runs: the program runner, result types and where each lives."""

    __slots__ = ("run", "out_types", "structure", "rebuild", "one", "out_type")

    def __init__(self, program: Any, out_types: list[Any], structure: Any,
                 rebuild: Callable[[Any, list[Any]], Any]):
        one = program.one_kernel_runner()
        self.run: Callable[[list[RawTensor]], list[RawTensor]] = one or program.run
        self.out_types = out_types
        self.structure = structure
        self.rebuild = rebuild
        # A one-kernel program with one result returned as is: the call inlines it.
        plain = (one is not None and not one.input_need and one.in_slots == (0, 1)
                 and len(one.results) == 1 and structure == ("t", 0))
        self.one = one if plain else None
        self.out_type = out_types[0] if out_types else None


class PlainLane:
    """The plain-call table of one compiled function."""

    __slots__ = ("table", "types")

    def __init__(self) -> None:
        self.table: dict[Any, _Route] = {}
        self.types: set[type] = set()  # tensor types of the arguments seen in the table

    def call(self, args: tuple[Any, ...]) -> Any:
        """The call's result, or :data:`MISS` (take the general path)."""
        types = self.types
        if len(args) == 2:  # the common case, unrolled
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
            route = self.table.get((_grad.depth == 0, ta, ra.shape, ra.strides, tb, rb.shape,
                                    rb.strides))
            if route is None or _local.tracer is not None:
                return MISS
            one = route.one
            if one is not None:  # one kernel, one result: OneKernel.__call__ inlined
                sa, sb = ra.storage, rb.storage
                ba, bb = sa.buf, sb.buf
                fn = one.entry
                if fn is not None and ba is not None and bb is not None \
                        and ba.dtype is one.dtypes[0] and bb.dtype is one.dtypes[1] \
                        and not (sa.borrowed or sb.borrowed):
                    small = one.small
                    out = np.empty(one.count, one.dt) if small else POOL.take(one.dt, one.count)
                    oa, ob = ra.offset, rb.offset
                    fn(out, ba[oa:] if oa else ba, bb[ob:] if ob else bb, *one.tail)
                    # RawTensor(Storage(out), ...) as OneKernel makes it, without the
                    # constructors' call overhead (every slot set, as __init__ would)
                    st: Any = _new(Storage if small else PooledStorage)
                    st.buf = out
                    st.refs = 1
                    st.readonly = False
                    st.borrowed = False
                    v = one.result
                    raw: Any = _new(RawTensor)
                    raw.storage = st
                    raw.dtype = v.dtype
                    raw.shape = v.shape
                    raw.strides = v.strides
                    raw.offset = v.offset
                    return _wrap(route.out_type, raw, ctx)
            if ra.storage.buf is None or rb.storage.buf is None:
                return MISS
            raws = [ra, rb]
        else:
            key: list[Any] = [_grad.depth == 0]
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
            if route is None or _local.tracer is not None:
                return MISS
        results = route.run(raws)
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
        if caps.slots or caps.guards or entry.made_ctx or entry.arg_writes or entry.consumed \
                or entry.prologues or entry.clears or entry.grad_targets \
                or any(entry.out_rg) or entry.grad_presence or entry.diff:
            return
        if entry.bindings != [("arg", k) for k in range(len(args))]:
            return
        if any(kind != "arg" for kind, _ in entry.out_ctx):
            return  # every argument is on one context: results live there too
        if len(self.table) >= LANE_SIZE:
            self.table.clear()
        self.types.update(type(a) for a in args)
        self.table[tuple(key)] = _Route(entry.program, list(entry.out_types), entry.structure,
                                        rebuild)


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
