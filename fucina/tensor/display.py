"""How a tensor prints: numpy-style values, summarized with ``...`` when large.

Storage-only formats print as values, not bits: bf16 and the FP8 formats are
decoded to f32 first. Only the elements that will be shown are read and
decoded, so printing a large tensor costs the same as printing a small one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType

#: numpy's own print defaults: summarize above 1000 elements, 3 at each edge.
THRESHOLD = 1000
EDGE = 3


def decode(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Storage elements as values: bf16 / FP8 bits become f32, the rest pass through."""
    if dtype is DType.bf16:
        from ..kernels.cast import bf16_to_f32

        return bf16_to_f32(arr)
    if dtype is DType.f8_e4m3:
        from ..kernels.cast import f8e4m3_to_f32

        return f8e4m3_to_f32(arr)
    if dtype is DType.f8_e5m2:
        from ..kernels.cast import f8e5m2_to_f32

        return f8e5m2_to_f32(arr)
    return arr


def _edges(arr: np.ndarray) -> np.ndarray:
    """A small copy keeping EDGE items at both ends of every long axis, plus one filler
    item that numpy's summarizer replaces by ``...`` (so the layout matches numpy's)."""
    for axis, n in enumerate(arr.shape):
        if n > 2 * EDGE + 1:
            keep = np.r_[0:EDGE + 1, n - EDGE:n]
            arr = np.take(arr, keep, axis=axis)
    return arr


def format_values(arr: np.ndarray, dtype: DType, prefix: str) -> str:
    """numpy's array2string of the values of storage array ``arr``."""
    if arr.size > THRESHOLD:
        shown = decode(_edges(arr), dtype)
        return np.array2string(shown, separator=", ", prefix=prefix, threshold=0,
                               edgeitems=EDGE)
    return np.array2string(decode(arr, dtype), separator=", ", prefix=prefix,
                           threshold=THRESHOLD, edgeitems=EDGE)


def tensor_repr(x: Any) -> str:
    """``tensor([...], tags=(...), shape=(...), dtype=..., requires_grad=...)``."""
    cls = type(x)
    node = x._node_
    tail = [f"tags={cls.axis_tags!r}"]
    if node is None:
        return f"tensor(<deinit'ed>, {tail[0]})"
    tail.append(f"shape={tuple(node.shape)!r}")
    if cls.dtype is not DType.f32:
        tail.append(f"dtype={cls.dtype.value!r}")
    tail.append(f"requires_grad={node.requires_grad}")
    raw = node.value
    if raw.is_symbolic:
        body = "<traced>"
    elif raw.dtype.is_block:
        body = f"<{raw.numel // raw.dtype.block_size} {raw.dtype.value} blocks>"
    else:
        arr = raw.array()
        if cls.tag_count == 0:
            arr = arr.reshape(())
        body = format_values(arr, raw.dtype, "tensor(")
    return f"tensor({body}, {', '.join(tail)})"
