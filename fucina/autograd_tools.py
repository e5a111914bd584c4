"""Autograd utilities over callables: checkpointing, custom VJPs, gradient checks.

- :func:`checkpoint` / :func:`checkpoint_with_context` run a block without
  recording and keep only its inputs and output; backward re-runs the block
  on the same inputs and differentiates the re-run.
- :func:`custom_vjp` admits an op whose backward the caller writes.
- :func:`gradcheck` compares analytical gradients with central differences.

Checkpoints and custom VJPs are one IR primitive (``custom``, see
:mod:`fucina.ir.custom`), so under :func:`fucina.compile` their backward
(the re-run block, the user's backward) becomes part of the program.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import DType
from .errors import (
    CheckpointMissingInputGradient,
    CheckpointOutputNotDifferentiable,
    ContextMismatch,
    InvalidGradcheckOptions,
    MissingAnalyticalGradient,
    MissingBackwardGradient,
    NestedCheckpointRecompute,
    NoVariableInputs,
    ShapeMismatch,
    TagError,
    UnsupportedView,
)
from .ir import autodiff
from .ir.custom import custom, grad_sink
from .ir.execute import current_tracer, emit
from .ir.graph import Node
from .runtime.gradmode import enable_grad, is_grad_enabled, no_grad
from .tensor import Tensor


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) and type(x).axis_tags is not None


def _tensor_inputs(inputs: Any, what: str) -> tuple[Any, ...]:
    """``inputs`` as a tuple of live f32 tensors on one context."""
    if _is_tensor(inputs) or not isinstance(inputs, (tuple, list)):
        raise TypeError(f"{what}: inputs must be a tuple or list of tensors, got "
                        f"{type(inputs).__name__} (write (x,) for one input)")
    out = tuple(inputs)
    for k, x in enumerate(out):
        if not _is_tensor(x):
            raise TypeError(f"{what}: inputs[{k}] must be a fucina tensor, got "
                            f"{type(x).__name__}")
        x._node  # noqa: B018 - raises Deinitialized
        if x.dtype is not DType.f32:
            raise TagError(f"{what}: inputs[{k}] is {type(x)!r}; inputs must be f32 tensors "
                           "(pass other tensors through extra)")
        if x._ctx is not out[0]._ctx:
            raise ContextMismatch(f"{what}: inputs[{k}] belongs to a different ExecContext")
    return out


def _f32_result(y: Any, what: str) -> Any:
    if not _is_tensor(y):
        raise TypeError(f"{what} must return one fucina tensor, got {type(y).__name__}")
    y._node  # noqa: B018
    if y.dtype is not DType.f32:
        raise TagError(f"{what} must return an f32 tensor, got {type(y)!r}")
    return y


def _alias(node: Node) -> Node:
    """A no-grad identity view of ``node`` (shares storage; traced like any view)."""
    r = len(node.shape)
    coeffs = tuple(tuple(1 if j == k else 0 for j in range(r)) for k in range(r))
    with no_grad():
        return emit("view", (node,), shape=node.shape, coeffs=coeffs, base=(0,) * r)


def _wrap(cls: Any, node: Node, ctx: Any, *, op_result: bool = False) -> Any:
    node.tags = cls.axis_tags
    return cls._from_node(node, ctx, op_result=op_result)


def _no_grad_result(y: Any) -> Any:
    """``y`` itself unless it still requires grad (a block returning an input)."""
    if not y.requires_grad:
        return y
    return _wrap(type(y), _alias(y._node), y._ctx, op_result=True)


# -- custom_vjp ------------------------------------------------------------------------


def custom_vjp(Spec: Any, extra: Any, inputs: Sequence[Any]) -> Any:
    """A differentiable op whose backward ``Spec`` supplies.

    ``Spec.forward(extra, *inputs)`` computes the result (nothing inside is
    recorded); ``Spec.backward(extra, inputs, output, grad_output)`` returns one
    gradient tensor (or None) per input. An optional ``Spec.Output`` tensor type
    is checked against the forward's result. Every input that requires grad must
    get a gradient of its own tags and shape (tags in another order are
    permuted back).
    """
    ins = _tensor_inputs(inputs, "custom_vjp")
    name = getattr(Spec, "__name__", type(Spec).__name__)
    for fn in ("forward", "backward"):
        if not callable(getattr(Spec, fn, None)):
            raise TypeError(f"custom_vjp: {name} has no callable {fn}(...)")
    want = getattr(Spec, "Output", None)
    if want is not None and not (isinstance(want, type) and issubclass(want, Tensor)
                                 and want.axis_tags is not None):
        raise TypeError(f"custom_vjp: {name}.Output must be a tensor type, got {want!r}")
    with no_grad():
        out = _f32_result(Spec.forward(extra, *ins), f"{name}.forward")
    if want is not None and type(out) is not want:
        raise TagError(f"{name}.forward returned {type(out)!r}, {name}.Output is {want!r}")
    if not (is_grad_enabled() and any(x.requires_grad for x in ins)):
        return _no_grad_result(out)
    ctx = out._ctx
    in_types = tuple(type(x) for x in ins)
    out_type = type(out)

    def vjp(node: Node, g: Node) -> tuple[Node | None, ...]:
        operands = node.inputs[1:]
        xs = tuple(_wrap(t, _alias(n), ctx) for t, n in zip(in_types, operands))
        y = _wrap(out_type, _alias(node.inputs[0]), ctx)
        gy = _wrap(out_type, _alias(g), ctx)
        got = Spec.backward(extra, xs, y, gy)
        return _check_grads(name, got, in_types, operands)

    node = custom(out._node, tuple(x._node for x in ins), vjp)
    return _wrap(out_type, node, ctx, op_result=True)


def _check_grads(name: str, got: Any, in_types: tuple[Any, ...],
                 operands: tuple[Node, ...]) -> tuple[Node | None, ...]:
    """The backward's gradients as f32 nodes shaped like their inputs."""
    n = len(in_types)
    if n == 1 and (got is None or _is_tensor(got)):
        got = (got,)
    if not isinstance(got, (tuple, list)) or len(got) != n:
        raise TypeError(f"{name}.backward must return {n} gradient(s) (a tensor or None per "
                        f"input), got {type(got).__name__}"
                        + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""))
    out: list[Node | None] = []
    for k, (gr, typ, node) in enumerate(zip(got, in_types, operands)):
        if gr is None:
            if node.requires_grad:
                raise MissingBackwardGradient(
                    f"{name}.backward returned None for input {k}, which requires grad")
            out.append(None)
            continue
        if not _is_tensor(gr):
            raise TypeError(f"{name}.backward: gradient {k} must be a fucina tensor or None, "
                            f"got {type(gr).__name__}")
        tags = typ.axis_tags
        if tuple(gr.axis_tags) != tuple(tags):
            if sorted(gr.axis_tags) != sorted(tags):
                raise TagError(f"{name}.backward: gradient {k} has tags {gr.axis_tags}, input "
                               f"{k} has {tags}")
            gr = gr.permute_to(tags)
        if tuple(gr.shape) != tuple(node.shape):
            raise ShapeMismatch(f"{name}.backward: gradient {k} has shape {gr.shape}, input {k} "
                                f"has shape {node.shape}")
        if not gr.dtype.is_float:
            raise TypeError(f"{name}.backward: gradient {k} is {gr.dtype.value}, not a float")
        gn = gr._node
        if gn.dtype is not DType.f32:
            gn = emit("cast", (gn,), dtype=DType.f32, src=gn.dtype)
        out.append(gn)
    return tuple(out)


# -- checkpoint -----------------------------------------------------------------------

_recompute = threading.local()


def checkpoint(fn: Callable[..., Any], inputs: Sequence[Any]) -> Any:
    """``fn(*inputs)``, keeping only the inputs and the output for backward.

    The block runs without recording; backward re-runs it on the same inputs
    (so it must be deterministic: dropout with explicit seeds qualifies) and
    differentiates the re-run. Gradients flow to ``inputs`` only: variables the
    block reaches otherwise are treated as constants. Whether the result records
    depends on the inputs alone, as in the reference (not on ``no_grad``). A
    checkpoint inside a checkpointed block raises ``NestedCheckpointRecompute``
    when backward re-runs it.
    """
    return _checkpoint(fn, (), inputs, "checkpoint")


def checkpoint_with_context(fn: Callable[..., Any], extra: Any, inputs: Sequence[Any]) -> Any:
    """``checkpoint`` of ``fn(extra, *inputs)``: ``extra`` is passed verbatim to the
    forward run and the re-run and never receives gradients (frozen weights,
    tables, configuration)."""
    return _checkpoint(fn, (extra,), inputs, "checkpoint_with_context")


def _checkpoint(fn: Callable[..., Any], lead: tuple[Any, ...], inputs: Sequence[Any],
                what: str) -> Any:
    if not callable(fn):
        raise TypeError(f"{what}: fn must be callable, got {type(fn).__name__}")
    ins = _tensor_inputs(inputs, what)
    block = getattr(fn, "__name__", "block")
    with no_grad():
        out = _f32_result(fn(*lead, *ins), f"{what} block {block}")
    if not any(x.requires_grad for x in ins):
        return _no_grad_result(out)
    ctx = out._ctx
    in_types = tuple(type(x) for x in ins)
    out_type = type(out)

    def vjp(node: Node, g: Node) -> tuple[Node | None, ...]:
        if getattr(_recompute, "active", False):
            raise NestedCheckpointRecompute(
                f"{what} block {block} re-ran inside another checkpoint's recompute; "
                "checkpointed blocks must not contain checkpoints")
        operands = node.inputs[1:]
        grads: list[Node | None] = [None] * len(operands)

        def collector(k: int) -> Callable[[Node], None]:
            def collect(gk: Node) -> None:
                grads[k] = gk
            return collect

        _recompute.active = True
        try:
            with enable_grad():
                xs = [_wrap(t, grad_sink(n, collector(k)), ctx)
                      for k, (t, n) in enumerate(zip(in_types, operands))]
                y = _f32_result(fn(*lead, *xs), f"{what} block {block}")
            if not y.requires_grad:
                raise CheckpointOutputNotDifferentiable(
                    f"{what} block {block}: the re-run output has no gradient graph")
            if tuple(y.shape) != tuple(g.shape):
                raise ShapeMismatch(f"{what} block {block}: the re-run output has shape "
                                    f"{y.shape}, the first run {g.shape}")
            autodiff.backward(y._node, g, deliver=_drop)
        finally:
            _recompute.active = False
        for k, n in enumerate(operands):
            if n.requires_grad and grads[k] is None:
                raise CheckpointMissingInputGradient(
                    f"{what} block {block}: input {k} requires grad but received no gradient")
        return tuple(grads)

    node = custom(out._node, tuple(x._node for x in ins), vjp, record_always=True)
    return _wrap(out_type, node, ctx, op_result=True)


def _drop(leaf: Node, g: Node) -> None:
    """Leaves reached by a recompute other than through its inputs get nothing."""


# -- gradcheck ------------------------------------------------------------------------


@dataclass(frozen=True)
class GradcheckResult:
    """Outcome of :func:`gradcheck`.

    ``checked`` counts the elements compared; ``max_abs_error`` is the largest
    ``|numerical - analytical|`` and ``max_rel_error`` the largest such error
    divided by ``|analytical|`` over elements whose analytical value is nonzero;
    ``passed`` holds when every element satisfies
    ``|numerical - analytical| <= atol + rtol * |analytical|``.
    """

    checked: int
    max_abs_error: float
    max_rel_error: float
    passed: bool


def _option(value: Any, name: str, positive: bool) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):  # (an int beyond float)
        raise InvalidGradcheckOptions(f"gradcheck: {name} must be a number, got "
                                      f"{value!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        need = "finite and positive" if positive else "finite and non-negative"
        raise InvalidGradcheckOptions(f"gradcheck: {name} must be {need}, got {value!r}")
    return v


def gradcheck(fn: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-3,
              atol: float = 1e-2, rtol: float = 1e-2) -> GradcheckResult:
    """Compare ``fn``'s analytical gradients with central differences.

    ``fn(*inputs)`` must return a scalar (``fucina.Tensor()``) f32 loss and be
    deterministic. Every variable among ``inputs`` is checked element by
    element (each is perturbed in place by ``+-eps`` and restored); constants
    are passed through. A mismatch gives ``passed=False``; invalid options or
    inputs raise. Inputs and every gradient are left as they were found: the
    analytical pass delivers its gradients to the check only.
    """
    eps = _option(eps, "eps", True)
    atol = _option(atol, "atol", False)
    rtol = _option(rtol, "rtol", False)
    if not callable(fn):
        raise TypeError(f"gradcheck: fn must be callable, got {type(fn).__name__}")
    if current_tracer() is not None:
        raise TypeError("gradcheck evaluates fn many times on real data; call it outside "
                        "fucina.compile")
    ins = _tensor_inputs(inputs, "gradcheck")
    checked = [k for k, x in enumerate(ins) if x._node.op == "variable"]
    if not checked:
        raise NoVariableInputs("gradcheck: no input is a variable (nothing to check)")
    for k in checked:
        raw = ins[k]._node.value
        if not raw.is_contiguous():
            raise UnsupportedView(f"gradcheck: input {k} is not contiguous; it is perturbed "
                                  "element by element in its own storage")
        if raw.storage.readonly:
            raise UnsupportedView(f"gradcheck: input {k} has read-only storage")
    analytical = _analytical(fn, ins, checked)
    with no_grad():
        numerical = [_numerical(fn, ins, k, eps) for k in checked]
    count, max_abs, max_rel, passed = 0, 0.0, 0.0, True
    for ana, num in zip(analytical, numerical):
        err = np.abs(num - ana)
        count += err.size
        if err.size:
            max_abs = max(max_abs, float(np.max(err)))
            nz = ana != 0
            if nz.any():
                max_rel = max(max_rel, float(np.max(err[nz] / np.abs(ana[nz]))))
            ok = err <= atol + rtol * np.abs(ana)
            passed = passed and bool(np.all(ok))
            if np.isnan(err).any():
                max_abs = max_rel = math.nan
    return GradcheckResult(count, max_abs, max_rel, passed)


def _scalar_loss(fn: Callable[..., Any], ins: tuple[Any, ...]) -> Any:
    loss = fn(*ins)
    if not _is_tensor(loss):
        raise TypeError(f"gradcheck: fn must return a scalar tensor, got {type(loss).__name__}")
    if loss.axis_tags != () or loss.dtype is not DType.f32:
        raise TagError(f"gradcheck: fn must return an f32 scalar (fucina.Tensor()), got "
                       f"{type(loss)!r}")
    return loss


def _analytical(fn: Callable[..., Any], ins: tuple[Any, ...],
                checked: list[int]) -> list[np.ndarray]:
    """d loss / d input for the checked inputs, delivered to nobody else's gradient."""
    loss = _scalar_loss(fn, ins)
    if not loss.requires_grad:
        raise MissingAnalyticalGradient("gradcheck: the loss does not depend on any variable "
                                        "input (no gradient graph)")
    want = {id(ins[k]._node): k for k in checked}
    got: dict[int, np.ndarray] = {}

    def deliver(leaf: Node, g: Node) -> None:
        k = want.get(id(leaf))
        if k is not None:
            got[k] = np.array(g.value.array(), dtype=np.float64).reshape(-1)

    node = loss._node
    seed = emit("fill", (), shape=node.shape, dtype=DType.f32, value=1.0)
    autodiff.backward(node, seed, deliver=deliver)
    missing = [k for k in checked if k not in got]
    if missing:
        raise MissingAnalyticalGradient(f"gradcheck: backward produced no gradient for "
                                        f"input {missing[0]}")
    return [got[k] for k in checked]


def _numerical(fn: Callable[..., Any], ins: tuple[Any, ...], k: int, eps: float) -> np.ndarray:
    flat = ins[k]._node.value.flat()
    out = np.empty(flat.size, dtype=np.float64)
    for i in range(flat.size):
        orig = flat[i]
        try:
            flat[i] = orig + np.float32(eps)
            hi = float(flat[i])
            f_hi = float(_scalar_loss(fn, ins).item())
            flat[i] = orig - np.float32(eps)
            lo = float(flat[i])
            f_lo = float(_scalar_loss(fn, ins).item())
        finally:
            flat[i] = orig
        if hi == lo:
            raise InvalidGradcheckOptions(
                f"gradcheck: eps={eps} does not change input {k} element {i} "
                f"(value {float(orig)}) in f32; use a larger eps")
        # Divide by the step actually taken: orig +- eps rounds in f32.
        out[i] = (f_hi - f_lo) / (hi - lo)
    return out
