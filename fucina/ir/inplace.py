"""``assign``: the one primitive that writes into existing storage.

Everything else in the IR computes fresh values; optimizers and gradient
clipping need to update a variable, a state tensor or an accumulated gradient
where it lives, so that every holder of that storage (a compiled program that
captured the variable included) sees the new value. ``assign(target, value)``
writes ``value`` into ``target``'s storage, in ``target``'s layout; eager
mode executes it at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import ShapeMismatch, UnsupportedView
from ..kernels.reference import kernel
from .execute import current_tracer, emit
from .graph import Node
from .ops import OPS, OpDef


def _infer(ins: list[Any], attrs: dict[str, Any]) -> tuple[tuple[int, ...], DType]:
    return ins[0].shape, ins[0].dtype


OPS["assign"] = OpDef("assign", infer=_infer, differentiable=False)


@kernel("assign")
def _assign_kernel(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Write ins[1] into ins[0] (a view of the target's own storage)."""
    target, value = ins
    target[...] = value
    return target


def assign(target: Node, value: Node) -> None:
    """Write ``value`` into ``target``'s storage (same shape and dtype).

    While a function is traced the tracer records the update: later reads of
    the target in the trace see ``value``, and the compiled program writes it
    into the target's storage when it runs.
    """
    t, v = target.value, value.value
    if t.shape != v.shape:
        raise ShapeMismatch(f"assign: value shape {v.shape} differs from target shape {t.shape}")
    if t.dtype is not v.dtype:
        raise TypeError(f"assign: value dtype {v.dtype.value} differs from target dtype "
                        f"{t.dtype.value}")
    if t.storage.readonly:
        raise UnsupportedView("assign: the target's storage is read-only (borrowed const)")
    tracer: Any = current_tracer()
    if tracer is not None:
        record = getattr(tracer, "assign", None)
        if record is None:
            raise TypeError("assign: this tracer cannot record in-place updates")
        record(target, value)
        return
    emit("assign", (target, value))
