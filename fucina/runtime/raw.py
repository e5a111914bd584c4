"""The raw tensor: storage + dtype + shape + strides + offset, no tags.

Strides and offsets count storage elements (blocks for block-quantized
dtypes, whose last logical axis is stored ``block_size`` elements per block).
A raw tensor whose storage holds no buffer is symbolic: the tracer uses it to
carry shapes and layouts through a program without data.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..argnames import bad_argument
from ..dtypes import DType
from ..errors import InvalidDataLength, InvalidShape, UnsupportedView
from .storage import Storage, SymbolicStorage

MAX_RANK = 8
#: Most elements a tensor may have (no allocation beyond it can succeed). 2**59 keeps an
#: 8-byte buffer of that many elements (or a float64 temporary) within numpy's limit of
#: 2**63 - 1 bytes, so a larger request is numpy's MemoryError, never its "array is too
#: big" ValueError.
MAX_ELEMENTS = 2**59
#: :data:`MAX_ELEMENTS` as the messages that refuse a larger size write it.
MAX_ELEMENTS_TEXT = f"2**{MAX_ELEMENTS.bit_length() - 1}"

class _Reads(threading.local):
    fn: Callable[[RawTensor], None] | None = None  # a default: no AttributeError per read


_reads = _Reads()


def set_read_observer(fn: Callable[[RawTensor], None] | None
                      ) -> Callable[[RawTensor], None] | None:
    """Call ``fn(raw)`` whenever host code reads a raw tensor's data on this thread.

    ``fucina.compile`` observes reads while tracing: a captured tensor whose
    values the traced Python code reads (a mask turned into indices) shapes the
    trace, so its values are guarded. Returns the previous observer.
    """
    prev = _reads.fn
    _reads.fn = fn
    return prev


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) for ``shape``."""
    strides = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= shape[i]
    return tuple(strides)


def check_shape(shape: object, rank: int | None = None) -> tuple[int, ...]:
    """Validate a shape: a sequence of positive ints of the expected rank (1..8).

    TypeError (naming the argument) for anything but a sequence of ints;
    InvalidShape for sizes that are not positive, a wrong rank, or more
    elements than any buffer can hold.
    """
    if isinstance(shape, np.ndarray) and shape.ndim == 1:
        shape = shape.tolist()
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(bad_argument("shape", shape, "a sequence of ints"))
    dims: tuple[object, ...] = tuple(shape)
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(bad_argument("shape", shape, f"a sequence of ints ({d!r} is not)"))
        if d <= 0:
            raise InvalidShape(f"zero or negative dimension {int(d)} in shape {dims!r}")
        out.append(int(d))
    if rank is not None and len(out) != rank:
        raise InvalidShape(f"shape {tuple(out)} has rank {len(out)}, expected rank {rank}")
    if not 1 <= len(out) <= MAX_RANK:
        raise InvalidShape(f"raw rank must be 1..{MAX_RANK}, got shape {tuple(out)}")
    if math.prod(out) > MAX_ELEMENTS:
        raise InvalidShape(f"shape {tuple(out)} has more than {MAX_ELEMENTS_TEXT} elements")
    return tuple(out)


class RawTensor:
    """A strided view over refcounted storage (``fucina.internal.RawTensor``)."""

    __slots__ = ("storage", "dtype", "shape", "strides", "offset")

    def __init__(self, storage: Storage, dtype: DType, shape: tuple[int, ...],
                 strides: tuple[int, ...], offset: int = 0):
        self.storage = storage
        self.dtype = dtype
        self.shape = shape
        self.strides = strides
        self.offset = offset

    # -- construction -------------------------------------------------------

    @classmethod
    def empty(cls, dtype: DType, shape: tuple[int, ...]) -> RawTensor:
        """Fresh uninitialized contiguous storage."""
        n = _storage_count(dtype, shape)
        return cls(Storage(np.empty(n, dtype=dtype.storage)), dtype, shape,
                   _storage_strides(dtype, shape))

    @classmethod
    def symbolic(cls, dtype: DType, shape: tuple[int, ...]) -> RawTensor:
        """A contiguous layout with no data (tracing)."""
        return cls(SymbolicStorage(_storage_count(dtype, shape)), dtype, shape,
                   _storage_strides(dtype, shape))

    @classmethod
    def symbolic_like(cls, raw: RawTensor) -> RawTensor:
        """A traced stand-in for ``raw``: its layout from offset 0, storage size unknown."""
        return cls(SymbolicStorage(None), raw.dtype, raw.shape, raw.strides, 0)

    @classmethod
    def from_array(cls, dtype: DType, arr: np.ndarray, shape: tuple[int, ...] | None = None,
                   *, borrow: bool = False, readonly: bool = False) -> RawTensor:
        """Wrap (borrow) or copy ``arr`` (storage elements, row-major) as ``shape``."""
        shape = tuple(arr.shape) if shape is None else shape
        flat = np.asarray(arr)
        if borrow:
            if flat.dtype != dtype.storage:
                raise InvalidDataLength(
                    f"borrowed buffer has dtype {flat.dtype}, expected {dtype.storage}")
            if not flat.flags.c_contiguous:
                raise UnsupportedView("borrowed buffer must be C-contiguous")
            flat = flat.reshape(-1)
        else:
            flat = np.array(flat, dtype=dtype.storage, copy=True).reshape(-1)
        n = _storage_count(dtype, shape)
        if flat.size != n:
            raise InvalidDataLength(
                f"buffer holds {flat.size} elements, shape {shape} needs {n}")
        if readonly and flat.flags.writeable:
            flat = flat.view()
            flat.flags.writeable = False
        st = Storage(flat, readonly=readonly or not flat.flags.writeable, borrowed=borrow)
        return cls(st, dtype, shape, _storage_strides(dtype, shape))

    # -- geometry -------------------------------------------------------------

    @property
    def rank(self) -> int:
        """Number of axes."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Logical element count."""
        return math.prod(self.shape)

    @property
    def is_symbolic(self) -> bool:
        """True when no buffer backs this tensor (a traced value)."""
        return self.storage.buf is None

    def storage_shape(self) -> tuple[int, ...]:
        """Shape in storage elements (the last axis divided by the block size)."""
        bs = self.dtype.block_size
        if bs == 1:
            return self.shape
        return self.shape[:-1] + (self.shape[-1] // bs,)

    def is_contiguous(self) -> bool:
        """Dense row-major in logical order (size-1 axes may have any stride)."""
        expected = _storage_strides(self.dtype, self.shape)
        sshape = self.storage_shape()
        return all(s == e or d == 1 for s, e, d in zip(self.strides, expected, sshape))

    def view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> RawTensor:
        """A new raw tensor over the same storage (retains it)."""
        return RawTensor(self.storage.retain(), self.dtype, shape, strides, offset)

    # -- data -------------------------------------------------------------------

    def array(self) -> np.ndarray:
        """numpy view in logical shape over storage elements (blocks: storage shape)."""
        observer = _reads.fn
        if observer is not None:
            observer(self)
        buf = self.storage.buf
        assert buf is not None, "a symbolic tensor has no buffer"
        item = buf.itemsize
        return np.ndarray(self.storage_shape(), dtype=buf.dtype, buffer=buf,
                          offset=self.offset * item,
                          strides=tuple(s * item for s in self.strides))

    def flat(self) -> np.ndarray:
        """1-D view of a contiguous tensor's storage elements."""
        if not self.is_contiguous():
            raise UnsupportedView(
                f"tensor with shape {self.shape} and strides {self.strides} is not contiguous; "
                "materialize it first or use copy_to")
        observer = _reads.fn
        if observer is not None:
            observer(self)
        n = _storage_count(self.dtype, self.shape)
        buf = self.storage.buf
        assert buf is not None, "a symbolic tensor has no buffer"
        return buf[self.offset:self.offset + n]

    def contiguous_copy(self) -> RawTensor:
        """A fresh contiguous copy."""
        out = RawTensor.empty(self.dtype, self.shape)
        out.array()[...] = self.array()
        return out

    def __repr__(self) -> str:
        return (f"RawTensor(dtype={self.dtype.value}, shape={self.shape}, "
                f"strides={self.strides}, offset={self.offset})")


def _storage_count(dtype: DType, shape: tuple[int, ...]) -> int:
    bs = dtype.block_size
    n = math.prod(shape)
    if bs != 1:
        if shape[-1] % bs:
            raise InvalidShape(
                f"innermost dimension {shape[-1]} is not a multiple of the "
                f"{dtype.value} block size {bs}")
        return n // bs
    return n


def _storage_strides(dtype: DType, shape: tuple[int, ...]) -> tuple[int, ...]:
    bs = dtype.block_size
    if bs == 1:
        return contiguous_strides(shape)
    return contiguous_strides(shape[:-1] + (shape[-1] // bs,))
