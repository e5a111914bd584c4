"""Elemental ops: user scalar functions lifted to differentiable tensor ops (f32).

An ``Op`` is a class with static scalar functions::

    class Square:
        @staticmethod
        def forward(x, extra):
            return x * x

        @staticmethod
        def backward(x, y, grad_y, extra):  # returns dL/dx, not dy/dx
            return 2 * x * grad_y

A binary op has ``forward(a, b, extra)`` and ``backward(a, b, y, grad_y, extra)``
returning ``(dL/da, dL/db)``. Fucina compiles them with Numba into the op's
kernel (they fuse with their neighbours under ``fucina.compile``); ``extra``
is None, a number or a tuple of numbers, passed at run time (a new value
compiles nothing). Broadcast operands receive gradients summed back to their
own tags, and only operands that need a gradient get one. The functions are
compiled like ``numba.njit`` code: globals they read are frozen at the op's
first use in a process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import tags as T
from ..errors import TagError
from ..ir.elemental import elemental
from ..kernels import user_fns
from .base import Tensor, align_node, broadcast_sizes, check_tensor, result, same_ctx

if TYPE_CHECKING:
    from typing_extensions import Self


class Elemental(Tensor):
    """elemental_unary and elemental_binary (f32)."""

    __slots__ = ()

    def elemental_unary(self, op: Any, extra: Any = None) -> Self:
        """``op.forward(x, extra)`` elementwise; the gradient is ``op.backward(x, y,
        grad_y, extra)`` (the propagated dL/dx). TypeError when ``op`` lacks either
        function, has the wrong arity, or Numba cannot compile it."""
        spec, params = user_fns.extra_params(extra)
        entry = user_fns.register_op(op, "unary", spec)
        return result(self, self.axis_tags, elemental((self._node,), entry.key, params))

    def elemental_binary(self, other: Tensor, op: Any, extra: Any = None) -> Tensor:
        """``op.forward(a, b, extra)`` elementwise over ``self`` and ``other`` broadcast by
        tag (the result tags of ``add``); ``op.backward(a, b, y, grad_y, extra)`` returns
        ``(dL/da, dL/db)``."""
        check_tensor(other, "other")
        same_ctx(self, other)
        if other.dtype is not self.dtype:
            raise TagError(f"elemental_binary requires two {self.dtype.value} tensors, got "
                           f"{other.dtype.value}")
        spec, params = user_fns.extra_params(extra)
        entry = user_fns.register_op(op, "binary", spec)
        out = T.pointwise_result(self.axis_tags, other.axis_tags)
        shape = broadcast_sizes(self, other, out)
        a = align_node(self, out, shape)
        b = align_node(other, out, shape)
        return result(self, out, elemental((a, b), entry.key, params))
