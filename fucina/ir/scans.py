"""Scan-like primitives beyond cumsum/cumprod, and their VJP rules.

``linear_recurrence(b, a[, h0]; axis, reverse)``: h_t = a_t h_{t-1} + b_t along
``axis`` (all operands at b's shape; ``h0`` with a size-1 axis). With
``reverse`` it is its own adjoint's scan, h_t = a_{t+1} h_{t+1} + b_t. The
VJP is one reverse scan: gh = reverse(gy, a); db = gh; da_t = gh_t h_{t-1};
dh0 = a_0 gh_0. Broadcast operands arrive as zero-stride views, so the view
adjoint reduces their gradients.

``segment_sum(x, offsets; axis)`` sums contiguous ranges of an axis;
``segment_broadcast(g, offsets; axis, dim)`` repeats each row over its range
(its adjoint). Offsets are an i64 tensor operand, so a compiled program
takes new offsets without retracing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..kernels import scans as _kernels  # registers the reference kernels
from ..runtime.raw import RawTensor
from .autodiff import Grads, narrow_view, rule
from .checks import VALUE_CHECKS
from .execute import emit
from .graph import Node
from .ops import OPS, Meta, OpDef


def _same(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[0].shape, ins[0].dtype


def _segment_sum_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    shape = list(ins[0].shape)
    shape[attrs["axis"]] = ins[1].shape[0] - 1
    return tuple(shape), ins[0].dtype


def _segment_broadcast_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    shape = list(ins[0].shape)
    shape[attrs["axis"]] = attrs["dim"]
    return tuple(shape), ins[0].dtype


OPS["linear_recurrence"] = OpDef("linear_recurrence", infer=_same)
OPS["segment_sum"] = OpDef("segment_sum", infer=_segment_sum_meta)
OPS["segment_broadcast"] = OpDef("segment_broadcast", infer=_segment_broadcast_meta)


def _offsets_value(inputs: Sequence[Node], attrs: dict[str, Any],
                   arrays: list[np.ndarray]) -> None:
    n = attrs["dim"] if "dim" in attrs else inputs[0].shape[attrs["axis"]]
    _kernels.check_offsets(np.asarray(arrays[1]).reshape(-1), n, "segment_sum")


# Traced offsets are checked when the op runs in eager mode, and by a compiled program even
# where nothing reads the sums (ir/checks.needs_value_check).
VALUE_CHECKS["segment_sum"] = _offsets_value
VALUE_CHECKS["segment_broadcast"] = _offsets_value


def _zeros(shape: tuple[int, ...]) -> Node:
    return emit("fill", (), shape=shape, dtype=DType.f32, value=0.0)


@rule("linear_recurrence")
def _linear_recurrence(n: Node, g: Node) -> Grads:
    if n.attrs.get("reverse"):
        raise KeyError("the reverse linear recurrence (a VJP) has no gradient rule")
    axis = n.attrs["axis"]
    a = n.inputs[1]
    h0 = n.inputs[2] if len(n.inputs) > 2 else None
    gh = emit("linear_recurrence", (g, a), axis=axis, reverse=True)
    ga = gh0 = None
    if a.requires_grad:
        t = n.shape[axis]
        first = h0 if h0 is not None else _zeros(tuple(1 if k == axis else d
                                                       for k, d in enumerate(n.shape)))
        prev = first if t == 1 else emit("concat", (first, narrow_view(n, axis, 0, t - 1)),
                                         axis=axis)
        ga = emit("binary", (gh, prev), fn="mul")
    if h0 is not None and h0.requires_grad:
        gh0 = narrow_view(emit("binary", (a, gh), fn="mul"), axis, 0, 1)
    return (gh, ga) if h0 is None else (gh, ga, gh0)


@rule("segment_sum")
def _segment_sum(n: Node, g: Node) -> Grads:
    x, off = n.inputs
    axis = n.attrs["axis"]
    return emit("segment_broadcast", (g, off), axis=axis, dim=x.shape[axis]), None


@rule("segment_broadcast")
def _segment_broadcast(n: Node, g: Node) -> Grads:
    return emit("segment_sum", (g, n.inputs[1]), axis=n.attrs["axis"]), None


def linear_recurrence(b: Node, a: Node, h0: Node | None, axis: int) -> Node:
    """Emit the forward recurrence (operands already aligned to ``b``'s shape)."""
    ins = (b, a) if h0 is None else (b, a, h0)
    return emit("linear_recurrence", ins, axis=axis)
