"""The closed set of primitive ops: result shapes, dtypes and view layouts.

Every facade op records as a composition of these. View ops produce a new
layout over their input's storage (no kernel runs); compute ops produce a
fresh contiguous result whose shape and dtype ``infer`` decides. Attributes
are positional (axis numbers, shapes), never tag names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType
from ..errors import InvalidDataLength
from ..runtime.raw import RawTensor

Meta = tuple[tuple[int, ...], DType]


@dataclass(frozen=True)
class OpDef:
    """Static facts about one primitive."""

    name: str
    infer: Callable[[list[RawTensor], dict[str, Any]], Meta] | None = None
    layout: Callable[[RawTensor, dict[str, Any]], RawTensor] | None = None
    differentiable: bool = True

    @property
    def is_view(self) -> bool:
        """True when the op re-describes its input's storage."""
        return self.layout is not None


OPS: dict[str, OpDef] = {}


def _op(name: str, **kw: Any) -> None:
    OPS[name] = OpDef(name, **kw)


# -- views -------------------------------------------------------------------


def view_layout(x: RawTensor, attrs: dict[str, Any]) -> RawTensor:
    """Affine view: in_index[j] = base[j] + sum_k out_index[k] * coeffs[k][j]."""
    coeffs, base = attrs["coeffs"], attrs["base"]
    strides = tuple(sum(c * s for c, s in zip(row, x.strides)) for row in coeffs)
    offset = x.offset + sum(b * s for b, s in zip(base, x.strides))
    return x.view(tuple(attrs["shape"]), strides, offset)


def reshape_layout(x: RawTensor, attrs: dict[str, Any]) -> RawTensor:
    """Row-major reinterpretation of a contiguous input."""
    from ..runtime.raw import contiguous_strides

    shape = tuple(attrs["shape"])
    return x.view(shape, contiguous_strides(shape), x.offset)


def strided_layout(x: RawTensor, attrs: dict[str, Any]) -> RawTensor:
    """Raw shape/strides/offset relative to the input's first element.

    The view may reach any element of the storage, so its extent is checked
    against the storage size: at once when the size is known (a real buffer or
    a traced intermediate), else recorded on a traced input's storage and
    checked by the program when the argument is bound.
    """
    shape, strides = tuple(attrs["shape"]), tuple(attrs["strides"])
    offset = x.offset + attrs["offset"]
    need = offset + sum((d - 1) * s for d, s in zip(shape, strides)) + 1
    st = x.storage
    size = st.buf.size if st.buf is not None else getattr(st, "size", None)
    if size is None:
        st.need = max(st.need, need)  # type: ignore[attr-defined]
    elif need > size:
        raise InvalidDataLength(extent_message(need - 1, size))
    return x.view(shape, strides, offset)


def extent_message(last: int, size: int) -> str:
    """The error text of a strided view that reaches past its storage."""
    return f"view_with_strides: the view reaches element {last}, storage holds {size}"


def merge_layout(x: RawTensor, attrs: dict[str, Any]) -> RawTensor:
    """Fold axes [start, start+count) into one; the caller checked they collapse."""
    a, n = attrs["start"], attrs["count"]
    dims = x.shape[a:a + n]
    live = [s for d, s in zip(dims, x.strides[a:a + n]) if d != 1]
    shape = x.shape[:a] + (math.prod(dims),) + x.shape[a + n:]
    strides = x.strides[:a] + ((live[-1] if live else 1),) + x.strides[a + n:]
    return x.view(shape, strides, x.offset)


_op("view", layout=view_layout)
_op("merge", layout=merge_layout)
_op("reshape", layout=reshape_layout)
_op("strided", layout=strided_layout)


# -- compute -----------------------------------------------------------------


def _same(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[0].shape, ins[0].dtype


def _cast(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[0].shape, attrs["dtype"]


def _bool_out(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[0].shape, DType.bool


def _binary(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    a, b = ins
    assert a.shape == b.shape, (a.shape, b.shape)
    if attrs["fn"] in ("logical_and", "logical_or", "logical_xor"):
        return a.shape, DType.bool
    return a.shape, a.dtype


def _unary(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    from ..kernels.elementwise import UNARY

    if UNARY[attrs["fn"]].out_bool:
        return ins[0].shape, DType.bool
    return ins[0].shape, ins[0].dtype


def _argmax(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    axis = attrs["axis"]
    shape = tuple(d for i, d in enumerate(ins[0].shape) if i != axis) or (1,)
    return shape, DType.i64


def _where(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[1].shape, ins[1].dtype


def _reduce(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    axes = attrs["axes"]
    shape = tuple(d for i, d in enumerate(ins[0].shape) if i not in axes) or (1,)
    return shape, attrs["dtype"]


def _contract(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return tuple(attrs["shape"]), attrs["dtype"]


def _with_axis_len(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    # The positions come from the attributes or, as a traced value, a rank-1 i64 input.
    shape = list(ins[0].shape)
    shape[attrs["axis"]] = ins[1].shape[0] if len(ins) > 1 else len(attrs["index"])
    return tuple(shape), ins[0].dtype


def _scatter_axis(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    shape = list(ins[0].shape)
    shape[attrs["axis"]] = attrs["dim"]
    return tuple(shape), ins[0].dtype


def _concat(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    axis = attrs["axis"]
    shape = list(ins[0].shape)
    shape[axis] = sum(x.shape[axis] for x in ins)
    return tuple(shape), ins[0].dtype


def _pad(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    shape = list(ins[0].shape)
    shape[attrs["axis"]] += attrs["before"] + attrs["after"]
    return tuple(shape), ins[0].dtype


def _given_shape(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return tuple(attrs["shape"]), (attrs.get("dtype") or ins[0].dtype)


def _embed(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return tuple(attrs["in_shape"]), ins[0].dtype


def _fill(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return tuple(attrs["shape"]), attrs["dtype"]


_op("input", differentiable=False)  # a traced function's argument (no kernel)
_op("copy", infer=_same)
_op("cast", infer=_cast)
_op("binary", infer=_binary)
_op("compare", infer=_bool_out, differentiable=False)
_op("unary", infer=_unary)
_op("scalar", infer=_same)
_op("where", infer=_where)
_op("reduce", infer=_reduce)
_op("scan", infer=_same)  # inclusive cumsum/cumprod along ``axis`` (``reverse``: suffix scan)
_op("argmax", infer=_argmax, differentiable=False)
_op("contract", infer=_contract)
_op("gather", infer=_with_axis_len)  # positions: attrs["index"] or input 1 (i64, rank 1)
_op("scatter_axis_add", infer=_scatter_axis)  # gather's adjoint, positions the same way
_op("index_add", infer=_same)
_op("set_index", infer=_same)
_op("concat", infer=_concat)
_op("pad", infer=_pad)
_op("take_along", infer=_given_shape)
_op("scatter_add", infer=_same)
_op("scatter", infer=_same)
_op("gather_flat", infer=_given_shape)
_op("scatter_flat_add", infer=_given_shape)
_op("embed_view", infer=_embed)
_op("fill", infer=_fill, differentiable=False)
_op("dequantize", infer=lambda ins, attrs: (ins[0].shape, DType.f32), differentiable=False)
