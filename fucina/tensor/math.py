"""Pointwise arithmetic, comparisons and logic, broadcasting by tag name, and the
Python operators that spell them.

Mixins here: :class:`Arithmetic` (add/sub/mul: float and integer branches),
:class:`FloatArithmetic` (div and the scalar forms, float operators),
:class:`ScalarMath` (f32/f16/bf16 scalar forms, negation, ``**``),
:class:`Ordering` (compare, maximum/minimum), :class:`Logic`
(logical_and/or/xor/not), :class:`BoolOperators` (``~ & | ^`` on bool),
:class:`IntegerMath` (integer division, remainders, bitwise ops and their
operators).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..dtypes import DType, reduction_dtype
from ..errors import ShapeMismatch, TagError, UnsupportedGradient
from ..ir.execute import emit
from ..ir.graph import Node
from ..kernels.cache import SIZE_SOURCES
from ..runtime.lru import LRU
from . import fast
from .arguments import choice_arg, real_arg
from .base import (
    Tensor,
    align_node,
    broadcast_sizes,
    check_tensor,
    new,
    result,
    same_ctx,
    tensor_type,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import BoolTensor


def forward_only(self: Tensor, *others: Tensor) -> None:
    """Typed (non-f32) math is forward-only: reject graph operands instead of dropping them."""
    if self.dtype is DType.f32:
        return
    for t in (self, *others):
        if t.requires_grad:
            raise UnsupportedGradient(
                f"{self.dtype.value} math is forward-only; cast with to('f32') to differentiate")


#: Most (op, types, shapes) signatures whose binary-op tag decisions are kept.
BIN_PLAN_CACHE_SIZE = 4096
BIN_PLANS = LRU(BIN_PLAN_CACHE_SIZE)
SIZE_SOURCES["binary_plan_cache"] = lambda: (len(BIN_PLANS), BIN_PLANS.maxsize)


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
    """The ``binary`` primitive ``fn`` of two tensors, broadcasting by tag."""
    sn = self._node
    try:
        on = other._node
    except AttributeError:
        check_tensor(other)
        raise
    if other._ctx is not self._ctx:
        check_tensor(other)  # a tensor type (a class) reads as a foreign context
        same_ctx(self, other)
    key = (fn, type(self), type(other), sn.value.shape, on.value.shape)
    plans = BIN_PLANS
    plan = plans.get(key)
    if plan is None:
        check_tensor(other)
        plan = _binary_plan(self, other, fn)
        plans.put(key, plan)
    out, cls, shape, need_a, need_b = plan
    if self.dtype is not DType.f32:
        forward_only(self, other)
    a = align_node(self, out, shape) if need_a else sn
    b = align_node(other, out, shape) if need_b else on
    node = emit("binary", (a, b), fn=fn)
    node.tags = out
    return new(cls, node, self._ctx)


#: The ``binary`` primitive ``fn`` of two tensors, broadcasting by tag (a repeated
#: signature on plain tensors takes the eager fast path).
binary = fast.binary_op(_binary)


def _is_number(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def scalar_op(self: Any, fn: str, value: Any, name: str = "s") -> Any:
    """The ``scalar`` primitive: ``self <fn> value`` for a real Python number (the
    argument ``name`` is blamed for anything else)."""
    v = real_arg(value, name)
    forward_only(self)
    return result(self, self.axis_tags, emit("scalar", (self._node,), fn=fn, value=v))


def _compare_number(self: Any, op: str, value: Any) -> Any:
    """``self <op> value`` for a Python number: exact on integer tensors at any magnitude
    (a bound past the dtype's range, a fraction or NaN decides the answer on the host);
    f16/bf16 compare through f32, as their other ops do."""
    node = self._node
    dt = self.dtype
    v: float
    if dt.is_integer:
        decided = _integer_bound(op, value, dt)
        if isinstance(decided, bool):
            fill = emit("fill", (), shape=node.shape, dtype=DType.bool, value=decided)
            return result(self, self.axis_tags, fill, DType.bool)
        op, v = decided
    else:
        v = real_arg(value, "other")
        if dt in (DType.f16, DType.bf16):
            node = emit("cast", (node,), dtype=DType.f32, src=dt)
    return result(self, self.axis_tags, emit("compare", (node,), fn=op, value=v), DType.bool)


def _integer_bound(op: str, value: Any, dt: DType) -> tuple[str, int] | bool:
    """An integer compare against ``value`` as (op, in-range int), or its constant answer."""
    if isinstance(value, numbers.Integral):
        k = int(value)
    else:
        f = real_arg(value, "other")
        if math.isnan(f):
            return op == "ne"
        if math.isinf(f):
            k = math.inf if f > 0 else -math.inf  # type: ignore[assignment]
        elif f != math.floor(f):
            if op in ("eq", "ne"):
                return op == "ne"
            # x < 2.5 is x <= 2; x > 2.5 is x >= 3 (no integer lies between)
            op, k = ("le", math.floor(f)) if op in ("lt", "le") else ("ge", math.ceil(f))
        else:
            k = int(f)
    info = np.iinfo(dt.storage)
    if k > info.max:
        return op in ("lt", "le", "ne")
    if k < info.min:
        return op in ("gt", "ge", "ne")
    return op, int(k)


def reduce_tags(self: Any, tags_: tuple[str, ...], fn: str) -> Any:
    """Unmasked ``reduce`` over ``tags_`` (sum/mean widen per ``reduction_dtype``)."""
    forward_only(self)
    for t in tags_:
        T.index(self.axis_tags, t)
    out = T.remove_tags(self.axis_tags, tags_)
    axes = tuple(sorted(self.axis_tags.index(t) for t in tags_)) if self.tag_count else (0,)
    dt = reduction_dtype(self.dtype) if fn in ("sum", "mean") else self.dtype
    node = emit("reduce", (self._node,), fn=fn, axes=axes, dtype=dt)
    return result(self, out, node, dt)


def same_shape(self: Any, other: Any, what: str) -> Node:
    """``other`` aligned to ``self``: the same tags (any order) and sizes."""
    if set(other.axis_tags) != set(self.axis_tags):
        raise TagError(f"{what} needs the same tags: {other.axis_tags} vs {self.axis_tags}")
    sizes = dict(zip(other.axis_tags, other.shape))
    for t, d in zip(self.axis_tags, self.shape):
        if sizes[t] != d:
            raise ShapeMismatch(f"{what}: tag {t!r} has sizes {d} and {sizes[t]}")
    return align_node(other, self.axis_tags, self.shape)


def _truth(x: Any, node: Node) -> Node:
    if x.dtype is DType.bool:
        return node
    return emit("compare", (node,), fn="ne", value=0)


def _logical(self: Any, other: Any, fn: str) -> Any:
    check_tensor(other)
    same_ctx(self, other)
    b = same_shape(self, other, fn)
    node = emit("binary", (_truth(self, self._node), _truth(other, b)), fn=fn)
    return result(self, self.axis_tags, node, DType.bool)


def _foreign(other: object, op: str) -> Any:
    """An operator's answer to an operand that is neither a tensor nor a number:
    numpy arrays get a TypeError that says how to convert, anything else
    NotImplemented (so Python tries the other operand's reflected operator)."""
    if isinstance(other, np.ndarray):
        raise TypeError(
            f"'{op}' between a fucina tensor and a numpy array: make the array a tensor "
            f"(T.from_numpy(ctx, array)) or the tensor an array (np.asarray(x))")
    return NotImplemented


def _no_scalar(self: Any, op: str) -> TypeError:
    return TypeError(
        f"'{op}' on {self.dtype.value} tensors takes another {self.dtype.value} tensor: "
        f"the {self.dtype.value} branch has no scalar forms (add_scalar, scale, ...), so a "
        f"Python number combines with float tensors only; make it a tensor first")


def _reflected(self: Any, other: object, op: str) -> Any:
    """``number <op> tensor`` on a branch without scalar forms: the same TypeError as
    ``tensor <op> number``; other operands get Python's protocol (NotImplemented)."""
    if _is_number(other) or isinstance(other, (bool, np.bool_)):
        raise _no_scalar(self, op)
    return _foreign(other, op)


# -- add / sub / mul: every numeric branch but bool and f8 ----------------------------


class Arithmetic(Tensor):
    """Elementwise add, sub and mul, broadcasting by tag (float and integer branches;
    integers wrap)."""

    __slots__ = ()

    def add(self, other: Tensor) -> Self:
        """Elementwise sum, broadcasting by tag (result tags: self's, then other's new
        ones; a tag of size 1 stretches)."""
        return binary(self, other, "add")

    def sub(self, other: Tensor) -> Self:
        """Elementwise difference, broadcasting by tag."""
        return binary(self, other, "sub")

    def mul(self, other: Tensor) -> Self:
        """Elementwise product, broadcasting by tag."""
        return binary(self, other, "mul")


# -- float arithmetic (f32, f16/bf16, f64) ------------------------------------------------


class FloatArithmetic(Tensor):
    """Division, scaling and the arithmetic operators of the float branches: ``a + b``
    is :meth:`add`, and a Python number on either side uses the scalar form."""

    __slots__ = ()

    def div(self, other: Tensor) -> Self:
        """Elementwise quotient, broadcasting by tag."""
        return binary(self, other, "div")

    def scale(self, s: float) -> Self:
        """x * s."""
        return scalar_op(self, "mul", s)

    def div_scalar(self, s: float) -> Self:
        """x / s."""
        return scalar_op(self, "div", s)

    def __add__(self, other: Tensor | float) -> Self:
        """``a + b`` is :meth:`add`; ``a + 2.0`` adds a scalar."""
        if isinstance(other, Tensor):
            return binary(self, other, "add")
        if _is_number(other):
            return scalar_op(self, "add", other, "other")
        return _foreign(other, "+")

    def __radd__(self, other: float) -> Self:
        """``2.0 + a`` adds a scalar."""
        if _is_number(other):
            return scalar_op(self, "add", other, "other")
        return _foreign(other, "+")

    def __sub__(self, other: Tensor | float) -> Self:
        """``a - b`` is :meth:`sub`; ``a - 2.0`` subtracts a scalar."""
        if isinstance(other, Tensor):
            return binary(self, other, "sub")
        if _is_number(other):  # (negated as a float: -np.uint8(3) wraps to 253)
            return scalar_op(self, "add", -real_arg(other, "other"), "other")
        return _foreign(other, "-")

    def __rsub__(self, other: float) -> Self:
        """``2.0 - a``: a scalar minus each element."""
        if _is_number(other):
            return scalar_op(self, "rsub", other, "other")
        return _foreign(other, "-")

    def __mul__(self, other: Tensor | float) -> Self:
        """``a * b`` is :meth:`mul`; ``a * 2.0`` is :meth:`scale`."""
        if isinstance(other, Tensor):
            return binary(self, other, "mul")
        if _is_number(other):
            return scalar_op(self, "mul", other, "other")
        return _foreign(other, "*")

    def __rmul__(self, other: float) -> Self:
        """``2.0 * a`` is :meth:`scale`."""
        if _is_number(other):
            return scalar_op(self, "mul", other, "other")
        return _foreign(other, "*")

    def __truediv__(self, other: Tensor | float) -> Self:
        """``a / b`` is :meth:`div`; ``a / 2.0`` is :meth:`div_scalar`."""
        if isinstance(other, Tensor):
            return binary(self, other, "div")
        if _is_number(other):
            return scalar_op(self, "div", other, "other")
        return _foreign(other, "/")

    def __rtruediv__(self, other: float) -> Self:
        """``2.0 / a``: a scalar divided by each element."""
        if _is_number(other):
            return scalar_op(self, "rdiv", other, "other")
        return _foreign(other, "/")


# -- f32 / f16 / bf16 scalar forms ------------------------------------------------------------


class ScalarMath(Tensor):
    """Scalar add/sub, negation and ``x ** s`` (f32, f16, bf16)."""

    __slots__ = ()

    def add_scalar(self, s: float) -> Self:
        """x + s."""
        return scalar_op(self, "add", s)

    def sub_scalar(self, s: float) -> Self:
        """x - s."""
        return scalar_op(self, "add", -real_arg(s, "s"))

    def neg(self) -> Self:
        """-x."""
        forward_only(self)
        return result(self, self.axis_tags, emit("unary", (self._node,), fn="neg"))

    def __neg__(self) -> Self:
        """``-a`` is :meth:`neg`."""
        return self.neg()

    def __pow__(self, s: float) -> Self:
        """``a ** s`` is :meth:`pow_scalar` (a Python number exponent)."""
        if isinstance(s, Tensor):
            raise TypeError("'**' takes a Python number exponent; a tensor exponent is "
                            "x.pow(y) (f32)")
        if not _is_number(s):
            return _foreign(s, "**")
        return scalar_op(self, "pow", s, "exponent")


# -- comparisons and ordering --------------------------------------------------------------

_CMP = ("eq", "ne", "lt", "le", "gt", "ge")


class Ordering(Tensor):
    """Comparisons (bool results; ``<``, ``<=``, ``>``, ``>=``), maximum and minimum
    (f32, f16, bf16 and the integer branches). ``==``/``!=`` keep Python's identity."""

    __slots__ = ()

    def compare(self, op: str, other: Tensor | float) -> BoolTensor:
        """bool mask of ``self <op> other`` (op one of "eq", "ne", "lt", "le", "gt",
        "ge"); ``other`` a same-tagged tensor of self's dtype, or a number."""
        choice_arg(op, _CMP, "compare op")
        if _is_number(other):
            return _compare_number(self, op, other)
        check_tensor(other)
        assert isinstance(other, Tensor)
        same_ctx(self, other)
        if other.dtype is not self.dtype:
            raise TagError(f"compare requires matching dtypes ({self.dtype.value} vs "
                           f"{other.dtype.value})")
        b = same_shape(self, other, "compare")
        return result(self, self.axis_tags, emit("compare", (self._node, b), fn=op), DType.bool)

    def maximum(self, other: Tensor) -> Self:
        """Elementwise max, broadcasting by tag; NaN propagates; ties split the gradient."""
        return binary(self, other, "maximum")

    def minimum(self, other: Tensor) -> Self:
        """Elementwise min, broadcasting by tag; NaN propagates; ties split the gradient."""
        return binary(self, other, "minimum")

    def __lt__(self, other: Tensor | float) -> BoolTensor:
        """``a < b`` is ``compare("lt", b)``."""
        return self.compare("lt", other)

    def __le__(self, other: Tensor | float) -> BoolTensor:
        """``a <= b`` is ``compare("le", b)``."""
        return self.compare("le", other)

    def __gt__(self, other: Tensor | float) -> BoolTensor:
        """``a > b`` is ``compare("gt", b)``."""
        return self.compare("gt", other)

    def __ge__(self, other: Tensor | float) -> BoolTensor:
        """``a >= b`` is ``compare("ge", b)``."""
        return self.compare("ge", other)


# -- logic -------------------------------------------------------------------------------


class Logic(Tensor):
    """Elementwise logic on truthiness (``!= 0``; NaN is true), bool results
    (f32, f16, bf16, bool). Operands have the same tags (any order) and sizes."""

    __slots__ = ()

    def logical_and(self, other: Tensor) -> BoolTensor:
        """Elementwise and of truthiness (!= 0), bool result."""
        return _logical(self, other, "logical_and")

    def logical_or(self, other: Tensor) -> BoolTensor:
        """Elementwise or of truthiness, bool result."""
        return _logical(self, other, "logical_or")

    def logical_xor(self, other: Tensor) -> BoolTensor:
        """Elementwise xor of truthiness, bool result."""
        return _logical(self, other, "logical_xor")

    def logical_not(self) -> BoolTensor:
        """Elementwise not of truthiness, bool result."""
        node = emit("unary", (_truth(self, self._node),), fn="logical_not")
        return result(self, self.axis_tags, node, DType.bool)


def _mask_op(self: Any, other: Tensor, fn: str) -> Any:
    """``m & n`` (| ^): masks combine with masks only, as ``i & m`` refuses the other way
    (:meth:`logical_and` itself reads any tensor's truthiness)."""
    if isinstance(other, Tensor) and other.dtype is not DType.bool:
        raise TagError(f"pointwise {fn} requires matching dtypes (bool vs "
                       f"{other.dtype.value}); cast explicitly with to()")
    return _logical(self, other, fn)


class BoolOperators(Tensor):
    """``~m``, ``m & n``, ``m | n``, ``m ^ n`` on bool masks: the logical ops."""

    __slots__ = ()

    def __invert__(self) -> Self:
        """``~m`` is :meth:`logical_not`."""
        node = emit("unary", (self._node,), fn="logical_not")
        return result(self, self.axis_tags, node, DType.bool)

    def __and__(self, other: Tensor) -> Self:
        """``m & n`` is :meth:`logical_and`."""
        if not isinstance(other, Tensor):
            return _reflected(self, other, "&")
        return _mask_op(self, other, "logical_and")

    def __or__(self, other: Tensor) -> Self:
        """``m | n`` is :meth:`logical_or`."""
        if not isinstance(other, Tensor):
            return _reflected(self, other, "|")
        return _mask_op(self, other, "logical_or")

    def __xor__(self, other: Tensor) -> Self:
        """``m ^ n`` is :meth:`logical_xor`."""
        if not isinstance(other, Tensor):
            return _reflected(self, other, "^")
        return _mask_op(self, other, "logical_xor")

    def __rand__(self, other: object) -> Any:
        """``True & m``: TypeError (masks combine with masks only)."""
        return _reflected(self, other, "&")

    def __ror__(self, other: object) -> Any:
        """``True | m``: TypeError (masks combine with masks only)."""
        return _reflected(self, other, "|")

    def __rxor__(self, other: object) -> Any:
        """``True ^ m``: TypeError (masks combine with masks only)."""
        return _reflected(self, other, "^")


# -- integer math ------------------------------------------------------------------------------


class IntegerMath(Tensor):
    """Integer division and remainders (DivisionByZero on a zero divisor), bitwise ops,
    and the integer operators ``+ - * // % & | ^`` on two tensors (wrapping)."""

    __slots__ = ()

    def div_trunc(self, other: Tensor) -> Self:
        """Integer division toward zero (DivisionByZero on a zero divisor)."""
        return binary(self, other, "div_trunc")

    def div_floor(self, other: Tensor) -> Self:
        """Integer division toward -inf (DivisionByZero on a zero divisor)."""
        return binary(self, other, "div_floor")

    def rem(self, other: Tensor) -> Self:
        """Remainder with the sign of the dividend (pairs div_trunc)."""
        return binary(self, other, "rem")

    def mod(self, other: Tensor) -> Self:
        """Remainder with the sign of the divisor (pairs div_floor)."""
        return binary(self, other, "mod")

    def bit_and(self, other: Tensor) -> Self:
        """Bitwise and of two's-complement patterns."""
        return binary(self, other, "bit_and")

    def bit_or(self, other: Tensor) -> Self:
        """Bitwise or of two's-complement patterns."""
        return binary(self, other, "bit_or")

    def bit_xor(self, other: Tensor) -> Self:
        """Bitwise xor of two's-complement patterns."""
        return binary(self, other, "bit_xor")

    def _tensor_op(self, other: object, op: str, fn: str) -> Self:
        if not isinstance(other, Tensor):
            return _reflected(self, other, op)
        return binary(self, other, fn)

    def __add__(self, other: Tensor) -> Self:
        """``a + b`` is the wrapping :meth:`add`."""
        return self._tensor_op(other, "+", "add")

    def __sub__(self, other: Tensor) -> Self:
        """``a - b`` is the wrapping :meth:`sub`."""
        return self._tensor_op(other, "-", "sub")

    def __mul__(self, other: Tensor) -> Self:
        """``a * b`` is the wrapping :meth:`mul`."""
        return self._tensor_op(other, "*", "mul")

    def __floordiv__(self, other: Tensor) -> Self:
        """``a // b`` is :meth:`div_floor` (Python's floor division)."""
        return self._tensor_op(other, "//", "div_floor")

    def __mod__(self, other: Tensor) -> Self:
        """``a % b`` is :meth:`mod` (Python's sign of the divisor)."""
        return self._tensor_op(other, "%", "mod")

    def __and__(self, other: Tensor) -> Self:
        """``a & b`` is :meth:`bit_and`."""
        return self._tensor_op(other, "&", "bit_and")

    def __or__(self, other: Tensor) -> Self:
        """``a | b`` is :meth:`bit_or`."""
        return self._tensor_op(other, "|", "bit_or")

    def __xor__(self, other: Tensor) -> Self:
        """``a ^ b`` is :meth:`bit_xor`."""
        return self._tensor_op(other, "^", "bit_xor")

    def __radd__(self, other: object) -> Any:
        """``1 + a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "+")

    def __rsub__(self, other: object) -> Any:
        """``1 - a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "-")

    def __rmul__(self, other: object) -> Any:
        """``2 * a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "*")

    def __rfloordiv__(self, other: object) -> Any:
        """``7 // a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "//")

    def __rmod__(self, other: object) -> Any:
        """``7 % a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "%")

    def __rand__(self, other: object) -> Any:
        """``1 & a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "&")

    def __ror__(self, other: object) -> Any:
        """``1 | a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "|")

    def __rxor__(self, other: object) -> Any:
        """``1 ^ a``: TypeError (no scalar forms on integer tensors)."""
        return _reflected(self, other, "^")
