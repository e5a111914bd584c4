"""Refcounted flat storage shared by a tensor and its views, and the buffer pool."""

from __future__ import annotations

import sys
import threading

import numpy as np

#: Buffers at least this large are recycled through the pool: fresh large
#: allocations pay a page fault per 4 KiB page on first touch (measured here:
#: a 16 MB result cost more than the kernel that filled it).
POOL_MIN_BYTES = 1 << 16
#: Upper bound on the bytes the pool holds idle.
POOL_MAX_BYTES = 512 << 20


class BufferPool:
    """Idle large buffers by (dtype, element count), reused before allocating."""

    def __init__(self) -> None:
        self._free: dict[tuple[str, int], list[np.ndarray]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, dtype: np.dtype, count: int) -> np.ndarray:
        """A buffer of ``count`` elements (contents undefined)."""
        dtype = np.dtype(dtype)
        if count * dtype.itemsize >= POOL_MIN_BYTES:
            with self._lock:
                bucket = self._free.get((dtype.str, count))
                if bucket:
                    buf = bucket.pop()
                    self._bytes -= buf.nbytes
                    return buf
        return np.empty(count, dtype=dtype)

    def give(self, buf: np.ndarray) -> None:
        """Return an unreferenced buffer for reuse."""
        if buf.nbytes < POOL_MIN_BYTES:
            return
        with self._lock:
            if self._bytes + buf.nbytes > POOL_MAX_BYTES:
                return
            self._free.setdefault((buf.dtype.str, buf.size), []).append(buf)
            self._bytes += buf.nbytes

    def clear(self) -> None:
        """Drop every idle buffer."""
        with self._lock:
            self._free.clear()
            self._bytes = 0


POOL = BufferPool()


class Storage:
    """A flat numpy buffer plus the owner count of the tensors viewing it.

    Memory itself is reclaimed by Python's garbage collector; the count makes
    ownership observable (views retain, deinit releases) as in the seeds.
    Pooled storages hand their buffer back to :data:`POOL` when collected,
    unless something else (a numpy view handed to the user) still holds it.
    """

    __slots__ = ("buf", "refs", "readonly", "borrowed")

    def __init__(self, buf: np.ndarray | None, *, readonly: bool = False, borrowed: bool = False):
        self.buf = buf
        self.refs = 1
        self.readonly = readonly
        self.borrowed = borrowed

    def retain(self) -> Storage:
        """Add one owner."""
        self.refs += 1
        return self

    def release(self) -> None:
        """Drop one owner."""
        if self.refs > 0:
            self.refs -= 1



class SymbolicStorage(Storage):
    """The storage of a traced value: no buffer, only what a program knows about its size.

    ``size`` is the element count when the trace knows it (an intermediate), None for
    a program input (bound at call time). ``need`` is the element count the traced views
    over it read (``strided`` views reach as far as their strides say), checked against
    the real buffer when an input is bound.
    """

    __slots__ = ("size", "need")

    def __init__(self, size: int | None = None):
        super().__init__(None)
        self.size = size
        self.need = 0


def storage_for(buf: np.ndarray, pooled: bool) -> Storage:
    """Storage for a fresh result; large pooled buffers get the recycling finalizer."""
    if pooled and buf.nbytes >= POOL_MIN_BYTES:
        return PooledStorage(buf)
    return Storage(buf)


class PooledStorage(Storage):
    """Storage whose large buffer returns to the pool when the storage is collected."""

    __slots__ = ()

    def __del__(self) -> None:
        buf = self.buf
        # getrefcount sees this slot, its argument and the local: 3 means nobody else.
        if buf is not None and sys.getrefcount(buf) <= 3:
            POOL.give(buf)
