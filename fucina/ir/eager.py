"""Eager execution through the generated kernels, with per-signature plans.

The first eager call of an op on a given (op, fn, dtypes, shapes, strides)
builds a one-node program once: its kernel, the argument layout and the
result meta. Later calls with that signature only allocate the result and
launch the kernel; nothing about tags, strides or kernels is derived again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels.cache import SIZE_SOURCES
from ..kernels.codegen import STRIDED
from ..runtime.lru import LRU
from ..runtime.raw import RawTensor, contiguous_strides
from ..runtime.storage import POOL, POOL_MIN_BYTES, PooledStorage, Storage
from .fusion import fusable, fusable_reduce, param_value
from .graph import Node
from .ops import OPS


class Plan:
    """A ready-to-launch kernel for one eager op signature."""

    __slots__ = ("kernel", "fn", "dtype", "shape", "strides", "count", "np_dtype", "ints",
                 "offset_pos", "tail", "node", "small", "param_kind", "entry", "in_np",
                 "plain", "rest")

    def __init__(self, program: Any, node: Node):
        step = program.steps[0]
        b = step.built
        self.kernel = step.kernel
        self.fn = None  # the bare dispatcher, once the first call has been accounted
        # The compiled entry point for the first call's argument types and the storage
        # dtypes it was given (``fucina.tensor.fast`` calls it for exactly those).
        self.entry: Any = None
        self.in_np: tuple[np.dtype, ...] = ()
        self.node = node
        v = node.value
        self.dtype = v.dtype
        self.shape = v.shape
        self.strides = contiguous_strides(v.shape)
        self.count = int(np.prod(v.storage_shape()))
        self.np_dtype = v.dtype.storage
        self.ints = list(b.int_args)
        # Each input's ints start with its offset, which varies from call to call.
        self.offset_pos = []
        pos = 0
        for op in b.spec.inputs:
            self.offset_pos.append(pos)
            pos += 1 + op.pattern.count(STRIDED)
        self.tail = list(b.loop_sizes)
        # Plain layout: each input's ints are its offset alone (no strided operand), so a
        # call is (out, *buffers, *offsets, *rest).
        self.plain = self.offset_pos == list(range(len(self.offset_pos)))
        self.rest = tuple(self.ints[len(self.offset_pos):] + self.tail)
        self.small = self.count * self.np_dtype.itemsize < POOL_MIN_BYTES
        if node.op == "scalar" or (node.op == "compare" and len(node.inputs) == 1):
            self.param_kind = 1
        elif node.op in ("unary", "elemental"):
            self.param_kind = 2
        else:
            self.param_kind = 0

    def run(self, inputs: tuple[Node, ...], attrs: dict[str, Any]) -> RawTensor:
        """Allocate the result and launch the kernel."""
        small = self.small
        out = np.empty(self.count, self.np_dtype) if small else POOL.take(self.np_dtype,
                                                                          self.count)
        ints = self.ints.copy()
        args = [out]
        for pos, v in zip(self.offset_pos, inputs):
            raw = v.value
            ints[pos] = raw.offset
            args.append(raw.storage.buf)  # type: ignore[arg-type]  # eager values are concrete
        args += ints
        args += self.tail
        kind = self.param_kind
        if kind == 1:
            args.append(param_value(self.node, attrs["value"]))
        elif kind == 2:
            args += attrs.get("params", ())
        fn = self.fn
        if fn is None:
            self.kernel(*args)  # first call: counts a compile or a disk hit
            self.fn = self.kernel.call
            self.in_np = tuple(a.dtype for a in args[1:1 + len(inputs)])
            self.entry = self.kernel.bare(args)
        else:
            fn(*args)
        return RawTensor(Storage(out) if small else PooledStorage(out), self.dtype, self.shape,
                         self.strides, 0)


#: Most eager op signatures a process keeps plans for (least recently used dropped).
PLAN_CACHE_SIZE = 4096
PLANS = LRU(PLAN_CACHE_SIZE)
_MISSING = object()
SIZE_SOURCES["plan_cache"] = lambda: (len(PLANS), PLANS.maxsize)


_FAST_OPS = frozenset({"binary", "compare", "unary", "scalar", "where", "cast", "copy",
                       "reduce", "elemental"})


def lookup(op: str, inputs: tuple[Node, ...], attrs: dict[str, Any]) -> Plan | None:
    """The plan for this signature (built on first use), or None for the reference path."""
    if op not in _FAST_OPS:
        return None
    key: tuple[Any, ...] = (op, attrs.get("fn"), attrs.get("axes"), attrs.get("dtype"))
    for v in inputs:
        raw = v.value
        if raw.storage.buf is None:
            return None  # symbolic values never run
        key += (raw.dtype, raw.shape, raw.strides)
    data = PLANS.data
    plan = data.get(key, _MISSING)
    if plan is not _MISSING:
        try:
            data.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        return plan
    plan = _build(op, inputs, attrs)
    PLANS.put(key, plan)
    return plan


def _build(op: str, inputs: tuple[Node, ...], attrs: dict[str, Any]) -> Plan | None:
    from .program import Program

    sym_inputs = []
    for k, v in enumerate(inputs):
        sym = RawTensor.symbolic_like(v.value)
        sym_inputs.append(Node("input", (), {"index": k}, sym, None, False))
    infer = OPS[op].infer
    assert infer is not None  # views never reach a plan
    shape, dtype = infer([p.value for p in sym_inputs], attrs)
    node = Node(op, tuple(sym_inputs), attrs, RawTensor.symbolic(dtype, shape), None, False)
    if not (fusable(node) or fusable_reduce(node)) or OPS[op].is_view:
        return None
    prog = Program(sym_inputs, [node])
    if len(prog.steps) != 1 or prog.steps[0].kind != "kernel":
        return None
    return Plan(prog, node)
