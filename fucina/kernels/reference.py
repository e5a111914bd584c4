"""Reference kernels: every compute primitive over numpy arrays.

Each kernel takes the op's attributes and its inputs as numpy arrays in
logical shape (any strides) and returns the result array. They are the
always-correct lowering every primitive has; generated kernels replace them
where speed matters. Inputs arrive already validated (indices in range,
shapes consistent): nothing here trusts unchecked user data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import DType
from . import gemm
from .cast import bf16_to_f32, cast_array, f32_to_bf16
from .elementwise import BINARY, COMPARE, SCALAR, UNARY

Kernel = Callable[[dict[str, Any], list[np.ndarray], DType], np.ndarray]
KERNELS: dict[str, Kernel] = {}


def kernel(name: str) -> Callable[[Kernel], Kernel]:
    """Register a reference kernel for primitive ``name``."""

    def deco(fn: Kernel) -> Kernel:
        KERNELS[name] = fn
        return fn

    return deco


@kernel("copy")
def copy(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Contiguous copy."""
    return np.array(ins[0], copy=True, order="C")


@kernel("cast")
def cast(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """dtype conversion by the casting table."""
    return cast_array(ins[0], attrs["src"].value, out.value)


@kernel("binary")
def binary(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Same-shape elementwise binary op. An integer division's divisor was checked
    before this runs (``ir/checks``: eager's op and a program's check step)."""
    with np.errstate(all="ignore"):
        return BINARY[attrs["fn"]].numpy(ins[0], ins[1])


@kernel("compare")
def compare(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Elementwise comparison against a tensor or a scalar."""
    other = ins[1] if len(ins) > 1 else attrs["value"]
    with np.errstate(all="ignore"):
        return COMPARE[attrs["fn"]].numpy(ins[0], other)


@kernel("unary")
def unary(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Elementwise unary op (with optional parameters)."""
    with np.errstate(all="ignore"):
        return UNARY[attrs["fn"]].numpy(ins[0], *attrs.get("params", ()))


@kernel("scalar")
def scalar(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Elementwise op with a scalar operand: x (fn) value, in x's dtype."""
    a = ins[0]
    v = np.asarray(attrs["value"]).astype(a.dtype)
    with np.errstate(all="ignore"):
        return SCALAR[attrs["fn"]].numpy(a, v)


@kernel("where")
def where(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """cond ? a : b."""
    return np.where(ins[0], ins[1], ins[2])


@kernel("reduce")
def reduce(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """sum/mean/max/min/prod over axes, accumulating in the result dtype."""
    a, axes, fn = ins[0], tuple(attrs["axes"]), attrs["fn"]
    acc = out.storage
    with np.errstate(all="ignore"):
        if fn == "sum":
            r = np.sum(a, axis=axes, dtype=acc)
        elif fn == "mean":
            r = np.sum(a, axis=axes, dtype=acc)
            count = 1
            for ax in axes:
                count *= a.shape[ax]
            r = r / acc.type(count)
        elif fn == "max":
            r = np.max(a, axis=axes)
        elif fn == "min":
            r = np.min(a, axis=axes)
        elif fn == "prod":
            r = np.prod(a, axis=axes, dtype=acc)
        else:
            raise KeyError(fn)
    return np.asarray(r, dtype=acc)


@kernel("scan")
def scan(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Inclusive cumsum/cumprod along ``axis``, serial in sequence order.

    ``reverse`` scans from the end (a suffix sum: cumsum's adjoint).
    """
    a, axis = ins[0], attrs["axis"]
    acc = out.storage
    if attrs.get("reverse"):
        a = np.flip(a, axis)
    with np.errstate(all="ignore"):
        if attrs["fn"] == "cumsum":
            r = np.cumsum(a, axis=axis, dtype=acc)
        elif attrs["fn"] == "cumprod":
            r = np.cumprod(a, axis=axis, dtype=acc)
        else:
            raise KeyError(attrs["fn"])
    if attrs.get("reverse"):
        r = np.flip(r, axis)
    return np.ascontiguousarray(r)


@kernel("argmax")
def argmax(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """First index of the maximum along ``axis``; NaN never wins (an all-NaN lane gives 0)."""
    a, axis = ins[0], attrs["axis"]
    if a.dtype.kind != "f":
        return np.argmax(a, axis=axis).astype(np.int64)
    # The first element equal to the lane's non-NaN maximum: with NaN read as -inf,
    # np.argmax would pick a NaN ahead of a -inf maximum ([nan, -inf] gives 0, not 1).
    # An all-NaN lane matches nowhere, and argmax of all-False is 0.
    top = np.max(np.where(np.isnan(a), a.dtype.type(-np.inf), a), axis=axis, keepdims=True)
    return np.argmax(a == top, axis=axis).astype(np.int64)


@kernel("contract")
def contract(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Two-operand contraction over labelled axes: BLAS GEMM, f32/f64 accumulation."""
    la, lb, lo = attrs["labels"]
    acc = np.dtype(np.float64 if out is DType.f64 else np.float32)
    return gemm.contract(ins[0], ins[1], tuple(la), tuple(lb), tuple(lo), acc)


def _axis_first(a: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(a, axis, 0)


@kernel("gather")
def gather(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Select positions ``index`` (attribute, or the i64 second input) along ``axis``."""
    index = ins[1].reshape(-1) if len(ins) > 1 else attrs["index"]
    return np.take(ins[0], index, axis=attrs["axis"])


@kernel("scatter_axis_add")
def scatter_axis_add(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Zeros of length ``dim`` along ``axis`` with rows of the input added at ``index``."""
    g, axis = ins[0], attrs["axis"]
    index = ins[1].reshape(-1) if len(ins) > 1 else attrs["index"]
    shape = list(g.shape)
    shape[axis] = attrs["dim"]
    res = np.zeros(shape, dtype=g.dtype)
    np.add.at(_axis_first(res, axis), index, _axis_first(g, axis))
    return res


@kernel("index_add")
def index_add(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """base with update rows added at ``index`` (attribute, or the i64 third input;
    duplicates accumulate)."""
    index = ins[2].reshape(-1) if len(ins) > 2 else attrs["index"]
    res = np.array(ins[0], copy=True)
    np.add.at(_axis_first(res, attrs["axis"]), index, _axis_first(ins[1], attrs["axis"]))
    return res


@kernel("set_index")
def set_index(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """base with rows at ``index`` (attribute, or the i64 third input) overwritten by
    update."""
    index = ins[2].reshape(-1) if len(ins) > 2 else attrs["index"]
    res = np.array(ins[0], copy=True)
    _axis_first(res, attrs["axis"])[index] = _axis_first(ins[1], attrs["axis"])
    return res


@kernel("concat")
def concat(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Join along ``axis``."""
    return np.concatenate(ins, axis=attrs["axis"])


def _fill_value(value: Any, out: DType) -> Any:
    if out is DType.bf16:
        return f32_to_bf16(np.asarray([value], dtype=np.float32))[0]
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(out.storage)


@kernel("pad")
def pad(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Grow ``axis`` by ``before``/``after`` positions holding ``value``."""
    a = ins[0]
    widths = [(0, 0)] * a.ndim
    widths[attrs["axis"]] = (attrs["before"], attrs["after"])
    return np.pad(a, widths, mode="constant", constant_values=_fill_value(attrs["value"], out))


def _full_index(idx: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    grids: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    return tuple(grids)


@kernel("take_along")
def take_along(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """out[..i..] = x[..idx[..i..]..] along ``axis`` (torch.gather)."""
    x, idx = ins
    return x[_full_index(idx, attrs["axis"])]


@kernel("scatter_add")
def scatter_add(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """base with src added at idx along ``axis`` (torch.scatter_add)."""
    base, idx, src = ins
    res = np.array(base, copy=True)
    np.add.at(res, _full_index(idx, attrs["axis"]), src[tuple(slice(0, d) for d in idx.shape)])
    return res


@kernel("scatter")
def scatter(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """base with src written at idx along ``axis`` (torch.scatter)."""
    base, idx, src = ins
    res = np.array(base, copy=True)
    res[_full_index(idx, attrs["axis"])] = src[tuple(slice(0, d) for d in idx.shape)]
    return res


@kernel("gather_flat")
def gather_flat(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """out.flat[i] = x.flat[index[i]], or ``fill`` where index[i] < 0."""
    src = np.ascontiguousarray(ins[0]).reshape(-1)
    index = attrs["index"]
    res = src[np.maximum(index, 0)]
    if attrs.get("has_fill"):
        res = np.where(index >= 0, res, _fill_value(attrs["fill"], out))
    return res.reshape(attrs["shape"])


@kernel("scatter_flat_add")
def scatter_flat_add(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Adjoint of gather_flat: zeros with g.flat[i] added at index[i] (index >= 0)."""
    g = np.ascontiguousarray(ins[0]).reshape(-1)
    index = attrs["index"]
    keep = index >= 0
    n = int(np.prod(attrs["shape"]))
    res = np.bincount(index[keep], weights=g[keep].astype(np.float64), minlength=n)
    return res.astype(g.dtype).reshape(attrs["shape"])


@kernel("embed_view")
def embed_view(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Adjoint of an affine view: zeros(in_shape) with g added at the viewed positions.

    Positions the view reads more than once (broadcast axes, overlapping
    windows) receive the sum of their gradients.
    """
    g = ins[0]
    coeffs, base = attrs["coeffs"], attrs["base"]
    # Broadcast axes (no input axis) read one element many times: sum them first.
    bcast = tuple(k for k, row in enumerate(coeffs) if not any(row))
    if bcast:
        g = g.sum(axis=bcast, keepdims=True)
    res = np.zeros(attrs["in_shape"], dtype=g.dtype)
    item = res.itemsize
    cstr = [s // item for s in res.strides]
    shape = tuple(1 if k in bcast else d for k, d in enumerate(g.shape))
    strides = tuple(0 if k in bcast else sum(c * s for c, s in zip(row, cstr))
                    for k, row in enumerate(coeffs))
    off = sum(b * s for b, s in zip(base, cstr))
    if one_to_one(shape, strides):
        target = np.ndarray(shape, dtype=res.dtype, buffer=res, offset=off * item,
                            strides=tuple(s * item for s in strides))
        target += g
        return res
    # Overlapping windows (conv-style views): accumulate, in f64 like scatter_flat_add.
    flat = np.full(shape, off, dtype=np.int64)
    for k, (d, s) in enumerate(zip(shape, strides)):
        if d > 1 and s:
            axis_shape = [1] * len(shape)
            axis_shape[k] = d
            flat = flat + (np.arange(d, dtype=np.int64) * s).reshape(axis_shape)
    summed = np.bincount(flat.reshape(-1), weights=g.reshape(-1).astype(np.float64),
                         minlength=res.size)
    return summed.astype(res.dtype).reshape(res.shape)


def one_to_one(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether distinct positions of a strided layout address distinct elements.

    Sufficient test: sorted by stride, each axis steps past everything the
    smaller-stride axes span (how any row-major sub-view nests). A layout that
    fails it is treated as overlapping, which is exact either way.
    """
    span = 0
    for s, d in sorted((s, d) for s, d in zip(strides, shape) if d > 1):
        if s <= span:
            return False
        span += (d - 1) * s
    return True


@kernel("fill")
def fill(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """A constant-filled tensor."""
    return np.full(attrs["shape"], _fill_value(attrs["value"], out), dtype=out.storage)


@kernel("dequantize")
def dequantize(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """GGML blocks (storage shape) to f32 values (logical shape)."""
    from .quant import dequantize as decode

    return decode(ins[0], attrs["src"].value)


# bf16 is stored as raw bits: arithmetic ops decode to f32 and narrow once.
_BF16_MATH = frozenset({"binary", "unary", "scalar", "reduce", "contract", "compare",
                        "scan", "argmax"})


def run(op: str, attrs: dict[str, Any], ins: list[np.ndarray], in_dtypes: list[DType],
        out: DType, buf: np.ndarray | None = None, decided: Any = None) -> np.ndarray:
    """Run primitive ``op`` and return a result in ``out``'s storage dtype.

    ``buf`` (a flat buffer of the result's size) lets a GEMM write its f32/f64
    result in place instead of allocating; ``decided`` is a GEMM plan made at
    trace time.
    """
    # inf and NaN are defined inputs: IEEE results, never numpy floating-point warnings
    with np.errstate(all="ignore"):
        if buf is not None and op == "contract" and out in (DType.f32, DType.f64) \
                and all(dt is out for dt in in_dtypes):
            la, lb, lo = attrs["labels"]
            return gemm.contract(ins[0], ins[1], tuple(la), tuple(lb), tuple(lo), out.storage,
                                 out=buf, decided=decided)
        if op in _BF16_MATH:
            ins = [bf16_to_f32(a) if dt is DType.bf16 else a for a, dt in zip(ins, in_dtypes)]
        res = KERNELS[op](attrs, ins, out)
        if out is DType.bf16 and op in _BF16_MATH:
            return f32_to_bf16(np.asarray(res, dtype=np.float32))
        return np.asarray(res, dtype=out.storage)
