"""Constructors: every way to make a leaf tensor (all class methods, context first)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import rng
from ..argnames import explain
from ..dtypes import DType
from ..errors import ContextMismatch, InvalidDataLength, InvalidShape, ShapeMismatch, TagError
from ..ir.execute import current_tracer, emit
from ..ir.graph import Node, leaf
from ..runtime.context import ExecContext
from ..runtime.raw import MAX_ELEMENTS, RawTensor, check_shape
from ..runtime.values import values_array
from .arguments import count_arg, int_arg, optional_int_arg, real_arg
from .base import Tensor, host_indices, index_input, new

if TYPE_CHECKING:
    from typing_extensions import Self

    _Values = Sequence[float] | np.ndarray


def _ctx(ctx: Any) -> ExecContext:
    if not isinstance(ctx, ExecContext):
        raise TypeError(explain(ctx, "an ExecContext (constructors take the context first)"))
    ctx.check_open()
    tracer = current_tracer()
    if tracer is not None:  # a constant made inside fucina.compile: its context is guarded
        note = getattr(tracer, "context", None)
        if note is not None:
            note(ctx)
    return ctx


def _shape(cls: Any, shape: Sequence[int]) -> tuple[int, ...]:
    return check_shape(shape, cls.tensor_rank)


def _wrap_raw(cls: Any, ctx: ExecContext, raw: RawTensor, variable: bool = False) -> Any:
    return new(cls, leaf(raw, cls.axis_tags, variable), ctx, op_result=False)


def _check_layout(shp: tuple[int, ...], values: Any, what: str) -> None:
    """A multi-dimensional array must have exactly the given shape (never reshaped)."""
    if isinstance(values, np.ndarray) and values.ndim > 1 and values.shape != shp:
        raise ShapeMismatch(f"{what}: the array has shape {values.shape}, the tensor shape is "
                            f"{shp}; pass a flat sequence or reshape explicitly")


def _from_values(cls: Any, ctx: Any, shape: Sequence[int], values: Any,
                 name: str = "values") -> RawTensor:
    shp = _shape(cls, shape)
    if cls.dtype.is_block:
        return RawTensor.from_array(cls.dtype, values_array(cls.dtype, shp, values, name), shp)
    if isinstance(values, (list, tuple)) and values and isinstance(values[0], (list, tuple)):
        try:
            values = np.asarray(values)
        except (TypeError, ValueError):
            raise InvalidDataLength(f"{name} are not a flat sequence of numbers nor an array "
                                    f"of shape {shp}") from None
    _check_layout(shp, values, name)
    return RawTensor.from_array(cls.dtype, values_array(cls.dtype, shp, values, name), shp)


def _check_raw(cls: Any, raw: Any) -> RawTensor:
    if not isinstance(raw, RawTensor):
        raise TypeError(explain(raw, "a fucina.internal.RawTensor (from ctx.from_slice, ...)"))
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


def _borrow(cls: Any, ctx: Any, shape: Sequence[int], array: Any, readonly: bool) -> Any:
    shp = _shape(cls, shape)
    if not isinstance(array, np.ndarray):
        raise TypeError(explain(array, "a numpy array (borrowed storage)"))
    if not cls.dtype.is_block:
        _check_layout(shp, array, "borrowed array")
    if not readonly and not array.flags.writeable:
        raise InvalidDataLength("from_borrowed_slice needs a writable array")
    raw = RawTensor.from_array(cls.dtype, array, shp, borrow=True, readonly=readonly)
    return _wrap_raw(cls, _ctx(ctx), raw)


# -- filled ------------------------------------------------------------------------


def _full(cls: Any, ctx: Any, shape: Sequence[int], value: float) -> Any:
    return _wrap_raw(cls, _ctx(ctx), ctx.full_typed(cls.dtype, _shape(cls, shape), value))


# -- ranges and structured constants ----------------------------------------------


def _need_tags(cls: Any, n: int, what: str) -> None:
    if cls.tag_count != n:
        raise TagError(f"{what} needs a {n}-tag tensor type, {cls!r} has {cls.tag_count}")


def _check_count(n: int, what: str) -> int:
    if n > MAX_ELEMENTS:
        raise InvalidShape(f"{what} would have {n} elements, more than any tensor holds")
    return n


def _leaf_f32(cls: Any, ctx: Any, arr: np.ndarray) -> Any:
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(cls.dtype, arr.astype(np.float32)))


# -- counter-based random constructors ---------------------------------------------


def _random(cls: Any, ctx: Any, shape: Sequence[int], fill: Any, *args: Any) -> Any:
    ctx = _ctx(ctx)
    shp = _shape(cls, shape)
    out = np.empty(math.prod(shp), dtype=np.float32)
    try:
        fill(*args[:1], out, *args[1:])
    except ValueError as e:
        raise InvalidShape(str(e)) from None
    return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(cls.dtype, out, shp))


class Wrap(Tensor):
    """Wrapping a context-made raw tensor (every branch)."""

    __slots__ = ()

    @classmethod
    def constant(cls, ctx: ExecContext, value: RawTensor) -> Self:
        """Wrap a context-made raw tensor (``ctx.from_slice(...)``, ...) as a no-grad
        constant of this type (same dtype, this type's rank)."""
        return _wrap_raw(cls, _ctx(ctx), _check_raw(cls, value))

    @classmethod
    def from_tensor(cls, ctx: ExecContext, value: RawTensor) -> Self:
        """Alias of :meth:`constant`."""
        return _wrap_raw(cls, _ctx(ctx), _check_raw(cls, value))


class Filled(Tensor):
    """Constructors from values, numpy arrays and fills (every scalar-dtype branch)."""

    __slots__ = ()

    @classmethod
    def from_slice(cls, ctx: ExecContext, shape: Sequence[int], values: _Values) -> Self:
        """Copy ``values`` into a new constant of ``shape``: a flat sequence or array of
        the right length, or an array of exactly ``shape`` (ShapeMismatch for a
        multi-dimensional array of another shape: nothing is silently reshaped).

        Values convert to the dtype: floats round to nearest (f16, bf16, FP8);
        integer dtypes take exact integers within the type's range (ValueError
        naming the value otherwise: wrap explicitly with ``to``); a ``uint16``
        array for bf16 and a ``uint8`` array for FP8 are raw bits, as ``data()``
        returns them. Strings and other non-numbers are a TypeError."""
        return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, values))

    @classmethod
    def from_numpy(cls, ctx: ExecContext, array: np.ndarray) -> Self:
        """Copy a numpy array with one dimension per tag; the shape comes from the array
        (a scalar type takes a 0-d or one-element array). Values convert to the dtype as
        in :meth:`from_slice`; ``from_borrowed_slice`` is the zero-copy form."""
        ctx = _ctx(ctx)
        if not isinstance(array, np.ndarray):
            raise TypeError(explain(array, "a numpy array"))
        if array.ndim != cls.tag_count and not (cls.tag_count == 0 and array.size == 1):
            raise ShapeMismatch(
                f"from_numpy: {cls!r} has {cls.tag_count} axes, the array has {array.ndim} "
                f"dimensions (shape {array.shape})")
        shape = array.shape if cls.tag_count else (1,)
        return _wrap_raw(cls, ctx, _from_values(cls, ctx, shape, array.reshape(-1), "array"))

    @classmethod
    def from_borrowed_const_slice(cls, ctx: ExecContext, shape: Sequence[int],
                                  array: np.ndarray) -> Self:
        """Zero-copy, read-only over a numpy array (never written through)."""
        return _borrow(cls, ctx, shape, array, readonly=True)

    @classmethod
    def empty(cls, ctx: ExecContext, shape: Sequence[int]) -> Self:
        """Uninitialized storage."""
        return _wrap_raw(cls, _ctx(ctx), RawTensor.empty(cls.dtype, _shape(cls, shape)))

    @classmethod
    def zeros(cls, ctx: ExecContext, shape: Sequence[int]) -> Self:
        """All zeros."""
        return _full(cls, ctx, shape, 0)

    @classmethod
    def ones(cls, ctx: ExecContext, shape: Sequence[int]) -> Self:
        """All ones."""
        return _full(cls, ctx, shape, 1)

    def empty_like(self) -> Self:
        """Uninitialized, same type and shape."""
        return type(self).empty(self._ctx, self.shape)

    def zeros_like(self) -> Self:
        """Zeros, same type and shape."""
        return type(self).zeros(self._ctx, self.shape)

    def ones_like(self) -> Self:
        """Ones, same type and shape."""
        return type(self).ones(self._ctx, self.shape)


class Variables(Tensor):
    """Trainable leaves (f32; f16/bf16 leaves get f32 gradients)."""

    __slots__ = ()

    @classmethod
    def variable(cls, ctx: ExecContext, value: RawTensor) -> Self:
        """Wrap a raw tensor as a trainable leaf (f16/bf16 leaves get f32 gradients)."""
        return _wrap_raw(cls, _ctx(ctx), _check_raw(cls, value), variable=True)

    @classmethod
    def variable_from_slice(cls, ctx: ExecContext, shape: Sequence[int], values: _Values,
                            ) -> Self:
        """Copy ``values`` into a new trainable leaf."""
        return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, values), variable=True)


def _one_hot_node(cls: Any, ctx: ExecContext, indices: Tensor, depth: int) -> Any:
    """one_hot of an integer tensor: its (checked) values compared with the class iota."""
    node = index_input(indices, indices, depth, "one_hot depth")
    assert isinstance(node, Node)  # a tensor's indices are a node
    if indices._ctx is not ctx:
        raise ContextMismatch("one_hot: indices belong to another ExecContext")
    n = node.shape[0]
    _check_count(n * depth, "one_hot")
    iota = leaf(RawTensor.from_array(DType.i64, np.arange(depth, dtype=np.int64)), None, False)
    iota.tags = ("one_hot depth",)  # names the axis in IndexOutOfBounds, as host data does
    node = emit("check_index", (iota, node), axis=0)
    rows = emit("view", (node,), shape=(n, depth), coeffs=((1,), (0,)), base=(0,))
    cols = emit("view", (iota,), shape=(n, depth), coeffs=((0,), (1,)), base=(0,))
    hit = emit("compare", (rows, cols), fn="eq")
    out = emit("cast", (hit,), dtype=cls.dtype, src=DType.bool)
    out.tags = cls.axis_tags
    return new(cls, out, ctx)


class F32Constructors(Tensor):
    """Fills, ranges, structured constants and counter-based random tensors (f32)."""

    __slots__ = ()

    @classmethod
    def from_borrowed_slice(cls, ctx: ExecContext, shape: Sequence[int], array: np.ndarray,
                            ) -> Self:
        """Zero-copy over a writable numpy array: mutations show through both."""
        return _borrow(cls, ctx, shape, array, readonly=False)

    @classmethod
    def full(cls, ctx: ExecContext, shape: Sequence[int], value: float) -> Self:
        """Every element ``value``."""
        return _full(cls, ctx, shape, value)

    @classmethod
    def scalar(cls, ctx: ExecContext, value: float) -> Self:
        """A single-element tensor holding ``value``."""
        return _full(cls, ctx, (1,) * cls.tensor_rank, value)

    def full_like(self, value: float) -> Self:
        """``value`` everywhere, same type and shape."""
        return type(self).full(self._ctx, self.shape, value)

    @classmethod
    def arange(cls, ctx: ExecContext, start: float, end: float, step: float = 1.0) -> Self:
        """torch.arange: element i is start + i*step, end exclusive."""
        _need_tags(cls, 1, "arange")
        ctx = _ctx(ctx)
        lo, hi, d = real_arg(start, "start"), real_arg(end, "end"), real_arg(step, "step")
        if d == 0 or not all(math.isfinite(v) for v in (lo, hi, d)):
            raise InvalidShape(f"arange needs a finite nonzero step, got {start}, {end}, {step}")
        span = (hi - lo) / d
        if not math.isfinite(span):
            raise InvalidShape(f"arange({start}, {end}, {step}) has too many elements")
        n = _check_count(math.ceil(span), f"arange({start}, {end}, {step})")
        if n <= 0:
            raise InvalidShape(f"arange({start}, {end}, {step}) is empty")
        start, step = lo, d
        return _leaf_f32(cls, ctx, start + np.arange(n, dtype=np.float64) * step)

    @classmethod
    def linspace(cls, ctx: ExecContext, start: float, end: float, steps: int) -> Self:
        """torch.linspace: ``steps`` values, end inclusive and exact."""
        _need_tags(cls, 1, "linspace")
        ctx = _ctx(ctx)
        start, end = real_arg(start, "start"), real_arg(end, "end")
        steps = count_arg(steps, "steps")
        with np.errstate(all="ignore"):  # an infinite end gives inf/NaN steps, as in torch
            vals = np.linspace(start, end, steps, dtype=np.float64)
        vals[-1] = end if steps > 1 else start
        return _leaf_f32(cls, ctx, vals)

    @classmethod
    def one_hot(cls, ctx: ExecContext, indices: Sequence[int] | np.ndarray | Tensor,
                depth: int) -> Self:
        """[len(indices), depth] one-hot rows (first tag rows, second classes).

        ``indices`` is host data or a rank-1 integer tensor on ``ctx`` (a traced
        input under compile, its values checked when the op runs)."""
        _need_tags(cls, 2, "one_hot")
        ctx = _ctx(ctx)
        depth = count_arg(depth, "depth")
        if isinstance(indices, Tensor):
            return cast("Self", _one_hot_node(cls, ctx, indices, depth))
        idx = host_indices(indices, depth, "one_hot depth")
        _check_count(idx.size * depth, "one_hot")
        out = np.zeros((idx.size, depth), dtype=np.float32)
        out[np.arange(idx.size), idx] = 1
        return _leaf_f32(cls, ctx, out)

    @classmethod
    def eye(cls, ctx: ExecContext, n: int) -> Self:
        """The [n, n] identity (first tag rows, second columns)."""
        _need_tags(cls, 2, "eye")
        ctx = _ctx(ctx)
        n = count_arg(n, "n")
        _check_count(n * n, "eye")
        return _leaf_f32(cls, ctx, np.eye(n, dtype=np.float32))

    @classmethod
    def rand(cls, ctx: ExecContext, shape: Sequence[int], seed: int) -> Self:
        """Uniform [0, 1) from the counter stream at ``seed``."""
        return _random(cls, ctx, shape, rng.uniform_fill, int_arg(seed, "seed"), 0.0, 1.0)

    @classmethod
    def uniform(cls, ctx: ExecContext, shape: Sequence[int], seed: int, lo: float,
                hi: float) -> Self:
        """Uniform [lo, hi) from the counter stream at ``seed``."""
        return _random(cls, ctx, shape, rng.uniform_fill, int_arg(seed, "seed"),
                       real_arg(lo, "lo"), real_arg(hi, "hi"))

    @classmethod
    def randn(cls, ctx: ExecContext, shape: Sequence[int], seed: int) -> Self:
        """Standard normal (Box-Muller) from the counter stream at ``seed``."""
        return _random(cls, ctx, shape, rng.gaussian_fill, int_arg(seed, "seed"), 1.0)

    @classmethod
    def normal(cls, ctx: ExecContext, shape: Sequence[int], seed: int, mean: float,
               std: float) -> Self:
        """Normal(mean, std) from the counter stream at ``seed``."""
        return _random(cls, ctx, shape, rng.normal_fill, int_arg(seed, "seed"),
                       real_arg(mean, "mean"), real_arg(std, "std"))

    @classmethod
    def bernoulli(cls, ctx: ExecContext, shape: Sequence[int], seed: int, p: float) -> Self:
        """1.0 where the [0, 1) draw at (seed, i) falls below ``p``."""
        return _random(cls, ctx, shape, rng.bernoulli_fill, int_arg(seed, "seed"),
                       real_arg(p, "p"))

    @classmethod
    def gumbel(cls, ctx: ExecContext, shape: Sequence[int], seed: int) -> Self:
        """Standard Gumbel(0, 1) noise over a strictly open uniform (always finite)."""
        return _random(cls, ctx, shape, rng.gumbel_fill, int_arg(seed, "seed"))


class IndexConstructors(Tensor):
    """Random integers and permutations (i64)."""

    __slots__ = ()

    @classmethod
    def randint(cls, ctx: ExecContext, shape: Sequence[int], seed: int, low: int,
                high: int) -> Self:
        """Uniform integers over [low, high) by multiply-shift."""
        ctx = _ctx(ctx)
        shp = _shape(cls, shape)
        seed, low, high = int_arg(seed, "seed"), int_arg(low, "low"), int_arg(high, "high")
        out = np.empty(math.prod(shp), dtype=np.int64)
        try:
            rng.randint_fill(seed, out, low, high)
        except ValueError as e:
            raise InvalidShape(str(e)) from None
        return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(DType.i64, out, shp))

    @classmethod
    def randperm(cls, ctx: ExecContext, n: int, seed: int) -> Self:
        """A Fisher-Yates permutation of 0..n-1 (single-tag types)."""
        _need_tags(cls, 1, "randperm")
        ctx = _ctx(ctx)
        n = count_arg(n, "n")
        seed = int_arg(seed, "seed")
        out = np.empty(n, dtype=np.int64)
        rng.randperm_fill(seed, out)
        return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(DType.i64, out))


class MaskConstructors(Tensor):
    """Band masks (bool)."""

    __slots__ = ()

    @classmethod
    def band_mask(cls, ctx: ExecContext, shape: Sequence[int], lower: int | None,
                  upper: int | None) -> Self:
        """bool mask: (i, j) true iff i - j <= lower and j - i <= upper (None: unbounded)."""
        _need_tags(cls, 2, "band_mask")
        ctx = _ctx(ctx)
        shp = _shape(cls, shape)
        lower, upper = optional_int_arg(lower, "lower"), optional_int_arg(upper, "upper")
        i = np.arange(shp[0])[:, None]
        j = np.arange(shp[1])[None, :]
        keep = np.ones(shp, dtype=bool)
        if lower is not None:
            keep &= (i - j) <= lower
        if upper is not None:
            keep &= (j - i) <= upper
        return _wrap_raw(cls, _ctx(ctx), RawTensor.from_array(DType.bool, keep))


class BlockConstructors(Tensor):
    """Block-quantized tensors from GGML blocks."""

    __slots__ = ()

    @classmethod
    def from_blocks(cls, ctx: ExecContext, shape: Sequence[int], blocks: np.ndarray) -> Self:
        """Copy a structured array of GGML blocks (``fucina.BlockQ8_0``, ...); ``shape``
        counts logical elements (the innermost a multiple of the block size)."""
        return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, blocks))

    @classmethod
    def from_storage_slice(cls, ctx: ExecContext, shape: Sequence[int], blocks: np.ndarray,
                           ) -> Self:
        """Alias of :meth:`from_blocks` (the seeds' name)."""
        return _wrap_raw(cls, _ctx(ctx), _from_values(cls, ctx, shape, blocks))

    @classmethod
    def from_borrowed_blocks(cls, ctx: ExecContext, shape: Sequence[int], blocks: np.ndarray,
                             ) -> Self:
        """Zero-copy over a structured array of blocks."""
        return _borrow(cls, ctx, shape, blocks, readonly=False)
