"""IR nodes: one primitive op, its inputs, attributes and result value."""

from __future__ import annotations

from typing import Any

from ..runtime.raw import RawTensor


class Node:
    """One IR node.

    ``value`` is the result's raw tensor: real data in eager mode, a symbolic
    layout (no buffer) while tracing. ``tags`` are the facade's names for the
    result axes (kernels never read them). Leaves are ``const`` (no grad) or
    ``variable`` (a trainable leaf whose accumulated gradient is ``grad``).
    """

    __slots__ = ("op", "inputs", "attrs", "value", "tags", "requires_grad", "grad",
                 "__weakref__")

    def __init__(self, op: str, inputs: tuple[Node, ...], attrs: dict[str, Any],
                 value: RawTensor, tags: tuple[str, ...] | None, requires_grad: bool):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.value = value
        self.tags = tags
        self.requires_grad = requires_grad
        self.grad: RawTensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """Result shape."""
        return self.value.shape

    @property
    def dtype(self):
        """Result dtype."""
        return self.value.dtype

    @property
    def is_leaf(self) -> bool:
        """True for const and variable nodes."""
        return self.op in ("const", "variable")

    def __repr__(self) -> str:
        return f"Node({self.op}, shape={self.shape}, dtype={self.dtype.value})"


def topo_order(roots: list[Node], grad_only: bool = False) -> list[Node]:
    """Nodes reachable from ``roots``, inputs before users (iterative DFS).

    ``grad_only`` follows only inputs that require grad (the backward walk).
    """
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for inp in reversed(node.inputs):
            if id(inp) not in seen and (inp.requires_grad or not grad_only):
                stack.append((inp, False))
    return order


def leaf(value: RawTensor, tags: tuple[str, ...] | None, variable: bool) -> Node:
    """A const or variable leaf around an existing raw tensor."""
    return Node("variable" if variable else "const", (), {}, value, tags, variable)
