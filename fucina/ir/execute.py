"""The one executor every facade op goes through.

``emit`` builds an IR node for a primitive and, in eager mode, runs it at
once: views get a new layout over their input's storage, compute ops run a
kernel into fresh storage. While a tracer is active (``fucina.compile``) the
node gets a symbolic value instead and is recorded into the tracer's program.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Protocol

import numpy as np

from ..dtypes import DType
from ..errors import InvalidShape
from ..kernels import reference
from ..runtime.gradmode import is_grad_enabled
from ..runtime.raw import MAX_ELEMENTS, MAX_ELEMENTS_TEXT, RawTensor
from ..runtime.storage import POOL, storage_for
from . import eager
from .checks import ATTR_CHECKS, VALUE_CHECKS
from .graph import Node
from .ops import OPS


class Tracer(Protocol):
    """Receives nodes while a function is being traced."""

    def record(self, node: Node) -> None:
        """Append ``node`` to the program being traced."""

    def gradient(self, leaf: Node, grad: Node) -> None:
        """A backward pass inside the trace produced ``grad`` for ``leaf``."""

    def fresh(self, node: Node) -> Node:
        """The value a traced op reads for a traced (symbolic) input node: itself, or
        its newest value after an in-place update."""

    def storage_of(self, node: Node) -> tuple[int, int] | None:
        """(offset, storage size) in the concrete storage traced for ``node`` (an input
        or a view of one), when known: a view's reach is checked against it at trace
        time, as eager would."""

    def lift(self, node: Node) -> Node:
        """The value a traced op reads for a concrete (data-holding) input node.

        A tensor the function captured from outside becomes an implicit
        program input (read when the program runs); anything else stays a
        constant of the program.
        """


class _State(threading.local):
    """Per-thread state; the class default makes ``_local.tracer`` a plain read."""

    tracer: Tracer | None = None


_local = _State()

#: Threads with a tracer installed, in a one-element list (hot paths import the list
#: and read ``[0]``). While it is 0 no thread traces, so a hot path reads this global
#: (~10 ns) and skips the thread-local (~60 ns): ``not TRACING[0] or _local.tracer is
#: None`` means "not tracing". It rises before a thread installs a tracer and falls
#: after it removes one, so a tracing thread always sees it above 0; a lock keeps the
#: threads' updates from losing each other.
TRACING = [0]
_tracing_lock = threading.Lock()


def current_tracer() -> Tracer | None:
    """The active tracer on this thread, if any."""
    return getattr(_local, "tracer", None)


def set_tracer(tracer: Tracer | None) -> Tracer | None:
    """Install ``tracer`` (None to leave tracing); returns the previous one."""
    prev = current_tracer()
    if prev is None and tracer is not None:
        with _tracing_lock:
            TRACING[0] += 1
    _local.tracer = tracer
    if prev is not None and tracer is None:
        with _tracing_lock:
            TRACING[0] -= 1
    return prev


def wrap_array(dtype: DType, arr: np.ndarray, shape: tuple[int, ...],
               pooled: bool = False) -> RawTensor:
    """Adopt a freshly computed array as a contiguous raw tensor of logical ``shape``."""
    flat = np.ascontiguousarray(arr, dtype=dtype.storage).reshape(-1)
    out = RawTensor.symbolic(dtype, shape)
    out.storage = storage_for(flat, pooled)
    return out


def emit(op: str, inputs: tuple[Node, ...] | list[Node], tags: tuple[str, ...] | None = None,
         **attrs: Any) -> Node:
    """Build (and in eager mode execute) one primitive node."""
    d = OPS[op]
    inputs = tuple(inputs)
    tracer = _local.tracer if TRACING[0] else None
    if tracer is not None and d.layout is None:
        # A compute op reads data: concrete inputs become program inputs or constants.
        # (Views of concrete tensors stay concrete, so traced host code may still read them.)
        # Traced inputs read their newest value after an in-place update (tracer.fresh).
        inputs = tuple(tracer.fresh(i) if i.value.storage.buf is None else tracer.lift(i)
                       for i in inputs)
    check = ATTR_CHECKS.get(op)
    if check is not None:
        check(inputs, attrs)
    rg = False
    if d.differentiable:
        for i in inputs:
            if i.requires_grad:
                rg = is_grad_enabled()
                break
    if d.layout is not None:
        value = d.layout(inputs[0].value, attrs)
    elif tracer is None and (plan := eager.lookup(op, inputs, attrs)) is not None:
        value = plan.run(inputs, attrs)  # the per-signature fast path
    else:
        ins = [i.value for i in inputs]
        assert d.infer is not None  # every non-view op infers its result
        shape, dtype = d.infer(ins, attrs)
        if math.prod(shape) > MAX_ELEMENTS:  # (numpy would raise its own ValueError)
            raise InvalidShape(f"{op}: the result shape {tuple(shape)} has more than "
                               f"{MAX_ELEMENTS_TEXT} elements")
        if tracer is not None or any(v.is_symbolic for v in ins):
            value = RawTensor.symbolic(dtype, shape)
        else:
            buf = None
            arrays = [v.array() for v in ins]
            vcheck = VALUE_CHECKS.get(op)
            if vcheck is not None:
                vcheck(inputs, attrs, arrays)
            if op == "contract":  # GEMM results land in a pooled buffer, written in place
                buf = POOL.take(dtype.storage, int(np.prod(shape)))
            res = reference.run(op, attrs, arrays, [v.dtype for v in ins], dtype, buf=buf)
            pooled = buf is not None and (res.base is buf or res is buf)
            value = wrap_array(dtype, res, shape, pooled=pooled)
    # Eager no-grad results drop their inputs: nothing will walk back through them.
    node = Node(op, inputs if (rg or tracer is not None) else (), attrs, value, tags, rg)
    if tracer is not None:
        tracer.record(node)
    return node
