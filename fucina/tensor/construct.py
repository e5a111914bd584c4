"""Constructors: every way to make a leaf tensor (all class methods, context first)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import rng
from ..dtypes import DType
from ..errors import IndexOutOfBounds, InvalidDataLength, InvalidShape, TagError
from ..ir.graph import leaf
from ..runtime.context import ExecContext, values_array
from ..runtime.raw import RawTensor, check_shape
from .base import POOL, classmethod_, method, new


def _ctx(ctx: Any) -> ExecContext:
    if not isinstance(ctx, ExecContext):
        raise TypeError(f"the first argument must be an ExecContext, got {type(ctx).__name__}")
    ctx.check_open()
    return ctx


def _shape(cls: Any, shape: Any) -> tuple[int, ...]:
    return check_shape(shape, cls.tensor_rank)


def _wrap_raw(cls: Any, ctx: ExecContext, raw: RawTensor, variable: bool = False) -> Any:
    return new(cls, leaf(raw, cls.axis_tags, variable), ctx, op_result=False)


def _from_values(cls: Any, ctx: Any, shape: Any, values: Any) -> RawTensor:
    shp = _shape(cls, shape)
    return RawTensor.from_array(cls.dtype, values_array(cls.dtype, shp, values), shp)


def _check_raw(cls: Any, raw: Any) -> RawTensor:
    if not isinstance(raw, RawTensor):
        raise TypeError(f"expected a fucina.internal.RawTensor, got {type(raw).__name__}")
    if raw.dtype is not cls.dtype:
        raise InvalidShape(f"raw tensor has dtype {raw.dtype.value}, type is {cls.dtype.value}")
    if cls.tag_count == 0:
        if raw.numel != 1:
            raise InvalidShape(f"a scalar tensor needs a single-element value, got {raw.shape}")
        if raw.rank != 1:
            raw = raw.view((1,), (raw.strides[-1],), raw.offset)
    elif raw.rank != cls.tensor_rank:
        raise InvalidShape(
            f"raw tensor has rank {raw.rank} ({raw.shape}), type {cls!r} needs rank "
            f"{cls.tensor_rank}")
    return raw


# -- wrapping raw tensors ----------------------------------------------------------


@classmethod_
def constant(cls: Any, ctx: Any, value: Any) -> Any:
    """Wrap a context-made raw tensor as a no-grad constant."""
    return _wrap_raw(cls, _ctx(ctx), _check_raw(cls, value))


POOL["from_tensor"] = POOL["constant"]


@classmethod_
def variable(cls: Any, ctx: Any, value: Any) -> Any:
    """Wrap a raw tensor as a trainable leaf (f16/bf16 leaves get f32 gradients)."""
    return _wrap_raw(cls, _ctx(ctx), _check_raw(cls, value), variable=True)


@classmethod_
def variable_from_slice(cls: Any, ctx: Any, shape: Any, values: Any) -> Any:
    """Copy ``values`` into a new trainable leaf."""
    return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, values), variable=True)


@classmethod_
def from_slice(cls: Any, ctx: Any, shape: Any, values: Any) -> Any:
    """Copy ``values`` (any flat sequence or array) into a new constant."""
    return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, values))


def _borrow(cls: Any, ctx: Any, shape: Any, array: Any, readonly: bool) -> Any:
    shp = _shape(cls, shape)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"borrowed storage must be a numpy array, got {type(array).__name__}")
    if not readonly and not array.flags.writeable:
        raise InvalidDataLength("from_borrowed_slice needs a writable array")
    raw = RawTensor.from_array(cls.dtype, array, shp, borrow=True, readonly=readonly)
    return _wrap_raw(cls, _ctx(ctx), raw)


@classmethod_
def from_borrowed_slice(cls: Any, ctx: Any, shape: Any, array: Any) -> Any:
    """Zero-copy over a writable numpy array: mutations show through both."""
    return _borrow(cls, ctx, shape, array, readonly=False)


@classmethod_
def from_borrowed_const_slice(cls: Any, ctx: Any, shape: Any, array: Any) -> Any:
    """Zero-copy, read-only over a numpy array (never written through)."""
    return _borrow(cls, ctx, shape, array, readonly=True)


@classmethod_
def from_blocks(cls: Any, ctx: Any, shape: Any, blocks: Any) -> Any:
    """Copy a structured array of GGML blocks; ``shape`` counts logical elements."""
    return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, blocks))


POOL["from_storage_slice"] = POOL["from_blocks"]


@classmethod_
def from_borrowed_blocks(cls: Any, ctx: Any, shape: Any, blocks: Any) -> Any:
    """Zero-copy over a structured array of blocks."""
    return _borrow(cls, ctx, shape, blocks, readonly=False)


# -- filled ------------------------------------------------------------------------


@classmethod_
def empty(cls: Any, ctx: Any, shape: Any) -> Any:
    """Uninitialized storage."""
    return _wrap_raw(cls, _ctx(ctx), RawTensor.empty(cls.dtype, _shape(cls, shape)))


def _full(cls: Any, ctx: Any, shape: Any, value: Any) -> Any:
    return _wrap_raw(cls, _ctx(ctx), ctx.full_typed(cls.dtype, _shape(cls, shape), value))


@classmethod_
def zeros(cls: Any, ctx: Any, shape: Any) -> Any:
    """All zeros."""
    return _full(cls, ctx, shape, 0)


@classmethod_
def ones(cls: Any, ctx: Any, shape: Any) -> Any:
    """All ones."""
    return _full(cls, ctx, shape, 1)


@classmethod_
def full(cls: Any, ctx: Any, shape: Any, value: float) -> Any:
    """Every element ``value``."""
    return _full(cls, ctx, shape, value)


@classmethod_
def scalar(cls: Any, ctx: Any, value: float) -> Any:
    """A single-element tensor holding ``value``."""
    return _full(cls, ctx, (1,) * cls.tensor_rank, value)


@method
def empty_like(self: Any) -> Any:
    """Uninitialized, same type and shape."""
    return type(self).empty(self._ctx, self.shape)


@method
def zeros_like(self: Any) -> Any:
    """Zeros, same type and shape."""
    return type(self).zeros(self._ctx, self.shape)


@method
def ones_like(self: Any) -> Any:
    """Ones, same type and shape."""
    return type(self).ones(self._ctx, self.shape)


@method
def full_like(self: Any, value: float) -> Any:
    """``value`` everywhere, same type and shape."""
    return type(self).full(self._ctx, self.shape, value)


# -- ranges and structured constants ----------------------------------------------


def _need_tags(cls: Any, n: int, what: str) -> None:
    if cls.tag_count != n:
        raise TagError(f"{what} needs a {n}-tag tensor type, {cls!r} has {cls.tag_count}")


def _leaf_f32(cls: Any, ctx: Any, arr: np.ndarray) -> Any:
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(cls.dtype, arr.astype(np.float32)))


@classmethod_
def arange(cls: Any, ctx: Any, start: float, end: float, step: float = 1.0) -> Any:
    """torch.arange: element i is start + i*step, end exclusive."""
    _need_tags(cls, 1, "arange")
    if step == 0 or not all(math.isfinite(v) for v in (start, end, step)):
        raise InvalidShape(f"arange needs a finite nonzero step, got {start}, {end}, {step}")
    n = math.ceil((end - start) / step)
    if n <= 0:
        raise InvalidShape(f"arange({start}, {end}, {step}) is empty")
    return _leaf_f32(cls, ctx, start + np.arange(n, dtype=np.float64) * step)


@classmethod_
def linspace(cls: Any, ctx: Any, start: float, end: float, steps: int) -> Any:
    """torch.linspace: ``steps`` values, end inclusive and exact."""
    _need_tags(cls, 1, "linspace")
    if not isinstance(steps, int) or steps <= 0:
        raise InvalidShape(f"linspace needs steps >= 1, got {steps!r}")
    vals = np.linspace(start, end, steps, dtype=np.float64)
    vals[-1] = end if steps > 1 else start
    return _leaf_f32(cls, ctx, vals)


@classmethod_
def one_hot(cls: Any, ctx: Any, indices: Any, depth: int) -> Any:
    """[len(indices), depth] one-hot rows (first tag rows, second classes)."""
    _need_tags(cls, 2, "one_hot")
    if not isinstance(depth, int) or depth <= 0:
        raise InvalidShape(f"one_hot needs depth >= 1, got {depth!r}")
    idx = np.asarray(indices)
    if idx.size == 0:
        raise InvalidShape("one_hot needs at least one index")
    if not np.issubdtype(idx.dtype, np.integer):
        raise InvalidDataLength(f"one_hot indices must be integers, got {idx.dtype}")
    idx = idx.reshape(-1).astype(np.int64)
    bad = (idx < 0) | (idx >= depth)
    if bad.any():
        raise IndexOutOfBounds(f"one_hot index {int(idx[np.argmax(bad)])} >= depth {depth}")
    out = np.zeros((idx.size, depth), dtype=np.float32)
    out[np.arange(idx.size), idx] = 1
    return _leaf_f32(cls, ctx, out)


@classmethod_
def eye(cls: Any, ctx: Any, n: int) -> Any:
    """The [n, n] identity (first tag rows, second columns)."""
    _need_tags(cls, 2, "eye")
    if not isinstance(n, int) or n <= 0:
        raise InvalidShape(f"eye needs n >= 1, got {n!r}")
    return _leaf_f32(cls, ctx, np.eye(n, dtype=np.float32))


@classmethod_
def band_mask(cls: Any, ctx: Any, shape: Any, lower: int | None, upper: int | None) -> Any:
    """bool mask: (i, j) true iff i - j <= lower and j - i <= upper (None: unbounded)."""
    _need_tags(cls, 2, "band_mask")
    shp = _shape(cls, shape)
    i = np.arange(shp[0])[:, None]
    j = np.arange(shp[1])[None, :]
    keep = np.ones(shp, dtype=bool)
    if lower is not None:
        keep &= (i - j) <= lower
    if upper is not None:
        keep &= (j - i) <= upper
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(DType.bool, keep))


# -- counter-based random constructors ---------------------------------------------


def _random(cls: Any, ctx: Any, shape: Any, fill: Any, *args: Any) -> Any:
    shp = _shape(cls, shape)
    out = np.empty(math.prod(shp), dtype=np.float32)
    try:
        fill(*args[:1], out, *args[1:])
    except ValueError as e:
        raise InvalidShape(str(e)) from None
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(cls.dtype, out, shp))


@classmethod_
def rand(cls: Any, ctx: Any, shape: Any, seed: int) -> Any:
    """Uniform [0, 1) from the counter stream at ``seed``."""
    return _random(cls, ctx, shape, rng.uniform_fill, seed, 0.0, 1.0)


@classmethod_
def uniform(cls: Any, ctx: Any, shape: Any, seed: int, lo: float, hi: float) -> Any:
    """Uniform [lo, hi) from the counter stream at ``seed``."""
    return _random(cls, ctx, shape, rng.uniform_fill, seed, lo, hi)


@classmethod_
def randn(cls: Any, ctx: Any, shape: Any, seed: int) -> Any:
    """Standard normal (Box-Muller) from the counter stream at ``seed``."""
    return _random(cls, ctx, shape, rng.gaussian_fill, seed, 1.0)


@classmethod_
def normal(cls: Any, ctx: Any, shape: Any, seed: int, mean: float, std: float) -> Any:
    """Normal(mean, std) from the counter stream at ``seed``."""
    return _random(cls, ctx, shape, rng.normal_fill, seed, mean, std)


@classmethod_
def bernoulli(cls: Any, ctx: Any, shape: Any, seed: int, p: float) -> Any:
    """1.0 where the [0, 1) draw at (seed, i) falls below ``p``."""
    return _random(cls, ctx, shape, rng.bernoulli_fill, seed, p)


@classmethod_
def gumbel(cls: Any, ctx: Any, shape: Any, seed: int) -> Any:
    """Standard Gumbel(0, 1) noise over a strictly open uniform (always finite)."""
    return _random(cls, ctx, shape, rng.gumbel_fill, seed)


@classmethod_
def randint(cls: Any, ctx: Any, shape: Any, seed: int, low: int, high: int) -> Any:
    """Uniform integers over [low, high) by multiply-shift."""
    shp = _shape(cls, shape)
    out = np.empty(math.prod(shp), dtype=np.int64)
    try:
        rng.randint_fill(seed, out, low, high)
    except ValueError as e:
        raise InvalidShape(str(e)) from None
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(DType.i64, out, shp))


@classmethod_
def randperm(cls: Any, ctx: Any, n: int, seed: int) -> Any:
    """A Fisher-Yates permutation of 0..n-1 (single-tag types)."""
    _need_tags(cls, 1, "randperm")
    if not isinstance(n, int) or n <= 0:
        raise InvalidShape(f"randperm needs n >= 1, got {n!r}")
    out = np.empty(n, dtype=np.int64)
    rng.randperm_fill(seed, out)
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(DType.i64, out))
