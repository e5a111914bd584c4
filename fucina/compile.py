"""``fucina.compile(fn)``: trace a function into the IR and run it as kernels.

The first call per input signature (tensor types, shapes, strides, which
arguments share a context, static arguments) traces ``fn`` with symbolic
tensors that carry tags, dtype, shape and layout but no data; tag errors
surface then, at the user's line, and ``Tensor(...)`` annotations on
parameters and the return value are checked. The traced IR becomes a
:class:`~fucina.ir.program.Program` (fused kernels, views folded,
intermediates reusing buffers), cached per signature (least recently used
signatures are dropped past :data:`PROGRAM_CACHE_SIZE`).

A compiled function behaves as the eager one:

- Tensors it reaches through closures, globals, defaults and the objects
  those hold (:mod:`fucina.captures`) are implicit inputs read at call time,
  so rebinding one takes effect without a retrace. Python values the trace
  depends on are guarded: when one changes, the next call traces again.
- Arguments may be tensors, static hashable values, or tuples/lists/dicts of
  both (tensors anywhere in them are inputs).
- A function that calls ``backward()`` compiles forward and backward into
  one program; its gradients reach the variables (and eager graphs) they
  belong to when the program runs.
- A result that still requires grad carries a graph node whose backward runs
  a compiled program (the function's VJP, recomputing its forward), so
  ``fast(x).backward()`` works as it does eagerly.
- Called while another function is being traced, a compiled function inlines
  into that trace.
"""

from __future__ import annotations

import functools
import inspect
import struct
import sys
import threading
import typing
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import captures as cap
from . import plain_lane
from .dtypes import DType
from .errors import TagError, TensorError, UnsupportedGradient
from .ir import autodiff
from .ir.checks import needs_value_check
from .ir.execute import current_tracer, emit, set_tracer
from .ir.graph import Node, leaf
from .ir.ops import OPS, OpDef
from .ir.printer import format_program
from .ir.program import Program
from .kernels.cache import SIZE_SOURCES, Kernel
from .plain_lane import PlainLane
from .runtime.context import ExecContext
from .runtime.gradmode import enable_grad, is_grad_enabled, no_grad
from .runtime.lru import LRU
from .runtime.raw import RawTensor, contiguous_strides, set_read_observer

#: Input signatures whose programs one compiled function keeps (LRU).
PROGRAM_CACHE_SIZE = 64
#: Traces kept per signature for different guarded captured values (oldest dropped).
GUARD_VARIANTS = 8

_is_tensor = cap.is_tensor
_LIVE: weakref.WeakSet[Compiled] = weakref.WeakSet()


def _is_tensor_type(t: Any) -> bool:
    return isinstance(t, type) and getattr(t, "axis_tags", None) is not None


# -- arguments ------------------------------------------------------------------------------


class _Args:
    """A call's arguments split into tensor leaves, static values and a signature key."""

    __slots__ = ("tensors", "statics", "key", "ctx_class", "alias")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.tensors: list[Any] = []  # each tensor object once, in first-occurrence order
        self.statics: list[Any] = []
        self.ctx_class: list[int] = []  # per tensor: index of the first tensor on its context
        # id(tensor) -> its index in ``tensors``: one tensor passed in two places is one
        # program input, so an in-place update or a take_* through one is seen by the other.
        self.alias: dict[int, int] = {}
        ctxs: dict[int, int] = {}
        parts = [self._leaf(a, ctxs, "argument") for a in args]
        parts += [(k, self._leaf(kwargs[k], ctxs, f"argument {k!r}")) for k in sorted(kwargs)]
        self.key = (tuple(parts), is_grad_enabled())

    def _leaf(self, a: Any, ctxs: dict[int, int], what: str) -> Any:
        if _is_tensor(a):
            node = a._node  # raises Deinitialized
            seen = self.alias.get(id(a))
            if seen is not None:
                return ("A", seen)
            k = len(self.tensors)
            self.alias[id(a)] = k
            self.tensors.append(a)
            cls = ctxs.setdefault(id(a._ctx), k)
            self.ctx_class.append(cls)
            raw = node.value
            return ("T", type(a), raw.shape, raw.strides, node.requires_grad, cls)
        if isinstance(a, (tuple, list)):
            return (type(a), tuple(self._leaf(x, ctxs, what) for x in a))
        if isinstance(a, dict):
            return (dict, tuple((k, self._leaf(a[k], ctxs, what)) for k in a))
        try:
            hash(a)
        except TypeError:
            raise TypeError(
                f"compiled functions take tensors, hashable static values and "
                f"tuples/lists/dicts of those; {what} is a {type(a).__name__}") from None
        self.statics.append(a)
        # The type is part of the key: 1, 1.0 and True trace differently.
        if isinstance(a, (float, np.floating)):  # -0.0 is not 0.0; a NaN matches itself
            return ("S", type(a), struct.pack("<d", float(a)))
        return ("S", type(a), a)

    def rebuild(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                tensors: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The same argument structure with ``tensors`` in place of the tensor leaves."""

        def sub(a: Any) -> Any:
            if _is_tensor(a):
                return tensors[self.alias[id(a)]]
            if isinstance(a, (tuple, list)):
                return _remake(type(a), [sub(x) for x in a])
            if isinstance(a, dict):
                return {k: sub(v) for k, v in a.items()}
            return a

        new_args = tuple(sub(a) for a in args)
        new_kwargs = {k: sub(kwargs[k]) for k in sorted(kwargs)}
        return new_args, new_kwargs


# -- tracing --------------------------------------------------------------------------------


class _Tracer:
    """Records a trace; turns concrete tensors the function reads into program inputs."""

    def __init__(self, caps: cap.Captures):
        self.caps = caps
        self.grads: list[tuple[Node, Node]] = []
        self.inputs: list[Node] = []
        # Per input: ("arg", k) tensor argument k, ("slot", k) capture slot k (read through
        # its path at call time), ("pinned", node) a tensor only this trace can reach.
        # ("grad", k) the accumulated gradient of input k's tensor at call time.
        self.bindings: list[tuple[str, Any]] = []
        # id(concrete node) -> (that node, its program value). The node is kept so that
        # its id is not reused by a later temporary (a broadcast view made for one op).
        self._lifted: dict[int, tuple[Node, Node]] = {}
        self.read_slots: set[int] = set()
        # Contexts constructors used while tracing (constants made inside the function).
        self.contexts: list[ExecContext] = []
        # In-place updates and gradient reads inside the trace (optimizer steps).
        self.arg_nodes: set[int] = set()            # nodes of the tensor arguments
        self._version: dict[int, tuple[Node, Node]] = {}  # id(input) -> (input, value now)
        self.prologues: list[Callable[[], None]] = []
        self.grad_presence: dict[int, bool] = {}    # input -> its tensor has a grad at call
        self.clears: list[int] = []                 # inputs whose grad is dropped at call end
        self._grad_inputs: dict[int, Node] = {}
        # The in-place inference helpers on tensor arguments (see assign / consume).
        self.arg_rg: dict[int, bool] = {}       # id(argument input) -> its tensor's requires_grad
        self.arg_writes: dict[int, str] = {}    # argument index -> the helper writing into it
        self.consumed: list[int] = []           # arguments a take_* op consumes
        self._local: set[int] = set()           # updated program constants: no write-back
        self.checked: list[Node] = []           # ops whose input values eager checks
        # id(input) -> (offset, storage size) of the tensor traced for it: a view's reach is
        # checked against it at trace time where eager would meet that error first.
        self._storage: dict[int, tuple[int, int]] = {}

    def record(self, node: Node) -> None:
        """Keeps the ops that check input values (index data, integer divisors): the
        program checks them even when nothing reads their result (the rest is reached
        from the outputs)."""
        if needs_value_check(node):
            self.checked.append(node)

    def gradient(self, leaf_: Node, grad: Node) -> None:
        self.grads.append((leaf_, grad))

    def add_input(self, raw: RawTensor, tags: Any, requires_grad: bool,
                  binding: tuple[str, Any]) -> Node:
        node = Node("input", (), {"index": len(self.inputs)}, RawTensor.symbolic_like(raw),
                    tags, requires_grad)
        if raw.storage.buf is not None:
            self._storage[id(node)] = (raw.offset, raw.storage.buf.size)
        self.inputs.append(node)
        self.bindings.append(binding)
        return node

    def storage_of(self, node: Node) -> tuple[int, int] | None:
        """(offset, storage size) in the concrete storage of the tensor traced for
        ``node``: an input, or a view of one (its offset is relative to the input's)."""
        hit = self._storage.get(id(self._root(node)))
        return None if hit is None else (hit[0] + node.value.offset, hit[1])

    def lift(self, node: Node) -> Node:
        """The program value a traced op reads for a concrete tensor (after any assign)."""
        base = self._lift(node)
        hit = self._version.get(id(base))
        return base if hit is None else hit[1]

    def fresh(self, node: Node) -> Node:
        """The value a traced op reads for a traced node: an argument or a value computed
        while tracing that an in-place helper updated reads as its newest value, and so
        does every view of it (views share storage in eager mode)."""
        if not self._version:
            return node
        hit = self._version.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        if node.inputs and OPS.get(node.op, _NO_OP).is_view:
            base = node.inputs[0]
            nb = self.fresh(base) if base.value.storage.buf is None else self.lift(base)
            if nb is not base:
                with enable_grad() if node.requires_grad else no_grad():
                    return emit(node.op, (nb,), node.tags, **node.attrs)
        return node

    def _root(self, node: Node) -> Node:
        while node.inputs and OPS.get(node.op, _NO_OP).is_view:
            node = node.inputs[0]
        return node

    def concrete_requires_grad(self, node: Node) -> bool:
        """``requires_grad`` of the tensor a traced node stands for: an argument (or a
        view of one) requires grad as the caller's tensor does, whatever the grad mode
        the function was traced under."""
        root = self._root(node)
        return self.arg_rg.get(id(root), node.requires_grad) if root.op == "input" \
            else node.requires_grad

    def _arg_index(self, node: Node) -> int | None:
        if node.op != "input":
            return None
        kind, v = self.bindings[node.attrs["index"]]
        return v if kind == "arg" else None

    def consume(self, node: Node) -> None:
        """A take_* op consumed the traced tensor ``node``: when it is a whole argument,
        the caller's tensor is consumed by every call (as eager consumes it)."""
        k = self._arg_index(node)
        if k is not None and k not in self.consumed:
            self.consumed.append(k)

    def _lift(self, node: Node) -> Node:
        hit = self._lifted.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        # The lifted value requires grad exactly when the concrete one does, whatever the
        # grad mode at the first read (emit gates recording by the mode of each op).
        slot = self.caps.slot_of(node)
        if slot is not None:
            out = self.add_input(node.value, node.tags, node.requires_grad, ("slot", slot))
        elif OPS.get(node.op, _NO_OP).is_view and node.inputs:
            # A view made while tracing over a concrete tensor: the same view of its lifted
            # base, so the program reads the base as it is at call time.
            with enable_grad() if node.requires_grad else no_grad():
                out = emit(node.op, (self.lift(node.inputs[0]),), node.tags, **node.attrs)
        else:
            out = self.add_input(node.value, node.tags, node.requires_grad, ("pinned", node))
        self._lifted[id(node)] = (node, out)
        return out

    # -- optimizer steps inside a trace -------------------------------------------------
    #
    # An assign records the target's new value (later reads in the trace see it) and
    # the program writes the last value into the input after its run; the gradient a
    # variable holds mid-trace is its gradient at call time (an input, guarded on being
    # present) plus what this trace's backward passes produced; host-side bookkeeping
    # (step counts, bias corrections) runs as a prologue before every run.

    def _target(self, node: Node, what: str) -> Node:
        """The program input behind a concrete tensor ``what`` updates or reads."""
        if node.value.is_symbolic or id(node) in self.arg_nodes:
            raise TypeError(
                f"{what} inside fucina.compile works on tensors the function captures (a "
                "model's variables, an optimizer's state), not on its tensor arguments or on "
                "values computed while tracing")
        base = self._lift(node)
        if base.op != "input":
            raise TypeError(f"{what} inside fucina.compile needs a whole tensor, not a view")
        return base

    def assign(self, target: Node, value: Node) -> None:
        """``target`` (a captured tensor) holds ``value`` from here on in the trace."""
        base = self._target(target, "an in-place update (assign)")
        if target.value.storage.readonly:
            raise TypeError("assign: the target's storage is read-only (borrowed const)")
        if not value.value.is_symbolic:
            value = self.lift(value)
        self._version[id(base)] = (base, value)
        # Views lifted before this point read the old value: lift them again when used.
        self._lifted = {k: v for k, v in self._lifted.items() if v[1].op == "input"}

    def update(self, target: Node, value: Node, what: str) -> None:
        """An in-place inference helper (``what``) set ``target`` to ``value``.

        Later reads in the trace see ``value``. An argument or a captured tensor
        gets it written back after every run; a tensor the function made while
        tracing (a program constant) does not, since eager makes it afresh per call.
        """
        if not target.value.is_symbolic:
            base = self._target(target, what)
            if self.bindings[base.attrs["index"]][0] == "pinned":
                self._local.add(id(base))
            self._version[id(base)] = (base, value)
            self._lifted = {k: v for k, v in self._lifted.items() if v[1].op == "input"}
            return
        if target.inputs and OPS.get(target.op, _NO_OP).is_view:
            raise TypeError(
                f"{what} inside fucina.compile needs a whole tensor (an argument, a capture "
                "or a computed value), not a view made inside the function: update the "
                "tensor it views, or pass the view as an argument")
        if target.op == "input":
            k = self._arg_index(target)
            if k is None:
                raise TypeError(f"{what} inside fucina.compile cannot update this tensor")
            self.arg_writes.setdefault(k, what)
        self._version[id(target)] = (target, value)

    def writes(self) -> list[tuple[int, Node]]:
        """(input index, final value) of every assigned input."""
        return [(base.attrs["index"], v) for base, v in self._version.values()
                if v is not base and base.op == "input" and id(base) not in self._local]

    def grad(self, node: Node) -> Node | None:
        """The gradient the variable ``node`` holds at this point of the traced call."""
        base = self._target(node, "reading a gradient")
        k = base.attrs["index"]
        total = None
        if k not in self.clears:
            present = node.grad is not None
            self.grad_presence[k] = present
            if present:
                gi = self._grad_inputs.get(k)
                if gi is None:
                    gi = self._grad_inputs[k] = self.add_input(
                        node.grad, base.tags, False, ("grad", k))  # type: ignore[arg-type]
                total = gi
        for leaf_, g in self.grads:
            if leaf_ is base:
                total = g if total is None else emit("binary", (total, g), fn="add")
        return total

    def set_grad(self, node: Node, value: Node) -> None:
        """The variable ``node``'s gradient is ``value`` from here on (and after the call)."""
        self.zero_grad(node)
        self.grads.append((self._target(node, "setting a gradient"), value))

    def zero_grad(self, node: Node) -> None:
        """The variable ``node`` has no gradient from here on (and none after the call)."""
        base = self._target(node, "zero_grad()")
        self.grads = [(leaf_, g) for leaf_, g in self.grads if leaf_ is not base]
        k = base.attrs["index"]
        if k not in self.clears:
            self.clears.append(k)

    def prologue(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` before the program at every call (host-side optimizer bookkeeping)."""
        self.prologues.append(fn)

    def context(self, ctx: ExecContext) -> None:
        """A constructor made a tensor on ``ctx`` while tracing."""
        if not any(c is ctx for c in self.contexts):
            self.contexts.append(ctx)

    def read(self, raw: RawTensor) -> None:
        """Host code read data while tracing: a captured tensor's values now shape the trace."""
        self.read_slots.update(self.caps.slots_of_storage(raw.storage))

    def add_root(self, obj: Any) -> None:
        cap.add_root(self.caps, obj)


_NO_OP = OpDef("")


def _same_memory(a: Any, b: Any) -> bool:
    """Whether two storages are one, or their buffers' memory overlaps: two borrows of
    one numpy array (or of ``x.data()``) are two storages over the same memory."""
    if a is b:
        return True
    return a.buf is not None and b.buf is not None and bool(np.may_share_memory(a.buf, b.buf))


def _check_argument_updates(entry: _Entry, a: _Args, found: list[Any]) -> None:
    """The checks eager in-place helpers make on the caller's tensors, at every call:
    the traced program writes into (or consumes) arguments whose storage the trace could
    not see."""
    from .errors import ActiveExecScopeUnsupported, UnsupportedView

    for k in entry.consumed:
        if a.tensors[k]._scoped:
            raise ActiveExecScopeUnsupported(
                f"argument {k} is consumed by a take_* op, and an exec scope owns it; use the "
                "out-of-place op inside a scope")
    if not entry.arg_writes:
        return
    storages = [t._node.value.storage for t in a.tensors] + [
        t._node.value.storage for t in found]
    for k, what in entry.arg_writes:
        st = storages[k]
        if st.readonly:
            raise UnsupportedView(f"{what}: the tensor's storage is read-only (borrowed const)")
        for j, other in enumerate(storages):
            if j != k and _same_memory(other, st):
                who = f"argument {j}" if j < len(a.tensors) else "a captured tensor"
                raise TypeError(
                    f"{what} inside fucina.compile writes into argument {k}, whose storage "
                    f"{who} shares: the program reads its inputs as they were at the call; "
                    "pass tensors with their own storage or call the function eagerly")


def _check_capture_writes(entry: _Entry, a: _Args, found: list[Any]) -> None:
    """No argument may share memory with a captured tensor the program writes: the
    program reads arguments as they were at the call, where eager would see the write.
    (Checked before anything of the call runs, optimizer prologues included.)"""
    for w in entry.slot_writes:
        st = found[entry.bindings[w][1]]._node.value.storage
        for v in entry.arg_inputs:
            if _same_memory(a.tensors[v]._node.value.storage, st):
                raise TypeError(
                    f"fucina.compile: the function writes into a captured tensor whose "
                    f"memory argument {v} shares: the program reads its inputs as they were "
                    "at the call; pass tensors with their own storage or call the function "
                    "eagerly")


def _prefix_checks(tracer: _Tracer, a: _Args) -> None:
    """After the traced function raised: raise instead the value error (an index out of
    range, a zero divisor) an op traced before that point meets on these arguments, as
    eager, which checks each op's input values when it runs, would have. Returns when
    there is none (or no way to tell)."""
    if not tracer.checked:
        return
    ins: list[RawTensor] = []
    for kind, v in tracer.bindings:
        if kind == "arg":
            ins.append(a.tensors[v]._node.value)
        elif kind == "slot":
            ins.append(tracer.caps.slots[v]._node.value)
        elif kind == "pinned":
            ins.append(v.value)
        else:  # an accumulated gradient: leave the function's own error
            return
    try:
        Program(tracer.inputs, [], (), tracer.checked).run(ins)
    except TensorError as err:  # a check's error (IndexOutOfBounds, ...)
        raise err from None
    except Exception:  # nothing eager would have met first: the function's own error
        return


class _Entry:
    """One traced signature: its program, how to bind inputs and rebuild outputs."""

    def __init__(self, program: Program, tracer: _Tracer, structure: Any,
                 out_nodes: list[Node], out_types: list[Any], out_ctx: list[tuple[str, Any]],
                 grad_targets: list[Any]):
        self.program = program
        self.caps = tracer.caps
        self.bindings = tracer.bindings
        self.inputs = tracer.inputs
        self.structure = structure
        self.out_nodes = out_nodes
        self.out_types = out_types
        self.out_ctx = out_ctx
        self.out_rg = [n.requires_grad for n in out_nodes]
        self.grad_targets = grad_targets  # per gradient output: an input index or a node
        self.diff = [k for k, n in enumerate(self.inputs) if n.requires_grad]
        # What the trace saw of every captured tensor, and of the ones whose values it read.
        self.slot_meta = [_meta(t) for t in self.caps.slots]
        self.slot_values = {k: _values(self.caps.slots[k]) for k in sorted(tracer.read_slots)}
        # Context classes over arguments then the captures the program reads.
        self.slot_ctx_class: list[tuple[int, int]] = []  # (slot, class)
        # Contexts of constants made while tracing, each with the argument or captured
        # tensor that shared it then (None: neither did); a call must see the same.
        self.made_ctx: list[tuple[ExecContext, tuple[str, int] | None]] = []
        self.one_ctx = False  # arguments and used captures all on one context
        self._vjp: dict[int, tuple[Program, list[int | None], list[Node]]] = {}
        self._lock = threading.Lock()
        # Optimizer steps traced into the program (see _Tracer.assign/grad/zero_grad).
        self.prologues = tracer.prologues
        self.clears = tracer.clears
        # In-place helpers on tensor arguments: written back / consumed at every call.
        self.arg_writes = sorted(tracer.arg_writes.items())
        # Captured tensors the program writes (in-place helpers, optimizer steps): an
        # argument over their memory would be read as it was at the call.
        self.slot_writes = sorted({k for k, _ in tracer.writes()
                                   if tracer.bindings[k][0] == "slot"})
        # The arguments the program reads (per call, checked against slot_writes).
        self.arg_inputs = sorted({v for kind, v in tracer.bindings if kind == "arg"})
        self.consumed = tracer.consumed
        self.grad_presence = sorted(tracer.grad_presence.items())

    # -- guards ----------------------------------------------------------------------

    def match(self, fn: Any, args: _Args) -> list[Any] | None:
        """The captured tensors for this call, or None when the trace no longer applies."""
        caps = self.caps
        if not caps.slots and not caps.guards:
            return [] if not self.made_ctx or self._made_ctx_hold(args, []) else None
        found = caps.resolve(fn, tuple(args.statics))
        if found is None:
            return None
        for t, meta in zip(found, self.slot_meta):
            node = t._node_
            if node is None or meta is None or t._ctx.closed:
                return None
            v = node.value
            if v.shape != meta[0] or v.strides != meta[1] or node.requires_grad != meta[2]:
                return None
        for k, snapshot in self.slot_values.items():
            if not cap.same_value(_values(found[k]), snapshot):
                return None
        for k, present in self.grad_presence:  # the trace read (or not) a prior gradient
            kind, v = self.bindings[k]
            node = (args.tensors[v]._node if kind == "arg" else found[v]._node_
                    if kind == "slot" else v)
            if node is None or (node.grad is not None) != present:
                return None
        # Captured tensors share contexts with the arguments as they did when traced.
        scc = self.slot_ctx_class
        if scc:
            if self.one_ctx and args.tensors:  # the common case: everything on one context
                ctx0 = args.tensors[0]._ctx
                for slot, _ in scc:
                    if found[slot]._ctx is not ctx0:
                        return None
            else:
                ctx_of = {id(t._ctx): c for t, c in zip(args.tensors, args.ctx_class)}
                for slot, cls in scc:
                    if ctx_of.setdefault(id(found[slot]._ctx), -1 - slot) != cls:
                        return None
        if self.made_ctx and not self._made_ctx_hold(args, found):
            return None
        return found

    def _made_ctx_hold(self, args: _Args, found: list[Any]) -> bool:
        """Constants made while tracing meet the arguments and captures on the contexts
        they met then (else the facade's context checks must run again: a retrace), and
        their contexts are still open (else the constructors must raise again)."""
        for ctx, peer in self.made_ctx:
            if ctx.closed:
                return False
            if peer is None:
                if any(t._ctx is ctx for t in args.tensors) or any(
                        t._ctx is ctx for t in found):
                    return False
            elif peer[0] == "arg":
                if args.tensors[peer[1]]._ctx is not ctx:
                    return False
            elif found[peer[1]]._ctx is not ctx:
                return False
        return True

    # -- running ---------------------------------------------------------------------

    def bound(self, args: _Args, found: list[Any]) -> list[Node]:
        """The node each program input reads at this call."""
        tensors = args.tensors
        out: list[Node] = []
        for kind, v in self.bindings:
            if kind == "arg":
                out.append(tensors[v]._node)
            elif kind == "slot":
                out.append(found[v]._node)
            elif kind == "grad":  # input v's accumulated gradient (present: guarded)
                out.append(leaf(out[v].grad, None, False))
            else:
                out.append(v)
        return out

    def vjp(self, j: int) -> tuple[Program, list[int | None], list[Node]]:
        """The backward program of output ``j`` (built on first use).

        Its inputs are the forward inputs, the output's gradient and any
        constant the rules needed; it recomputes what the forward computed.
        Returns the program, per differentiable input the index of its
        gradient among the program outputs (None: no gradient reaches it),
        and the constant nodes bound after the gradient.
        """
        with self._lock:
            hit = self._vjp.get(j)
            if hit is not None:
                return hit
            out = self.out_nodes[j]
            rec = _Tracer(cap.Captures())
            rec.inputs = list(self.inputs)
            rec.bindings = [("fwd", k) for k in range(len(self.inputs))]
            seed = rec.add_input(RawTensor.symbolic(DType.f32, out.shape), None, False,
                                 ("seed", 0))
            prev = set_tracer(rec)
            try:
                autodiff.backward(out, seed)
            finally:
                set_tracer(prev)
            got = {id(leaf_): g for leaf_, g in rec.grads}
            outputs: list[Node] = []
            where: list[int | None] = []
            for k in self.diff:
                g = got.get(id(self.inputs[k]))
                where.append(None if g is None else len(outputs))
                if g is not None:
                    outputs.append(g)
            consts = [v for kind, v in rec.bindings[len(self.inputs) + 1:]]
            hit = self._vjp[j] = (Program(rec.inputs, outputs), where, consts)
            return hit


def _meta(t: Any) -> Any:
    node = t._node_ if _is_tensor(t) else None
    if node is None or t._ctx.closed:
        return None
    raw = node.value
    return (raw.shape, raw.strides, node.requires_grad)


def _values(t: Any) -> np.ndarray | None:
    node = t._node_
    return None if node is None else np.array(node.value.array(), copy=True)


class _CompiledCall:
    """What a graph node of a compiled result needs to run the function's VJP."""

    __slots__ = ("entry", "raws", "__weakref__")

    def __init__(self, entry: _Entry, raws: list[RawTensor]):
        self.entry = entry
        self.raws = raws  # every program input as it was in the forward call

    def grads(self, j: int, g: Node) -> tuple[Node | None, ...]:
        if current_tracer() is not None:
            raise UnsupportedGradient(
                "the result of a compiled function reached backward() inside another trace; "
                "pass it to the traced function as an argument instead")
        prog, where, consts = self.entry.vjp(j)
        gv = g.value
        if gv.dtype is not DType.f32:
            gv = emit("cast", (g,), dtype=DType.f32, src=gv.dtype).value
        if gv.strides != contiguous_strides(gv.shape) or gv.offset:
            gv = gv.contiguous_copy()
        raws = prog.run(self.raws + [gv] + [c.value for c in consts])
        return tuple(None if w is None else leaf(raws[w], None, False) for w in where)


def _compiled_call_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    return n.attrs["call"].grads(n.attrs["output"], g)


OPS["compiled_call"] = OpDef("compiled_call")
autodiff.VJP["compiled_call"] = _compiled_call_vjp


# -- the public object ----------------------------------------------------------------------


class Compiled:
    """A traced, optimized version of ``fn`` (see :func:`compile`)."""

    def __init__(self, fn: Callable[..., Any]):
        if not callable(fn):
            raise TypeError(f"fucina.compile needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.__fucina_compiled_fn__ = fn  # how the capture walk recognizes compiled functions
        self._cache = LRU(PROGRAM_CACHE_SIZE)
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)
        self._hints: dict[str, Any] | None = None
        self._lane = PlainLane()  # repeated plain-tensor calls (fucina/plain_lane.py)
        _LIVE.add(self)

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    # -- annotations -----------------------------------------------------------------

    def _annotations(self) -> dict[str, Any]:
        if self._hints is None:
            try:
                self._hints = typing.get_type_hints(self.fn)
            except Exception:
                self._hints = {}
        return self._hints

    def _check_params(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hints = self._annotations()
        if not hints:
            return
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            ann = hints.get(name)
            if _is_tensor_type(ann) and type(value) is not ann:
                raise TagError(
                    f"{self._name}: parameter {name!r} is annotated {ann!r}, "
                    f"got {type(value)!r}")

    def _check_return(self, out: Any) -> None:
        ann = self._annotations().get("return")
        if _is_tensor_type(ann) and type(out) is not ann:
            raise TagError(f"{self._name}: return is annotated {ann!r}, got {type(out)!r}")

    # -- tracing ---------------------------------------------------------------------

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any], a: _Args) -> _Entry:
        self._check_params(args, kwargs)
        roots: list[tuple[cap.Step, Any]] = [(("root", 0), self.fn)]
        roots += [(("arg", k), s) for k, s in enumerate(a.statics)
                  if not isinstance(s, cap.PRIMITIVES)]
        tracer = _Tracer(cap.discover(roots))
        sym = []
        for k, t in enumerate(a.tensors):
            node = t._node
            rg = node.requires_grad and is_grad_enabled()
            inp = tracer.add_input(node.value, t.axis_tags, rg, ("arg", k))
            tracer.arg_nodes.add(id(node))
            tracer.arg_rg[id(inp)] = node.requires_grad
            sym.append(type(t)._from_node(inp, t._ctx))
        sargs, skw = a.rebuild(args, kwargs, sym)
        flat: list[Node] = []
        out_types: list[Any] = []
        out_ctx_objs: list[ExecContext] = []

        def flatten(o: Any) -> Any:
            if _is_tensor(o):
                node = o._node
                if not node.value.is_symbolic:  # returned as is: read it at call time
                    node = tracer.lift(node)
                else:  # its newest value after any in-place update
                    node = tracer.fresh(node)
                flat.append(node)
                out_types.append(type(o))
                out_ctx_objs.append(o._ctx)
                return ("t", len(flat) - 1)
            if isinstance(o, (tuple, list)):
                return (type(o), [flatten(x) for x in o])
            if isinstance(o, dict):
                return (dict, [(k, flatten(v)) for k, v in o.items()])
            return ("v", o)

        prev = set_tracer(tracer)
        prev_obs = set_read_observer(tracer.read)
        try:
            try:
                out = self.fn(*sargs, **skw)
                self._check_return(out)
                structure = flatten(out)
            finally:
                set_read_observer(prev_obs)
                set_tracer(prev)
        except Exception:
            _prefix_checks(tracer, a)  # a value error eager meets first wins
            raise
        by_id = {id(n): k for k, n in enumerate(tracer.inputs)}
        targets = [by_id.get(id(leaf_), leaf_) for leaf_, _ in tracer.grads]
        program = Program(tracer.inputs, flat + [g for _, g in tracer.grads], tracer.writes(),
                          tracer.checked)
        # Each result lives on the context of the input it came from (or its own).
        ctx_rep: dict[int, tuple[str, Any]] = {}
        for k, t in enumerate(a.tensors):
            ctx_rep.setdefault(id(t._ctx), ("arg", k))
        for (kind, v) in tracer.bindings:
            if kind == "slot":
                ctx_rep.setdefault(id(tracer.caps.slots[v]._ctx), ("slot", v))
        out_ctx = [ctx_rep.get(id(c), ("fixed", c)) for c in out_ctx_objs]
        entry = _Entry(program, tracer, structure, flat, out_types, out_ctx, targets)
        ctx_class = {id(t._ctx): c for t, c in zip(a.tensors, a.ctx_class)}
        for kind, v in tracer.bindings:
            if kind == "slot":
                c = ctx_class.setdefault(id(tracer.caps.slots[v]._ctx), -1 - v)
                entry.slot_ctx_class.append((v, c))
        entry.one_ctx = all(c == 0 for c in a.ctx_class) and all(
            c == 0 for _, c in entry.slot_ctx_class)
        peers: dict[int, tuple[str, int]] = {}
        for k, t in enumerate(a.tensors):
            peers.setdefault(id(t._ctx), ("arg", k))
        for v, t in enumerate(tracer.caps.slots):
            peers.setdefault(id(t._ctx), ("slot", v))
        entry.made_ctx = [(c, peers.get(id(c))) for c in tracer.contexts]
        return entry

    def _lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[_Entry, _Args, list[Any]]:
        a = _Args(args, kwargs)
        variants = self._cache.get(a.key)
        if variants:
            for e in variants:
                found = e.match(self.fn, a)
                if found is not None:
                    return e, a, found
        with self._lock:
            variants = self._cache.get(a.key) or []
            for e in variants:  # another thread may have traced it meanwhile
                found = e.match(self.fn, a)
                if found is not None:
                    return e, a, found
            e = self._trace(args, kwargs, a)
            self._cache.put(a.key, (variants + [e])[-GUARD_VARIANTS:])
            # This call runs with what the trace read, even if the function changed its
            # captured values while tracing (then the next call traces again, as eager
            # would run the changed function).
            return e, a, list(e.caps.slots)

    # -- calling ---------------------------------------------------------------------

    #: A call tries the plain lane first (fucina/plain_lane.py), then :meth:`_general`.
    __call__ = plain_lane.enter

    def _general(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call the plain lane did not take: trace or look up, check, run, deliver."""
        tracer = current_tracer()
        if tracer is not None:
            return self._inline(tracer, args, kwargs)
        entry, a, found = self._lookup(args, kwargs)
        if entry.arg_writes or entry.consumed:
            _check_argument_updates(entry, a, found)
        if entry.slot_writes:
            _check_capture_writes(entry, a, found)
        for prologue in entry.prologues:
            prologue()
        nodes = entry.bound(a, found)
        in_raws = [n.value for n in nodes]
        raws = entry.program.run(in_raws)
        for k in entry.consumed:  # a take_* op consumed this argument, as eager does
            t = a.tensors[k]
            if t._node_ is not None:
                t._node_.value.storage.release()
                t._node_ = None
        for k in entry.clears:  # zero_grad() ran inside the function
            if nodes[k].op == "variable":
                nodes[k].grad = None
        nout = len(entry.out_types)
        call = _CompiledCall(entry, in_raws) if any(entry.out_rg) else None
        diff_nodes = tuple(nodes[k] for k in entry.diff)
        outs = []
        for j, (typ, r) in enumerate(zip(entry.out_types, raws)):
            kind, v = entry.out_ctx[j]
            ctx = (a.tensors[v]._ctx if kind == "arg" else found[v]._ctx if kind == "slot"
                   else v)
            if entry.out_rg[j]:
                node = Node("compiled_call", diff_nodes, {"call": call, "output": j}, r,
                            typ.axis_tags, True)
            else:
                node = leaf(r, typ.axis_tags, False)
            outs.append(typ._from_node(node, ctx, op_result=True))
        sole = entry.program.sole_outputs
        for j, (target, g) in enumerate(zip(entry.grad_targets, raws[nout:]), nout):
            _deliver(nodes[target] if isinstance(target, int) else target, g, j in sole)
        result = _rebuild(entry.structure, outs)
        self._lane.learn(args, kwargs, entry, _rebuild)
        return result

    def _inline(self, tracer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Called inside another trace: the function becomes part of that program."""
        self._check_params(args, kwargs)
        add_root = getattr(tracer, "add_root", None)
        if add_root is not None:
            add_root(self)  # what this function captures is read through it at call time
        out = self.fn(*args, **kwargs)
        self._check_return(out)
        return out

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Entry:
        if current_tracer() is not None:
            raise TypeError(f"{self._name}.ir()/.kernels() need concrete arguments, "
                            "not tensors being traced")
        return self._lookup(args, kwargs)[0]

    def ir(self, *args: Any, **kwargs: Any) -> str:
        """Readable text of the optimized program for these arguments."""
        e = self._entry(args, kwargs)
        notes = []
        for kind, v in e.bindings:
            if kind == "arg":
                notes.append(f"argument tensor {v}")
            elif kind == "slot":
                notes.append("captured: " + cap.describe(e.caps.paths[v][0]).strip()
                             + ", read at each call")
            elif kind == "grad":
                notes.append(f"the gradient of input {v} at each call")
            else:
                notes.append("constant made while tracing")
        return format_program(e.program, notes)

    def kernels(self, *args: Any, **kwargs: Any) -> list[Kernel]:
        """The generated kernels the program runs for these arguments, in order."""
        prog = self._entry(args, kwargs).program
        return [st.kernel for st in prog.steps if st.kernel is not None]

    def cache_size(self) -> int:
        """Traced programs this function holds (all signatures and guard variants)."""
        return sum(len(v) for v in self._cache.values())

    def __reduce__(self) -> tuple[Any, ...]:
        # Only the Python function travels (by reference, or by value under cloudpickle);
        # the unpickling process traces again and loads kernels from its own disk cache.
        return (_recompile, (self.fn,))


#: fn -> the compiled function unpickling gave for it: a module-level function pickles by
#: reference, so every task carrying it shares one Compiled and its traced programs.
_UNPICKLED: weakref.WeakKeyDictionary[Any, Compiled] = weakref.WeakKeyDictionary()
_UNPICKLED_LOCK = threading.Lock()


def _recompile(fn: Callable[..., Any]) -> Compiled:
    """Unpickle a compiled function: the one this process already made for ``fn``, else new."""
    with _UNPICKLED_LOCK:
        try:
            hit = _UNPICKLED.get(fn)
        except TypeError:  # unhashable or not weakly referenceable: no sharing
            return Compiled(fn)
        if hit is None:
            hit = Compiled(fn)
            try:
                _UNPICKLED[fn] = hit
            except TypeError:
                pass
        return hit


def _deliver(node: Node, grad: RawTensor, sole: bool) -> None:
    """Hand a gradient the compiled backward produced to its real destination.

    A variable without a gradient takes the program's fresh result buffer as
    its gradient when the program gave it whole to this output alone (``sole``)
    and nothing else holds it: what accumulate's copy would give, without the copy.
    """
    if sole and node.op == "variable" and node.grad is None and grad.dtype is DType.f32:
        st = grad.storage
        buf = st.buf
        # the storage slot, this local and getrefcount's argument: nobody else
        if (buf is not None and buf.base is None and st.refs == 1 and not st.readonly
                and not st.borrowed and sys.getrefcount(buf) <= 3):
            node.grad = grad
            return
    seed = leaf(grad, None, False)
    with no_grad():
        if node.op == "variable":
            autodiff.accumulate(node, seed)
        else:  # an argument computed in an eager graph: continue backward into it
            autodiff.backward(node, seed)


def _rebuild(s: Any, outs: list[Any]) -> Any:
    """Put results back into the traced output structure (no closure: no ref cycle)."""
    tag, payload = s
    if tag == "t":
        return outs[payload]
    if tag == "v":
        return payload
    if tag is dict:
        return {k: _rebuild(x, outs) for k, x in payload}
    return _remake(tag, [_rebuild(x, outs) for x in payload])


def _remake(cls: Any, items: list[Any]) -> Any:
    """A tuple or list of ``cls`` holding ``items`` (a namedtuple, such as sort's
    ``TopKResult``, takes them as its fields)."""
    make = getattr(cls, "_make", None)
    return make(items) if make is not None else cls(items)


def compile(fn: Callable[..., Any]) -> Compiled:
    """Trace ``fn`` per input signature into an optimized program of fused kernels.

    Results equal the eager call's. Tensors ``fn`` reaches outside its arguments
    (closures, globals, defaults, the attributes of objects and classes it uses) are
    read again at every call; Python values it reads there are guarded, and a changed
    one traces again. Python code with its own side effects (``random.random()``,
    ``next(iterator)``, printing) runs once per trace, not once per call: keep such
    state in tensors or arguments.
    """
    return Compiled(fn)


def _program_cache() -> tuple[int, int]:
    """(programs held by all live compiled functions, the per-function signature bound)."""
    return sum(c.cache_size() for c in list(_LIVE)), PROGRAM_CACHE_SIZE


SIZE_SOURCES["program_cache"] = _program_cache

