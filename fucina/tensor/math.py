"""Pointwise math, comparisons, logic and reductions, broadcasting by tag name."""

from __future__ import annotations

import numbers
from typing import Any

from .. import tags as T
from ..dtypes import DType, reduction_dtype
from ..errors import ShapeMismatch, TagError, UnsupportedGradient
from ..ir.execute import emit
from .base import (
    POOL,
    align_node,
    broadcast_sizes,
    check_tensor,
    method,
    new,
    result,
    same_ctx,
    tensor_type,
)


def _forward_only(self: Any, *others: Any) -> None:
    """Typed (non-f32) math is forward-only: reject graph operands instead of dropping them."""
    if self.dtype is DType.f32:
        return
    for t in (self, *others):
        if t.requires_grad:
            raise UnsupportedGradient(
                f"{self.dtype.value} math is forward-only; cast with to('f32') to differentiate")


_BIN_PLANS: dict[Any, tuple[Any, ...]] = {}


def _binary_plan(self: Any, other: Any, fn: str) -> tuple[Any, ...]:
    """Tag-level decisions of a binary op, made once per (types, shapes)."""
    if other.dtype is not self.dtype:
        raise TagError(
            f"pointwise {fn} requires matching dtypes ({self.dtype.value} vs "
            f"{other.dtype.value}); cast explicitly with to()")
    out = T.pointwise_result(self.axis_tags, other.axis_tags)
    shape = broadcast_sizes(self, other, out)
    raw_shape = shape or (1,)
    need_a = tuple(self.axis_tags) != out or self._node.shape != raw_shape
    need_b = tuple(other.axis_tags) != out or other._node.shape != raw_shape
    return out, tensor_type(tags=out, dtype=self.dtype), shape, need_a, need_b


def _binary(self: Any, other: Any, fn: str) -> Any:
    sn = self._node
    try:
        on = other._node
    except AttributeError:
        check_tensor(other)
        raise
    if other._ctx is not self._ctx:
        same_ctx(self, other)
    key = (fn, type(self), type(other), sn.value.shape, on.value.shape)
    plan = _BIN_PLANS.get(key)
    if plan is None:
        check_tensor(other)
        plan = _BIN_PLANS[key] = _binary_plan(self, other, fn)
    out, cls, shape, need_a, need_b = plan
    if self.dtype is not DType.f32:
        _forward_only(self, other)
    a = align_node(self, out, shape) if need_a else sn
    b = align_node(other, out, shape) if need_b else on
    node = emit("binary", (a, b), fn=fn)
    node.tags = out
    return new(cls, node, self._ctx)


def _make_binary(fn: str, doc: str) -> None:
    def op(self: Any, other: Any) -> Any:
        return _binary(self, other, fn)

    op.__name__ = fn
    op.__doc__ = doc
    POOL[fn] = op


for _fn, _doc in [
    ("add", "Elementwise sum, broadcasting by tag (result tags: self's, then other's new ones)."),
    ("sub", "Elementwise difference, broadcasting by tag."),
    ("mul", "Elementwise product, broadcasting by tag."),
    ("div", "Elementwise quotient, broadcasting by tag."),
    ("maximum", "Elementwise max; NaN propagates; ties split the gradient."),
    ("minimum", "Elementwise min; NaN propagates; ties split the gradient."),
    ("div_trunc", "Integer division toward zero (DivisionByZero on a zero divisor)."),
    ("div_floor", "Integer division toward -inf (DivisionByZero on a zero divisor)."),
    ("rem", "Remainder with the sign of the dividend (pairs div_trunc)."),
    ("mod", "Remainder with the sign of the divisor (pairs div_floor)."),
    ("bit_and", "Bitwise and of two's-complement patterns."),
    ("bit_or", "Bitwise or of two's-complement patterns."),
    ("bit_xor", "Bitwise xor of two's-complement patterns."),
]:
    _make_binary(_fn, _doc)


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {v!r}")
    return v


def _scalar(self: Any, fn: str, value: Any) -> Any:
    _forward_only(self)
    return result(self, self.axis_tags, emit("scalar", (self._node,), fn=fn,
                                             value=_number(value, "scalar")))


@method
def scale(self: Any, s: float) -> Any:
    """x * s."""
    return _scalar(self, "mul", s)


@method
def add_scalar(self: Any, s: float) -> Any:
    """x + s."""
    return _scalar(self, "add", s)


@method
def sub_scalar(self: Any, s: float) -> Any:
    """x - s."""
    return _scalar(self, "add", -_number(s, "scalar"))


@method
def div_scalar(self: Any, s: float) -> Any:
    """x / s."""
    return _scalar(self, "div", s)


@method
def neg(self: Any) -> Any:
    """-x."""
    _forward_only(self)
    return result(self, self.axis_tags, emit("unary", (self._node,), fn="neg"))


# -- Python operators (f32 and typed float branches) ---------------------------------


def _operator(name: str, tensor_fn: str, scalar_fn: Any, rscalar: Any = None) -> None:
    def op(self: Any, other: Any) -> Any:
        if isinstance(other, numbers.Real) and not isinstance(other, bool):
            return scalar_fn(self, other)
        return getattr(self, tensor_fn)(other)

    def rop(self: Any, other: Any) -> Any:
        if isinstance(other, numbers.Real) and not isinstance(other, bool):
            return rscalar(self, other)
        return NotImplemented

    op.__name__ = name
    POOL[name] = op
    if rscalar is not None:
        rop.__name__ = "__r" + name[2:]
        POOL[rop.__name__] = rop


_operator("__add__", "add", lambda x, s: _scalar(x, "add", s), lambda x, s: _scalar(x, "add", s))
_operator("__sub__", "sub", lambda x, s: _scalar(x, "add", -s), lambda x, s: _scalar(x, "rsub", s))
_operator("__mul__", "mul", lambda x, s: _scalar(x, "mul", s), lambda x, s: _scalar(x, "mul", s))
_operator("__truediv__", "div", lambda x, s: _scalar(x, "div", s),
          lambda x, s: _scalar(x, "rdiv", s))


@method
def __neg__(self: Any) -> Any:
    return self.neg()


@method
def __pow__(self: Any, s: float) -> Any:
    return _scalar(self, "pow", s)


# -- comparisons and logic -------------------------------------------------------------

_CMP = ("eq", "ne", "lt", "le", "gt", "ge")


@method
def compare(self: Any, op: str, other: Any) -> Any:
    """bool mask of ``self <op> other``; ``other`` a same-tagged tensor or a number."""
    if op not in _CMP:
        raise TagError(f"compare op must be one of {_CMP}, got {op!r}")
    if isinstance(other, numbers.Real) and not isinstance(other, bool):
        node = emit("compare", (self._node,), fn=op, value=other)
        return result(self, self.axis_tags, node, DType.bool)
    check_tensor(other)
    same_ctx(self, other)
    if other.dtype is not self.dtype:
        raise TagError(f"compare requires matching dtypes ({self.dtype.value} vs "
                       f"{other.dtype.value})")
    b = _same_shape(self, other, "compare")
    return result(self, self.axis_tags, emit("compare", (self._node, b), fn=op), DType.bool)


def _same_shape(self: Any, other: Any, what: str) -> Any:
    if set(other.axis_tags) != set(self.axis_tags):
        raise TagError(f"{what} needs the same tags: {other.axis_tags} vs {self.axis_tags}")
    sizes = dict(zip(other.axis_tags, other.shape))
    for t, d in zip(self.axis_tags, self.shape):
        if sizes[t] != d:
            raise ShapeMismatch(f"{what}: tag {t!r} has sizes {d} and {sizes[t]}")
    return align_node(other, self.axis_tags, self.shape)


def _truth(x: Any, node: Any) -> Any:
    if x.dtype is DType.bool:
        return node
    return emit("compare", (node,), fn="ne", value=0)


def _logical(self: Any, other: Any, fn: str) -> Any:
    check_tensor(other)
    same_ctx(self, other)
    b = _same_shape(self, other, fn)
    node = emit("binary", (_truth(self, self._node), _truth(other, b)), fn=fn)
    return result(self, self.axis_tags, node, DType.bool)


@method
def logical_and(self: Any, other: Any) -> Any:
    """Elementwise and of truthiness (!= 0), bool result."""
    return _logical(self, other, "logical_and")


@method
def logical_or(self: Any, other: Any) -> Any:
    """Elementwise or of truthiness, bool result."""
    return _logical(self, other, "logical_or")


@method
def logical_xor(self: Any, other: Any) -> Any:
    """Elementwise xor of truthiness, bool result."""
    return _logical(self, other, "logical_xor")


@method
def logical_not(self: Any) -> Any:
    """Elementwise not of truthiness, bool result."""
    node = emit("unary", (_truth(self, self._node),), fn="logical_not")
    return result(self, self.axis_tags, node, DType.bool)


def _cmp_operator(name: str, op: str) -> None:
    def fn(self: Any, other: Any) -> Any:
        return self.compare(op, other)

    fn.__name__ = name
    POOL[name] = fn


for _name, _op in [("__lt__", "lt"), ("__le__", "le"), ("__gt__", "gt"), ("__ge__", "ge")]:
    _cmp_operator(_name, _op)


# -- reductions ----------------------------------------------------------------------------


def _reduce(self: Any, tags_: tuple[str, ...], fn: str) -> Any:
    _forward_only(self)
    for t in tags_:
        T.index(self.axis_tags, t)
    out = T.remove_tags(self.axis_tags, tags_)
    axes = tuple(sorted(self.axis_tags.index(t) for t in tags_)) if self.tag_count else (0,)
    dt = reduction_dtype(self.dtype) if fn in ("sum", "mean") else self.dtype
    node = emit("reduce", (self._node,), fn=fn, axes=axes, dtype=dt)
    return result(self, out, node, dt)


@method
def sum_all(self: Any) -> Any:
    """Sum of every element as a scalar tensor."""
    return _reduce(self, self.axis_tags, "sum")


@method
def sum_many(self: Any, tags_: Any) -> Any:
    """Sum over several tags at once."""
    return _reduce(self, T.check_tags(T.normalize_tags(tags_)), "sum")
