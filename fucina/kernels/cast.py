"""Scalar dtype bridges and the element-wise cast between storage arrays.

Arrays here hold STORAGE values: ``bf16`` is raw ``uint16`` bit patterns, the
OCP FP8 formats (``f8_e4m3`` = E4M3FN, ``f8_e5m2``) are raw ``uint8`` bit
patterns, ``bool`` is numpy ``bool``, ``f16`` is numpy ``float16``.

Cast semantics (:func:`cast_array`):

* integer -> integer wraps (two's complement);
* integer -> float rounds to nearest (exact where representable); targets
  other than ``f64`` go through ``f32``;
* float -> integer truncates toward zero, saturates at the target's bounds,
  and maps NaN to 0;
* anything -> bool is ``value != 0`` (NaN is true, ``-0.0`` is false);
* bool -> number is 0 / 1;
* float -> float goes through ``f64`` when the target is ``f64`` and through
  ``f32`` otherwise; ``bf16`` and the FP8 formats always bridge through ``f32``.

No function here emits numpy floating-point warnings: inf, NaN and values far
outside a target's range are all defined inputs.
"""

import numpy as np

__all__ = [
    "SCALAR_DTYPES",
    "STORAGE_NP",
    "bf16_to_f32",
    "cast_array",
    "f8e4m3_to_f32",
    "f8e5m2_to_f32",
    "f32_to_bf16",
    "f32_to_f8e4m3",
    "f32_to_f8e5m2",
]

STORAGE_NP: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f8_e4m3": np.dtype(np.uint8),
    "f8_e5m2": np.dtype(np.uint8),
}
"""numpy storage dtype of every scalar dtype name."""

SCALAR_DTYPES: frozenset[str] = frozenset(STORAGE_NP)
"""Names of the scalar (non-block) dtypes."""

_INTEGER = frozenset({"u8", "u16", "i8", "i16", "i32", "i64"})
_F8 = frozenset({"f8_e4m3", "f8_e5m2"})


# --- bf16 -------------------------------------------------------------------------


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bits (``uint16``) to ``float32`` exactly."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Narrow ``float32`` values to raw bfloat16 bits, rounding to nearest even.

    NaN inputs are quieted (ggml's rule: keep the top 16 bits, set the quiet
    bit), so a NaN whose payload lives only in the low bits never turns into
    an infinity. Infinities and overflow-to-infinity round as IEEE says.
    """
    with np.errstate(all="ignore"):  # f64 inputs may overflow to inf here; that is intended
        u = np.asarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    # RNE on the integer image: add 0x7fff plus the LSB of the kept half. NaN lanes
    # may wrap here; they are replaced below.
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (u >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(is_nan, quiet, rounded).astype(np.uint16)


# --- OCP FP8 ----------------------------------------------------------------------


def _e4m3_table() -> np.ndarray:
    """Exact f32 value of every E4M3FN code (bias 7, no inf, S.1111.111 is NaN)."""
    codes = np.arange(256)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man * 2.0**-9, (8 + man) * np.exp2(exp - 10.0))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return np.where(codes & 0x80, -mag, mag).astype(np.float32)


def _e5m2_table() -> np.ndarray:
    """Exact f32 value of every E5M2 code: the code is the top byte of an f16."""
    halves = (np.arange(256, dtype=np.uint16) << np.uint16(8)).view(np.float16)
    with np.errstate(invalid="ignore"):  # widening the signaling-NaN codes flags "invalid"
        return halves.astype(np.float32)  # keeps sign and payload of the NaN codes


_E4M3_TO_F32 = _e4m3_table()
_E5M2_TO_F32 = _e5m2_table()
_E4M3_TO_F32.flags.writeable = False
_E5M2_TO_F32.flags.writeable = False


class _F8Format:
    """Encoding parameters of an FP8 format (non-negative half of the code space)."""

    def __init__(self, man_bits: int, min_exp: int, overflow_code: int, overflow_value: float):
        self.man_bits = man_bits
        self.min_exp = min_exp  # unbiased exponent of the smallest normal
        # Codes are monotonic in value, so "rounded past the largest finite value"
        # is "code >= overflow_code". E4M3FN's overflow code is its NaN code 0x7f
        # (where an IEEE-style format would have put 480); E5M2's is +inf, 0x7c.
        self.overflow_code = overflow_code
        self.overflow_value = np.float32(overflow_value)


_E4M3 = _F8Format(man_bits=3, min_exp=-6, overflow_code=0x7F, overflow_value=480.0)
_E5M2 = _F8Format(man_bits=2, min_exp=-14, overflow_code=0x7C, overflow_value=65536.0)
_F8_NAN_CODE = 0x7F  # canonical NaN of both formats (the sign bit is added on top)


def _encode_f8(x: np.ndarray, fmt: _F8Format) -> np.ndarray:
    """Round ``float32`` values onto an FP8 grid, nearest with ties to even."""
    m = fmt.man_bits
    # f64 inputs may overflow to inf and signaling NaNs flag "invalid": both are
    # defined inputs here, not errors.
    with np.errstate(all="ignore"):
        x32 = np.asarray(x, dtype=np.float32)
        is_nan = np.isnan(x32)
        # Anything at or past the overflow rung encodes as the overflow code; clamping
        # there keeps the arithmetic below in range (NaN lanes are patched at the end).
        a = np.minimum(np.abs(x32), fmt.overflow_value)
        exp = (a.view(np.uint32) >> np.uint32(23)).astype(np.int32) - 127
        exp = np.maximum(exp, fmt.min_exp)  # subnormals share the smallest normal's ulp
        # Adding c = 2**(exp - m + 23) leaves f32 ulps of exactly 2**(exp - m), so the
        # hardware's round-to-nearest-even rounds `a` onto the FP8 grid; subtracting
        # c back is exact.
        c = ((exp - m + 23 + 127).astype(np.uint32) << np.uint32(23)).view(np.float32)
        q = (a + c) - c
        bits = q.view(np.uint32)
        normal = ((bits >> np.uint32(23)).astype(np.int32) - (127 + fmt.min_exp - 1)) << m
        normal |= ((bits >> np.uint32(23 - m)) & np.uint32((1 << m) - 1)).astype(np.int32)
        # Below the smallest normal the code is the count of subnormal ulps; at
        # 2**min_exp both formulas agree (1 << m).
        sub = np.where(is_nan, 0, q * np.float32(2.0 ** (m - fmt.min_exp))).astype(np.int32)
        code = np.where(q >= np.float32(2.0**fmt.min_exp), normal, sub)
        code = np.minimum(code, fmt.overflow_code)
        code = np.where(is_nan, _F8_NAN_CODE, code).astype(np.uint8)
    return code | np.where(np.signbit(x32), np.uint8(0x80), np.uint8(0))


def f8e4m3_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode raw E4M3FN bits (``uint8``) to ``float32`` exactly (NaN codes keep their sign)."""
    return _E4M3_TO_F32[np.asarray(bits, dtype=np.uint8)]


def f32_to_f8e4m3(x: np.ndarray) -> np.ndarray:
    """Encode ``float32`` values as raw E4M3FN bits, rounding to nearest even.

    E4M3FN has no infinities: magnitudes that round past the largest finite
    value (448, i.e. anything above 464) and +-inf saturate to the NaN code
    ``0x7f`` with the input's sign; NaN inputs give ``0x7f`` / ``0xff``.
    """
    return _encode_f8(x, _E4M3)


def f8e5m2_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode raw E5M2 bits (``uint8``) to ``float32`` exactly (inf and NaN included)."""
    return _E5M2_TO_F32[np.asarray(bits, dtype=np.uint8)]


def f32_to_f8e5m2(x: np.ndarray) -> np.ndarray:
    """Encode ``float32`` values as raw E5M2 bits, rounding to nearest even.

    Magnitudes that round past 57344 overflow to +-inf (``0x7c`` / ``0xfc``);
    NaN inputs give the canonical NaN code ``0x7f`` with the input's sign.
    """
    return _encode_f8(x, _E5M2)


# --- general cast -----------------------------------------------------------------


def _check_name(name: str) -> None:
    if name not in STORAGE_NP:
        raise ValueError(f"cast_array: unknown scalar dtype {name!r}")


def _to_f64(a: np.ndarray, dtype: str) -> np.ndarray:
    """Exact f64 image of a float-family storage array."""
    if dtype == "bf16":
        return bf16_to_f32(a).astype(np.float64)
    if dtype == "f8_e4m3":
        return f8e4m3_to_f32(a).astype(np.float64)
    if dtype == "f8_e5m2":
        return f8e5m2_to_f32(a).astype(np.float64)
    return a.astype(np.float64)


def _to_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    """f32 image of a float-family storage array (f64 rounds to nearest even)."""
    if dtype == "bf16":
        return bf16_to_f32(a)
    if dtype == "f8_e4m3":
        return f8e4m3_to_f32(a)
    if dtype == "f8_e5m2":
        return f8e5m2_to_f32(a)
    return a.astype(np.float32)


def _from_f32(f: np.ndarray, dtype: str) -> np.ndarray:
    """Narrow (or copy) f32 values into a float-family storage dtype."""
    if dtype == "bf16":
        return f32_to_bf16(f)
    if dtype == "f8_e4m3":
        return f32_to_f8e4m3(f)
    if dtype == "f8_e5m2":
        return f32_to_f8e5m2(f)
    return f.astype(STORAGE_NP[dtype])  # f16 (RNE, overflow to inf) or f32 (copy)


def _float_to_int(v: np.ndarray, dtype: str) -> np.ndarray:
    """Truncate f64 values toward zero, saturating at the bounds, NaN -> 0."""
    np_dtype = STORAGE_NP[dtype]
    info = np.iinfo(np_dtype)
    t = np.trunc(v)
    # Both limits are exact in f64: max + 1 and min are 0 or powers of two.
    over = t >= float(info.max + 1)
    under = t < float(info.min)
    safe = np.where(over | under | np.isnan(t), 0.0, t).astype(np_dtype)
    out = np.where(over, np_dtype.type(info.max), safe)
    return np.where(under, np_dtype.type(info.min), out).astype(np_dtype)


def _truthy(a: np.ndarray, dtype: str) -> np.ndarray:
    """``value != 0`` on storage, with -0.0 false and NaN true for every float."""
    if dtype == "bf16":
        return (a & np.uint16(0x7FFF)) != 0  # ignore the sign bit: -0.0 is falsy
    if dtype in _F8:
        return (a & np.uint8(0x7F)) != 0
    return a != 0  # IEEE: -0.0 == 0 and NaN != 0


def cast_array(src: np.ndarray, src_dtype: str, dst_dtype: str) -> np.ndarray:
    """Cast a storage array between scalar dtypes (see the module docstring).

    ``src`` must hold ``STORAGE_NP[src_dtype]`` values (non-array inputs are
    converted). Returns a new C-contiguous array of ``STORAGE_NP[dst_dtype]``
    with the same shape; the source is never aliased.
    """
    _check_name(src_dtype)
    _check_name(dst_dtype)
    want = STORAGE_NP[src_dtype]
    if not isinstance(src, np.ndarray):
        src = np.asarray(src, dtype=want)
    elif src.dtype != want:
        raise ValueError(
            f"cast_array: {src_dtype} storage must be {want}, got an array of {src.dtype}"
        )
    dst_np = STORAGE_NP[dst_dtype]
    with np.errstate(all="ignore"):  # overflow to inf / NaN handling is defined here
        out = _cast(src, src_dtype, dst_dtype)
    return np.array(out, dtype=dst_np, order="C", copy=True).reshape(src.shape)


def _cast(src: np.ndarray, src_dtype: str, dst_dtype: str) -> np.ndarray:
    if src_dtype == dst_dtype:
        return src
    if dst_dtype == "bool":
        return _truthy(src, src_dtype)
    if src_dtype == "bool":
        src, src_dtype = src.astype(np.uint8), "u8"  # 0 / 1, then the integer rules
        if dst_dtype == "u8":
            return src
    dst_np = STORAGE_NP[dst_dtype]
    if src_dtype in _INTEGER:
        if dst_dtype in _INTEGER:
            return src.astype(dst_np)  # numpy integer casts wrap (two's complement)
        if dst_dtype == "f64":
            return src.astype(np.float64)
        # One rounding int -> f32 (only i64 can round), then the f32 bridge.
        return _from_f32(src.astype(np.float32), dst_dtype)
    # Float family from here on (f16, bf16, f32, f64, f8).
    if dst_dtype in _INTEGER:
        return _float_to_int(_to_f64(src, src_dtype), dst_dtype)
    if dst_dtype == "f64":
        return _to_f64(src, src_dtype)
    return _from_f32(_to_f32(src, src_dtype), dst_dtype)
