"""``fucina.compile(fn)``: trace a function into the IR and run it as kernels.

The first call per input signature (tensor types, shapes, strides, static
arguments) traces ``fn`` with symbolic tensors that carry tags, dtype, shape
and layout but no data; tag errors surface then, at the user's line, and
``Tensor(...)`` annotations on parameters and the return value are checked.
The traced IR becomes a :class:`~fucina.ir.program.Program` (fused kernels,
views folded, intermediates reusing buffers), cached per signature.

A function that calls ``backward()`` compiles forward and backward into one
program; its gradients reach the variables (and eager graphs) they belong to
when the program runs. A function whose results still require grad (the
caller will differentiate them) runs eagerly, so the graph exists.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from .errors import TagError
from .ir import autodiff
from .ir.execute import set_tracer
from .ir.graph import Node, leaf
from .ir.printer import format_program
from .ir.program import Program
from .kernels.cache import Kernel
from .runtime.context import ExecContext
from .runtime.gradmode import is_grad_enabled, no_grad
from .runtime.raw import RawTensor
from .runtime.storage import Storage


def _is_tensor(x: Any) -> bool:
    return getattr(type(x), "axis_tags", None) is not None and hasattr(x, "_node_")


def _is_tensor_type(t: Any) -> bool:
    return isinstance(t, type) and getattr(t, "axis_tags", None) is not None


class _Recorder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.grads: list[tuple[Node, Node]] = []

    def record(self, node: Node) -> None:
        self.nodes.append(node)

    def gradient(self, leaf: Node, grad: Node) -> None:
        self.grads.append((leaf, grad))


class _Traced:
    """One signature's program, how to rebuild its outputs, where gradients go."""

    def __init__(self, program: Program | None, structure: Any, out_types: list[Any],
                 grad_targets: list[Any], eager_only: bool = False):
        self.program = program
        self.structure = structure
        self.out_types = out_types
        # Per gradient output: an argument index (its symbolic input) or a leaf node.
        self.grad_targets = grad_targets
        self.eager_only = eager_only


class Compiled:
    """A traced, optimized version of ``fn`` (see :func:`compile`)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._cache: dict[Any, _Traced] = {}
        functools.update_wrapper(self, fn)
        self._hints: dict[str, Any] | None = None

    # -- signatures ----------------------------------------------------------------

    def _signature(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        parts: list[Any] = []
        for a in list(args) + [kwargs[k] for k in sorted(kwargs)]:
            if _is_tensor(a):
                raw = a._node.value
                parts.append((type(a), raw.shape, raw.strides, a._node.requires_grad))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(
                        f"compiled functions take tensors and hashable static values; got "
                        f"{type(a).__name__}") from None
                parts.append(("static", a))
        return (tuple(parts), tuple(sorted(kwargs)), is_grad_enabled())

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
                    f"{self.fn.__name__}: parameter {name!r} is annotated {ann!r}, "
                    f"got {type(value)!r}")

    def _check_return(self, out: Any) -> None:
        ann = self._annotations().get("return")
        if _is_tensor_type(ann) and type(out) is not ann:
            raise TagError(f"{self.fn.__name__}: return is annotated {ann!r}, got {type(out)!r}")

    # -- tracing -----------------------------------------------------------------------

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Traced:
        self._check_params(args, kwargs)
        inputs: list[Node] = []

        def symbolic(a: Any) -> Any:
            if not _is_tensor(a):
                return a
            raw = a._node.value
            sym = RawTensor(Storage(None), raw.dtype, raw.shape, raw.strides, 0)
            rg = a._node.requires_grad and is_grad_enabled()
            node = Node("input", (), {"index": len(inputs)}, sym, a.axis_tags, rg)
            inputs.append(node)
            return type(a)._from_node(node, a._ctx)

        sargs = tuple(symbolic(a) for a in args)
        skw = {k: symbolic(kwargs[k]) for k in sorted(kwargs)}  # the order run() binds
        rec = _Recorder()
        prev = set_tracer(rec)
        try:
            out = self.fn(*sargs, **skw)
        finally:
            set_tracer(prev)
        self._check_return(out)
        flat: list[Any] = []

        def flatten(o: Any) -> Any:
            if _is_tensor(o):
                flat.append(o)
                return ("t", len(flat) - 1)
            if isinstance(o, (tuple, list)):
                return (type(o), [flatten(x) for x in o])
            return ("v", o)

        structure = flatten(out)
        out_types = [type(t) for t in flat]
        if not rec.grads and any(t._node.requires_grad for t in flat):
            # A result still in a graph: the caller will differentiate it, so the
            # eager graph must exist. Run this signature eagerly.
            return _Traced(None, structure, out_types, [], eager_only=True)
        by_id = {id(n): k for k, n in enumerate(inputs)}
        targets = [by_id.get(id(leaf_), leaf_) for leaf_, _ in rec.grads]
        program = Program(inputs, [t._node for t in flat] + [g for _, g in rec.grads])
        return _Traced(program, structure, out_types, targets)

    def _traced(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Traced:
        key = self._signature(args, kwargs)
        tr = self._cache.get(key)
        if tr is None:
            tr = self._cache[key] = self._trace(args, kwargs)
        return tr

    # -- calling -----------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = list(args) + [kwargs[k] for k in sorted(kwargs)]
        tensors = [a for a in values if _is_tensor(a)]
        tr = self._traced(args, kwargs)
        if tr.eager_only:
            return self.fn(*args, **kwargs)
        assert tr.program is not None  # only eager-only signatures have no program
        ctx = tensors[0]._ctx if tensors else ExecContext()
        raws = tr.program.run([t._node.value for t in tensors])
        nout = len(tr.out_types)
        outs = [typ._from_node(leaf(r, typ.axis_tags, False), ctx, op_result=True)
                for typ, r in zip(tr.out_types, raws)]
        for target, g in zip(tr.grad_targets, raws[nout:]):
            _deliver(tensors[target]._node if isinstance(target, int) else target, g)
        return _rebuild(tr.structure, outs)

    def ir(self, *args: Any, **kwargs: Any) -> str:
        """Readable text of the optimized program for these arguments."""
        return format_program(self._traced(args, kwargs).program)

    def kernels(self, *args: Any, **kwargs: Any) -> list[Kernel]:
        """The generated kernels the program runs for these arguments, in order."""
        prog = self._traced(args, kwargs).program
        assert prog is not None, "this signature runs eagerly: it has no kernels"
        return [st.kernel for st in prog.steps if st.kernel is not None]


def _deliver(node: Node, grad: RawTensor) -> None:
    """Hand a gradient the compiled backward produced to its real destination."""
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
    return tag(_rebuild(x, outs) for x in payload)


def compile(fn: Callable[..., Any]) -> Compiled:
    """Trace ``fn`` per input signature into an optimized program of fused kernels."""
    return Compiled(fn)
