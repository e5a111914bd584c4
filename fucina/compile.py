"""``fucina.compile(fn)``: trace a function into the IR and run it as kernels.

The first call per input signature (tensor types, shapes, strides, static
arguments) traces ``fn`` with symbolic tensors that carry tags, dtype, shape
and layout but no data; tag errors surface then, at the user's line, and
``Tensor(...)`` annotations on parameters and the return value are checked.
The traced IR becomes a :class:`~fucina.ir.program.Program` (fused kernels,
views folded, intermediates reusing buffers), cached per signature.

Compiled programs compute values without recording gradients: when gradients
are being recorded for an argument that requires grad, the call runs ``fn``
eagerly instead, so autograd sees every op.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from .errors import TagError
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

    def record(self, node: Node) -> None:
        self.nodes.append(node)


class _Traced:
    """One signature's program and how to rebuild its outputs."""

    def __init__(self, program: Program, structure: Any, out_types: list[type]):
        self.program = program
        self.structure = structure
        self.out_types = out_types


class Compiled:
    """A traced, optimized version of ``fn`` (see :func:`compile`)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._cache: dict[Any, _Traced] = {}
        functools.update_wrapper(self, fn)
        self._hints: dict[str, Any] | None = None

    # -- signatures ----------------------------------------------------------------

    def _signature(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        parts = []
        for a in list(args) + [kwargs[k] for k in sorted(kwargs)]:
            if _is_tensor(a):
                raw = a._node.value
                parts.append((type(a), raw.shape, raw.strides))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(
                        f"compiled functions take tensors and hashable static values; got "
                        f"{type(a).__name__}") from None
                parts.append(("static", a))
        return (tuple(parts), tuple(sorted(kwargs)))

    def _annotations(self) -> dict[str, Any]:
        if self._hints is None:
            try:
                self._hints = typing.get_type_hints(self.fn)
            except Exception:  # noqa: BLE001 - unresolvable hints are simply not checked
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

        def placeholder(a: Any) -> Any:
            if not _is_tensor(a):
                return a
            raw = a._node.value
            sym = RawTensor(Storage(None), raw.dtype, raw.shape, raw.strides, 0)
            node = Node("input", (), {"index": len(inputs)}, sym, a.axis_tags, False)
            inputs.append(node)
            return type(a)._from_node(node, a._ctx)

        sargs = tuple(placeholder(a) for a in args)
        skw = {k: placeholder(v) for k, v in kwargs.items()}
        rec = _Recorder()
        prev = set_tracer(rec)
        try:
            with no_grad():
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
        program = Program(inputs, [t._node for t in flat])
        return _Traced(program, structure, [type(t) for t in flat])

    def _traced(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Traced:
        key = self._signature(args, kwargs)
        tr = self._cache.get(key)
        if tr is None:
            tr = self._cache[key] = self._trace(args, kwargs)
        return tr

    # -- calling -----------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in list(args) + list(kwargs.values()) if _is_tensor(a)]
        if is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.fn(*args, **kwargs)  # autograd needs the eager graph
        tr = self._traced(args, kwargs)
        ctx = tensors[0]._ctx if tensors else ExecContext()
        raws = tr.program.run([t._node.value for t in tensors])
        outs = [typ._from_node(leaf(r, typ.axis_tags, False), ctx, op_result=True)
                for typ, r in zip(tr.out_types, raws)]
        return _rebuild(tr.structure, outs)

    def ir(self, *args: Any, **kwargs: Any) -> str:
        """Readable text of the optimized program for these arguments."""
        return format_program(self._traced(args, kwargs).program)

    def kernels(self, *args: Any, **kwargs: Any) -> list[Kernel]:
        """The generated kernels the program runs for these arguments, in order."""
        prog = self._traced(args, kwargs).program
        return [st.kernel for st in prog.steps if st.kind == "kernel"]


def _rebuild(s: Any, outs: list[Any]) -> Any:
    """Put results back into the traced output structure (no closure: no ref cycle)."""
    tag, payload = s
    if tag == "t":
        return outs[payload]
    if tag == "v":
        return payload
    return tag(_rebuild(x, outs) for x in payload)


def compile(fn: Callable[..., Any]) -> Compiled:  # noqa: A001 - the public name
    """Trace ``fn`` per input signature into an optimized program of fused kernels."""
    return Compiled(fn)
