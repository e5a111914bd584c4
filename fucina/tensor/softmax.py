"""The softmax family, composed from primitives so it fuses (one row kernel compiled).

The shift by the lane max is a constant (it cancels in the value), so it is
built without gradient; a lane whose max is infinite is shifted by 0, as in
``logsumexp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import tags as T
from ..dtypes import DType
from ..errors import TagError, UnsupportedGradient
from ..ir.autodiff import broadcast_back
from ..ir.execute import emit
from ..ir.graph import Node
from ..runtime.gradmode import no_grad
from .base import Tensor, align_node, check_tensor, same_ctx
from .unary import float_op, real

if TYPE_CHECKING:
    from typing_extensions import Self


def _shift(x: Node, axes: tuple[int, ...]) -> Node:
    with no_grad():
        m = emit("reduce", (x,), fn="max", axes=axes, dtype=DType.f32)
        finite = emit("unary", (m,), fn="isfinite")
        zero = emit("fill", (), shape=m.shape, dtype=DType.f32, value=0.0)
        return broadcast_back(emit("where", (finite, m, zero)), x.shape, axes)


def _logits(self: Any, x: Node, scale: float | None, mask: Any) -> Node:
    if scale is not None:
        x = emit("scalar", (x,), fn="mul", value=real(scale, "scale"))
    if mask is not None:
        check_tensor(mask, "mask")
        same_ctx(self, mask)
        if mask.requires_grad:
            raise UnsupportedGradient("a softmax mask is additive control data: no gradient")
        if mask.dtype is not self.dtype:
            raise TagError(f"mask dtype {mask.dtype.value} differs from {self.dtype.value}")
        for t in mask.axis_tags:
            T.index(self.axis_tags, t)
        m = align_node(mask, self.axis_tags, self.shape)
        if mask.dtype is not DType.f32:
            m = emit("cast", (m,), dtype=DType.f32, src=mask.dtype)
        x = emit("binary", (x, m), fn="add")
    return x


class Softmax(Tensor):
    """Softmax and log-softmax over a tag (f32, f16, bf16), fused under compile."""

    __slots__ = ()

    def softmax(self, tag: str, scale: float | None = None, mask: Tensor | None = None,
                ) -> Self:
        """Softmax over ``tag`` of ``x * scale + mask`` (mask: additive, broadcast by tag)."""
        axes = (T.index(self.axis_tags, tag),)

        def build(x: Node) -> Node:
            x = _logits(self, x, scale, mask)
            e = emit("unary", (emit("binary", (x, _shift(x, axes)), fn="sub"),), fn="exp")
            total = emit("reduce", (e,), fn="sum", axes=axes, dtype=DType.f32)
            return emit("binary", (e, broadcast_back(total, e.shape, axes)), fn="div")

        return float_op(self, build)

    def log_softmax(self, tag: str) -> Self:
        """log(softmax(x)) over ``tag``, computed as x - max - log(sum(exp(x - max)))."""
        axes = (T.index(self.axis_tags, tag),)

        def build(x: Node) -> Node:
            z = emit("binary", (x, _shift(x, axes)), fn="sub")
            e = emit("unary", (z,), fn="exp")
            lse = emit("unary", (emit("reduce", (e,), fn="sum", axes=axes, dtype=DType.f32),),
                       fn="log")
            return emit("binary", (z, broadcast_back(lse, z.shape, axes)), fn="sub")

        return float_op(self, build)
