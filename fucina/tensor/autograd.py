"""Gradient accessors, backward, detach and dtype casts on the facade."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..dtypes import DType, as_dtype
from ..errors import (
    GradientCastUnsupported,
    MissingOutputGradient,
    NoGradientGraph,
    ShapeMismatch,
    TagError,
)
from ..ir import autodiff
from ..ir.execute import current_tracer, emit
from ..ir.graph import Node, leaf
from ..runtime.gradmode import no_grad
from ..runtime.raw import RawTensor
from .base import Tensor, check_tensor, identity_view, new, result, same_ctx, tensor_type

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import F32Tensor


def _seed_check(self: Any) -> Node:
    node = self._node
    if not node.requires_grad:
        raise NoGradientGraph(
            "backward() on a tensor with no gradient graph (no variable leaf reaches it, "
            "or it was built under no_grad)")
    return node


def _grad_tensor(self: Any, raw: RawTensor) -> Any:
    cls = tensor_type(tags=self.axis_tags, dtype=DType.f32)
    return new(cls, leaf(raw, self.axis_tags, False), self._ctx, op_result=False)


_DIFF_CASTS = {
    (DType.f32, DType.f32), (DType.f32, DType.f16), (DType.f32, DType.bf16),
    (DType.f16, DType.f32), (DType.bf16, DType.f32),
}


class Cast(Tensor):
    """dtype conversion (every branch; block formats dequantize to f32)."""

    __slots__ = ()

    def to(self, dtype: DType | str) -> Tensor:
        """A converted copy (the seeds' casting table; blocks dequantize to f32 only)."""
        target = as_dtype(dtype)
        src = self.dtype
        node = self._node
        if src.is_block:
            if target is not DType.f32:
                raise TagError(f"{src.value} tensors convert to f32 only, not {target.value}")
            return result(self, self.axis_tags, emit("dequantize", (node,), src=src), DType.f32)
        if target.is_block:
            raise TagError(f"to({target.value}): quantize with the block constructors instead")
        if node.requires_grad and (src, target) not in _DIFF_CASTS:
            raise GradientCastUnsupported(
                f"to({target.value}) on a {src.value} tensor that requires grad; detach() first")
        out = emit("cast", (node,), dtype=target, src=src)
        return result(self, self.axis_tags, out, target)


class Detach(Tensor):
    """Leaving the gradient graph (float branches)."""

    __slots__ = ()

    def detach(self) -> Self:
        """A no-grad tensor sharing storage with self."""
        node = self._node
        if current_tracer() is not None:
            # Inside fucina.compile: a no-grad view node, so the program still computes (or
            # reads at call time) what it views; a detached leaf would cut it off.
            with no_grad():
                view_node = identity_view(self)
            view_node.tags = self.axis_tags
            return new(type(self), view_node, self._ctx, op_result=False)
        raw = node.value
        view = raw.view(raw.shape, raw.strides, raw.offset)
        return new(type(self), leaf(view, self.axis_tags, False), self._ctx, op_result=False)

    def zero_grad(self) -> None:
        """Drop the accumulated gradient (under ``compile``: part of the program, so
        every call drops it, as eager does)."""
        node = self._node
        tracer = current_tracer()
        # (a value computed while tracing holds no gradient yet: nothing to record)
        if tracer is not None and not node.value.is_symbolic:
            if not hasattr(tracer, "zero_grad"):
                raise TypeError("zero_grad() cannot be traced here")
            tracer.zero_grad(node)
            return
        node.grad = None


class GradState:
    """The gradient state of a tensor that requires grad (the reference's ``GradState``,
    reached through ``x.grad_state``): its accumulated f32 gradient, read or replaced."""

    __slots__ = ("_tensor",)

    def __init__(self, tensor: Tensor):
        self._tensor = tensor

    def set_grad(self, grad: Tensor) -> None:
        """Replace the accumulated gradient with ``grad`` (f32, the tensor's tags and
        shape); the state keeps its own copy."""
        t: Any = self._tensor
        check_tensor(grad, "grad")
        same_ctx(t, grad)
        if tuple(grad.axis_tags) != tuple(t.axis_tags) or grad.dtype is not DType.f32:
            raise TagError(f"set_grad needs an f32 gradient tagged {t.axis_tags}, got "
                           f"{type(grad)!r}")
        if grad.shape != t.shape:
            raise ShapeMismatch(f"set_grad: gradient shape {grad.shape} differs from {t.shape}")
        tracer: Any = current_tracer()
        if tracer is not None:
            if not hasattr(tracer, "set_grad"):
                raise TypeError("set_grad cannot be traced here")
            tracer.set_grad(t._node, grad._node)
            return
        t._node.grad = grad._node.value.contiguous_copy()

    def zero_grad(self) -> None:
        """Drop the accumulated gradient (``x.zero_grad()``)."""
        self._tensor.zero_grad()  # type: ignore[attr-defined]

    def grad_clone(self) -> F32Tensor | None:
        """An owned copy of the accumulated gradient, or None (``x.grad()``)."""
        return self._tensor.grad()  # type: ignore[attr-defined]

    def grad_view(self) -> F32Tensor | None:
        """A view of the live gradient buffer, or None (``x.grad_view()``)."""
        return self._tensor.grad_view()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"GradState({type(self._tensor)!r})"


class GradFields(Tensor):
    """The reference's ``grad_state`` and ``scope_owned`` fields (float branches)."""

    __slots__ = ()

    @property
    def grad_state(self) -> GradState | None:
        """The gradient state when the tensor requires grad, else None: a ``fucina.GradState``
        with ``set_grad(grad)``, ``zero_grad()``, ``grad_clone()`` and ``grad_view()``."""
        return GradState(self) if self._node.requires_grad else None

    @property
    def scope_owned(self) -> bool:
        """True for an op result an open exec scope owns (its ``deinit`` is a no-op)."""
        return self._scoped


class GradAccess(Tensor):
    """Reading accumulated gradients (f32, and f16/bf16 leaves whose gradients are f32)."""

    __slots__ = ()

    def grad(self) -> F32Tensor | None:
        """An owned copy of the accumulated gradient (f32), or None (inside
        ``fucina.compile``: the gradient at this point of every call)."""
        node = self._node
        tracer: Any = current_tracer()
        if tracer is not None and not node.value.is_symbolic:
            # The host's gradient is only the trace-time one: read the program's.
            if not hasattr(tracer, "grad"):
                raise TypeError("grad() cannot be traced here")
            with no_grad():
                g = tracer.grad(node)
                if g is None:
                    return None
                out = emit("copy", (g,))
            return result(self, self.axis_tags, out, DType.f32)
        g = node.grad
        return None if g is None else _grad_tensor(self, g.contiguous_copy())

    def grad_view(self) -> F32Tensor | None:
        """A view sharing the live gradient buffer as of now, or None."""
        if current_tracer() is not None and not self._node.value.is_symbolic:
            raise TypeError("grad_view() inside fucina.compile: the live gradient buffer "
                            "is the program's; use grad() (or read grad_view() after the call)")
        g = self._node.grad
        if g is None:
            return None
        return _grad_tensor(self, g.view(g.shape, g.strides, g.offset))


class Backward(Tensor):
    """Reverse-mode differentiation from this tensor (f32)."""

    __slots__ = ()

    def backward(self) -> None:
        """Accumulate d(self)/d(leaf) into every variable leaf; self must be single-element."""
        node = _seed_check(self)
        if node.value.numel != 1:
            raise MissingOutputGradient(
                f"backward() needs a single-element output, shape is {node.shape}; "
                "use backward_with_grad(grad_output)")
        seed = emit("fill", (), shape=node.shape, dtype=DType.f32, value=1.0)
        autodiff.backward(node, seed)

    def backward_with_grad(self, grad_output: Tensor) -> None:
        """Backward with an explicit output gradient of self's type and shape."""
        node = _seed_check(self)
        check_tensor(grad_output, "grad_output")
        same_ctx(self, grad_output)
        if tuple(grad_output.axis_tags) != tuple(self.axis_tags):
            raise TagError(f"grad_output tags {grad_output.axis_tags} differ from {self.axis_tags}")
        if grad_output.shape != self.shape:
            raise ShapeMismatch(f"grad_output shape {grad_output.shape} differs from {self.shape}")
        g = grad_output._node
        if g.dtype is not DType.f32:
            g = emit("cast", (g,), dtype=DType.f32, src=g.dtype)
        autodiff.backward(node, Node("const", (), {}, g.value, None, False))
