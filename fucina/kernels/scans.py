"""Kernels for the scan-like primitives beyond cumsum/cumprod: the first-order linear
recurrence and contiguous segment sums (with their adjoints).

Operands arrive in logical shape with any strides; each kernel views them as
``[outer, axis, inner]`` (a copy only when the layout cannot be viewed so, e.g.
a broadcast decay) and loops serially along the axis, lanes in parallel.
The recurrence is compiled without fast-math: every step is one multiply
then one add, so a chunked run seeded with the previous chunk's last state
continues a sequence bit for bit. Offsets are checked before any kernel
reads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from ..dtypes import DType
from ..errors import InvalidShape
from .reference import kernel


def _three(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` viewed (or copied) as [prod(before axis), axis, prod(after axis)]."""
    shape = a.shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return a.reshape(outer, shape[axis], inner)


@njit(cache=True, nogil=True, parallel=True)
def _linrec_forward(b, a, h0, out):
    n_outer, n_t, n_inner = b.shape
    for o in prange(n_outer):
        for i in range(n_inner):
            out[o, 0, i] = a[o, 0, i] * h0[o, 0, i] + b[o, 0, i]
        for t in range(1, n_t):
            for i in range(n_inner):
                out[o, t, i] = a[o, t, i] * out[o, t - 1, i] + b[o, t, i]


@njit(cache=True, nogil=True, parallel=True)
def _linrec_reverse(b, a, out):
    n_outer, n_t, n_inner = b.shape
    for o in prange(n_outer):
        for i in range(n_inner):
            out[o, n_t - 1, i] = b[o, n_t - 1, i]
        for t in range(n_t - 2, -1, -1):
            for i in range(n_inner):
                out[o, t, i] = a[o, t + 1, i] * out[o, t + 1, i] + b[o, t, i]


@kernel("linear_recurrence")
def linear_recurrence(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """h_t = a_t * h_{t-1} + b_t along ``axis`` (h_{-1} = the optional third input, else 0).

    ``reverse``: the adjoint scan h_t = a_{t+1} * h_{t+1} + b_t from the end.
    """
    axis = attrs["axis"]
    b = ins[0]
    res = np.empty(b.shape, dtype=out.storage)
    b3, a3, r3 = _three(b, axis), _three(ins[1], axis), _three(res, axis)
    if attrs.get("reverse"):
        _linrec_reverse(b3, a3, r3)
    else:
        h0 = _three(ins[2], axis) if len(ins) > 2 else np.zeros((b3.shape[0], 1, b3.shape[2]),
                                                                 dtype=b.dtype)
        _linrec_forward(b3, a3, h0, r3)
    return res


def check_offsets(offsets: np.ndarray, n: int, what: str) -> None:
    """Segment offsets: rank 1, at least two entries, 0 first, ``n`` last, non-decreasing."""
    if offsets.ndim != 1 or offsets.size < 2:
        raise InvalidShape(f"{what} needs at least two offsets (one segment), got "
                           f"{offsets.size}")
    if offsets[0] != 0:
        raise InvalidShape(f"{what}: offsets must start at 0, got {int(offsets[0])}")
    if offsets[-1] != n:
        raise InvalidShape(f"{what}: offsets must end at the axis size {n}, got "
                           f"{int(offsets[-1])}")
    step = np.diff(offsets)
    if (step < 0).any():
        k = int(np.argmax(step < 0))
        raise InvalidShape(f"{what}: offsets must be non-decreasing; offsets[{k + 1}] = "
                           f"{int(offsets[k + 1])} < offsets[{k}] = {int(offsets[k])}")


@njit(cache=True, nogil=True, parallel=True)
def _segment_sum(x, off, out):
    n_outer, _, n_inner = x.shape
    n_seg = out.shape[1]
    for o in prange(n_outer):
        for s in range(n_seg):
            for i in range(n_inner):
                out[o, s, i] = 0
            for j in range(off[s], off[s + 1]):
                for i in range(n_inner):
                    out[o, s, i] += x[o, j, i]


@njit(cache=True, nogil=True, parallel=True)
def _segment_broadcast(g, off, out):
    n_outer, n_seg, n_inner = g.shape
    for o in prange(n_outer):
        for s in range(n_seg):
            for j in range(off[s], off[s + 1]):
                for i in range(n_inner):
                    out[o, j, i] = g[o, s, i]


@kernel("segment_sum")
def segment_sum(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """out[..., s, ...] = sum of x[..., j, ...] for j in [off[s], off[s+1]) along ``axis``."""
    x, axis = ins[0], attrs["axis"]
    off = np.ascontiguousarray(ins[1], dtype=np.int64).reshape(-1)
    check_offsets(off, x.shape[axis], "segment_sum")
    shape = list(x.shape)
    shape[axis] = off.size - 1
    res = np.empty(shape, dtype=out.storage)
    _segment_sum(_three(x, axis), off, _three(res, axis))
    return res


@kernel("segment_broadcast")
def segment_broadcast(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """The adjoint of segment_sum: each row of ``g`` repeated over its segment."""
    g, axis = ins[0], attrs["axis"]
    off = np.ascontiguousarray(ins[1], dtype=np.int64).reshape(-1)
    check_offsets(off, attrs["dim"], "segment_sum")
    shape = list(g.shape)
    shape[axis] = attrs["dim"]
    res = np.empty(shape, dtype=out.storage)
    _segment_broadcast(_three(g, axis), off, _three(res, axis))
    return res
