"""The ``Tensor(spec)`` type constructor and what every tensor instance shares.

``fucina.Tensor`` is a class; calling it with a spec returns a cached
subclass whose axis tags and dtype are class attributes. Instances hold one
IR node (value + graph link) and the ExecContext they belong to. Methods are
pooled here and in the sibling modules and assembled per dtype branch by
``branches.py``, so a branch has exactly its method set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import tags as T
from ..dtypes import DType, as_dtype
from ..errors import (
    ContextMismatch,
    Deinitialized,
    InvalidDataLength,
    InvalidShape,
    MutableDataRequiresNoGrad,
    ShapeMismatch,
    TagError,
    UnsupportedView,
)
from ..ir.execute import emit
from ..ir.graph import Node
from ..runtime.context import ExecContext

#: name -> function/descriptor; branches pick their methods from here.
POOL: dict[str, Any] = {}


def method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add an instance method to the pool under its own name."""
    POOL[fn.__name__] = fn
    return fn


def classmethod_(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add a class method (constructors, axis/has_tag) to the pool."""
    POOL[fn.__name__] = classmethod(fn)
    return fn


class _TensorMeta(type):
    """Calling ``Tensor(spec)`` builds (or fetches) a concrete tensor type."""

    def __call__(cls, *spec: Any, tags: Any = None, dtype: Any = None, rank: Any = None) -> Any:
        if cls.axis_tags is not None:
            raise TypeError(
                f"{cls.__name__} is a tensor type; build tensors with its constructors "
                f"(from_slice, zeros, ...), not by calling it")
        return tensor_type(*spec, tags=tags, dtype=dtype, rank=rank)

    def __repr__(cls) -> str:
        if cls.axis_tags is None:
            return "fucina.Tensor"
        inner = ", ".join(repr(t) for t in cls.axis_tags)
        if cls.dtype is not DType.f32:
            inner = f"{inner}, dtype={cls.dtype.value!r}" if inner else f"dtype={cls.dtype.value!r}"
        return f"fucina.Tensor({inner})"


class Tensor(metaclass=_TensorMeta):
    """A named-axis tensor. ``Tensor(spec)`` returns the type for ``spec``.

    Spec forms: tag names (``Tensor("batch", "in")`` or a tuple), a rank
    (``Tensor(2)`` -> tags ``_0, _1``), keywords ``tags=``/``rank=`` with
    ``dtype=``, or nothing (an f32 scalar).
    """

    axis_tags: tuple[str, ...] | None = None
    tag_count: int | None = None
    tensor_rank: int | None = None
    dtype: DType | None = None

    __slots__ = ("_node_", "_ctx", "_scoped", "__weakref__")

    # -- plumbing shared by every op ------------------------------------------

    @property
    def _node(self) -> Node:
        node = self._node_
        if node is None or self._ctx.closed:
            raise Deinitialized(f"{type(self)!r} tensor was deinit'ed, released by its scope, "
                                "or its ExecContext was deinit'ed")
        return node

    @classmethod
    def _from_node(cls, node: Node, ctx: ExecContext, *, op_result: bool = False) -> Any:
        """Wrap an IR node as an instance of this type (tracing and compiled results)."""
        return new(cls, node, ctx, op_result=op_result)

    def __repr__(self) -> str:
        node = self._node_
        if node is None:
            return f"<{type(self)!r} (deinit'ed)>"
        dims = ", ".join(f"{t}={d}" for t, d in zip(self.axis_tags, node.shape)) or "scalar"
        head = f"{type(self)!r} [{dims}]"
        raw = node.value
        if raw.is_symbolic:
            return f"<{head} traced>"
        if raw.numel > 64 or raw.dtype.is_block:
            return f"<{head}>"
        import numpy as np

        vals = np.array2string(self.numpy(), separator=", ", prefix="  ")
        grad = ", requires_grad" if node.requires_grad else ""
        return f"<{head}{grad}\n  {vals}>"


_TYPES: dict[tuple[DType, tuple[str, ...]], type] = {}


def tensor_type(*spec: Any, tags: Any = None, dtype: Any = None, rank: Any = None) -> type:
    """Normalize a spec and return the cached tensor type for (dtype, tags)."""
    if spec and (tags is not None or rank is not None):
        raise TagError("give tags either positionally or as tags=/rank=, not both")
    if tags is not None and rank is not None:
        raise TagError("a tensor spec takes tags or rank, not both")
    if spec:
        if len(spec) == 1 and not isinstance(spec[0], str):
            norm = T.normalize_tags(spec[0])
        else:
            norm = T.check_tags(spec)
    elif tags is not None:
        norm = T.normalize_tags(tags)
    elif rank is not None:
        norm = T.auto_tags(rank)
    elif dtype is not None:
        raise TagError("tensor dtype specs must include tags or rank")
    else:
        norm = ()
    dt = DType.f32 if dtype is None else as_dtype(dtype)
    key = (dt, norm)
    cls = _TYPES.get(key)
    if cls is None:
        from .branches import branch_for

        base = branch_for(dt)
        name = "Tensor[" + ",".join(norm) + (f";{dt.value}" if dt is not DType.f32 else "") + "]"
        cls = _TensorMeta(name, (base,), {
            "__slots__": (),
            "axis_tags": norm,
            "tag_count": len(norm),
            "tensor_rank": T.raw_rank(len(norm)),
            "dtype": dt,
            "__module__": "fucina",
            "__qualname__": name,
        })
        _TYPES[key] = cls
    return cls


# -- helpers used by every op module -----------------------------------------


def new(cls: type, node: Node, ctx: ExecContext, *, op_result: bool = True) -> Any:
    """Instantiate ``cls`` around ``node``; op results join the open exec scope."""
    obj = object.__new__(cls)
    obj._node_ = node
    obj._ctx = ctx
    obj._scoped = False
    if op_result:
        scopes = ctx._scopes  # this thread's open exec scopes
        if scopes:
            scopes[-1].append(obj)
            obj._scoped = True
    return obj


def result(self: Any, tags: Sequence[str], node: Node, dtype: DType | None = None) -> Any:
    """Wrap an op's result node as ``Tensor(tags, dtype)`` on ``self``'s context."""
    tags = tuple(tags)
    node.tags = tags
    dt = dtype or node.dtype
    cls = _TYPES.get((dt, tags)) or tensor_type(tags=tags, dtype=dt)
    return new(cls, node, self._ctx)


def same_ctx(self: Any, *others: Any) -> None:
    """Operands of one op must share a context."""
    for o in others:
        if o._ctx is not self._ctx:
            raise ContextMismatch("operands belong to different ExecContexts")


def check_tensor(x: Any, what: str = "operand") -> Any:
    """A live fucina tensor, or TypeError naming what was passed."""
    if not isinstance(x, Tensor) or x.axis_tags is None:
        raise TypeError(f"{what} must be a fucina tensor, got {type(x).__name__}")
    x._node  # noqa: B018 - raises Deinitialized
    return x


def sizes_of(x: Any) -> dict[str, int]:
    """tag -> size for a live tensor."""
    return dict(zip(x.axis_tags, x._node.shape))


def identity_coeffs(rank: int) -> tuple[tuple[int, ...], ...]:
    """Coefficient rows of the identity view."""
    return tuple(tuple(1 if j == k else 0 for j in range(rank)) for k in range(rank))


def align_node(x: Any, target: Sequence[str], shape: Sequence[int]) -> Node:
    """View ``x`` in ``target`` tag order at ``shape``: missing or size-1 tags broadcast."""
    node = x._node
    src = x.axis_tags
    if tuple(src) == tuple(target) and tuple(node.shape) == tuple(shape):
        return node
    in_rank = len(node.shape)
    coeffs = []
    for t, d in zip(target, shape):
        row = [0] * in_rank
        j = T.find(src, t)
        if j is not None and node.shape[j] == d:
            row[j] = 1
        coeffs.append(tuple(row))
    return emit("view", (node,), shape=tuple(shape) or (1,),
                coeffs=tuple(coeffs) or ((0,) * in_rank,), base=(0,) * in_rank)


def broadcast_sizes(a: Any, b: Any, out: Sequence[str]) -> tuple[int, ...]:
    """Per-tag broadcast of two operands' sizes (equal, or one of them 1)."""
    sa, sb = sizes_of(a), sizes_of(b)
    shape = []
    for t in out:
        da, db = sa.get(t, 1), sb.get(t, 1)
        if da != db and da != 1 and db != 1:
            raise ShapeMismatch(f"tag {t!r}: sizes {da} and {db} do not broadcast")
        shape.append(max(da, db))
    return tuple(shape)


def host_indices(indices: Any, dim: int, tag: str) -> np.ndarray:
    """Validate host-side indices for an axis of size ``dim`` (no wrapping)."""
    try:
        idx = np.asarray(indices)
    except (TypeError, ValueError):
        raise InvalidDataLength(f"indices for {tag!r} must be a sequence of ints") from None
    if idx.ndim != 1:
        idx = idx.reshape(-1)
    if idx.size == 0:
        raise InvalidShape(f"no indices given for {tag!r} (zero-size tensors do not exist)")
    if idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
        if idx.dtype.kind == "f" and np.all(np.isfinite(idx)) and np.all(idx == np.floor(idx)):
            idx = idx.astype(np.int64)
        else:
            raise InvalidDataLength(f"indices for {tag!r} must be integers, got {idx.dtype}")
    idx = idx.astype(np.int64)
    bad = (idx < 0) | (idx >= dim)
    if bad.any():
        first = int(idx[np.argmax(bad)])
        from ..errors import IndexOutOfBounds

        raise IndexOutOfBounds(f"index {first} out of range for {tag!r} of size {dim}")
    return idx


# -- the shared instance surface --------------------------------------------------


@method
def deinit(self: Any) -> None:
    """Release this tensor's storage reference; any later use raises Deinitialized."""
    node = self._node
    if self._scoped:
        return  # the scope owns it: deinit is a safe no-op until the scope closes
    node.value.storage.release()
    self._node_ = None


def _release_from_scope(self: Any) -> None:
    node = self._node_
    if node is not None:
        node.value.storage.release()
        self._node_ = None


Tensor._release_from_scope = _release_from_scope  # type: ignore[attr-defined]


@method
def __enter__(self: Any) -> Any:
    self._node  # noqa: B018
    return self


@method
def __exit__(self: Any, *exc: object) -> None:
    if self._node_ is not None:
        self.deinit()


def axis(cls: Any, tag: str) -> int:
    """Axis position of ``tag`` (TagError if the type lacks it)."""
    return T.index(cls.axis_tags, tag)


def has_tag(cls: Any, tag: str) -> bool:
    """Whether the type carries ``tag``."""
    return tag in cls.axis_tags


POOL["axis"] = classmethod(axis)
POOL["has_tag"] = classmethod(has_tag)


@method
def dim(self: Any, tag: str) -> int:
    """Size of the axis tagged ``tag``."""
    return self._node.shape[T.index(self.axis_tags, tag)]


POOL["shape"] = property(lambda self: tuple(self._node.shape),
                         doc="Runtime sizes in tag order (scalars: (1,)).")


@method
def is_contiguous(self: Any) -> bool:
    """True when storage is dense row-major in logical order."""
    return self._node.value.is_contiguous()


@method
def as_raw_tensor(self: Any) -> Any:
    """The underlying raw tensor (a borrow: do not mutate or deinit it)."""
    return self._node.value


def _readable(self: Any) -> Any:
    raw = self._node.value
    if raw.is_symbolic:
        raise UnsupportedView("a traced tensor has no data until the compiled program runs")
    return raw


@method
def data_const(self: Any) -> np.ndarray:
    """Read-only 1-D numpy view of the storage in logical order."""
    flat = _readable(self).flat().view()
    flat.flags.writeable = False
    return flat


@method
def data(self: Any) -> np.ndarray:
    """Writable 1-D numpy view of the storage in logical order."""
    if self.requires_grad:
        raise MutableDataRequiresNoGrad(
            "data() on a tensor that requires grad; use data_const() or detach()")
    raw = _readable(self)
    flat = raw.flat()
    if raw.storage.readonly:
        raise UnsupportedView("storage is borrowed read-only; use data_const()")
    return flat


@method
def copy_to(self: Any, dst: np.ndarray) -> None:
    """Copy the logical elements row-major into ``dst`` (same element count)."""
    raw = _readable(self)
    if not isinstance(dst, np.ndarray):
        raise TypeError(f"copy_to needs a numpy array, got {type(dst).__name__}")
    if dst.size != raw.numel // raw.dtype.block_size:
        raise InvalidDataLength(
            f"destination holds {dst.size} elements, tensor has {raw.numel}")
    flat = dst.reshape(-1) if dst.flags.c_contiguous else None
    src = raw.array()
    if flat is None:
        dst[...] = src.reshape(dst.shape)
    else:
        flat[...] = src.reshape(-1)


@method
def numpy(self: Any) -> np.ndarray:
    """A copy of the values as a numpy array in the tensor's logical shape."""
    raw = _readable(self)
    return np.array(raw.array(), copy=True)


@method
def item(self: Any) -> Any:
    """The single element as a Python number (InvalidShape unless one element)."""
    raw = _readable(self)
    if raw.numel != 1:
        raise InvalidShape(f"item() needs a single-element tensor, shape is {raw.shape}")
    v = raw.array().reshape(-1)[0]
    if raw.dtype is DType.bf16:
        from ..kernels.cast import bf16_to_f32

        return float(bf16_to_f32(np.asarray([v], dtype=np.uint16))[0])
    return v.item()


POOL["requires_grad"] = property(lambda self: self._node.requires_grad,
                                 doc="True when the tensor participates in autograd.")


@method
def materialize(self: Any) -> Any:
    """A contiguous copy in logical order (differentiable on float branches)."""
    return result(self, self.axis_tags, emit("copy", (self._node,)))


@method
def contiguous(self: Any) -> Any:
    """Zero-copy alias when already contiguous, else ``materialize()``."""
    if self.is_contiguous():
        node = self._node
        r = len(node.shape)
        return result(self, self.axis_tags, emit(
            "view", (node,), shape=node.shape, coeffs=identity_coeffs(r), base=(0,) * r))
    return self.materialize()


def _dunder_guard(name: str) -> Callable[..., Any]:
    def guard(self: Any, other: Any) -> Any:
        raise TypeError(
            f"'{name}' is not supported: a contraction must name its tag, e.g. a.dot(b, 'k')")

    return guard


Tensor.__matmul__ = _dunder_guard("@")  # type: ignore[attr-defined]
Tensor.__rmatmul__ = _dunder_guard("@")  # type: ignore[attr-defined]
