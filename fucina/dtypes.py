"""dtype metadata: the DType enum, storage mapping, predicates and the float policy."""

from __future__ import annotations

import builtins
import enum

import numpy as np

from .blocks import BLOCK_DTYPES, BLOCK_SIZES


class DType(enum.Enum):
    """Logical element format of a tensor (the seeds' dtype list)."""

    bool = "bool"
    u8 = "u8"
    u16 = "u16"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    f8_e4m3 = "f8_e4m3"
    f8_e5m2 = "f8_e5m2"
    q1_0 = "q1_0"
    q2_0 = "q2_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    q5_0 = "q5_0"
    q5_1 = "q5_1"
    q8_0 = "q8_0"
    q8_1 = "q8_1"
    q2_k = "q2_k"
    q3_k = "q3_k"
    q4_k = "q4_k"
    q5_k = "q5_k"
    q6_k = "q6_k"
    q8_k = "q8_k"
    iq1_s = "iq1_s"
    iq1_m = "iq1_m"
    iq2_xxs = "iq2_xxs"
    iq2_xs = "iq2_xs"
    iq2_s = "iq2_s"
    iq3_xxs = "iq3_xxs"
    iq3_s = "iq3_s"
    iq4_nl = "iq4_nl"
    iq4_xs = "iq4_xs"
    tq1_0 = "tq1_0"
    tq2_0 = "tq2_0"
    mxfp4 = "mxfp4"
    nvfp4 = "nvfp4"

    def __repr__(self) -> str:
        return f"fucina.{self.value if self.value != 'bool' else 'bool_'}"

    @property
    def is_block(self) -> builtins.bool:
        """True for GGML block-quantized formats."""
        return self.value in BLOCK_DTYPES

    @property
    def is_float(self) -> builtins.bool:
        """f16, bf16, f32, f64."""
        return self in _FLOATS

    @property
    def is_f8(self) -> builtins.bool:
        """The OCP FP8 storage-only floats."""
        return self in (DType.f8_e4m3, DType.f8_e5m2)

    @property
    def is_integer(self) -> builtins.bool:
        """u8, u16, i8, i16, i32, i64."""
        return self in _INTEGERS

    @property
    def is_signed(self) -> builtins.bool:
        """Signed integer dtypes."""
        return self in (DType.i8, DType.i16, DType.i32, DType.i64)

    @property
    def storage(self) -> np.dtype:
        """numpy dtype of one storage element (bf16 as uint16 bits, blocks as records)."""
        return _STORAGE[self]

    @property
    def block_size(self) -> int:
        """Logical elements per storage element (1 for scalar dtypes)."""
        return BLOCK_SIZES.get(self.value, 1)


_FLOATS = frozenset({DType.f16, DType.bf16, DType.f32, DType.f64})
_INTEGERS = frozenset({DType.u8, DType.u16, DType.i8, DType.i16, DType.i32, DType.i64})

_STORAGE: dict[DType, np.dtype] = {
    DType.bool: np.dtype(np.bool_),
    DType.u8: np.dtype(np.uint8),
    DType.u16: np.dtype(np.uint16),
    DType.i8: np.dtype(np.int8),
    DType.i16: np.dtype(np.int16),
    DType.i32: np.dtype(np.int32),
    DType.i64: np.dtype(np.int64),
    DType.f16: np.dtype(np.float16),
    DType.bf16: np.dtype(np.uint16),
    DType.f32: np.dtype(np.float32),
    DType.f64: np.dtype(np.float64),
    DType.f8_e4m3: np.dtype(np.uint8),
    DType.f8_e5m2: np.dtype(np.uint8),
}
for _name, _np in BLOCK_DTYPES.items():
    _STORAGE[DType(_name)] = _np

_ALIASES = {"bool_": DType.bool, "float32": DType.f32, "float64": DType.f64,
            "float16": DType.f16, "bfloat16": DType.bf16, "int64": DType.i64,
            "int32": DType.i32, "int16": DType.i16, "int8": DType.i8,
            "uint8": DType.u8, "uint16": DType.u16}


def as_dtype(value: object) -> DType:
    """Accept a DType member or its name ("f32", "bool", ...)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        try:
            return DType(value)
        except ValueError:
            if value in _ALIASES:
                return _ALIASES[value]
    from .errors import TagError

    raise TagError(f"unknown dtype {value!r}; expected one of {[d.value for d in DType]}")


def reduction_dtype(dt: DType) -> DType:
    """Result dtype of sum/mean-like reductions: f16/bf16 widen to f32, ints to i64."""
    if dt in (DType.f16, DType.bf16, DType.f32):
        return DType.f32
    if dt is DType.f64:
        return DType.f64
    return DType.i64
