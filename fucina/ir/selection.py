"""Selection primitives: ``topk_index``, ``multinomial`` and ``check_index``.

Ordering and sampling are not compositions of elementwise ops and reductions,
so they are primitives with Numba row kernels (``kernels/selection.py``). They
produce i64 indices and carry no gradient: ``top_k``/``sort`` values are
gathered from the input with ``take_along`` afterwards, whose VJP scatters the
gradient back through the indices (the reference's "values scatter back").

``check_index`` passes an i64 index vector through unchanged after checking
every entry against ``[0, dim)`` (or an allowed sentinel): index data a
compiled program receives as a traced tensor is checked when the program
runs, before any kernel reads it, exactly as eager checks it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import IndexOutOfBounds, InvalidShape
from ..kernels import selection as K
from ..kernels.reference import kernel
from ..runtime.raw import RawTensor
from .ops import OPS, Meta, OpDef


def rows_last(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` as C-contiguous 2-D rows with ``axis`` last (a copy only when needed)."""
    m = np.moveaxis(a, axis, -1)
    return np.ascontiguousarray(m).reshape(-1, m.shape[-1])


def rows_back(r: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Inverse of :func:`rows_last` for a result whose ``axis`` has ``r.shape[1]`` entries."""
    moved = [d for i, d in enumerate(shape) if i != axis] + [r.shape[1]]
    return np.ascontiguousarray(np.moveaxis(r.reshape(moved), -1, axis))


def check_indices(idx: np.ndarray, dim: int, allowed: int | None = None,
                  what: str = "index") -> np.ndarray:
    """Flat int64 copy of ``idx`` with every entry in [0, dim) or equal to ``allowed``;
    IndexOutOfBounds names the first bad entry and its position."""
    flat = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    bad = (flat < 0) | (flat >= dim)
    if allowed is not None:
        bad &= flat != allowed
    if bad.any():
        pos = int(np.argmax(bad))
        raise IndexOutOfBounds(f"{what} {int(flat[pos])} at position {pos} out of range for "
                               f"an axis of size {dim}")
    return flat


def _selected_shape(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    shape = list(ins[0].shape)
    shape[attrs["axis"]] = attrs["k"]
    return tuple(shape), DType.i64


OPS["topk_index"] = OpDef("topk_index", infer=_selected_shape, differentiable=False)
OPS["multinomial"] = OpDef("multinomial", infer=_selected_shape, differentiable=False)
OPS["check_index"] = OpDef("check_index", infer=lambda ins, attrs: (ins[0].shape, DType.i64),
                           differentiable=False)


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


@kernel("multinomial")
def _multinomial(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Categorical draws along ``axis`` (the last); the weights are checked first."""
    axis, num, replacement = attrs["axis"], attrs["k"], bool(attrs["replacement"])
    w = rows_last(np.asarray(ins[0], dtype=np.float32), axis)
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
    res = np.empty((w.shape[0], num), np.int64)
    K.multinomial_rows(w, num, np.uint64(attrs["seed"]), replacement, res)
    return rows_back(res, ins[0].shape, axis)


@kernel("check_index")
def _check_index(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """A copy of the index vector (never an alias of a buffer another tensor owns), after
    the range check."""
    flat = check_indices(ins[0], attrs["dim"], attrs.get("allowed"), attrs.get("what", "index"))
    return np.array(flat.reshape(ins[0].shape), copy=True)
