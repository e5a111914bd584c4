"""Inference helpers: bias adds, in-place updates and storage-consuming arithmetic (f32).

``bias_add`` is an ordinary out-of-place op (self's gradient passes through;
the bias is a constant). The in-place helpers write into the tensor's own
storage, so every view of it sees the new values; the ``take_*`` helpers
consume the tensor (any later use raises Deinitialized) and reuse its buffer
when nothing else can observe it. All of these reject operands that require
grad (UnsupportedGradient).

Under ``fucina.compile`` an in-place update is recorded by the tracer
(``update``): later reads in the trace see the new value, and the program
writes it into the argument's (or captured tensor's) storage at every call,
as the optimizers' ``assign`` does, with eager's checks on the caller's
tensor; a take_* op consumes the argument it was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import ActiveExecScopeUnsupported, ShapeMismatch, TagError, UnsupportedGradient
from ..ir.execute import current_tracer, emit
from ..ir.graph import Node, leaf
from ..kernels import inplace as K
from ..kernels.elementwise import PUBLIC_UNARY
from ..runtime.gradmode import no_grad
from .arguments import real_arg
from .base import (
    Tensor,
    align_node,
    broadcast_sizes,
    check_tensor,
    new,
    operand_requires_grad,
    result,
    same_ctx,
)
from .math import same_shape
from .norms import spread
from .structural import _const
from .unary import f32_param

if TYPE_CHECKING:
    from typing_extensions import Self

Vector = Sequence[float] | np.ndarray | Tensor


def _no_grad_operands(what: str, *xs: Any) -> None:
    for x in xs:
        if isinstance(x, Tensor) and operand_requires_grad(x):
            raise UnsupportedGradient(f"{what} is an inference helper: its operands must not "
                                      "require grad")


def _vector(self: Any, v: Any, n: int, what: str) -> Node:
    """A length-``n`` f32 vector from a sequence, numpy array or rank-1 f32 tensor."""
    if isinstance(v, Tensor):
        check_tensor(v, what)
        same_ctx(self, v)
        if v.dtype is not DType.f32 or v.tag_count != 1:
            raise TagError(f"{what} must be a rank-1 f32 tensor, got {v!r}")
        if operand_requires_grad(v):
            raise UnsupportedGradient(f"{what} is a constant here (no gradient); use add() "
                                      "for a trainable bias")
        if v.shape[0] != n:
            raise ShapeMismatch(f"{what} has {v.shape[0]} elements, expected {n}")
        return v._node
    try:
        arr = np.asarray(v, dtype=np.float32)
    except OverflowError:
        raise ValueError(f"{what} holds an integer beyond float32's range") from None
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of numbers, a numpy array or a tensor; "
                        f"got {type(v).__name__}") from None
    if arr.ndim != 1 or arr.size != n:
        raise ShapeMismatch(f"{what} has shape {arr.shape}, expected ({n},)")
    return _const(DType.f32, arr)


def _axis_vector(self: Any, bias: Any, axis_tag: str, last_only: bool) -> Node:
    axis = T.index(self.axis_tags, T.check_tag(axis_tag))
    if last_only and axis != self.tag_count - 1:
        raise TagError(f"the in-place axis vector runs along the last axis "
                       f"{self.axis_tags[-1]!r}, not {axis_tag!r}")
    vec = _vector(self, bias, self.shape[axis], "bias")
    return spread(vec, tuple(self.shape), tuple(int(k == axis) for k in range(self.tag_count)))


def _update_in_place(self: Any, what: str, build: Any) -> None:
    """Compute ``build(self node)`` and write it into self's own storage (while tracing:
    record the write; the program performs it)."""
    node = self._node
    raw = node.value
    K.check_target(raw, what)  # a traced argument's read-only flag is checked per call
    with no_grad():
        y = build(node)
    tracer: Any = current_tracer()
    if tracer is not None:
        tracer.update(node, y, what)
        return
    K.write(raw, y.value)


def _consume(self: Any, what: str, inplace: Any, functional: Any) -> Any:
    """The take_* protocol: reuse self's buffer when exclusive, else a fresh result; self is
    consumed either way."""
    if self._scoped:
        raise ActiveExecScopeUnsupported(
            f"{what} consumes its tensor, which an exec scope owns; use the out-of-place op "
            "inside a scope")
    node = self._node
    raw = node.value
    if current_tracer() is None and K.exclusive(raw):
        inplace(raw)
        out = new(type(self), leaf(raw, self.axis_tags, False), self._ctx)
        self._node_ = None  # the buffer now belongs to the result
        return out
    tracer: Any = current_tracer()
    with no_grad():
        out = result(self, self.axis_tags, functional(node))
    if tracer is None:
        raw.storage.release()
    elif raw.is_symbolic:
        tracer.consume(node)  # an argument: every call consumes the caller's tensor
    self._node_ = None
    return out


class InPlace(Tensor):
    """bias_add, in-place axis-vector / scaled adds, and the consuming take_* ops (f32)."""

    __slots__ = ()

    def bias_add(self, bias: Vector, axis_tag: str) -> Self:
        """self + bias along ``axis_tag`` (a new tensor). ``bias`` (a sequence, numpy array
        or rank-1 f32 tensor of dim(axis_tag) values) is a constant: self's gradient
        passes through, the bias gets none (use add() for a trainable bias)."""
        b = _axis_vector(self, bias, axis_tag, last_only=False)
        return result(self, self.axis_tags, emit("binary", (self._node, b), fn="add"))

    def add_axis_vector_in_place(self, bias: Vector, axis_tag: str) -> None:
        """self += bias along the last axis ``axis_tag``, in self's storage."""
        _no_grad_operands("add_axis_vector_in_place", self, bias)
        b = _axis_vector(self, bias, axis_tag, last_only=True)
        _update_in_place(self, "add_axis_vector_in_place",
                         lambda x: emit("binary", (x, b), fn="add"))

    def add_axis_vector_unary_in_place(self, op: str, bias: Vector, axis_tag: str) -> None:
        """self = op(self + bias) along the last axis ``axis_tag``, in self's storage;
        ``op`` is a unary op name (``unary``'s set, e.g. "gelu")."""
        if not isinstance(op, str) or op not in PUBLIC_UNARY:
            raise TagError(f"unknown unary op {op!r}; expected one of {PUBLIC_UNARY}")
        _no_grad_operands("add_axis_vector_unary_in_place", self, bias)
        b = _axis_vector(self, bias, axis_tag, last_only=True)
        _update_in_place(self, "add_axis_vector_unary_in_place",
                         lambda x: emit("unary", (emit("binary", (x, b), fn="add"),), fn=op))

    def add_scaled_in_place(self, other: Tensor, alpha: float) -> None:
        """self += alpha * other (same tags, any order, and sizes), in self's storage."""
        check_tensor(other, "other")
        same_ctx(self, other)
        _no_grad_operands("add_scaled_in_place", self, other)
        if other.dtype is not self.dtype:
            raise TagError(f"other dtype {other.dtype.value} differs from {self.dtype.value}")
        o = same_shape(self, other, "add_scaled_in_place")
        a = f32_param(alpha, "alpha")

        def build(x: Node) -> Node:
            return emit("binary", (x, emit("scalar", (o,), fn="mul", value=a)), fn="add")

        _update_in_place(self, "add_scaled_in_place", build)

    def take_add_no_grad(self, other: Tensor) -> Self:
        """self + other (other broadcast into self's tags and sizes), consuming self: its
        buffer holds the result when nothing else views it. Self is deinitialized."""
        check_tensor(other, "other")
        same_ctx(self, other)
        _no_grad_operands("take_add_no_grad", self, other)
        if other.dtype is not self.dtype:
            raise TagError(f"other dtype {other.dtype.value} differs from {self.dtype.value}")
        extra = [t for t in other.axis_tags if t not in self.axis_tags]
        if extra:
            raise TagError(f"take_add_no_grad keeps self's tags {self.axis_tags}; other has "
                           f"{tuple(extra)} too")
        if broadcast_sizes(self, other, self.axis_tags) != tuple(self.shape):
            raise ShapeMismatch(f"other sizes {dict(zip(other.axis_tags, other.shape))} do "
                                f"not broadcast to {dict(zip(self.axis_tags, self.shape))}")
        o = align_node(other, self.axis_tags, self.shape)
        return _consume(self, "take_add_no_grad", lambda raw: K.add_into(raw, o.value),
                        lambda x: emit("binary", (x, o), fn="add"))

    def take_scale_no_grad(self, s: float) -> Self:
        """self * s, consuming self (its buffer is reused when nothing else views it)."""
        _no_grad_operands("take_scale_no_grad", self)
        s = real_arg(s, "scale")
        return _consume(self, "take_scale_no_grad", lambda raw: K.scale_into(raw, s),
                        lambda x: emit("scalar", (x,), fn="mul", value=s))
