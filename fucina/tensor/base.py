"""The root ``Tensor`` class, the ``Tensor(spec)`` type constructor, and what every
tensor shares.

``fucina.Tensor`` is a class; calling it with a spec returns a cached
subclass whose axis tags and dtype are class attributes. That subclass
derives from one dtype *branch* (``branches.py``), and a branch is declared
as a list of capability mixins: each mixin is an ordinary class defined in
the module of its op family (``unary.UnaryMath``, ``views.AxisViews``, ...),
deriving from :class:`Tensor` so its methods can call one another. A branch
has exactly the methods of its mixins; an op it lacks is absent.

This module holds the root class (plumbing plus the surface every branch
shares: lifetime, metadata, data access, Python and numpy interop),
:class:`ItemAccess` and the helpers every op module uses.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from .. import tags as T
from ..argnames import explain
from ..dtypes import DType, as_dtype
from ..errors import (
    ContextMismatch,
    Deinitialized,
    IndexOutOfBounds,
    InvalidDataLength,
    InvalidShape,
    MutableDataRequiresNoGrad,
    ShapeMismatch,
    TagError,
    UnsupportedView,
)
from ..ir.execute import current_tracer, emit
from ..ir.graph import Node
from ..runtime.context import SCOPES_OPEN, ExecContext
from ..runtime.raw import RawTensor
from .display import decode, tensor_repr

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import (
        BoolTensor,
        F8Tensor,
        F32Tensor,
        F64Tensor,
        HalfTensor,
        I64Tensor,
        IntTensor,
    )

    _Spec = str | int | Sequence[str]
    _Tags = Sequence[str] | None


class _TensorMeta(type):
    """Calling ``Tensor(spec)`` builds (or fetches) a concrete tensor type."""

    if TYPE_CHECKING:  # None on the root and the mixins, set on every tensor type
        axis_tags: tuple[str, ...]
        dtype: DType

    def __call__(cls, *spec: Any, tags: Any = None, dtype: Any = None, rank: Any = None) -> Any:
        if cls is not Tensor:
            if cls.axis_tags is not None:
                raise TypeError(
                    f"{cls!r} is a tensor type; build tensors with its constructors "
                    f"(from_slice, zeros, ...), not by calling it")
            raise TypeError(f"{cls.__name__} is a facade class, not a tensor type: build "
                            f"types with fucina.Tensor(spec)")
        return tensor_type(*spec, tags=tags, dtype=dtype, rank=rank)

    def __repr__(cls) -> str:
        if cls.axis_tags is None:
            return "fucina.Tensor" if cls is Tensor else type.__repr__(cls)
        inner = ", ".join(repr(t) for t in cls.axis_tags)
        if cls.dtype is not DType.f32:
            inner = f"{inner}, dtype={cls.dtype.value!r}" if inner else f"dtype={cls.dtype.value!r}"
        return f"fucina.Tensor({inner})"


class Tensor(metaclass=_TensorMeta):
    """A named-axis tensor. ``Tensor(spec)`` returns the type for ``spec``.

    Spec forms: tag names (``Tensor("batch", "in")`` or a tuple), a rank
    (``Tensor(2)`` -> tags ``_0, _1``), keywords ``tags=``/``rank=`` with
    ``dtype=``, or nothing (an f32 scalar). ``isinstance(x, fucina.Tensor)``
    holds for every tensor; ``help(fucina.Tensor("a"))`` lists a type's methods.

    The methods defined here (lifetime, metadata, data access, Python and
    numpy interop) are shared by every branch.
    """

    if TYPE_CHECKING:
        # Set on every concrete type; None only on this root and the mixin classes.
        axis_tags: tuple[str, ...]
        tag_count: int
        tensor_rank: int
        dtype: DType
    else:
        axis_tags = tag_count = tensor_rank = dtype = None

    __slots__ = ("_node_", "_ctx", "_scoped", "__weakref__")

    _node_: Node | None
    _ctx: ExecContext
    _scoped: bool

    if TYPE_CHECKING:
        # What a type checker sees for ``fucina.Tensor(spec)``: the branch class of the
        # dtype (at run time the metaclass returns a cached subclass of that branch).
        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["f32", DType.f32] | None = None,
        ) -> type[F32Tensor]: ...

        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["f16", "bf16", DType.f16, DType.bf16],
        ) -> type[HalfTensor]: ...

        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["f64", DType.f64],
        ) -> type[F64Tensor]: ...

        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["i64", DType.i64],
        ) -> type[I64Tensor]: ...

        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["u8", "u16", "i8", "i16", "i32", DType.u8, DType.u16, DType.i8,
                           DType.i16, DType.i32],
        ) -> type[IntTensor]: ...

        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["bool", DType.bool],
        ) -> type[BoolTensor]: ...

        @overload
        def __new__(  # type: ignore[misc]
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: Literal["f8_e4m3", "f8_e5m2", DType.f8_e4m3, DType.f8_e5m2],
        ) -> type[F8Tensor]: ...

        @overload
        def __new__(
            cls, *spec: _Spec, tags: _Tags = None, rank: int | None = None,
            dtype: DType | str,
        ) -> Any: ...

        def __new__(cls, *spec: Any, tags: Any = None, rank: Any = None,
                    dtype: Any = None) -> Any: ...

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

    def _release_from_scope(self) -> None:
        """Called by an ending exec scope: release the storage reference."""
        node = self._node_
        if node is not None:
            node.value.storage.release()
            self._node_ = None

    def __repr__(self) -> str:
        """numpy-style values (summarized with ``...`` when large), tags, shape, dtype
        unless f32, and ``requires_grad``."""
        return tensor_repr(self)

    def __matmul__(self, other: object) -> Any:
        """``@`` raises TypeError: a contraction names its tag (``a.dot(b, "k")``)."""
        raise TypeError("'@' is not supported: a contraction must name its tag, "
                        "e.g. a.dot(b, 'k')")

    def __rmatmul__(self, other: object) -> Any:
        """``@`` raises TypeError: a contraction names its tag."""
        raise TypeError("'@' is not supported: a contraction must name its tag, "
                        "e.g. a.dot(b, 'k')")

    #: numpy defers to the tensor for ``array + tensor`` (and raises TypeError) instead of
    #: silently turning the tensor into an array.
    __array_ufunc__ = None

    # -- lifetime ------------------------------------------------------------------

    def deinit(self) -> None:
        """Release this tensor's storage reference; any later use raises Deinitialized."""
        node = self._node
        if self._scoped:
            return  # the scope owns it: deinit is a safe no-op until the scope closes
        node.value.storage.release()
        self._node_ = None

    def __enter__(self) -> Self:
        """``with T.zeros(ctx, shape) as x:`` deinit's ``x`` when the block ends."""
        self._node  # noqa: B018 - raises Deinitialized
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the tensor (:meth:`deinit`) unless it already was."""
        if self._node_ is not None:
            self.deinit()

    # -- metadata ------------------------------------------------------------------

    @classmethod
    def axis(cls, tag: str) -> int:
        """Axis position of ``tag`` (TagError if the type lacks it)."""
        return T.index(cls.axis_tags, tag)

    @classmethod
    def has_tag(cls, tag: str) -> bool:
        """Whether the type carries ``tag`` (a str; anything else is a TagError)."""
        if not isinstance(tag, str):
            T.check_tag(tag)  # raises, naming what was passed
        return tag in cls.axis_tags

    def dim(self, tag: str) -> int:
        """Size of the axis tagged ``tag``."""
        return self._node.shape[T.index(self.axis_tags, tag)]

    @property
    def shape(self) -> tuple[int, ...]:
        """Runtime sizes in tag order (scalars: ``(1,)``)."""
        return tuple(self._node.shape)

    @property
    def ndim(self) -> int:
        """Number of axes (tags); 0 for a scalar."""
        return self.tag_count

    @property
    def size(self) -> int:
        """Number of elements (logical elements for block-quantized tensors)."""
        return self._node.value.numel

    @property
    def requires_grad(self) -> bool:
        """True when the tensor participates in autograd."""
        return self._node.requires_grad

    def is_contiguous(self) -> bool:
        """True when storage is dense row-major in logical order."""
        return self._node.value.is_contiguous()

    # -- data access ---------------------------------------------------------------

    def as_raw_tensor(self) -> RawTensor:
        """The underlying raw tensor (a borrow: do not mutate or deinit it)."""
        return self._node.value

    @property
    def value(self) -> RawTensor:
        """The reference's ``value`` field: the raw tensor ``as_raw_tensor()`` returns."""
        return self._node.value

    def data_const(self) -> np.ndarray:
        """Read-only 1-D numpy view of the storage in logical order."""
        flat = readable(self).flat().view()
        flat.flags.writeable = False
        return flat

    def data(self) -> np.ndarray:
        """Writable 1-D numpy view of the storage in logical order."""
        if self.requires_grad:
            raise MutableDataRequiresNoGrad(
                "data() on a tensor that requires grad; use data_const() or detach()")
        raw = readable(self)
        flat = raw.flat()
        if raw.storage.readonly:
            raise UnsupportedView("storage is borrowed read-only; use data_const()")
        return flat

    def copy_to(self, dst: np.ndarray) -> None:
        """Copy the logical elements row-major into ``dst`` (same element count)."""
        raw = readable(self)
        if not isinstance(dst, np.ndarray):
            raise TypeError(explain(dst, "a numpy array"))
        if dst.size != raw.numel // raw.dtype.block_size:
            raise InvalidDataLength(
                f"destination holds {dst.size} elements, tensor has {raw.numel}")
        flat = dst.reshape(-1) if dst.flags.c_contiguous else None
        src = raw.array()
        if flat is None:
            dst[...] = src.reshape(dst.shape)
        else:
            flat[...] = src.reshape(-1)

    def numpy(self) -> np.ndarray:
        """A copy of the values as a numpy array in the tensor's logical shape."""
        return np.array(readable(self).array(), copy=True)

    def materialize(self) -> Self:
        """A contiguous copy in logical order (differentiable on float branches)."""
        return result(self, self.axis_tags, emit("copy", (self._node,)))

    # -- Python and numpy interop -----------------------------------------------------

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(x)``: the values in logical shape (storage elements: bf16 and FP8
        as bits, blocks as records, like :meth:`numpy`). A read-only view when no copy
        or conversion is needed, else a copy; ``copy=False`` with a conversion raises
        ValueError, as numpy's protocol says."""
        arr = readable(self).array()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"np.asarray(copy=False) cannot convert {arr.dtype} to "
                                 f"{np.dtype(dtype)} without a copy")
            return arr.astype(dtype)
        if copy:
            return np.array(arr, copy=True)
        view = arr.view()
        view.flags.writeable = False
        return view

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """numpy functions (``np.sum(x)``, ``np.max(x, axis=1)``, ``np.concatenate([x,
        y])``) take a tensor as the array of its values, like any array-like, and return
        numpy results. (Ufuncs such as ``np.add(x, 1)`` raise TypeError: use the
        tensor's operators.)"""
        return func(*_as_arrays(args), **_as_arrays(kwargs))

    def __len__(self) -> int:
        """Size of the first axis (TypeError for a scalar, as numpy's 0-d arrays)."""
        if not self.tag_count:
            raise TypeError(f"len() of a scalar tensor {type(self)!r}")
        return self._node.shape[0]

    def _one(self, what: str) -> Any:
        v = one_value(self)
        if v is None:
            raise ValueError(
                f"{what}() needs a one-element tensor; {type(self)!r} has {self.size} "
                f"elements (use any_all()/all_all() or a reduction)")
        return v

    def __bool__(self) -> bool:
        """Truth of a one-element tensor (ValueError otherwise, as numpy)."""
        return bool(self._one("bool"))

    def __float__(self) -> float:
        """Value of a one-element tensor as a float (ValueError otherwise)."""
        return float(self._one("float"))

    def __int__(self) -> int:
        """Value of a one-element tensor as an int, truncated (ValueError otherwise)."""
        v = self._one("int")
        if isinstance(v, float) and not np.isfinite(v):
            raise ValueError(f"int() of a non-finite value {v}")
        return int(v)


_TYPES: dict[tuple[DType, tuple[str, ...]], type] = {}


def tensor_type(*spec: Any, tags: Any = None, dtype: Any = None, rank: Any = None) -> Any:
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
            "__doc__": base.__doc__,
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
    obj: Any = object.__new__(cls)
    obj._node_ = node
    obj._ctx = ctx
    obj._scoped = False
    if op_result and SCOPES_OPEN[0]:  # (no scope open anywhere: nothing to join)
        scopes = ctx._scopes  # this thread's open exec scopes
        if scopes:
            scopes[-1].append(obj)
            obj._scoped = True
    return obj


def result(self: Tensor, tags: Sequence[str], node: Node, dtype: DType | None = None) -> Any:
    """Wrap an op's result node as ``Tensor(tags, dtype)`` on ``self``'s context."""
    tags = tuple(tags)
    node.tags = tags
    dt = dtype or node.dtype
    cls = _TYPES.get((dt, tags)) or tensor_type(tags=tags, dtype=dt)
    return new(cls, node, self._ctx)


def same_ctx(self: Tensor, *others: Tensor) -> None:
    """Operands of one op must share a context."""
    for o in others:
        if o._ctx is not self._ctx:
            # A dead operand (deinit'ed, or its context closed) is Deinitialized first, as
            # a compiled call reports it before any context is compared.
            self._node  # noqa: B018
            o._node  # noqa: B018
            raise ContextMismatch("operands belong to different ExecContexts")


def operand_requires_grad(x: Tensor) -> bool:
    """``x.requires_grad``; while tracing, that of the caller's tensor: an argument traced
    under no_grad still requires grad when it is a variable, so inference-only ops refuse
    it as in eager."""
    tracer: Any = current_tracer()
    if tracer is None or not hasattr(tracer, "concrete_requires_grad"):
        return x.requires_grad
    return bool(tracer.concrete_requires_grad(x._node))


def check_tensor(x: Any, what: str = "operand") -> Any:
    """A live fucina tensor, or TypeError naming the argument and what was passed."""
    if not isinstance(x, Tensor) or x.axis_tags is None:
        raise TypeError(explain(x, f"a fucina tensor ({what})"))
    x._node  # noqa: B018 - raises Deinitialized
    return x


def tensor_list(xs: Any, what: str) -> list[Any]:
    """A list of tensors from a sequence argument; TypeError for anything else."""
    if isinstance(xs, (str, Tensor)) or not isinstance(xs, (Sequence, np.ndarray)):
        raise TypeError(explain(xs, f"a sequence of fucina tensors ({what})"))
    return [check_tensor(x, what) for x in xs]


def sizes_of(x: Tensor) -> dict[str, int]:
    """tag -> size for a live tensor."""
    return dict(zip(x.axis_tags, x._node.shape))


def identity_coeffs(rank: int) -> tuple[tuple[int, ...], ...]:
    """Coefficient rows of the identity view."""
    return tuple(tuple(1 if j == k else 0 for j in range(rank)) for k in range(rank))


def identity_view(x: Tensor) -> Node:
    """A zero-copy alias of ``x``'s node (a fresh node over the same storage)."""
    node = x._node
    r = len(node.shape)
    return emit("view", (node,), shape=node.shape, coeffs=identity_coeffs(r), base=(0,) * r)


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
        elif j is not None and node.shape[j] != 1:  # callers check; never read it as a broadcast
            raise ShapeMismatch(f"tag {t!r}: size {node.shape[j]} does not broadcast to {d}")
        coeffs.append(tuple(row))
    return emit("view", (node,), shape=tuple(shape) or (1,),
                coeffs=tuple(coeffs) or ((0,) * in_rank,), base=(0,) * in_rank)


def broadcast_sizes(a: Tensor, b: Tensor, out: Sequence[str]) -> tuple[int, ...]:
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
        raise IndexOutOfBounds(f"index {first} out of range for {tag!r} of size {dim}")
    return idx


def index_input(self: Tensor, indices: Any, dim: int, tag: str) -> np.ndarray | Node:
    """Row indices along ``tag`` (size ``dim``): host data (a sequence or numpy
    integers) as a checked int64 array, or a rank-1 integer tensor as its i64 node.

    A tensor is a traced input under ``compile`` (new values never retrace); the IR
    checks its values (``ir/checks.py``) before any kernel reads them, at once in
    eager mode and as a program step when compiled, with host data's errors.
    """
    if not isinstance(indices, Tensor):
        return host_indices(indices, dim, tag)
    check_tensor(indices, "indices")
    same_ctx(self, indices)
    if not indices.dtype.is_integer:
        raise TagError(f"indices for {tag!r} must be an integer tensor, got "
                       f"{indices.dtype.value}")
    if indices.tag_count != 1:
        raise TagError(f"indices for {tag!r} must be a rank-1 tensor, got tags "
                       f"{indices.axis_tags}")
    node = indices._node
    if node.dtype is not DType.i64:
        node = emit("cast", (node,), dtype=DType.i64, src=node.dtype)
    return node


def readable(x: Tensor) -> RawTensor:
    """The raw value of a live, non-traced tensor (UnsupportedView while tracing)."""
    raw = x._node.value
    if raw.is_symbolic:
        raise UnsupportedView("a traced tensor has no data until the compiled program runs")
    return raw


def one_value(x: Tensor) -> Any:
    """The single element of ``x`` as a Python number (None unless one element)."""
    raw = readable(x)
    if raw.numel != 1:
        return None
    v = decode(raw.array().reshape(-1)[:1], raw.dtype)[0]
    return v.item()


# -- the per-branch mixins defined here -----------------------------------------


class ItemAccess(Tensor):
    """``item()`` on the scalar-dtype branches (block formats have no single elements)."""

    __slots__ = ()

    def item(self) -> float | int | bool:
        """The single element as a Python number (InvalidShape unless one element);
        bf16 and FP8 give their value, not their bits."""
        v = one_value(self)
        if v is None:
            raise InvalidShape(
                f"item() needs a single-element tensor, shape is {readable(self).shape}")
        return v


def real_number(v: object) -> bool:
    """A real Python/numpy number that is not a bool (an operator's scalar operand)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _as_arrays(v: Any) -> Any:
    """``v`` with every tensor in it (through tuples, lists and dicts) as its values."""
    if isinstance(v, Tensor):
        return np.asarray(v)
    if isinstance(v, (tuple, list)):
        items = [_as_arrays(u) for u in v]
        make = getattr(type(v), "_make", None)  # a namedtuple takes its fields
        return make(items) if make is not None else type(v)(items)
    if isinstance(v, dict):
        return {k: _as_arrays(u) for k, u in v.items()}
    return v
