"""Eager execution through the generated kernels, with per-signature plans.

The first eager call of an op on a given (op, fn, dtypes, shapes, strides)
builds a one-node program once: its kernel, the argument layout and the
result meta. Later calls with that signature only allocate the result and
launch the kernel; nothing about tags, strides or kernels is derived again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels.codegen import STRIDED
from ..runtime.raw import RawTensor, contiguous_strides
from ..runtime.storage import POOL, Storage
from .fusion import _param, fusable, fusable_reduce
from .graph import Node
from .ops import OPS


class Plan:
    """A ready-to-launch kernel for one eager op signature."""

    __slots__ = ("kernel", "dtype", "shape", "strides", "count", "np_dtype", "ints",
                 "offset_pos", "tail", "node")

    def __init__(self, program: Any, node: Node):
        step = program.steps[0]
        b = step.built
        self.kernel = step.kernel
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

    def run(self, inputs: tuple[Node, ...], attrs: dict[str, Any]) -> RawTensor:
        """Allocate the result and launch the kernel."""
        out = POOL.take(self.np_dtype, self.count)
        ints = self.ints.copy()
        bufs = []
        for pos, v in zip(self.offset_pos, inputs):
            raw = v.value
            ints[pos] = raw.offset
            bufs.append(raw.storage.buf)
        node = self.node
        if node.op == "scalar" or (node.op == "compare" and len(inputs) == 1):
            params = [_param(node, attrs["value"])]
        elif node.op == "unary":
            params = list(attrs.get("params", ()))
        else:
            params = []
        self.kernel(out, *bufs, *ints, *self.tail, *params)
        return RawTensor(Storage(out, pooled=True), self.dtype, self.shape, self.strides, 0)


_PLANS: dict[Any, Plan | None] = {}


_FAST_OPS = frozenset({"binary", "compare", "unary", "scalar", "where", "cast", "copy",
                       "reduce"})


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
    try:
        return _PLANS[key]
    except KeyError:
        pass
    plan = _PLANS[key] = _build(op, inputs, attrs)
    return plan


def _build(op: str, inputs: tuple[Node, ...], attrs: dict[str, Any]) -> Plan | None:
    from .program import Program

    placeholders = []
    for k, v in enumerate(inputs):
        raw = v.value
        sym = RawTensor(Storage(None), raw.dtype, raw.shape, raw.strides, 0)
        placeholders.append(Node("input", (), {"index": k}, sym, None, False))
    shape, dtype = OPS[op].infer([p.value for p in placeholders], attrs)
    node = Node(op, tuple(placeholders), attrs, RawTensor.symbolic(dtype, shape), None, False)
    if not (fusable(node) or fusable_reduce(node)) or OPS[op].is_view:
        return None
    prog = Program(placeholders, [node])
    if len(prog.steps) != 1 or prog.steps[0].kind != "kernel":
        return None
    return Plan(prog, node)
