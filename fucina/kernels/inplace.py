"""Writing into existing storage: the in-place and storage-consuming inference helpers.

Everything else computes fresh results; these helpers update a tensor's own
buffer (visible to every view of it) or reuse the buffer of a tensor they
consume. Targets are checked first: a read-only (borrowed const) buffer or a
broadcast view (several elements sharing one address) is refused.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import UnsupportedView
from ..runtime.raw import RawTensor


def check_target(dst: RawTensor, what: str) -> None:
    """``dst`` can be written element by element (UnsupportedView otherwise)."""
    if dst.storage.readonly:
        raise UnsupportedView(f"{what}: the tensor's storage is read-only (borrowed const)")
    if any(s == 0 and d > 1 for s, d in zip(dst.strides, dst.shape)):
        raise UnsupportedView(f"{what}: the tensor is a broadcast view (shape {dst.shape}, "
                              f"strides {dst.strides}); materialize it first")


def write(dst: RawTensor, src: RawTensor) -> None:
    """Copy ``src``'s values into ``dst``'s storage, in ``dst``'s layout (same shape)."""
    dst.array()[...] = src.array()


def exclusive(raw: RawTensor) -> bool:
    """True when ``raw`` is the only user of a whole, writable, owned buffer: no other
    tensor view, no numpy view handed out, not borrowed from the caller."""
    st = raw.storage
    buf = st.buf
    if buf is None or st.refs != 1 or st.readonly or st.borrowed:
        return False
    if buf.base is not None:  # a view of another array: its readers are not countable here
        return False
    if raw.offset != 0 or not raw.is_contiguous() or raw.numel != buf.size:
        return False
    # the storage slot, this local and getrefcount's argument: nobody else
    return sys.getrefcount(buf) <= 3


def add_into(dst: RawTensor, other: RawTensor) -> None:
    """dst += other elementwise (``other`` at dst's shape, possibly broadcast)."""
    a = dst.array()
    np.add(a, other.array(), out=a)


def scale_into(dst: RawTensor, s: float) -> None:
    """dst *= s, with ``s`` in dst's dtype (as the ``scale`` op rounds it)."""
    a = dst.array()
    np.multiply(a, a.dtype.type(s), out=a)
