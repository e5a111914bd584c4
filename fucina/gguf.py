"""GGUF model files: read (memory-mapped, zero-copy), write, and the f32 codec seam.

``open(path)`` maps the file read-only and parses its header, metadata and
tensor directory; tensor data is never read until a tensor is used, and
``File.tensor`` hands out tensors that view the mapping directly (block
formats stay quantized). ``write`` serializes through ``gguf.GGUFWriter``, so
the files are the ones gguf-py and llama.cpp read. ``encode_f32`` and
``decode_f32`` convert between float32 values and a format's wire data.

The header is parsed here rather than by ``gguf.GGUFReader``: the reader
builds one numpy array per array element (3.7 s to open the 98 MB
SmolLM2 file on this machine, mostly its 100k tokenizer strings) and trusts
the counts it reads, so a corrupt count can make it loop for a very long
time. This parser checks every count and offset against the file size before
using it; the type codes and block sizes come from the ``gguf`` package.

Errors (all in :mod:`fucina.errors`, messages name the file and tensor):
``InvalidMagic``, ``UnsupportedVersion``, ``TruncatedFile``,
``InvalidTensorInfo`` (bad rank/shape, misaligned, data past the end of the
file), ``UnsupportedDType`` (unknown GGML type code) — all subclasses of
``ModelFileError`` (a ``TensorError`` and a ``ValueError``);
``TensorNotFound`` (a ``KeyError``) for a missing name; ``TagError`` for a
tag count that does not match the tensor's rank.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

from .blocks import BLOCK_SIZES
from .dtypes import DType, as_dtype
from .errors import (
    EncoderUnavailable,
    InvalidMagic,
    InvalidShape,
    InvalidTensorInfo,
    ModelFileError,
    NonFiniteValue,
    TagError,
    TensorNotFound,
    TruncatedFile,
    UnsupportedDType,
    UnsupportedVersion,
)
from .mappings import named_items
from .tags import normalize_tags

__all__ = ["File", "TensorInfo", "decode_f32", "encode_f32", "open", "write"]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_ALIGNMENT = 1 << 20
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NESTING = 32  # arrays of arrays in metadata (llama.cpp's own keys nest at most 1)

# GGML type code -> fucina dtype. Q2_0 (PrismML's g128 ternary, code 42) is not in
# gguf-py's enum; its block layout is fucina.BlockQ2_0.
_Q2_0_CODE = 42
_GGML_TO_DTYPE: dict[int, DType] = {}
for _t in GGMLQuantizationType:
    try:
        _GGML_TO_DTYPE[int(_t)] = DType(_t.name.lower())
    except ValueError:
        pass
_GGML_TO_DTYPE[_Q2_0_CODE] = DType.q2_0
_DTYPE_TO_GGML = {dt: code for code, dt in _GGML_TO_DTYPE.items()}

# element type code -> (struct format, size) for fixed-size metadata values
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1), GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2), GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4), GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4), GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8), GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_NP_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8", GGUFValueType.BOOL: "?",
}


def _ggml_sizes(code: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGML type code.

    Block formats take fucina's block layout, which is ggml's: gguf-py 0.19's table
    gives Q8_1 40 bytes where ggml's ``block_q8_1`` has 36 (two halves and 32 int8;
    fixed upstream in llama.cpp PR 29036)."""
    dt = _GGML_TO_DTYPE.get(code)
    if dt is not None and dt.is_block:
        return BLOCK_SIZES[dt.value], dt.storage.itemsize
    return GGML_QUANT_SIZES[GGMLQuantizationType(code)]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    ``shape`` is row-major, outermost first (GGUF stores dims innermost
    first: a ``[out, in]`` matrix is ``ne = [in, out]`` on disk). ``offset``
    is the absolute byte offset in the part file holding the tensor
    (``part`` counts from 0; 0 for single files).
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int
    part: int = 0


class _Cursor:
    """Bounds-checked little-endian reads over the mapped bytes of one file."""

    def __init__(self, buf: np.ndarray, path: str):
        self.buf = buf
        self.mv = buf.data
        self.size = buf.size
        self.pos = 0
        self.path = path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise TruncatedFile(
                f"{self.path}: file ends inside {what} (needs {n} bytes at offset {self.pos}, "
                f"file has {self.size})")

    def scalar(self, code: int, what: str) -> Any:
        fmt, n = _SCALARS[code]
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.mv, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT32, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT64, what))

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = bytes(self.mv[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{self.path}: {what} is not valid UTF-8 ({e})") from None

    def value(self, code: int, what: str, depth: int = 0) -> Any:
        if code in _SCALARS:
            v = self.scalar(code, what)
            return bool(v) if code == GGUFValueType.BOOL else v
        if code == GGUFValueType.STRING:
            return self.string(what)
        if code == GGUFValueType.ARRAY:
            item = self.u32(what)
            count = self.u64(what)
            if item in _NP_SCALARS:
                n = count * _SCALARS[item][1]
                self.need(n, what)
                arr = np.frombuffer(self.buf, dtype=_NP_SCALARS[item], count=count,
                                    offset=self.pos)
                self.pos += n
                return arr.tolist()
            if item not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
                raise ModelFileError(f"{self.path}: {what} has unknown array item type {item}")
            self.need(count * 8, what)  # every string/array element takes >= 8 bytes
            if item == GGUFValueType.ARRAY and depth >= _MAX_NESTING:
                # (a few bytes per level: a small file could exhaust Python's stack)
                raise ModelFileError(f"{self.path}: {what} nests arrays deeper than "
                                     f"{_MAX_NESTING} levels")
            return [self.value(item, what, depth + 1) for _ in range(count)]
        raise ModelFileError(f"{self.path}: {what} has unknown value type {code}")


def _map(path: str) -> np.ndarray:
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise FileNotFoundError(f"{path}: {e.strerror}") from None
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a GGUF file")
    if size == 0:
        raise InvalidMagic(f"{path}: empty file, not a GGUF file")
    return np.memmap(path, dtype=np.uint8, mode="r")


def _parse(path: str, part: int) -> tuple[np.ndarray, dict[str, Any], list[TensorInfo]]:
    """Map one GGUF file; returns (mapping, metadata, tensor directory)."""
    buf = _map(path)
    c = _Cursor(buf, path)
    c.need(4, "the magic")
    if bytes(c.mv[:4]) != _MAGIC:
        raise InvalidMagic(f"{path}: bad magic {bytes(c.mv[:4])!r}, expected {_MAGIC!r}")
    c.pos = 4
    version = c.u32("the version")
    if version not in _VERSIONS:
        raise UnsupportedVersion(
            f"{path}: GGUF version {version} is not supported (only {_VERSIONS})")
    n_tensors = c.u64("the tensor count")
    n_kv = c.u64("the metadata count")
    # Each tensor entry and each KV takes well over 8 bytes: reject absurd counts at once.
    if (n_tensors + n_kv) * 8 > c.size:
        raise TruncatedFile(f"{path}: header claims {n_tensors} tensors and {n_kv} metadata "
                            f"entries, more than a {c.size}-byte file can hold")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string("a metadata key")
        code = c.u32(f"metadata {key!r}")
        if key in metadata:
            raise ModelFileError(f"{path}: metadata key {key!r} appears twice")
        if key == "general.alignment" and code != GGUFValueType.UINT32:
            raise ModelFileError(f"{path}: general.alignment must be a uint32 (type {code})")
        metadata[key] = c.value(code, f"metadata {key!r}")
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1) or alignment > _MAX_ALIGNMENT:
        raise ModelFileError(f"{path}: general.alignment {alignment} is not a power of two "
                             f"<= {_MAX_ALIGNMENT}")
    entries = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = c.string("a tensor name")
        what = f"tensor {name!r}"
        n_dims = c.u32(what)
        if not 1 <= n_dims <= _MAX_DIMS:
            raise InvalidTensorInfo(f"{path}: {what} has {n_dims} dims (1..{_MAX_DIMS})")
        c.need(8 * n_dims, what)
        ne = [c.u64(what) for _ in range(n_dims)]
        code = c.u32(what)
        offset = c.u64(what)
        if name in names:
            raise InvalidTensorInfo(f"{path}: tensor {name!r} appears twice")
        names.add(name)
        entries.append((name, ne, code, offset))
    data_start = -(-c.pos // alignment) * alignment
    tensors = []
    for name, ne, code, offset in entries:
        tensors.append(_tensor_info(path, part, name, ne, code, offset, data_start,
                                    alignment, c.size))
    return buf, metadata, tensors


def _tensor_info(path: str, part: int, name: str, ne: list[int], code: int, offset: int,
                 data_start: int, alignment: int, size: int) -> TensorInfo:
    dtype = _GGML_TO_DTYPE.get(code)
    if dtype is None:
        raise UnsupportedDType(f"{path}: tensor {name!r} has unknown GGML type code {code}")
    bs, type_size = _ggml_sizes(code)
    if ne[0] % bs:
        raise InvalidTensorInfo(f"{path}: tensor {name!r} ({dtype.value}) innermost dim {ne[0]} "
                                f"is not a multiple of the block size {bs}")
    count = 1
    for d in ne:
        count *= d
    nbytes = count // bs * type_size
    if offset % alignment:
        raise InvalidTensorInfo(f"{path}: tensor {name!r} offset {offset} is not a multiple of "
                                f"the alignment {alignment}")
    start = data_start + offset
    if start + nbytes > size:
        short = start + nbytes - size
        raise InvalidTensorInfo(
            f"{path}: tensor {name!r} ends {short} bytes past the end of the file "
            f"(needs bytes {start}..{start + nbytes}, file has {size}); truncated download?")
    return TensorInfo(name, dtype, tuple(reversed(ne)), code, start, nbytes, part)


_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<idx>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_paths(path: str | os.PathLike[str]) -> list[str] | None:
    """All part paths of a llama.cpp split GGUF named by its first part, else None."""
    m = _SPLIT.match(os.fspath(path))
    if m is None or int(m["idx"]) != 1:
        return None
    n = int(m["count"])
    return [f"{m['prefix']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


class File:
    """An open GGUF file (or split set): metadata, tensor directory, zero-copy tensors.

    Use as a context manager or call :meth:`close`. Tensors handed out keep
    their part of the mapping alive after the file is closed.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        parts = split_paths(self.path) or [self.path]
        self.parts = parts
        self._maps: list[np.ndarray] | None = []
        self.tensors: dict[str, TensorInfo] = {}
        self.metadata: dict[str, Any] = {}
        for k, p in enumerate(parts):
            buf, meta, infos = _parse(p, k)
            self._maps.append(buf)
            if k == 0:
                self.metadata = meta
                count = meta.get("split.count")
                if count is not None and len(parts) > 1 and count != len(parts):
                    raise ModelFileError(f"{p}: split.count is {count}, but the name says "
                                         f"{len(parts)} parts")
            for info in infos:
                if info.name in self.tensors:
                    raise InvalidTensorInfo(f"{p}: tensor {info.name!r} also appears in "
                                            f"{parts[self.tensors[info.name].part]}")
                self.tensors[info.name] = info

    # -- lifetime -------------------------------------------------------------------

    def close(self) -> None:
        """Drop this file's references to the mappings (tensors keep theirs)."""
        self._maps = None

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"fucina.gguf.File({self.path!r}, tensors={len(self.tensors)})"

    # -- data -------------------------------------------------------------------------

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise TensorNotFound(f"{self.path}: no tensor named {name!r}") from None

    def array(self, name: str) -> np.ndarray:
        """Read-only numpy view of a tensor's storage elements (blocks stay blocks).

        Shape is the storage shape: the logical shape with the innermost
        axis divided by the block size for block formats.
        """
        if self._maps is None:
            raise ValueError(f"{self.path}: file is closed")
        info = self._info(name)
        storage = info.dtype.storage
        shape = info.shape[:-1] + (info.shape[-1] // info.dtype.block_size,)
        raw = self._maps[info.part][info.offset:info.offset + info.nbytes]
        return raw.view(storage).reshape(shape)

    def tensor(self, ctx: Any, name: str, tags: Sequence[str] | str) -> Any:
        """A zero-copy constant tensor over the mapping, tagged ``tags`` (outermost first).
        ``tags`` is a spec as in ``fucina.Tensor(...)``: names, one name, or a rank."""
        from .runtime.raw import RawTensor
        from .tensor import Tensor

        info = self._info(name)
        tag_tuple = normalize_tags(tags)
        # GGUF has no rank 0: write() stores a rank-0 tensor as shape (1,), read back by ().
        rank0 = not tag_tuple and info.shape == (1,)
        if len(tag_tuple) != len(info.shape) and not rank0:
            raise TagError(f"{self.path}: tensor {name!r} has rank {len(info.shape)} (shape "
                           f"{info.shape}), got {len(tag_tuple)} tags {tag_tuple}")
        if any(d == 0 for d in info.shape):
            raise InvalidShape(f"{self.path}: tensor {name!r} has an empty dim {info.shape}")
        arr = self.array(name)
        T = Tensor(tags=tag_tuple, dtype=info.dtype)
        raw = RawTensor.from_array(info.dtype, arr, info.shape, borrow=True, readonly=True)
        return T.constant(ctx, raw)


def open(path: str | os.PathLike[str]) -> File:
    """Open (memory-map) a GGUF file; a first split part opens the whole set."""
    return File(path)


# -- writing ----------------------------------------------------------------------------

_NP_TO_VT = {
    np.dtype(np.uint8): GGUFValueType.UINT8, np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16, np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32, np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.uint64): GGUFValueType.UINT64, np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float32): GGUFValueType.FLOAT32, np.dtype(np.float64): GGUFValueType.FLOAT64,
    np.dtype(np.bool_): GGUFValueType.BOOL,
}


def _int_type(values: Sequence[int], key: str, scalar: bool) -> GGUFValueType:
    lo, hi = min(values), max(values)
    if scalar and lo >= 0 and hi < 1 << 32:
        return GGUFValueType.UINT32  # llama.cpp reads its integer keys as uint32
    if -(1 << 31) <= lo and hi < 1 << 31:
        return GGUFValueType.INT32
    if -(1 << 63) <= lo and hi < 1 << 63:
        return GGUFValueType.INT64
    if lo >= 0 and hi < 1 << 64:
        return GGUFValueType.UINT64
    raise ValueError(f"gguf.write: metadata {key!r} has an integer outside 64 bits")


def _value_type(value: Any, key: str) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(value, wire type, array item type) for a metadata value."""
    if isinstance(value, np.generic) and value.dtype in _NP_TO_VT:
        return value.item(), _NP_TO_VT[value.dtype], None
    if isinstance(value, (bool, np.bool_)):
        return bool(value), GGUFValueType.BOOL, None
    if isinstance(value, int):
        return value, _int_type([value], key, True), None
    if isinstance(value, float):
        return value, GGUFValueType.FLOAT32, None
    if isinstance(value, str):
        return value, GGUFValueType.STRING, None
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype in _NP_TO_VT:
        if value.size == 0:
            raise ValueError(f"gguf.write: metadata {key!r} is an empty array")
        return value.tolist(), GGUFValueType.ARRAY, _NP_TO_VT[value.dtype]
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            raise ValueError(f"gguf.write: metadata {key!r} is an empty array")
        if all(isinstance(v, str) for v in items):
            return items, GGUFValueType.ARRAY, GGUFValueType.STRING
        if all(isinstance(v, bool) for v in items):
            return items, GGUFValueType.ARRAY, GGUFValueType.BOOL
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return items, GGUFValueType.ARRAY, _int_type(items, key, False)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            return [float(v) for v in items], GGUFValueType.ARRAY, GGUFValueType.FLOAT32
        raise ValueError(f"gguf.write: metadata {key!r} mixes item types; use a numpy array")
    raise ValueError(f"gguf.write: metadata {key!r} has unsupported type {type(value).__name__}")


def _wire(name: str, value: Any) -> tuple[np.ndarray, GGMLQuantizationType | None,
                                          tuple[int, ...] | None]:
    """(array for GGUFWriter.add_tensor, raw GGML type, element shape of block data) of a
    fucina tensor or numpy array."""
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        if arr.dtype not in (np.float32, np.float16, np.float64, np.int8, np.int16, np.int32,
                             np.int64):
            raise ValueError(f"gguf.write: tensor {name!r} has numpy dtype {arr.dtype}; "
                             "pass a fucina tensor for bf16 or block formats")
        return arr, None, None
    raw_of = getattr(value, "as_raw_tensor", None)
    if raw_of is None:
        raise TypeError(f"gguf.write: tensor {name!r} must be a fucina tensor or numpy array, "
                        f"got {type(value).__name__}")
    raw = raw_of()
    dt: DType = raw.dtype
    code = _DTYPE_TO_GGML.get(dt)
    if code is None or code == _Q2_0_CODE:
        raise EncoderUnavailable(f"gguf.write: tensor {name!r}: GGUF (gguf-py) cannot store "
                                 f"{dt.value}")
    arr = np.ascontiguousarray(raw.array())
    if dt.is_block:
        # Bytes as int8 with the element shape given: gguf-py derives the shape of uint8
        # data from its own block sizes (its Q8_1 size is not ggml's; see _ggml_sizes).
        return arr.view(np.int8).reshape(arr.shape[:-1] + (-1,)), GGMLQuantizationType(code), \
            tuple(raw.shape)
    if dt is DType.bf16:
        return arr, GGMLQuantizationType.BF16, None
    return arr, None, None


def write(path: str | os.PathLike[str], metadata: Mapping[str, Any],
          tensors: Mapping[str, Any], *, split_max_tensors: int = 0) -> list[Path]:
    """Write a GGUF file (version 3) with ``metadata`` and ``tensors`` through gguf-py.

    Metadata values: str, bool, float (float32), int (uint32 when it fits in
    one, as llama.cpp reads its integer keys; else int32/int64/uint64), lists
    of one of those, or numpy scalars and 1-D arrays for an exact wire type.
    Tensors: fucina tensors of any dtype gguf-py can store (block formats
    stay quantized) or numpy arrays. ``split_max_tensors`` > 0 writes a
    llama.cpp split set (``name-00001-of-0000N.gguf``, ...). Returns the
    paths written.
    """
    path = Path(path)
    meta_items = named_items(metadata, "gguf.write: metadata")
    tensor_items = named_items(tensors, "gguf.write: tensors")
    w = GGUFWriter(path, "", split_max_tensors=split_max_tensors)
    for key, value in meta_items:
        v, vt, sub = _value_type(value, key)
        w.add_key_value(key, v, vt, sub_type=sub)
    for name, value in tensor_items:
        arr, raw_dtype, raw_shape = _wire(name, value)
        w.add_tensor(name, arr, raw_shape=raw_shape, raw_dtype=raw_dtype)
    written = w.format_shard_names(path)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return written


# -- the f32 codec seam -----------------------------------------------------------------


def encode_f32(dtype: Any, values: Any) -> np.ndarray:
    """Encode float32 values as ``dtype`` data (ggml's byte layout).

    Block formats return structured blocks of shape ``(..., n // block_size)``
    (feed them to ``T.from_blocks``); ``f32``/``f16`` return arrays of that
    type and ``bf16`` its raw uint16 bits (round to nearest even). Block
    formats need finite input (``NonFiniteValue``) and an innermost size
    that is a positive multiple of the block size (``InvalidShape``); formats
    without an encoder raise ``EncoderUnavailable``.
    """
    from .kernels.cast import f32_to_bf16
    from .kernels.quant_encode import ENCODE_FORMATS, encode_blocks

    dt = as_dtype(dtype)
    x = np.asarray(values, dtype=np.float32)
    if dt is DType.f32:
        return x.copy()
    if dt is DType.f16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if dt is DType.bf16:
        return f32_to_bf16(x)
    if not dt.is_block or dt.value not in ENCODE_FORMATS:
        raise EncoderUnavailable(f"encode_f32: no encoder for {dt.value} (encodable: "
                                 f"f32, f16, bf16, {', '.join(sorted(ENCODE_FORMATS))})")
    bs = dt.block_size
    if x.ndim == 0 or x.shape[-1] == 0 or x.shape[-1] % bs:
        raise InvalidShape(f"encode_f32: {dt.value} needs an innermost size that is a positive "
                           f"multiple of {bs}, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise NonFiniteValue(f"encode_f32: {dt.value} input holds NaN or infinity")
    return encode_blocks(dt.value, x)


def decode_f32(dtype: Any, data: Any) -> np.ndarray:
    """Decode ``dtype`` data (blocks or raw bytes, or f16/bf16/f32 arrays) to float32."""
    from .kernels.cast import bf16_to_f32
    from .kernels.quant import DEQUANTIZE_FORMATS, dequantize

    dt = as_dtype(dtype)
    if dt in (DType.f32, DType.f16):
        return np.asarray(data).astype(np.float32)
    if dt is DType.bf16:
        return bf16_to_f32(np.asarray(data, dtype=np.uint16))
    if not dt.is_block or dt.value not in DEQUANTIZE_FORMATS:
        raise EncoderUnavailable(f"decode_f32: no decoder for {dt.value}")
    try:
        return dequantize(data, dt.value)
    except ValueError as e:
        raise InvalidShape(str(e)) from None
