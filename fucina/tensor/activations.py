"""Activations with learnable per-channel parameters: snake and prelu (f32).

Composed from elementwise primitives over the parameters broadcast along
the channel axis (zero-stride views), so both differentiate their
parameters through the view's adjoint (a sum over the other axes) and fuse
under ``fucina.compile``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ShapeMismatch, TagError
from ..ir.execute import emit
from .base import Tensor, check_tensor, result, same_ctx
from .norms import axis_param, spread

if TYPE_CHECKING:
    from typing_extensions import Self


class ParamActivations(Tensor):
    """snake and prelu (f32)."""

    __slots__ = ()

    def snake(self, channel_tag: str, alpha: Tensor, inv_b: Tensor) -> Self:
        """Snake (the DAC codec's activation): x + inv_b[c] * sin(alpha[c] * x)^2, with
        ``alpha`` and ``inv_b`` each a ``Tensor(channel_tag)``; both are independent
        differentiable operands."""
        a = axis_param(self, alpha, channel_tag, "alpha")
        ib = axis_param(self, inv_b, channel_tag, "inv_b")
        x = self._node
        s = emit("unary", (emit("binary", (a, x), fn="mul"),), fn="sin")
        bump = emit("binary", (ib, emit("binary", (s, s), fn="mul")), fn="mul")
        return result(self, self.axis_tags, emit("binary", (x, bump), fn="add"))

    def prelu(self, alpha: Tensor) -> Self:
        """x > 0 ? x : alpha[c] * x with ``alpha`` a rank-1 slope per channel, the channel
        being the innermost axis (torch.nn.PReLU on channel-last data). Differentiable
        in x and alpha."""
        check_tensor(alpha, "alpha")
        same_ctx(self, alpha)
        if not self.tag_count:
            raise TagError("prelu needs a channel axis; got a scalar tensor")
        if alpha.tag_count != 1 or alpha.dtype is not self.dtype:
            raise TagError(f"prelu's alpha must be a rank-1 {self.dtype.value} tensor, got "
                           f"{alpha!r}")
        last = self.axis_tags[-1]
        if alpha.axis_tags[0] != last and alpha.axis_tags[0] in self.axis_tags:
            raise TagError(f"prelu's alpha runs along the innermost axis {last!r}, not "
                           f"{alpha.axis_tags[0]!r}")
        c = self.shape[-1]
        if alpha.shape[0] != c:
            raise ShapeMismatch(f"prelu's alpha has {alpha.shape[0]} elements, the channel "
                                f"axis {last!r} has {c}")
        coeffs = tuple(int(k == self.tag_count - 1) for k in range(self.tag_count))
        a = spread(alpha._node, tuple(self.shape), coeffs)
        x = self._node
        pos = emit("compare", (x,), fn="gt", value=0)
        return result(self, self.axis_tags,
                      emit("where", (pos, x, emit("binary", (a, x), fn="mul"))))
