"""Selection primitives: ``topk_index``, ``multinomial`` and ``check_index``.

Ordering and sampling are not compositions of elementwise ops and reductions,
so they are primitives with Numba row kernels (``kernels/selection.py``). They
produce i64 indices and carry no gradient: ``top_k``/``sort`` values are
gathered from the input with ``take_along`` afterwards, whose VJP scatters the
gradient back through the indices (the reference's "values scatter back").

``check_index(x, index)`` passes an i64 index vector through unchanged; its
entry in ``ir/checks.py`` checks every entry against the size of ``x``'s axis
``axis``, for composites (``nll_loss``) that compare with index data instead of
reading through it. Like every index check it runs at once in eager mode and as
a program step under ``compile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import IndexOutOfBounds, InvalidShape
from ..kernels import selection as K
from ..kernels.reference import kernel
from ..runtime.raw import RawTensor
from .checks import VALUE_CHECKS, axis_name, check_range
from .graph import Node
from .ops import OPS, Meta, OpDef


def rows_last(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` as C-contiguous 2-D rows with ``axis`` last (a copy only when needed)."""
    m = np.moveaxis(a, axis, -1)
    return np.ascontiguousarray(m).reshape(-1, m.shape[-1])


def rows_back(r: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Inverse of :func:`rows_last` for a result whose ``axis`` has ``r.shape[1]`` entries."""
    moved = [d for i, d in enumerate(shape) if i != axis] + [r.shape[1]]
    return np.ascontiguousarray(np.moveaxis(r.reshape(moved), -1, axis))


def check_labels(index: Any, dim: int, allowed: int | None, what: str) -> None:
    """IndexOutOfBounds unless every entry lies in [0, dim) or equals ``allowed``
    (``ir/checks.py``'s message: the index, ``what`` names the axis, its size)."""
    idx = np.asarray(index).reshape(-1)
    if allowed is not None:
        idx = idx[idx != allowed]
    check_range(idx, 0, dim, what, dim)


def check_indices(idx: np.ndarray, dim: int, allowed: int | None = None) -> np.ndarray:
    """Flat int64 copy of ``idx``, range-checked once more where a kernel takes it (the
    IR checked it already: this guard keeps a kernel from ever reading out of bounds)."""
    flat = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    bad = (flat < 0) | (flat >= dim)
    if allowed is not None:
        bad &= flat != allowed
    if bad.any():
        raise IndexOutOfBounds(f"index {int(flat[np.argmax(bad)])} out of range for an axis "
                               f"of size {dim}")
    return flat


def _selected_shape(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    shape = list(ins[0].shape)
    shape[attrs["axis"]] = attrs["k"]
    return tuple(shape), DType.i64


OPS["topk_index"] = OpDef("topk_index", infer=_selected_shape, differentiable=False)
OPS["multinomial"] = OpDef("multinomial", infer=_selected_shape, differentiable=False)
OPS["check_index"] = OpDef("check_index", infer=lambda ins, attrs: (ins[1].shape, DType.i64),
                           differentiable=False)


def _check_index_values(inputs: Sequence[Node], attrs: dict[str, Any],
                        arrays: list[np.ndarray]) -> None:
    x, axis = inputs[0], attrs["axis"]
    check_labels(arrays[1], x.shape[axis], None, axis_name(x, axis))


VALUE_CHECKS["check_index"] = _check_index_values


@kernel("topk_index")
def _topk_index(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Per-lane top-k (``sort=False``: -1 marks unfilled slots) or full sort order."""
    axis, k = attrs["axis"], attrs["k"]
    rows = rows_last(np.asarray(ins[0], dtype=np.float32), axis)
    res = np.empty((rows.shape[0], k), np.int64)
    if attrs["sort"]:
        K.sort_rows(rows, bool(attrs["descending"]), res)
    else:
        K.topk_rows(rows, k, res)
    return rows_back(res, ins[0].shape, axis)


def _weight_rows(attrs: dict[str, Any], weights: np.ndarray) -> np.ndarray:
    """The weights as f32 rows (``axis`` last)."""
    return rows_last(np.asarray(weights, dtype=np.float32), attrs["axis"])


def _multinomial_value(inputs: Sequence[Node], attrs: dict[str, Any],
                       arrays: list[np.ndarray]) -> None:
    """The weights are finite, >= 0, with a positive one per row, and without replacement
    as many nonzero classes as draws. Eager runs this before the op, a compiled program
    as a step of its own even where nothing reads the draws (checks.needs_value_check),
    so the kernel below takes checked weights."""
    w = _weight_rows(attrs, arrays[0])
    num, replacement = attrs["k"], bool(attrs["replacement"])
    if not np.isfinite(w).all():
        raise InvalidShape("multinomial weights must be finite")
    if (w < 0).any():
        raise InvalidShape("multinomial weights must be >= 0")
    nonzero = (w > 0).sum(axis=1)
    if (nonzero == 0).any():
        row = int(np.argmax(nonzero == 0))
        raise InvalidShape(f"multinomial row {row} has no positive weight")
    if not replacement and (nonzero < num).any():
        row = int(np.argmax(nonzero < num))
        raise InvalidShape(f"multinomial without replacement: {num} samples but row {row} "
                           f"has {int(nonzero[row])} nonzero classes")


VALUE_CHECKS["multinomial"] = _multinomial_value


@kernel("multinomial")
def _multinomial(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Categorical draws along ``axis`` (the last), from checked weights."""
    axis, num, replacement = attrs["axis"], attrs["k"], bool(attrs["replacement"])
    w = _weight_rows(attrs, ins[0])
    res = np.empty((w.shape[0], num), np.int64)
    K.multinomial_rows(w, num, np.uint64(attrs["seed"]), replacement, res)
    return rows_back(res, ins[0].shape, axis)


@kernel("check_index")
def _check_index(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """A copy of the (checked) index vector: never an alias of a buffer another tensor owns."""
    x, idx = ins
    flat = check_indices(idx, x.shape[attrs["axis"]])
    return np.array(flat.reshape(idx.shape), copy=True)
