"""Copying structural ops: gather/scatter, concat/stack, pad, flip/roll, reshape, masks.

Index arguments are host data (a sequence or numpy integers, validated before
anything runs) or an integer tensor (a traced input under ``compile``, its
values checked by the IR before any kernel reads them); either way a bad index
raises ``IndexOutOfBounds`` naming the index and the axis. Gradients route
through the index maps via the gather/scatter primitives' VJP rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..argnames import bad_argument
from ..dtypes import DType
from ..errors import (
    EmptySelection,
    IndexOutOfBounds,
    InvalidShape,
    ShapeMismatch,
    TagError,
    UnsupportedGradient,
    UnsupportedView,
)
from ..ir.checks import check_unique
from ..ir.execute import emit
from ..ir.graph import Node, leaf
from ..runtime.raw import MAX_ELEMENTS, RawTensor, contiguous_strides
from .arguments import count_arg, int_arg, int_seq_arg, is_int, real_arg, sizes_arg
from .base import (
    Tensor,
    align_node,
    check_tensor,
    identity_view,
    index_input,
    result,
    same_ctx,
    sizes_of,
    tensor_list,
)
from .display import decode
from .math import reduce_tags
from .views import diagonal_view, narrow_node, with_axis

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import F32Tensor


def _const(dtype: DType, arr: np.ndarray) -> Node:
    """A constant leaf built host-side (masks, identity matrices)."""
    if dtype is DType.bf16:
        from ..kernels.cast import f32_to_bf16

        arr = f32_to_bf16(arr.astype(np.float32))
    return leaf(RawTensor.from_array(dtype, arr), None, False)


def _same_type(self: Any, other: Any, what: str) -> None:
    check_tensor(other, what)
    same_ctx(self, other)
    if type(other) is not type(self):
        raise TagError(f"{what} must be a {type(self)!r}, got {type(other)!r}")


def _match_except(self: Any, other: Any, tag: str, what: str) -> None:
    for t, a, b in zip(self.axis_tags, self.shape, other.shape):
        if t != tag and a != b:
            raise ShapeMismatch(f"{what}: tag {t!r} has size {b}, expected {a}")


def _gather_node(self: Any, axis: int, idx: np.ndarray) -> Node:
    return emit("gather", (self._node,), axis=axis, index=idx)


def _rows_node(op: str, inputs: tuple[Node, ...], idx: np.ndarray | Node, axis: int,
               **attrs: Any) -> Node:
    """``op`` over ``inputs`` at rows ``idx``: host rows in the attributes, a traced
    index (an integer tensor's i64 node) as the last input."""
    if isinstance(idx, Node):
        return emit(op, (*inputs, idx), axis=axis, index=None, **attrs)
    return emit(op, inputs, axis=axis, index=idx)


def _count(idx: np.ndarray | Node) -> int:
    return int(idx.size) if isinstance(idx, np.ndarray) else idx.shape[0]


def _gather(self: Any, tag: str, indices: Any, out_tag: str) -> Any:
    i = T.index(self.axis_tags, tag)
    out = T.replace_tag(self.axis_tags, tag, out_tag)
    idx = index_input(self, indices, self._node.shape[i], tag)
    return result(self, out, _rows_node("gather", (self._node,), idx, i))


def _concat(self: Any, tag: str, others: Any) -> Any:
    i = T.index(self.axis_tags, tag)
    rest = tensor_list(others, "concat operands")
    for o in rest:
        _same_type(self, o, "concat operand")
        _match_except(self, o, tag, "concat")
    if self.dtype.is_block and (self.tag_count != 2 or i != 0):
        raise TagError(f"{self.dtype.value} concat joins rank-2 tensors along the row axis only")
    if not rest:
        return self.materialize()
    node = emit("concat", (self._node, *(o._node for o in rest)), axis=i)
    return result(self, self.axis_tags, node)


def _set_rows_node(self: Any, axis: int, idx: np.ndarray, update: Node) -> Node:
    return emit("set_index", (self._node, update), axis=axis, index=idx)


def _zero_rows(self: Any, axis: int, idx: np.ndarray | Node) -> Any:
    shape = list(self.shape)
    shape[axis] = _count(idx)
    zeros = emit("fill", (), shape=tuple(shape), dtype=self.dtype, value=0)
    return result(self, self.axis_tags, _rows_node("set_index", (self._node, zeros), idx, axis))


def _pad_node(node: Node, axis: int, before: int, after: int, fill: float) -> Node:
    return emit("pad", (node,), axis=axis, before=before, after=after, value=fill)


def _crop(x: Any, tag: str, lo: int, hi: int) -> Any:
    """A view of ``x`` without ``lo`` leading and ``hi`` trailing positions along ``tag``."""
    dim = x.dim(tag)
    return result(x, x.axis_tags, narrow_node(x, T.index(x.axis_tags, tag), lo, dim - lo - hi))


def _pad2d(self: Any, h: str, w: str, padding: Any, fill: float) -> Any:
    fill = real_arg(fill, "fill")
    if is_int(padding):
        padding = (int(padding),) * 4
    else:
        try:
            padding = int_seq_arg(padding, "padding")
        except TypeError:
            raise TypeError(bad_argument("padding", padding,
                                         "an int or (left, right, top, bottom) ints")) from None
    if len(padding) != 4:
        raise InvalidShape(f"padding must be an int or (left, right, top, bottom), got {padding}")
    left, right, top, bottom = padding
    grown = max(left, 0) + max(right, 0) + max(top, 0) + max(bottom, 0)
    if grown * self._node.value.numel > MAX_ELEMENTS:
        raise InvalidShape(f"padding {padding} makes a tensor larger than any buffer")
    x, padded = self, False
    for tag, lo, hi in ((w, left, right), (h, top, bottom)):
        dim = x.dim(tag)
        if dim + lo + hi <= 0:
            raise InvalidShape(f"padding {padding} crops {tag!r} of size {dim} to nothing")
        crop_lo, crop_hi = max(0, -lo), max(0, -hi)
        # Crop, then pad; when one side's crop passes the other side's edge (torch keeps
        # the fill positions: width 1 padded (2, -1) is [fill, fill]), pad first.
        # (then one side pads, as the result is not empty)
        first_pad = dim - crop_lo - crop_hi <= 0
        if not first_pad and (crop_lo or crop_hi):
            x = _crop(x, tag, crop_lo, crop_hi)
        if lo > 0 or hi > 0:
            x = result(x, x.axis_tags, _pad_node(x._node, T.index(x.axis_tags, tag),
                                                 max(lo, 0), max(hi, 0), fill))
            padded = True
        if first_pad:
            x = _crop(x, tag, crop_lo, crop_hi)
    # Padding allocates; pure crops are views, so copy them to return owned storage.
    return x if padded else x.materialize()


def _mask_flags(self: Any, mask: Any, op: str) -> np.ndarray:
    check_tensor(mask, "mask")
    same_ctx(self, mask)
    if mask._node.value.is_symbolic:
        raise UnsupportedView(
            f"{op}: the mask's values are read while tracing (they decide which positions "
            "exist); under compile capture the mask from a closure or global instead of "
            "passing it as an argument: its values are then guarded (a change traces again)")
    if mask.requires_grad:
        raise UnsupportedGradient("a mask is control data and must not require grad")
    if set(mask.axis_tags) != set(self.axis_tags):
        raise TagError(f"mask tags {mask.axis_tags} differ from {self.axis_tags}")
    sizes = sizes_of(mask)
    for t, d in zip(self.axis_tags, self.shape):
        if sizes[t] != d:
            raise ShapeMismatch(f"mask: tag {t!r} has size {sizes[t]}, tensor has {d}")
    arr = mask.permute_to(self.axis_tags).numpy() if self.tag_count else mask.numpy()
    if mask.dtype is DType.bf16:
        from ..kernels.cast import bf16_to_f32

        arr = bf16_to_f32(arr)
    return (arr != 0).reshape(-1)


def _section_index(self: Any, tag: str, offsets: Any, circular: bool) -> np.ndarray:
    i = T.index(self.axis_tags, tag)
    shape = self._node.shape
    n = shape[i]
    sections = self._node.value.numel // n
    off = np.asarray(offsets)
    if off.ndim != 1 or off.size != sections or not np.issubdtype(off.dtype, np.integer):
        raise InvalidShape(f"expected {sections} integer offsets (one per section along "
                           f"{tag!r}), got {off.size}")
    base = np.moveaxis(np.arange(self._node.value.numel, dtype=np.int64).reshape(shape), i, -1)
    moved_shape = base.shape
    rows = base.reshape(sections, n)
    off = off.astype(np.int64)
    if circular:
        off = off % n  # keeps the subtraction below in range for any int64 offset
    else:
        off = np.clip(off, -n, n)
    j = np.arange(n, dtype=np.int64)[None, :] - off[:, None]
    if circular:
        j %= n
        src = np.take_along_axis(rows, j, axis=1)
    else:
        valid = (j >= 0) & (j < n)
        src = np.where(valid, np.take_along_axis(rows, np.clip(j, 0, n - 1), axis=1), -1)
    return np.moveaxis(src.reshape(moved_shape), -1, i).reshape(-1)


def _i64_broadcast(values: np.ndarray, shape: tuple[int, ...], axis: int | None) -> Node:
    """An i64 constant viewed over ``shape``: a scalar (``axis`` None) or a vector along
    ``axis``."""
    node = leaf(RawTensor.from_array(DType.i64, values.astype(np.int64).reshape(-1)), None,
                False)
    coeffs = tuple((1,) if k == axis else (0,) for k in range(len(shape)))
    return emit("view", (node,), shape=shape, coeffs=coeffs, base=(0,))


def _section_shift(self: Any, tag: str, offsets: Any, circular: bool, fill: float) -> Node:
    """roll_by / shift_by with per-section offsets from an integer tensor (a traced input):
    each element's source position is computed in the IR and read with ``take_along``
    (exactly the host path's index map, values known only when the op runs)."""
    i = T.index(self.axis_tags, tag)
    shape = self._node.shape
    n = shape[i]
    sections = self._node.value.numel // n
    check_tensor(offsets, "offsets")
    same_ctx(self, offsets)
    if not offsets.dtype.is_integer:
        raise TagError(f"offsets must be an integer tensor, got {offsets.dtype.value}")
    off = offsets._node
    if offsets.tag_count != 1 or off.value.numel != sections:
        raise InvalidShape(f"expected {sections} integer offsets (one per section along "
                           f"{tag!r}), got {off.value.numel}")
    if not off.value.is_contiguous():
        off = emit("copy", (off,))
    if off.dtype is not DType.i64:
        off = emit("cast", (off,), dtype=DType.i64, src=off.dtype)
    # section s = the row-major position over the other axes (the host path's order)
    rest = iter(contiguous_strides(tuple(d for k, d in enumerate(shape) if k != i) or (1,)))
    coeffs = tuple((0,) if k == i else (next(rest),) for k in range(len(shape)))
    off = emit("view", (off,), shape=shape, coeffs=coeffs, base=(0,))
    iota = _i64_broadcast(np.arange(n), shape, i)

    def const(v: int) -> Node:
        return _i64_broadcast(np.array([v]), shape, None)

    def take(index: Node) -> Node:
        return emit("take_along", (self._node, index), axis=i, shape=shape, dtype=self.dtype)

    if circular:  # (j - off mod n) mod n: in range for any int64 offset
        k = emit("binary", (off, const(n)), fn="mod")
        return take(emit("binary", (emit("binary", (iota, k), fn="sub"), const(n)), fn="mod"))
    lo, hi = const(-n), const(n)
    off = emit("where", (emit("compare", (off, lo), fn="lt"), lo,
                         emit("where", (emit("compare", (off, hi), fn="gt"), hi, off))))
    j = emit("binary", (iota, off), fn="sub")  # in [-n, 2n)
    zero = const(0)
    below = emit("compare", (j, zero), fn="lt")
    above = emit("compare", (j, const(n)), fn="ge")
    src = take(emit("where", (below, zero, emit("where", (above, zero, j)))))
    filled = emit("fill", (), shape=shape, dtype=self.dtype, value=fill)
    return emit("where", (below, filled, emit("where", (above, filled, src))))


# -- per-element indexed ops ----------------------------------------------------------------


def _element_index(self: Any, tag: str, indices: Any, shape_like: Any = None) -> tuple:
    i = T.index(self.axis_tags, tag)
    check_tensor(indices, "indices")
    same_ctx(self, indices)
    if not indices.dtype.is_integer:
        raise TagError(f"indices must be an integer tensor, got {indices.dtype.value}")
    if set(indices.axis_tags) != set(self.axis_tags):
        raise TagError(f"indices tags {indices.axis_tags} differ from {self.axis_tags}")
    isz = sizes_of(indices)
    ishape = tuple(isz[t] for t in self.axis_tags) or (1,)
    for t, d in zip(self.axis_tags, self.shape):
        if t != tag and isz[t] != d:
            raise ShapeMismatch(f"indices: tag {t!r} has size {isz[t]}, tensor has {d}")
    # Index values are checked by the IR before the kernel reads them (eager and compiled).
    node = align_node(indices, self.axis_tags, ishape)
    if indices.dtype is not DType.i64:
        node = emit("cast", (node,), dtype=DType.i64, src=indices.dtype)
    return i, node, ishape


def _scatter(self: Any, tag: str, indices: Any, src: Any, op: str) -> Any:
    _same_type(self, src, "src")
    i, idx, ishape = _element_index(self, tag, indices)
    if ishape != tuple(src.shape):
        raise ShapeMismatch(f"indices shape {ishape} must equal src shape {src.shape}")
    return result(self, self.axis_tags, emit(op, (self._node, idx, src._node), axis=i))


# -- diagonals ----------------------------------------------------------------------------


def _eye_mask(n: int) -> Node:
    return _const(DType.bool, np.eye(n, dtype=np.bool_))


def _keep_diagonal(v: Node, eye: Node, dtype: DType) -> Node:
    """``v`` where ``eye`` is set, exact zeros elsewhere (a product with an identity
    matrix would put NaN off the diagonal of a NaN or inf entry: torch keeps zeros)."""
    zero = emit("fill", (), shape=v.shape, dtype=dtype, value=0)
    return emit("where", (eye, v, zero))


class Concat(Tensor):
    """Joining tensors along an existing axis (every branch; block formats by rows)."""

    __slots__ = ()

    def concat(self, tag: str, others: Sequence[Tensor]) -> Self:
        """Join self and ``others`` (same type, same sizes except ``tag``) along the
        existing axis ``tag``. Block-quantized tensors join rank-2 tensors by rows."""
        return _concat(self, tag, others)


class RowEdits(Tensor):
    """Row gathers and slice/row overwrites (every scalar-dtype branch)."""

    __slots__ = ()

    def gather(self, tag: str, indices: Sequence[int] | np.ndarray | Tensor,
               out_tag: str) -> Self:
        """Rows ``indices`` along ``tag`` (host ints or a rank-1 integer tensor, a traced
        input under compile), the axis retagged ``out_tag``."""
        return _gather(self, tag, indices, out_tag)

    def set_slice(self, tag: str, start: int, update: Tensor) -> Self:
        """Copy of self with [start, start+len) along ``tag`` overwritten by ``update``."""
        i = T.index(self.axis_tags, tag)
        _same_type(self, update, "update")
        _match_except(self, update, tag, "set_slice")
        n, dim = update.shape[i], self.shape[i]
        start = int_arg(start, "start")
        if start < 0 or start + n > dim:
            raise IndexOutOfBounds(f"set_slice: [{start}, {start}+{n}) out of range for {tag!r} "
                                   f"of size {dim}")
        idx = np.arange(start, start + n, dtype=np.int64)
        return result(self, self.axis_tags, _set_rows_node(self, i, idx, update._node))

    def set_rows(self, tag: str, indices: Sequence[int] | np.ndarray | Tensor,
                 update: Tensor) -> Self:
        """Copy of self with rows ``indices`` (unique; host ints or a rank-1 integer
        tensor) along ``tag`` overwritten by ``update``."""
        i = T.index(self.axis_tags, tag)
        _same_type(self, update, "update")
        idx = index_input(self, indices, self.shape[i], tag)
        if isinstance(idx, np.ndarray):
            check_unique(idx, "set_rows")  # a tensor's values: when the op runs
        n = _count(idx)
        if update.shape[i] != n:
            raise InvalidShape(f"set_rows: update has {update.shape[i]} rows along {tag!r}, "
                               f"{n} indices given")
        _match_except(self, update, tag, "set_rows")
        node = _rows_node("set_index", (self._node, update._node), idx, i,
                          **({"unique": True} if isinstance(idx, Node) else {}))
        return result(self, self.axis_tags, node)


class Rearrange(Tensor):
    """Copying rearrangements: reshape, flatten, flip, roll, stack, repeat (float branches)."""

    __slots__ = ()

    def reshape(self, new_tags: Sequence[str], new_shape: Sequence[int]) -> Self:
        """Row-major reinterpretation to ``new_tags`` at ``new_shape`` (view when contiguous)."""
        tgt = T.normalize_tags(new_tags)
        shp = sizes_arg(new_shape, "new_shape", len(tgt))
        raw_shape = shp or (1,)
        if math.prod(raw_shape) != self._node.value.numel:
            raise InvalidShape(f"reshape: {math.prod(raw_shape)} elements requested, tensor has "
                               f"{self._node.value.numel}")
        node = self._node
        if not node.value.is_contiguous():
            node = emit("copy", (node,))
        return result(self, tgt, emit("reshape", (node,), shape=raw_shape))

    def flatten(self, out_tag: str) -> Self:
        """Rank-1 ``out_tag`` over every element (copies only a non-contiguous source)."""
        return self.reshape((T.check_tag(out_tag),), (self._node.value.numel,))

    def flip(self, tag: str) -> Self:
        """Reverse the axis ``tag``."""
        i = T.index(self.axis_tags, tag)
        idx = np.arange(self.shape[i] - 1, -1, -1, dtype=np.int64)
        return result(self, self.axis_tags, _gather_node(self, i, idx))

    def roll(self, tag: str, shift: int) -> Self:
        """Rotate the axis ``tag`` by ``shift`` (torch.roll: element i moves to i + shift)."""
        i = T.index(self.axis_tags, tag)
        n = self.shape[i]
        k = int_arg(shift, "shift") % n  # exact for any Python int, then small
        idx = (np.arange(n, dtype=np.int64) - k) % n
        return result(self, self.axis_tags, _gather_node(self, i, idx))

    def stack(self, new_tag: str, axis_index: int, others: Sequence[Tensor]) -> Self:
        """Stack self and ``others`` (same type and shape) along a new axis ``new_tag``
        at ``axis_index``."""
        rest = tensor_list(others, "stack operands")
        for o in rest:
            _same_type(self, o, "stack operand")
            if o.shape != self.shape:
                raise ShapeMismatch(f"stack: shapes {o.shape} and {self.shape} differ")
        parts = [with_axis(x, new_tag, axis_index) for x in [self, *rest]]
        return _concat(parts[0], new_tag, parts[1:])

    def repeat_axis(self, tag: str, n: int) -> Self:
        """Tile the axis ``tag`` n times ([a, b] -> [a, b, a, b])."""
        i = T.index(self.axis_tags, tag)
        n = count_arg(n, "n")
        if n * self._node.value.numel > MAX_ELEMENTS:
            raise InvalidShape(f"repeat_axis: {n} copies make a tensor larger than any buffer")
        if n == 1:
            return result(self, self.axis_tags, identity_view(self))
        idx = np.tile(np.arange(self.shape[i], dtype=np.int64), n)
        return result(self, self.axis_tags, _gather_node(self, i, idx))


class Padding(Tensor):
    """Padding an axis with a fill value (f32, f16, bf16)."""

    __slots__ = ()

    def pad(self, tag: str, before: int, after: int, fill: float = 0.0) -> Self:
        """Grow ``tag`` by ``before`` + ``after`` positions holding ``fill``."""
        i = T.index(self.axis_tags, tag)
        before, after = count_arg(before, "before", 0), count_arg(after, "after", 0)
        fill = real_arg(fill, "fill")
        if (before + after) * self._node.value.numel > MAX_ELEMENTS:
            raise InvalidShape(f"pad: {before} + {after} positions make a tensor larger than "
                               "any buffer")
        return result(self, self.axis_tags, _pad_node(self._node, i, before, after, fill))


class IndexedOps(Tensor):
    """Indexed and masked copies, scatters, 2-D padding and diagonals (f32)."""

    __slots__ = ()

    def index_select(self, tag: str, index: Tensor, out_tag: str) -> Self:
        """torch.index_select: ``gather`` with a rank-1 integer index tensor."""
        check_tensor(index, "index")
        if index.tag_count != 1:
            raise TagError(
                f"index_select needs a rank-1 index tensor, got tags {index.axis_tags}")
        return _gather(self, tag, index, out_tag)

    def index_add(self, tag: str, indices: Sequence[int] | np.ndarray | Tensor,
                  update: Tensor) -> Self:
        """Copy of self with ``update``'s rows added at ``indices`` (host ints or a rank-1
        integer tensor; duplicates accumulate)."""
        i = T.index(self.axis_tags, tag)
        _same_type(self, update, "update")
        idx = index_input(self, indices, self.shape[i], tag)
        n = _count(idx)
        if update.shape[i] != n:
            raise InvalidShape(f"index_add: update has {update.shape[i]} rows along {tag!r}, "
                               f"{n} indices given")
        _match_except(self, update, tag, "index_add")
        node = _rows_node("index_add", (self._node, update._node), idx, i)
        return result(self, self.axis_tags, node)

    def zero_slice(self, tag: str, start: int, length: int) -> Self:
        """Copy of self with [start, start+length) along ``tag`` zeroed."""
        i = T.index(self.axis_tags, tag)
        dim = self.shape[i]
        start, length = int_arg(start, "start"), count_arg(length, "length")
        if start < 0 or start + length > dim:
            raise IndexOutOfBounds(f"zero_slice: [{start}, {start}+{length}) out of range for "
                                   f"{tag!r} of size {dim}")
        return _zero_rows(self, i, np.arange(start, start + length, dtype=np.int64))

    def zero_rows(self, tag: str, indices: Sequence[int] | np.ndarray | Tensor) -> Self:
        """Copy of self with rows ``indices`` (host ints or a rank-1 integer tensor) along
        ``tag`` zeroed."""
        i = T.index(self.axis_tags, tag)
        idx = index_input(self, indices, self.shape[i], tag)
        return _zero_rows(self, i, np.unique(idx) if isinstance(idx, np.ndarray) else idx)

    def take_along_axis(self, tag: str, indices: Tensor) -> Self:
        """torch.gather along ``tag`` with a same-tagged integer index tensor."""
        i, idx, ishape = _element_index(self, tag, indices)
        node = emit("take_along", (self._node, idx), axis=i, shape=ishape, dtype=self.dtype)
        return result(self, self.axis_tags, node)

    def scatter_add(self, tag: str, indices: Tensor, src: Tensor) -> Self:
        """torch.scatter_add along ``tag``: src added at indices (duplicates accumulate)."""
        return _scatter(self, tag, indices, src, "scatter_add")

    def scatter(self, tag: str, indices: Tensor, src: Tensor) -> Self:
        """torch.scatter along ``tag``: src written at indices (last row-major write wins)."""
        return _scatter(self, tag, indices, src, "scatter")

    def masked_select(self, mask: Tensor, out_tag: str) -> Self:
        """Rank-1 ``out_tag`` of the elements where ``mask`` is nonzero (row-major)."""
        T.check_tag(out_tag)
        flags = _mask_flags(self, mask, "masked_select")
        idx = np.flatnonzero(flags).astype(np.int64)
        if idx.size == 0:
            raise EmptySelection("masked_select: the mask selects nothing")
        node = emit("gather_flat", (self._node,), index=idx, shape=(idx.size,))
        return result(self, (out_tag,), node)

    def masked_scatter(self, mask: Tensor, values_tag: str, values: Tensor) -> Self:
        """Copy of self with rank-1 ``values`` written where ``mask`` is nonzero (row-major)."""
        T.check_tag(values_tag)
        flags = _mask_flags(self, mask, "masked_scatter")
        check_tensor(values, "values")
        same_ctx(self, values)
        if values.axis_tags != (values_tag,):
            raise TagError(f"values must be tagged ({values_tag!r},), got {values.axis_tags}")
        if values.dtype is not self.dtype:
            raise TagError(f"values dtype {values.dtype.value} differs from {self.dtype.value}")
        count = int(flags.sum())
        if count == 0:
            raise EmptySelection("masked_scatter: the mask selects nothing")
        if values.shape[0] != count:
            raise InvalidShape(f"masked_scatter: {values.shape[0]} values for {count} positions")
        src = np.full(flags.size, -1, dtype=np.int64)
        src[flags] = np.arange(count, dtype=np.int64)
        spread = emit("gather_flat", (values._node,), index=src, shape=self._node.shape,
                      has_fill=True, fill=0)
        cond = _const(DType.bool, flags.reshape(self._node.shape))
        return result(self, self.axis_tags, emit("where", (cond, spread, self._node)))

    def nonzero(self) -> list[int]:
        """Row-major flat indices of the nonzero elements (NaN counts), host-side."""
        arr = decode(self.numpy(), self.dtype)
        return np.flatnonzero(arr.reshape(-1) != 0).tolist()

    def roll_by(self, tag: str, offsets: Sequence[int] | np.ndarray | Tensor) -> Self:
        """Roll each section along ``tag`` by its own offset (roll's sign convention).

        Sections are the positions of the other axes in row-major order; ``offsets``
        holds one int per section (host data, or a rank-1 integer tensor: a traced
        input under compile)."""
        if isinstance(offsets, Tensor):
            return result(self, self.axis_tags, _section_shift(self, tag, offsets, True, 0.0))
        idx = _section_index(self, tag, offsets, circular=True)
        node = emit("gather_flat", (self._node,), index=idx, shape=self._node.shape)
        return result(self, self.axis_tags, node)

    def shift_by(self, tag: str, offsets: Sequence[int] | np.ndarray | Tensor,
                 fill: float = 0.0) -> Self:
        """Non-circular per-section shift along ``tag``; shifted-in positions hold ``fill``
        (offsets as :meth:`roll_by`)."""
        fill = real_arg(fill, "fill")
        if isinstance(offsets, Tensor):
            return result(self, self.axis_tags, _section_shift(self, tag, offsets, False, fill))
        idx = _section_index(self, tag, offsets, circular=False)
        node = emit("gather_flat", (self._node,), index=idx, shape=self._node.shape,
                    has_fill=True, fill=fill)
        return result(self, self.axis_tags, node)

    def zero_pad2d(self, h_tag: str, w_tag: str, padding: int | Sequence[int]) -> Self:
        """nn.ZeroPad2d over named axes: (left, right, top, bottom); negatives crop."""
        T.index(self.axis_tags, h_tag)
        T.index(self.axis_tags, w_tag)
        return _pad2d(self, h_tag, w_tag, padding, 0.0)

    def constant_pad2d(self, h_tag: str, w_tag: str, padding: int | Sequence[int],
                       fill: float) -> Self:
        """nn.ConstantPad2d over named axes: (left, right, top, bottom); negatives crop."""
        T.index(self.axis_tags, h_tag)
        T.index(self.axis_tags, w_tag)
        return _pad2d(self, h_tag, w_tag, padding, fill)

    def diag(self, out_tags: Sequence[str]) -> Self:
        """Embed a rank-1 tensor as the diagonal of an [n, n] matrix tagged ``out_tags``."""
        out = T.normalize_tags(out_tags)
        if self.tag_count != 1 or len(out) != 2:
            raise TagError(f"diag maps a rank-1 tensor to two tags, got {self.axis_tags} -> {out}")
        n = self.shape[0]
        v = emit("view", (self._node,), shape=(n, n), coeffs=((1,), (0,)), base=(0,))
        return result(self, out, _keep_diagonal(v, _eye_mask(n), self.dtype))

    def diag_embed(self, vec_tag: str, out_tags: Sequence[str]) -> Self:
        """Batched diag: with ``out_tags = (row_tag, col_tag)``, ``vec_tag`` becomes
        ``row_tag`` in place and ``col_tag`` is appended last."""
        pair = T.normalize_tags(out_tags)
        if len(pair) != 2:
            raise TagError(f"diag_embed needs two out_tags (row, col), got {pair}")
        row, col = pair
        renamed = T.replace_tag(self.axis_tags, vec_tag, row)
        out = T.check_tags(renamed + (col,))
        n = self.dim(vec_tag)
        sizes = dict(zip(renamed, self.shape), **{col: n})
        shape = tuple(sizes[t] for t in out)
        v = emit("view", (self._node,), shape=shape, base=(0,) * len(renamed),
                 coeffs=tuple(tuple(int(t == u) for u in renamed) for t in out))
        eye = emit("view", (_eye_mask(n),), shape=shape,
                   coeffs=tuple((int(t == row), int(t == col)) for t in out), base=(0, 0))
        return result(self, out, _keep_diagonal(v, eye, self.dtype))

    def trace(self, tag_a: str, tag_b: str) -> Self:
        """Sum of the (tag_a, tag_b) diagonal; both tags removed."""
        tmp = "_trace_diag"
        while tmp in self.axis_tags:
            tmp += "_"
        return reduce_tags(diagonal_view(self, tag_a, tag_b, tmp), (tmp,), "sum")


class BlockRows(Tensor):
    """Row access on block-quantized tensors."""

    __slots__ = ()

    def get_rows(self, tag: str, indices: Sequence[int] | np.ndarray | Tensor, out_tag: str,
                 ) -> F32Tensor:
        """Gather rows ``indices`` (host ints or a rank-1 integer tensor) of a rank-2
        block-quantized tensor and dequantize them to f32."""
        i = T.index(self.axis_tags, tag)
        if self.tag_count != 2 or i != 0:
            raise TagError("get_rows gathers along the row (first) axis of a rank-2 tensor")
        out = T.replace_tag(self.axis_tags, tag, out_tag)
        idx = index_input(self, indices, self._node.shape[i], tag)
        rows = _rows_node("gather", (self._node,), idx, i)
        return result(self, out, emit("dequantize", (rows,), src=self.dtype), DType.f32)
