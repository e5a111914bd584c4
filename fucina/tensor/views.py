"""Zero-copy views: re-describe storage with new tags, shape and strides.

Every view records as the ``view`` primitive (an affine map from result
indices to input indices), ``reshape`` (contiguous reinterpretation),
``merge`` folded into ``strided`` when layouts collapse, or ``strided``
(the audited escape hatch). Their gradients come from those primitives.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tags as T
from ..argnames import bad_argument
from ..errors import (
    IndexOutOfBounds,
    InvalidDataLength,
    InvalidShape,
    ShapeMismatch,
    TagError,
    UnsupportedGradient,
    UnsupportedView,
)
from ..ir.execute import current_tracer, emit
from ..ir.graph import Node
from ..runtime.raw import contiguous_strides
from .arguments import int_arg, int_seq_arg, optional_int_arg, sizes_arg
from .base import Tensor, align_node, identity_view, result, sizes_of

if TYPE_CHECKING:
    from typing_extensions import Self


def affine(x: Any, shape: tuple[int, ...], coeffs: list[list[int]], base: list[int]) -> Node:
    """Emit a view node: in_index[j] = base[j] + sum_k out[k] * coeffs[k][j]."""
    node = x._node
    if not shape:  # scalar result: rank-1 [1], reading the base element
        shape, coeffs = (1,), [[0] * len(node.shape)]
    return emit("view", (node,), shape=tuple(shape), coeffs=tuple(tuple(r) for r in coeffs),
                base=tuple(base))


def _unit(rank: int, j: int, c: int = 1) -> list[int]:
    row = [0] * rank
    row[j] = c
    return row


def _raw_axes(x: Any) -> int:
    return len(x._node.shape)


def _spec(args: tuple[Any, ...]) -> tuple[str, ...]:
    if len(args) == 1 and not isinstance(args[0], str):
        return T.normalize_tags(args[0])
    return T.check_tags(args)


def with_axis(x: Any, tag: str, axis_index: int) -> Any:
    """``x`` with a new size-1 axis ``tag`` at ``axis_index`` (a view)."""
    out = T.insert_tag(x.axis_tags, tag, int_arg(axis_index, "axis_index"))
    sizes = dict(sizes_of(x), **{tag: 1})
    return result(x, out, align_node(x, out, tuple(sizes[t] for t in out)))


def diagonal_view(x: Any, tag_a: str, tag_b: str, out_tag: str) -> Any:
    """The (tag_a, tag_b) main diagonal of ``x``, appended last as ``out_tag`` (a view)."""
    ia, ib = T.index(x.axis_tags, tag_a), T.index(x.axis_tags, tag_b)
    if ia == ib:
        raise TagError(f"diagonal needs two different tags, got {tag_a!r} twice")
    kept = T.remove_tags(x.axis_tags, (tag_a, tag_b))
    out = T.check_tags(kept + (T.check_tag(out_tag),))
    r = _raw_axes(x)
    node = x._node
    shape = [node.shape[k] for k in range(r) if k not in (ia, ib)]
    coeffs = [_unit(r, k) for k in range(r) if k not in (ia, ib)]
    row = [0] * r
    row[ia] = row[ib] = 1
    shape.append(min(node.shape[ia], node.shape[ib]))
    coeffs.append(row)
    return result(x, out, affine(x, tuple(shape), coeffs, [0] * r))


def narrow_node(self: Any, i: int, start: int, length: int, step: int = 1) -> Node:
    """A window of axis ``i``: ``length`` positions from ``start`` every ``step`` (a view)."""
    node = self._node
    r = len(node.shape)
    shape = list(node.shape)
    shape[i] = length
    coeffs = [_unit(r, k, step if k == i else 1) for k in range(r)]
    base = [start if k == i else 0 for k in range(r)]
    return affine(self, tuple(shape), coeffs, base)


class SliceRange:
    """A per-tag range for ``slice``: start/end/step, each optional (torch bounds)."""

    __slots__ = ("start", "end", "step")

    def __init__(self, start: int | None = None, end: int | None = None,
                 step: int | None = None):
        self.start, self.end, self.step = start, end, step

    def __repr__(self) -> str:
        return f"SliceRange(start={self.start}, end={self.end}, step={self.step})"


def _flat_index(shape: tuple[int, ...], strides: tuple[int, ...], numel: int) -> np.ndarray:
    """Source flat index of every element of a strided view over a contiguous source."""
    addr = np.zeros(shape, dtype=np.int64)
    for k, (d, s) in enumerate(zip(shape, strides)):
        shp = [1] * len(shape)
        shp[k] = d
        addr = addr + (np.arange(d, dtype=np.int64) * s).reshape(shp)
    addr = addr.reshape(-1)
    if addr.size and int(addr.max()) >= numel:
        raise UnsupportedGradient(
            "this strided view reads storage outside its source tensor; gradients cannot "
            "flow through it")
    return addr


class Retag(Tensor):
    """Renaming axes (every branch)."""

    __slots__ = ()

    def with_tags(self, *new_tags: str | Sequence[str]) -> Self:
        """Rename every axis (same rank, same dtype), sharing storage:
        ``x.with_tags("row", "col")`` or ``x.with_tags(("row", "col"))``."""
        new = _spec(new_tags)
        if len(new) != self.tag_count:
            raise TagError(f"with_tags needs {self.tag_count} tags, got {new!r}")
        return result(self, new, identity_view(self))


class AxisViews(Tensor):
    """Zero-copy axis views (every scalar-dtype branch): permutation, size-1 axes,
    broadcasting, narrowing."""

    __slots__ = ()

    def align_to(self, *target: str | Sequence[str]) -> Self:
        """Permute to ``target`` order, inserting missing tags as size-1 axes."""
        tgt = _spec(target)
        T.align_axes(self.axis_tags, tgt)
        sizes = sizes_of(self)
        shape = tuple(sizes.get(t, 1) for t in tgt)
        return result(self, tgt, align_node(self, tgt, shape))

    def permute_to(self, *target: str | Sequence[str]) -> Self:
        """Pure permutation to ``target`` (the same tag set)."""
        tgt = _spec(target)
        T.check_same_set(self.axis_tags, tgt)
        sizes = sizes_of(self)
        node = align_node(self, tgt, tuple(sizes[t] for t in tgt))
        if node is self._node:
            node = identity_view(self)
        return result(self, tgt, node)

    def transpose(self, *target: str | Sequence[str]) -> Self:
        """Alias of :meth:`permute_to`."""
        return self.permute_to(*target)

    def insert_axis(self, tag: str, axis_index: int) -> Self:
        """A new size-1 axis ``tag`` at position ``axis_index``."""
        return with_axis(self, tag, axis_index)

    def squeeze(self, tag: str) -> Self:
        """Drop the size-1 axis ``tag``."""
        i = T.index(self.axis_tags, tag)
        if self._node.shape[i] != 1:
            raise InvalidShape(f"squeeze: axis {tag!r} has size {self._node.shape[i]}, not 1")
        out = T.remove_tags(self.axis_tags, (tag,))
        r = _raw_axes(self)
        shape = [d for k, d in enumerate(self._node.shape) if k != i]
        coeffs = [_unit(r, k) for k in range(r) if k != i]
        return result(self, out, affine(self, tuple(shape), coeffs, [0] * r))

    def broadcast_to(self, target: Sequence[str], shape: Sequence[int]) -> Self:
        """Stride-0 view over ``target`` tags at ``shape`` (missing or size-1 tags stretch)."""
        tgt = T.normalize_tags(target)
        T.align_axes(self.axis_tags, tgt)
        shp = sizes_arg(shape, "shape", len(tgt))
        sizes = sizes_of(self)
        for t, d in zip(tgt, shp):
            if t in sizes and sizes[t] not in (1, d):
                raise ShapeMismatch(f"broadcast_to: tag {t!r} has size {sizes[t]}, target {d}")
        return result(self, tgt, align_node(self, tgt, shp))

    def narrow(self, tag: str, start: int, length: int) -> Self:
        """Zero-copy window [start, start+length) along ``tag``."""
        i = T.index(self.axis_tags, tag)
        start, length = int_arg(start, "start"), int_arg(length, "length")
        dim = self._node.shape[i]
        if length <= 0:
            raise InvalidShape(f"narrow: length {length} along {tag!r} must be positive")
        if start < 0 or start + length > dim:
            raise IndexOutOfBounds(
                f"narrow: [{start}, {start + length}) out of range for {tag!r} of size {dim}")
        return result(self, self.axis_tags, narrow_node(self, i, start, length))


class SplitMerge(Tensor):
    """Factoring and fusing axes, strided windows (float branches)."""

    __slots__ = ()

    def split(self, tag: str, parts: Sequence[str], sizes: Sequence[int]) -> Self:
        """Factor axis ``tag`` into ``parts`` of ``sizes`` (zero-copy on any layout)."""
        new_tags = T.normalize_tags(parts)
        out = T.split_tags(self.axis_tags, tag, new_tags)
        sizes = sizes_arg(sizes, "sizes", len(new_tags))
        i = T.index(self.axis_tags, tag)
        dim = self._node.shape[i]
        if math.prod(sizes) != dim:
            raise InvalidShape(f"split: sizes {sizes} multiply to {math.prod(sizes)}, "
                               f"axis {tag!r} has size {dim}")
        r = _raw_axes(self)
        shape: list[int] = []
        coeffs: list[list[int]] = []
        for k in range(r):
            if k == i:
                inner = contiguous_strides(sizes)
                for s, c in zip(sizes, inner):
                    shape.append(s)
                    coeffs.append(_unit(r, i, c))
            else:
                shape.append(self._node.shape[k])
                coeffs.append(_unit(r, k))
        return result(self, out, affine(self, tuple(shape), coeffs, [0] * r))

    def merge(self, out_tag: str, merged: Sequence[str]) -> Self:
        """Fuse the adjacent axes ``merged`` into ``out_tag`` (stride-compatible layouts only)."""
        fused = T.normalize_tags(merged)
        out = T.merge_tags(self.axis_tags, out_tag, fused)
        start = T.merge_start(self.axis_tags, fused)
        node = self._node
        raw = node.value
        dims = node.shape[start:start + len(fused)]
        strides = raw.strides[start:start + len(fused)]
        live = [(d, s) for d, s in zip(dims, strides) if d != 1]
        for (_, s0), (d1, s1) in zip(live, live[1:]):
            if s0 != d1 * s1:
                raise UnsupportedView(
                    f"merge of {fused} needs stride-compatible axes; this layout (strides "
                    f"{strides}) cannot collapse: materialize() first")
        return result(self, out, emit("merge", (node,), start=start, count=len(fused)))

    def slice_step(self, tag: str, start: int, length: int, step: int) -> Self:
        """x[start::step] along ``tag``, ``length`` elements, as a strided view."""
        i = T.index(self.axis_tags, tag)
        start, length = int_arg(start, "start"), int_arg(length, "length")
        step = int_arg(step, "step")
        dim = self._node.shape[i]
        if length <= 0 or step <= 0:
            raise InvalidShape(f"slice_step: length {length} and step {step} must be positive")
        if start < 0 or start + (length - 1) * step >= dim:
            raise IndexOutOfBounds(
                f"slice_step: start {start}, {length} elements of step {step} overrun "
                f"{tag!r} of size {dim}")
        if length == 1:  # one element: the step never applies (and may not fit a stride)
            step = 1
        return result(self, self.axis_tags, narrow_node(self, i, start, length, step))


class StridedViews(Tensor):
    """Selection, basic slicing, explicit strides, diagonals and unbinding (f32)."""

    __slots__ = ()

    def select(self, tag: str, index: int) -> Self:
        """One position of ``tag`` (negative counts from the end), the axis removed."""
        i = T.index(self.axis_tags, tag)
        index = int_arg(index, "index")
        dim = self._node.shape[i]
        pos = index + dim if index < 0 else index
        if not 0 <= pos < dim:
            raise IndexOutOfBounds(f"select: index {index} out of range for {tag!r} of size {dim}")
        out = T.remove_tags(self.axis_tags, (tag,))
        r = _raw_axes(self)
        shape = [d for k, d in enumerate(self._node.shape) if k != i]
        coeffs = [_unit(r, k) for k in range(r) if k != i]
        base = [pos if k == i else 0 for k in range(r)]
        return result(self, out, affine(self, tuple(shape), coeffs, base))

    def slice(self, **ranges: builtins.slice | SliceRange) -> Self:
        """Multi-axis basic slicing, one keyword per sliced tag:
        ``x.slice(h=slice(1, -1), w=slice(None, None, 2))`` (or ``fucina.SliceRange``);
        positive steps only (compose ``flip``)."""
        node = self._node
        r = len(node.shape)
        shape = list(node.shape)
        coeffs = [_unit(r, k) for k in range(r)]
        base = [0] * r
        for tag, rng in ranges.items():
            i = T.index(self.axis_tags, tag)
            if not isinstance(rng, (builtins.slice, SliceRange)):
                raise TypeError(
                    f"slice range for {tag!r} must be a slice or SliceRange, got {rng!r}")
            if isinstance(rng, builtins.slice):
                lo, hi = rng.start, rng.stop
            else:
                lo, hi = rng.start, rng.end
            lo, hi = optional_int_arg(lo, tag), optional_int_arg(hi, tag)
            step = 1 if rng.step is None else int_arg(rng.step, tag)
            if step <= 0:
                raise InvalidShape(
                    f"slice: step {step} for {tag!r} must be positive (compose flip)")
            dim = node.shape[i]
            start, end, _ = builtins.slice(lo, hi).indices(dim)
            n = max(0, math.ceil((end - start) / step))
            if n == 0:
                raise InvalidShape(f"slice: empty range {rng!r} for {tag!r} of size {dim}")
            shape[i] = n
            # one element: the step never applies (and may not fit a stride)
            coeffs[i] = _unit(r, i, step if n > 1 else 1)
            base[i] = start
        return result(self, self.axis_tags, affine(self, tuple(shape), coeffs, base))

    def view_with_strides(self, new_tags: Sequence[str], shape: Sequence[int],
                          strides: Sequence[int]) -> Self:
        """Explicit shape + strides (elements) over this tensor's storage, bounds-checked."""
        tgt = T.normalize_tags(new_tags)
        node = self._node
        raw = node.value
        shp = sizes_arg(shape, "shape", max(len(tgt), 1))
        st = int_seq_arg(strides, "strides")
        if len(st) != len(shp):
            raise InvalidShape(f"view_with_strides: shape {shp} / strides {st} do not fit {tgt}")
        if not tgt and shp != (1,):  # a rank-0 tensor is one element, stored as shape (1,)
            raise InvalidShape(f"view_with_strides: a view with no tags holds one element, "
                               f"got shape {shp}")
        if any(s < 0 for s in st):
            raise InvalidShape(f"view_with_strides: negative strides {st}")
        if raw.dtype.block_size != 1:
            raise UnsupportedView("view_with_strides is for scalar dtypes")
        reach = sum((d - 1) * s for d, s in zip(shp, st))
        storage = None if raw.storage.buf is None else (raw.offset, raw.storage.buf.size)
        tracer = current_tracer()
        if storage is None and tracer is not None:  # a traced argument: the call's storage
            storage = tracer.storage_of(node)       # (so the error is eager's, not the grad one)
        if storage is not None and storage[0] + reach >= storage[1]:
            raise InvalidDataLength(
                f"view_with_strides: the view reaches element {storage[0] + reach}, storage "
                f"holds {storage[1]}")
        index = None
        if node.requires_grad:
            if not raw.is_contiguous():
                raise UnsupportedGradient(
                    "view_with_strides under gradients needs a contiguous source")
            index = _flat_index(shp, st, raw.numel)
        return result(self, tgt, emit("strided", (node,), shape=shp, strides=st, offset=0,
                                      grad_index=index))

    def diagonal(self, tag_a: str, tag_b: str, out_tag: str) -> Self:
        """Main diagonal of the (tag_a, tag_b) plane, appended last as ``out_tag``."""
        return diagonal_view(self, tag_a, tag_b, out_tag)

    def unbind(self, tag: str) -> list[Self]:
        """The ``dim(tag)`` slices along ``tag``, each with ``tag`` removed (views)."""
        return [self.select(tag, i) for i in range(self.dim(tag))]

    def unbind_into(self, tag: str, out: list[Any]) -> None:
        """Fill ``out`` (a list of length dim(tag)) with the slices along ``tag``."""
        n = self.dim(tag)
        if not isinstance(out, list):
            raise TypeError(bad_argument("out", out, f"a list of length {n}"))
        if len(out) != n:
            raise InvalidShape(f"unbind_into: out has {len(out)} entries, {tag!r} has size {n}")
        for i in range(n):
            out[i] = self.select(tag, i)

    def contiguous(self) -> Self:
        """Zero-copy alias when already contiguous, else :meth:`materialize`."""
        if self.is_contiguous():
            return result(self, self.axis_tags, identity_view(self))
        return self.materialize()
