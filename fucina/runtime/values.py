"""Host values -> storage arrays: what constructors and fills accept, converted or refused.

Constructors take numbers and convert their VALUES to the dtype: floats round
(f16/bf16/FP8 to nearest even, overflow to inf or the format's saturation
code), bool is ``!= 0``. Integer dtypes take exact integers within the type's
range (integral floats included); anything else is a ``ValueError`` naming
the value, because a silently wrapped or truncated constant is a wrong
constant. Wrapping is asked for explicitly with a cast (``to``).

Two inputs are storage bits rather than values, as the data accessors
return them: a ``uint16`` array for bf16 and a ``uint8`` array for the FP8
formats. Strings, complex numbers and other objects are a ``TypeError``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ..argnames import bad_argument
from ..dtypes import DType
from ..errors import InvalidDataLength, InvalidShape


def values_array(dtype: DType, shape: tuple[int, ...], values: Any,
                 name: str = "values") -> np.ndarray:
    """Convert a host sequence/array to a flat storage array of ``shape``'s length."""
    n = math.prod(shape)
    if dtype.is_block:
        if shape[-1] % dtype.block_size:
            raise InvalidShape(f"innermost dimension {shape[-1]} is not a multiple of the "
                               f"{dtype.value} block size {dtype.block_size}")
        arr = np.asarray(values)
        if arr.dtype != dtype.storage:
            raise InvalidDataLength(
                f"{dtype.value} blocks must be a numpy array of dtype {dtype.storage}, "
                f"got {arr.dtype}")
        need = n // dtype.block_size
        if arr.size != need:
            raise InvalidDataLength(f"got {arr.size} blocks, shape {shape} needs {need}")
        return arr.reshape(-1)
    if isinstance(values, (str, bytes)) or np.ndim(values) == 0 and not isinstance(
            values, np.ndarray):
        raise TypeError(bad_argument(name, values, "a sequence or numpy array of numbers"))
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidDataLength(f"{name} are not a flat sequence of numbers: {e}") from None
    arr = arr.reshape(-1)
    if arr.size != n:
        raise InvalidDataLength(f"got {arr.size} values, shape {shape} needs {n}")
    return convert(dtype, arr, name)


def fill_value(dtype: DType, value: Any, name: str = "value") -> Any:
    """One fill value converted to ``dtype``'s storage element (checked like a value
    of :func:`values_array`; bool only fills bool tensors)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    is_bool = isinstance(value, (bool, np.bool_))
    if not isinstance(value, numbers.Real) or is_bool and dtype is not DType.bool:
        what = "True/False or a number" if dtype is DType.bool else "a real number"
        raise TypeError(bad_argument(name, value, what))
    return convert(dtype, np.asarray([value]), name)[0]


def convert(dtype: DType, arr: np.ndarray, name: str) -> np.ndarray:
    """Convert a flat host array to ``dtype`` storage (see the module docstring)."""
    kind = arr.dtype.kind
    if kind == "O":
        arr = _from_objects(dtype, arr, name)
        kind = arr.dtype.kind
    if kind not in "biuf":
        raise TypeError(bad_argument(name, _first_of(arr), f"numbers (not {arr.dtype})"))
    if dtype is DType.bf16:
        if arr.dtype == np.uint16:  # raw bits, as data() returns them
            return arr.copy()
        from ..kernels.cast import f32_to_bf16

        return f32_to_bf16(_to_f32(arr))
    if dtype.is_f8:
        if arr.dtype == np.uint8:  # raw bits, as data() returns them
            return arr.copy()
        from ..kernels.cast import f32_to_f8e4m3, f32_to_f8e5m2

        enc = f32_to_f8e4m3 if dtype is DType.f8_e4m3 else f32_to_f8e5m2
        return enc(_to_f32(arr))
    if dtype.is_integer:
        return _to_integer(dtype, arr, name)
    with np.errstate(all="ignore"):  # float overflow rounds to inf: a defined conversion
        return arr.astype(dtype.storage)


def _to_f32(arr: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return arr.astype(np.float32)


def _first_of(arr: np.ndarray) -> Any:
    return arr[0] if arr.size else arr


def _to_integer(dtype: DType, arr: np.ndarray, name: str) -> np.ndarray:
    info = np.iinfo(dtype.storage)
    kind = arr.dtype.kind
    if kind == "b":
        return arr.astype(dtype.storage)
    if kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.trunc(arr))
        if bad.any():
            v = arr[np.argmax(bad)]
            raise ValueError(bad_argument(name, v.item(),
                                          f"integers for a {dtype.value} tensor"))
        # The bounds compare exactly in f64: min and max + 1 are 0 or powers of two.
        out = (arr < float(info.min)) | (arr >= float(info.max) + 1.0)
    else:
        out = (arr < info.min) | (arr > info.max)
    if out.any():
        v = arr[np.argmax(out)].item()
        raise ValueError(bad_argument(name, v, f"values in {dtype.value}'s range "
                                               f"[{info.min}, {info.max}]"))
    return arr.astype(dtype.storage)


def _from_objects(dtype: DType, arr: np.ndarray, name: str) -> np.ndarray:
    """An object array (Python ints past 64 bits, mixed objects) as a numeric array,
    or the error that names the first value that is not one."""
    out: list[int | float] = []
    for v in arr:
        if isinstance(v, (bool, np.bool_, numbers.Integral)):
            out.append(int(v))
            continue
        if not isinstance(v, numbers.Real):
            raise TypeError(bad_argument(name, v, "numbers"))
        try:
            f = float(v)
        except OverflowError:
            raise ValueError(bad_argument(name, v, "numbers within the float range")) from None
        if dtype.is_integer and (not math.isfinite(f) or f != math.trunc(f)):
            raise ValueError(bad_argument(name, v, f"integers for a {dtype.value} tensor"))
        out.append(int(f) if dtype.is_integer else f)
    if dtype.is_integer:
        info = np.iinfo(dtype.storage)
        for v in out:
            if not info.min <= v <= info.max:
                raise ValueError(bad_argument(name, v, f"values in {dtype.value}'s range "
                                                       f"[{info.min}, {info.max}]"))
        return np.array(out, dtype=dtype.storage)
    floats: list[float] = []
    for v in out:
        try:
            floats.append(float(v))
        except OverflowError:
            raise ValueError(bad_argument(name, v, "numbers within the float range")) from None
    return np.array(floats, dtype=np.float64)
