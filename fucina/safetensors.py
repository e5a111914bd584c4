"""safetensors files: read (memory-mapped, zero-copy) and write, on the ``safetensors`` package.

``open(path)`` validates the file with ``safetensors.safe_open`` (the
package checks the header schema, offsets, coverage and length), then maps
it read-only and reads the JSON header itself for each tensor's byte range:
the package's Python API copies tensors out (and has no numpy bf16), so
tensors are handed out as views of the mapping. A view is zero-copy when the
tensor's file offset is a multiple of its element size (files written by
safetensors pad the header to 8 bytes, so always for them); otherwise
``tensor`` copies that one tensor. ``save`` serializes with
``safetensors.serialize_file``.

Dtypes: F32, F16, BF16 (raw uint16 bits), F64, I8, I16, I32, I64, U8, U16,
BOOL, F8_E4M3, F8_E5M2. Other safetensors dtypes are listed with
``dtype=None`` and raise ``UnsupportedDType`` when read. Errors name the
file and tensor: ``TruncatedFile`` (shorter than its header),
``ModelFileError`` (the package rejected the header), ``TensorNotFound``,
``TagError`` (tag count differs from the rank).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import safetensors as _st

from .dtypes import DType
from .errors import (
    EncoderUnavailable,
    InvalidShape,
    ModelFileError,
    TagError,
    TensorNotFound,
    TruncatedFile,
    UnsupportedDType,
)
from .mappings import named_items
from .tags import normalize_tags

__all__ = ["File", "TensorInfo", "open", "save"]

_TO_FUCINA = {
    "F32": DType.f32, "F16": DType.f16, "BF16": DType.bf16, "F64": DType.f64,
    "I8": DType.i8, "I16": DType.i16, "I32": DType.i32, "I64": DType.i64,
    "U8": DType.u8, "U16": DType.u16, "BOOL": DType.bool,
    "F8_E4M3": DType.f8_e4m3, "F8_E5M2": DType.f8_e5m2,
}
_FROM_FUCINA = {dt: name for name, dt in _TO_FUCINA.items()}
# TensorSpec's dtype spellings (safetensors >= 0.8)
_SPEC_NAMES = {
    DType.f32: "float32", DType.f16: "float16", DType.bf16: "bfloat16", DType.f64: "float64",
    DType.i8: "int8", DType.i16: "int16", DType.i32: "int32", DType.i64: "int64",
    DType.u8: "uint8", DType.u16: "uint16", DType.bool: "bool",
    DType.f8_e4m3: "float8_e4m3fn", DType.f8_e5m2: "float8_e5m2",
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: fucina ``dtype`` (None when fucina has none), the file's dtype
    name, row-major ``shape`` and its absolute byte range in the file."""

    name: str
    dtype: DType | None
    st_dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class File:
    """An open safetensors file: ``metadata`` (str -> str), ``tensors``, zero-copy tensors."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        if size < 8:
            raise TruncatedFile(f"{self.path}: {size} bytes, shorter than the 8-byte header "
                                "length")
        try:
            with _st.safe_open(self.path, framework="numpy") as f:
                self.metadata: dict[str, str] = dict(f.metadata() or {})
        except _st.SafetensorError as e:
            raise ModelFileError(f"{self.path}: not a valid safetensors file ({e})") from None
        self._map: np.ndarray | None = np.memmap(self.path, dtype=np.uint8, mode="r")
        (n,) = struct.unpack("<Q", bytes(self._map[:8]))
        header = json.loads(bytes(self._map[8:8 + n]).decode("utf-8"))
        start = 8 + n
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            self.tensors[name] = TensorInfo(name, _TO_FUCINA.get(entry["dtype"]), entry["dtype"],
                                            tuple(int(d) for d in entry["shape"]), start + begin,
                                            end - begin)

    def close(self) -> None:
        """Drop this file's reference to the mapping (tensors keep theirs)."""
        self._map = None

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"fucina.safetensors.File({self.path!r}, tensors={len(self.tensors)})"

    def _info(self, name: str) -> tuple[TensorInfo, DType]:
        try:
            info = self.tensors[name]
        except KeyError:
            raise TensorNotFound(f"{self.path}: no tensor named {name!r}") from None
        if info.dtype is None:
            raise UnsupportedDType(f"{self.path}: tensor {name!r} has dtype {info.st_dtype}, "
                                   "which fucina has no dtype for")
        return info, info.dtype

    def array(self, name: str) -> np.ndarray:
        """Read-only numpy view of the tensor (bf16/f8 as raw bits; a copy if misaligned)."""
        if self._map is None:
            raise ValueError(f"{self.path}: file is closed")
        info, dtype = self._info(name)
        storage = dtype.storage
        raw = self._map[info.offset:info.offset + info.nbytes]
        if info.offset % storage.itemsize:
            raw = np.array(raw)  # the one unaligned case: copy rather than misalign a kernel
        arr = raw.view(storage).reshape(info.shape)
        arr.flags.writeable = False
        return arr

    def tensor(self, ctx: Any, name: str, tags: Sequence[str] | str) -> Any:
        """A constant tensor over the mapping, tagged ``tags`` (outermost first).
        ``tags`` is a spec as in ``fucina.Tensor(...)``: names, one name, or a rank."""
        from .runtime.raw import RawTensor
        from .tensor import Tensor

        info, dtype = self._info(name)
        tag_tuple = normalize_tags(tags)
        if len(tag_tuple) != len(info.shape):
            raise TagError(f"{self.path}: tensor {name!r} has rank {len(info.shape)} (shape "
                           f"{info.shape}), got {len(tag_tuple)} tags {tag_tuple}")
        if any(d == 0 for d in info.shape):
            raise InvalidShape(f"{self.path}: tensor {name!r} has shape {info.shape}; fucina "
                               "tensors have no empty axes")
        shape = info.shape or (1,)  # a rank-0 tensor is held as one element
        arr = self.array(name).reshape(shape)
        raw = RawTensor.from_array(dtype, arr, shape, borrow=True, readonly=True)
        return Tensor(tags=tag_tuple, dtype=dtype).constant(ctx, raw)


def open(path: str | os.PathLike[str]) -> File:
    """Open (memory-map) a safetensors file."""
    return File(path)


def _array_of(name: str, value: Any) -> tuple[np.ndarray, DType]:
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        for dt in _FROM_FUCINA:
            if dt.storage == arr.dtype and dt not in (DType.bf16, DType.f8_e4m3, DType.f8_e5m2):
                return arr, dt
        raise ValueError(f"safetensors.save: tensor {name!r} has numpy dtype {arr.dtype}; "
                         "pass a fucina tensor for bf16/f8")
    raw_of = getattr(value, "as_raw_tensor", None)
    if raw_of is None:
        raise TypeError(f"safetensors.save: tensor {name!r} must be a fucina tensor or numpy "
                        f"array, got {type(value).__name__}")
    raw = raw_of()
    if raw.dtype not in _FROM_FUCINA:
        raise EncoderUnavailable(f"safetensors.save: tensor {name!r} is {raw.dtype.value}, "
                                 "which safetensors cannot store (use GGUF for block formats)")
    arr = np.ascontiguousarray(raw.array())
    if getattr(value, "tag_count", None) == 0:
        arr = arr.reshape(())
    return arr, raw.dtype


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any],
         metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (name -> fucina tensor or numpy array) and string ``metadata``."""
    arrays = {name: _array_of(name, v)
              for name, v in named_items(tensors, "safetensors.save: tensors")}
    meta = None if metadata is None else {
        k: str(v) for k, v in named_items(metadata, "safetensors.save: metadata")}
    specs: dict[str, Any]
    if hasattr(_st, "TensorSpec"):
        specs = {name: _st.TensorSpec(dtype=_SPEC_NAMES[dt], shape=list(a.shape),
                                      data_ptr=a.ctypes.data, data_len=a.nbytes)
                 for name, (a, dt) in arrays.items()}
    else:  # older packages: the dict form with header dtype names
        specs = {name: {"dtype": _FROM_FUCINA[dt], "shape": list(a.shape), "data": a.tobytes()}
                 for name, (a, dt) in arrays.items()}
    _st.serialize_file(specs, os.fspath(path), metadata=meta)
    del arrays  # the specs point into these buffers until here
