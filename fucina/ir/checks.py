"""Index checks made before any kernel reads index data, the same in eager and compiled.

Index data reaches a primitive two ways: as a host array in the node's
attributes (known while tracing, checked once when the node is built) or as
an integer tensor input (a traced value, checked when the op runs: in eager
mode just before its kernel, in a compiled program as a step of its own).
Either way an index outside its axis raises ``IndexOutOfBounds`` naming the
index, the axis and its size; ``-1`` is out of range (no wrapping).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DivisionByZero, IndexOutOfBounds, InvalidShape
from .graph import Node

#: op -> check over (inputs, attrs) for index data held in the attributes.
ATTR_CHECKS: dict[str, Callable[[Sequence[Node], dict[str, Any]], None]] = {}
#: op -> check over (inputs, attrs, input arrays) for index data held in an input tensor.
VALUE_CHECKS: dict[str, Callable[[Sequence[Node], dict[str, Any], list[np.ndarray]], None]] = {}


def axis_name(node: Node, axis: int) -> str:
    """How an error names axis ``axis`` of ``node``: its tag when the node carries tags."""
    tags = node.tags
    if tags and 0 <= axis < len(tags):
        return repr(tags[axis])
    return f"axis {axis}"


def check_range(index: Any, low: int, high: int, what: str, what_size: int) -> None:
    """Raise ``IndexOutOfBounds`` unless every entry of ``index`` lies in [low, high)."""
    idx = np.asarray(index)
    if idx.size == 0:
        return
    bad = (idx < low) | (idx >= high)
    if bad.any():
        first = int(idx.reshape(-1)[np.argmax(bad.reshape(-1))])
        raise IndexOutOfBounds(f"index {first} out of range for {what} of size {what_size}")


def _along(inputs: Sequence[Node], attrs: dict[str, Any], index: Any, bound: int | None = None,
           low: int = 0) -> None:
    axis = attrs["axis"]
    x = inputs[0]
    dim = x.shape[axis] if bound is None else bound
    check_range(index, low, dim, axis_name(x, axis), dim)


def _flat(inputs: Sequence[Node], attrs: dict[str, Any], index: Any, n: int, low: int) -> None:
    check_range(index, low, n, "the flattened tensor", n)


# -- index data in the attributes -------------------------------------------------------


def _gather_attr(inputs: Sequence[Node], attrs: dict[str, Any]) -> None:
    if len(inputs) == 1:
        _along(inputs, attrs, attrs["index"])


def _scatter_axis_attr(inputs: Sequence[Node], attrs: dict[str, Any]) -> None:
    if len(inputs) == 1:
        _along(inputs, attrs, attrs["index"], bound=attrs["dim"])


def _rows_attr(inputs: Sequence[Node], attrs: dict[str, Any]) -> None:
    if len(inputs) == 2:
        _along(inputs, attrs, attrs["index"])


def _gather_flat_attr(inputs: Sequence[Node], attrs: dict[str, Any]) -> None:
    # -1 marks a position that takes the fill value instead of reading.
    _flat(inputs, attrs, attrs["index"], int(np.prod(inputs[0].shape)),
          -1 if attrs.get("has_fill") else 0)


def _scatter_flat_attr(inputs: Sequence[Node], attrs: dict[str, Any]) -> None:
    # Negative entries are positions nothing is added from (gather_flat's fill).
    _flat(inputs, attrs, attrs["index"], int(np.prod(attrs["shape"])), -1)


ATTR_CHECKS.update({
    "gather": _gather_attr,
    "scatter_axis_add": _scatter_axis_attr,
    "index_add": _rows_attr,
    "set_index": _rows_attr,
    "gather_flat": _gather_flat_attr,
    "scatter_flat_add": _scatter_flat_attr,
})


# -- index data in an input tensor ------------------------------------------------------


def _second_input(inputs: Sequence[Node], attrs: dict[str, Any],
                  arrays: list[np.ndarray]) -> None:
    _along(inputs, attrs, arrays[1])


def _gather_value(inputs: Sequence[Node], attrs: dict[str, Any],
                  arrays: list[np.ndarray]) -> None:
    if len(inputs) > 1:
        _along(inputs, attrs, arrays[1])


def _scatter_axis_value(inputs: Sequence[Node], attrs: dict[str, Any],
                        arrays: list[np.ndarray]) -> None:
    if len(inputs) > 1:
        _along(inputs, attrs, arrays[1], bound=attrs["dim"])


def _rows_value(inputs: Sequence[Node], attrs: dict[str, Any],
                arrays: list[np.ndarray]) -> None:
    # index_add / set_index: (base, update) with the rows in the attributes, or
    # (base, update, index) with a traced i64 index.
    if len(inputs) > 2:
        _along(inputs, attrs, arrays[2])
        if attrs.get("unique"):
            check_unique(arrays[2], "set_rows")


def check_unique(index: Any, what: str) -> None:
    """InvalidShape when ``index`` repeats an entry (rows written once each)."""
    idx = np.asarray(index).reshape(-1)
    if np.unique(idx).size != idx.size:
        raise InvalidShape(f"{what}: duplicate indices in {idx.tolist()}")


VALUE_CHECKS.update({
    "take_along": _second_input,
    "scatter_add": _second_input,
    "scatter": _second_input,
    "gather": _gather_value,
    "scatter_axis_add": _scatter_axis_value,
    "index_add": _rows_value,
    "set_index": _rows_value,
})

#: Ops whose index data is optionally a traced input: the input count beyond which
#: it is one (below it the index is an attribute, checked when the node is built).
_OPTIONAL_INDEX_INPUT = {"gather": 1, "scatter_axis_add": 1, "index_add": 2, "set_index": 2}

#: Integer divisions (``binary`` ops): a zero divisor raises before the kernel runs.
INT_DIVISION = frozenset({"div_trunc", "div_floor", "rem", "mod"})


def _divisor_value(inputs: Sequence[Node], attrs: dict[str, Any],
                   arrays: list[np.ndarray]) -> None:
    if attrs["fn"] in INT_DIVISION and not np.all(arrays[1]):
        raise DivisionByZero(f"{attrs['fn']}: the divisor holds a zero")


VALUE_CHECKS["binary"] = _divisor_value


#: How ``fast.ir()`` states a value check: op -> (the input checked, what holds, the
#: error otherwise). Ops not listed check index data in their second input.
CHECK_TEXT: dict[str, tuple[int, str, str]] = {
    "binary": (1, "no zero divisor", "DivisionByZero"),
    "multinomial": (0, "weights finite, >= 0, a positive one per row", "InvalidShape"),
    "segment_sum": (1, "offsets from 0 to the axis size, non-decreasing", "InvalidShape"),
    "segment_broadcast": (1, "offsets from 0 to the axis size, non-decreasing",
                          "InvalidShape"),
}


def check_text(node: Node) -> tuple[int, str, str]:
    """(input checked, what holds, error otherwise) of ``node``'s value check."""
    return CHECK_TEXT.get(node.op, (1, "index values in range", "IndexOutOfBounds"))


def needs_value_check(node: Node) -> bool:
    """Whether running ``node`` needs a check of its input values first (index data, an
    integer divisor): eager checks every such op, so a program runs it even when nothing
    reads its result."""
    if node.op == "binary":
        return node.attrs.get("fn") in INT_DIVISION
    return node.op in VALUE_CHECKS and len(node.inputs) > _OPTIONAL_INDEX_INPUT.get(node.op, 0)
