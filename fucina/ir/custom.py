"""Primitives whose gradient comes from outside the rule table.

``custom`` is the value of its first input (an identity view over a result
computed without recording) whose remaining inputs are the operands it is
differentiated against; its VJP is a callable carried by the node. Custom
VJPs and activation checkpoints are both this one primitive.

``grad_sink`` is an identity view whose VJP hands the incoming gradient to a
collector and stops there: a checkpoint's recompute reads its inputs'
gradients from sinks instead of letting them reach the outer graph's leaves.

Both are views, so a program folds them away (no copy, no kernel); under a
tracer the VJPs emit ordinary primitives and become part of the program.
"""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.raw import RawTensor
from .autodiff import Grads, rule
from .execute import current_tracer, emit
from .graph import Node
from .ops import OPS, OpDef


def _alias(x: RawTensor, attrs: dict[str, object]) -> RawTensor:
    return x.view(x.shape, x.strides, x.offset)


OPS["custom"] = OpDef("custom", layout=_alias)
OPS["grad_sink"] = OpDef("grad_sink", layout=_alias)

#: vjp(node, g) -> one gradient (or None) per differentiated operand (inputs[1:]).
CustomVJP = Callable[[Node, Node], Grads]


@rule("custom")
def _custom(n: Node, g: Node) -> Grads:
    return (None, *n.attrs["vjp"](n, g))


@rule("grad_sink")
def _grad_sink(n: Node, g: Node) -> Grads:
    n.attrs["collect"](g)
    return (None,)


def custom(value: Node, operands: tuple[Node, ...], vjp: CustomVJP, *,
           record_always: bool = False) -> Node:
    """A node carrying ``value``'s result, differentiated against ``operands`` by ``vjp``.

    It records when an operand requires grad and grad mode is on; with
    ``record_always`` grad mode is ignored (a checkpoint keys on its inputs alone).
    """
    tracer = current_tracer()
    if tracer is not None:
        # Concrete operands (captured tensors) become the program inputs the trace reads,
        # so gradients reach whatever the capture resolves to at call time.
        value, *rest = (n if n.value.is_symbolic else tracer.lift(n) for n in (value, *operands))
        operands = tuple(rest)
    if not record_always:
        return emit("custom", (value, *operands), vjp=vjp)
    rg = any(o.requires_grad for o in operands)
    inputs = (value, *operands) if rg else (value,)
    node = Node("custom", inputs, {"vjp": vjp}, _alias(value.value, {}), None, rg)
    if tracer is not None:
        tracer.record(node)
    return node


def grad_sink(x: Node, collect: Callable[[Node], None]) -> Node:
    """An alias of ``x`` whose incoming gradient goes to ``collect`` and no further."""
    return emit("grad_sink", (x,), collect=collect)
