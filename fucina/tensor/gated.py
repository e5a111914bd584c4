"""Gated activations: ``up * act(gate)`` (glu, swiglu, geglu, situ) and the split form
that halves one axis and gates one half with the other.

Composed from elementwise primitives, so gradients come from their VJP
rules and ``fucina.compile`` fuses a gated unit into its neighbours' kernel.
On f16/bf16 the math runs in f32 and narrows once (forward-only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidShape, TagError
from ..ir.autodiff import narrow_view
from ..ir.execute import emit
from ..ir.graph import Node
from .base import Tensor, align_node, broadcast_sizes, check_tensor, result, same_ctx
from .math import forward_only
from .unary import HALF, narrow

if TYPE_CHECKING:
    from typing_extensions import Self

#: The reference's GatedOp members; swiglu_clamp10 is inference-only (MoE entries).
GATED_OPS = ("glu", "swiglu", "geglu", "swiglu_clamp10", "situ")


def _u(fn: str, x: Node) -> Node:
    return emit("unary", (x,), fn=fn)


def _mul(a: Node, b: Node) -> Node:
    return emit("binary", (a, b), fn="mul")


def _soft_clamp(x: Node, beta: float) -> Node:
    """beta * tanh(x / beta)."""
    t = _u("tanh", emit("scalar", (x,), fn="div", value=beta))
    return emit("scalar", (t,), fn="mul", value=beta)


def _gate(op: str, up: Node, gate: Node) -> Node:
    if op == "glu":
        return _mul(up, _u("sigmoid", gate))
    if op == "swiglu":
        return _mul(up, _u("silu", gate))
    if op == "geglu":
        return _mul(up, _u("gelu", gate))
    # situ: a soft-bounded SiLU gate (beta 4) on a soft-clamped up input (beta 25).
    # sigmoid reads (gate / 4) * 4, which is gate exactly (power-of-two scaling), so the
    # whole gate side is one chain and fuses into one kernel.
    q = emit("scalar", (gate,), fn="div", value=4.0)
    t = emit("scalar", (_u("tanh", q),), fn="mul", value=4.0)
    s = _u("sigmoid", emit("scalar", (q,), fn="mul", value=4.0))
    return _mul(_soft_clamp(up, 25.0), _mul(t, s))


def _check_op(self: Any, op: Any, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(op, str) or op not in GATED_OPS:
        raise TagError(f"unknown gated op {op!r}; expected one of {GATED_OPS}")
    if op == "swiglu_clamp10":
        raise TagError("swiglu_clamp10 is inference-only (the MoE entries); it has no "
                       f"backward and no {what} form")
    if op not in allowed:
        raise TagError(f"{what} on {self.dtype.value} tensors has no {op!r} form "
                       f"(allowed: {allowed})")
    return op


def _f32(node: Node) -> Node:
    if node.dtype in HALF:
        return emit("cast", (node,), dtype=DType.f32, src=node.dtype)
    return node


def _gated(self: Any, other: Any, op: str) -> Any:
    check_tensor(other, "gate")
    same_ctx(self, other)
    if other.dtype is not self.dtype:
        raise TagError(f"gated requires matching dtypes ({self.dtype.value} vs "
                       f"{other.dtype.value}); cast explicitly with to()")
    forward_only(self, other)
    out = T.pointwise_result(self.axis_tags, other.axis_tags)
    shape = broadcast_sizes(self, other, out)
    up = _f32(align_node(self, out, shape))
    gate = _f32(align_node(other, out, shape))
    return result(self, out, narrow(_gate(op, up, gate), self.dtype))


_POINTWISE_HALF = ("glu", "swiglu", "geglu")
_POINTWISE_F32 = ("glu", "swiglu", "geglu", "situ")


class Gated(Tensor):
    """``up * act(gate)`` with tag broadcasting: gated, glu, swiglu, geglu (f32, f16,
    bf16; typed floats compute in f32, narrow once and are forward-only)."""

    __slots__ = ()

    def gated(self, other: Tensor, op: str) -> Self:
        """``self * act(other)`` for ``op`` in "glu" (sigmoid), "swiglu" (silu), "geglu"
        (tanh-approximate gelu) and, on f32, "situ": 25 tanh(self/25) * 4 tanh(other/4)
        * sigmoid(other). The second operand is the gate; tags broadcast as in add."""
        allowed = _POINTWISE_F32 if self.dtype is DType.f32 else _POINTWISE_HALF
        return _gated(self, other, _check_op(self, op, allowed, "gated"))

    def glu(self, other: Tensor) -> Self:
        """self * sigmoid(other)."""
        return _gated(self, other, "glu")

    def swiglu(self, other: Tensor) -> Self:
        """self * silu(other)."""
        return _gated(self, other, "swiglu")

    def geglu(self, other: Tensor) -> Self:
        """self * gelu(other) (tanh approximation, Gemma's GeGLU)."""
        return _gated(self, other, "geglu")


class GatedF32(Tensor):
    """situ and split_gated (f32)."""

    __slots__ = ()

    def situ(self, other: Tensor) -> Self:
        """SiTU (Kimi K3): 25 tanh(self/25) * 4 tanh(other/4) * sigmoid(other)."""
        return _gated(self, other, "situ")

    def split_gated(self, op: str, tag: str, out_tag: str) -> Self:
        """Halve axis ``tag`` and gate one half with the other (ggml's conventions):
        "swiglu" is silu(first) * second, "glu" is first * sigmoid(second). The halved
        axis is retagged ``out_tag`` (which may equal ``tag``)."""
        op = _check_op(self, op, ("glu", "swiglu"), "split_gated")
        axis = T.index(self.axis_tags, T.check_tag(tag))
        out = T.replace_tag(self.axis_tags, tag, out_tag)
        n = self.shape[axis]
        if n % 2:
            raise InvalidShape(f"split_gated halves {tag!r}, whose size {n} is odd")
        x = self._node
        first, second = narrow_view(x, axis, 0, n // 2), narrow_view(x, axis, n // 2, n // 2)
        if op == "swiglu":
            return result(self, out, _gate("swiglu", second, first))
        return result(self, out, _gate("glu", first, second))
