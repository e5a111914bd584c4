"""The eager fast path: a repeated small op on plain tensors, with almost no Python work.

The first eager call of an op on a signature goes the normal way (tag rules,
checks, :func:`~fucina.ir.execute.emit`, the per-signature kernel plan of
:mod:`fucina.ir.eager`). Once that succeeded, the signature is remembered here
together with its plan, and later calls with the same signature allocate the
result and call the kernel's compiled entry point directly.

A signature is everything the normal path decides from: the op and its
parameters, the operand types (dtype and tags), shapes and strides. A call takes
the fast path only when, in addition, nothing could make the normal path behave
differently: no tracer is active, every operand is live on one open context,
none requires grad (the graph path records nodes), the storage buffers hold the
dtypes the entry point was built for. Anything else (broadcasting, borrowed or
symbolic storage, a first call, an error) takes the normal path, which raises
what it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.eager import Plan, lookup
from ..ir.execute import TRACING, _local
from ..ir.graph import Node
from ..kernels import batched_gemm, blas_threads
from ..runtime.context import SCOPES_OPEN
from ..runtime.ieee import quiet
from ..runtime.raw import RawTensor
from ..runtime.storage import POOL, POOL_MIN_BYTES, PooledStorage, Storage

#: Most signatures remembered (the table is emptied when it grows past this).
FAST_CACHE_SIZE = 4096


class _Fast:
    """What a fast call needs: the kernel plan, the result type and its tags."""

    __slots__ = ("plan", "entry", "cls", "tags", "op", "attrs", "count", "np_dtype", "small",
                 "shape", "strides", "dtype", "in_np", "rest")

    def __init__(self, plan: Plan, cls: type, tags: tuple[str, ...], op: str,
                 attrs: dict[str, Any]):
        self.plan = plan
        self.entry = plan.entry
        self.cls = cls
        self.tags = tags
        self.op = op
        self.attrs = attrs
        self.count = plan.count
        self.np_dtype = np.dtype(plan.np_dtype)
        self.small = plan.small
        self.shape = plan.shape
        self.strides = plan.strides
        self.dtype = plan.dtype
        self.in_np = plan.in_np
        self.rest = plan.rest


_FAST: dict[Any, Any] = {}  # signature -> _Fast or _FastDot


def _remember(key: Any, inputs: tuple[Node, ...], op: str, attrs: dict[str, Any],
              out: Any) -> None:
    """Remember ``key`` after the normal path produced ``out`` from ``inputs``."""
    if getattr(_local, "tracer", None) is not None:
        return
    for n in inputs:
        st = n.value.storage
        if n.requires_grad or st.buf is None or st.borrowed:
            return
    plan = lookup(op, inputs, attrs)
    if plan is None or plan.entry is None or not plan.plain or plan.param_kind == 1:
        return
    if op == "unary" and attrs.get("params"):
        return
    node = out._node_
    if node is None or node.requires_grad or node.value.shape != plan.shape:
        return
    if len(_FAST) >= FAST_CACHE_SIZE:
        _FAST.clear()
    _FAST[key] = _Fast(plan, type(out), node.tags, op, dict(attrs))


_new = object.__new__


def result(cls: Any, ctx: Any, out: np.ndarray, small: bool, dtype: Any, shape: Any,
           strides: Any, offset: int, op: str, attrs: dict[str, Any], tags: Any) -> Any:
    """A ``cls`` tensor around the fresh buffer ``out``: what ``emit`` and ``result``
    make, built without the constructors' call overhead (every slot of Storage,
    RawTensor and Node is set here, as their ``__init__`` would). The one builder of
    the eager fast paths and the compiled plain lane."""
    st: Any = _new(Storage if small else PooledStorage)
    st.buf = out
    st.refs = 1
    st.readonly = False
    st.borrowed = False
    raw: Any = _new(RawTensor)
    raw.storage = st
    raw.dtype = dtype
    raw.shape = shape
    raw.strides = strides
    raw.offset = offset
    node: Any = _new(Node)
    node.op = op
    node.inputs = ()
    node.attrs = attrs
    node.value = raw
    node.tags = tags
    node.requires_grad = False
    node.grad = None
    return tensor_of(cls, node, ctx)


def _wrap(f: Any, out: np.ndarray, ctx: Any, attrs: dict[str, Any]) -> Any:
    return result(f.cls, ctx, out, f.small, f.dtype, f.shape, f.strides, 0, f.op, attrs,
                  f.tags)


def tensor_of(cls: Any, node: Node, ctx: Any) -> Any:
    """A ``cls`` tensor on ``node``, owned by ``ctx``'s innermost open exec scope if any:
    what ``cls._from_node(node, ctx, op_result=True)`` makes, without its call overhead."""
    obj: Any = _new(cls)
    obj._node_ = node
    obj._ctx = ctx
    obj._scoped = False
    if SCOPES_OPEN[0]:  # some scope is open somewhere: is one open here?
        try:
            scopes = ctx._local.scopes  # this thread's open exec scopes
        except AttributeError:  # none made on this thread yet (the property makes it)
            scopes = ctx._scopes
        if scopes:
            scopes[-1].append(obj)
            obj._scoped = True
    return obj


def _alloc(f: _Fast) -> np.ndarray:
    if f.small:
        return np.empty(f.count, f.np_dtype)
    return POOL.take(f.np_dtype, f.count)


def binary_op(slow: Callable[[Any, Any, str], Any]) -> Callable[[Any, Any, str], Any]:
    """``slow`` (the normal path of the ``binary`` primitive) behind the fast path."""

    def binary(self: Any, other: Any, fn: str) -> Any:
        sn = self._node_
        on = getattr(other, "_node_", None)  # (a tensor type has a slot descriptor there)
        if sn is not None and type(on) is Node and not (sn.requires_grad or on.requires_grad):
            ctx = self._ctx
            ra = sn.value
            rb = on.value
            f = _FAST.get((fn, type(self), type(other), ra.shape, ra.strides, rb.shape,
                           rb.strides))
            if f is not None and other._ctx is ctx and not ctx.closed \
                    and (not TRACING[0] or _local.tracer is None):
                sa = ra.storage
                sb = rb.storage
                ba = sa.buf
                bb = sb.buf
                d0, d1 = f.in_np
                if ba is not None and bb is not None and ba.dtype is d0 and bb.dtype is d1 \
                        and not (sa.borrowed or sb.borrowed):
                    out = np.empty(f.count, f.np_dtype) if f.small else _alloc(f)
                    f.entry(out, ba, bb, ra.offset, rb.offset, *f.rest)
                    return _wrap(f, out, ctx, {"fn": fn})
        out = slow(self, other, fn)
        _learn_binary(self, other, fn, out)
        return out

    return binary


def _learn_binary(self: Any, other: Any, fn: str, out: Any) -> None:
    """After the normal path computed ``out = self <fn> other``: remember the signature
    when its operands needed no broadcasting."""
    sn, on = self._node_, getattr(other, "_node_", None)
    if on is None or sn is None or out._node_ is None:
        return
    ra, rb = sn.value, on.value
    if ra.shape != rb.shape or ra.shape != out._node_.value.shape \
            or self.axis_tags != other.axis_tags:
        return  # broadcast or aligned operands: views the fast path does not make
    key = (fn, type(self), type(other), ra.shape, ra.strides, rb.shape, rb.strides)
    _remember(key, (sn, on), "binary", {"fn": fn}, out)


def unary(self: Any, fn: str) -> Any:
    """The parameterless ``unary`` op ``fn`` on the fast path, or None."""
    sn = self._node_
    if sn is None or sn.requires_grad:
        return None
    ra = sn.value
    f = _FAST.get(("unary", fn, type(self), ra.shape, ra.strides))
    return None if f is None else _run_one(self, ra, f)


def learn_unary(self: Any, fn: str, out: Any) -> None:
    """After the normal path computed the parameterless ``unary`` op ``fn``: remember it."""
    sn = self._node_
    if sn is None:
        return
    ra = sn.value
    _remember(("unary", fn, type(self), ra.shape, ra.strides), (sn,), "unary", {"fn": fn},
              out)


def reduce(self: Any, tag: Any, fn: str) -> Any:
    """The unmasked reduction ``fn`` over ``tag`` on the fast path, or None."""
    sn = self._node_
    if sn is None or sn.requires_grad or type(tag) is not str:
        return None
    ra = sn.value
    f = _FAST.get(("reduce", fn, tag, type(self), ra.shape, ra.strides))
    return None if f is None else _run_one(self, ra, f)


def _run_one(self: Any, ra: RawTensor, f: _Fast) -> Any:
    """A remembered one-input op on ``self`` (raw ``ra``), or None where the normal
    path must decide (closed context, tracing, another buffer dtype, borrowed)."""
    ctx = self._ctx
    if ctx.closed or (TRACING[0] and _local.tracer is not None):
        return None
    st = ra.storage
    ba = st.buf
    if ba is None or ba.dtype is not f.in_np[0] or st.borrowed:
        return None
    out = np.empty(f.count, f.np_dtype) if f.small else _alloc(f)
    f.entry(out, ba, ra.offset, *f.rest)
    return _wrap(f, out, ctx, f.attrs.copy())


def learn_reduce(self: Any, tag: Any, fn: str, out: Any) -> None:
    """After the normal path reduced ``self`` over ``tag``: remember it."""
    sn = self._node_
    node = out._node_
    if sn is None or node is None or type(tag) is not str:
        return
    ra = sn.value
    _remember(("reduce", fn, tag, type(self), ra.shape, ra.strides), (sn,), "reduce",
              node.attrs, out)


# -- dot: a planned GEMM straight into the result buffer --------------------------------


class _Matrix:
    """How one GEMM operand is viewed over its storage buffer: its matrix-stack shape,
    byte strides and byte offset from the raw tensor's own offset; ``whole`` when the
    view is the whole buffer reshaped (a raw tensor at offset 0 over a buffer of exactly
    ``size`` elements), the cheap case."""

    __slots__ = ("shape", "strides", "rel", "size", "whole", "small", "last", "blas")

    def __init__(self, view: np.ndarray, buf: np.ndarray, raw: RawTensor):
        self.shape = view.shape
        self.strides = view.strides
        self.rel = (view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
                    - raw.offset * buf.itemsize)
        self.size = view.size
        self.whole = self.rel == 0 and view.flags.c_contiguous
        # a 2-D C- or F-contiguous view: numpy's dot passes it to BLAS as matmul does
        self.blas = view.ndim == 2 and (view.flags.c_contiguous or view.flags.f_contiguous)
        # The last (buffer, offset, view) of a small operand: a weight used call after
        # call keeps its view (a view, so in-place writes to the buffer still show).
        # Only small buffers are held, so the table never pins much memory.
        self.small = buf.nbytes < POOL_MIN_BYTES
        self.last: tuple[Any, int, np.ndarray] | None = None

    def view(self, buf: np.ndarray, offset: int) -> np.ndarray:
        last = self.last
        if last is not None and last[0] is buf and last[1] == offset:
            return last[2]
        if self.whole and offset == 0 and buf.size == self.size:
            v = buf.reshape(self.shape)
        else:
            v = np.ndarray(self.shape, buf.dtype, buffer=buf,
                           offset=offset * buf.itemsize + self.rel, strides=self.strides)
        if self.small and buf.nbytes < POOL_MIN_BYTES:
            self.last = (buf, offset, v)
        return v


class _FastDot:
    """A remembered GEMM: the operands' matrix views, the product call and the result."""

    __slots__ = ("cls", "tags", "attrs", "dtype", "np_dtype", "count", "shape", "strides",
                 "small", "a", "b", "swapped", "out_shape", "in_np", "op", "gemm", "fresh")

    def __init__(self, out: Any, sides: tuple[_Matrix, _Matrix], swapped: bool,
                 out_shape: tuple[int, ...], in_np: tuple[np.dtype, np.dtype]):
        node = out._node_
        v = node.value
        self.op = "contract"
        self.cls = type(out)
        self.tags = node.tags
        self.attrs = dict(node.attrs)
        self.dtype = v.dtype
        self.np_dtype = np.dtype(v.dtype.storage)
        self.count = v.numel
        self.shape = v.shape
        self.strides = v.strides
        self.small = self.count * self.np_dtype.itemsize < POOL_MIN_BYTES
        self.a, self.b = sides
        self.swapped = swapped
        self.out_shape = out_shape
        self.in_np = in_np
        self.gemm = _gemm_call(sides, out_shape, self.np_dtype)
        self.fresh = self.small and returns_fresh(self.gemm)


#: fucina's ``matmul`` (stacks, large planes; BLAS below its sizes) as the fast dots call
#: it: quiet like the numpy products :func:`_gemm_call` returns.
_STACKED = quiet(batched_gemm.matmul)


def returns_fresh(gemm: Callable[..., Any]) -> bool:
    """Whether a product call from :func:`gemm_route` can make its own result
    (``gemm(A, B)``); fucina's ``matmul`` needs ``out``."""
    return gemm is not _STACKED


def _gemm_call(sides: tuple[_Matrix, _Matrix], out_shape: tuple[int, ...],
               dtype: np.dtype) -> Callable[..., Any]:
    """The product ``gemm(A, B, out)`` the normal path and a compiled program make for
    these views: fucina's ``matmul`` where :func:`batched_gemm.routes_here` says so,
    else ``np.matmul`` --
    or ``np.dot`` where that is the same BLAS call for less overhead: two whole
    matrices (C- or F-contiguous, every dimension above 1: numpy's dot and matmul
    then both call ``gemm`` with the same arguments, and both turn to ``syrk`` for a
    matrix times its own transpose), where matmul's ufunc machinery costs about
    0.5 us more per call."""
    # quiet, every one: outside a program (the eager fast dot, a one-GEMM lane) inf and
    # NaN operands must give IEEE results without numpy's warnings or errors, as inside
    # one (fucina's matmul falls back to numpy's BLAS for small stacks)
    a, b = sides
    if batched_gemm.routes_here(out_shape, a.shape[-1], dtype):
        return _STACKED
    m, n, k = out_shape[-2], out_shape[-1], a.shape[-1]
    if len(out_shape) == 2 and min(a.shape + b.shape) > 1 and a.blas and b.blas:
        return quiet(blas_threads.gemm_call(np.dot, m, n, k))
    return quiet(blas_threads.gemm_call(np.matmul, m, n, k))


def dot(self: Any, other: Any, contract: Any) -> Any:
    """``self.dot(other, contract)`` on the fast path, or None."""
    sn = self._node_
    on = getattr(other, "_node_", None)  # (a tensor type has a slot descriptor there)
    if sn is None or type(on) is not Node or sn.requires_grad or on.requires_grad:
        return None
    ra = sn.value
    rb = on.value
    try:
        f = _FAST.get(("dot", contract, type(self), type(other), ra.shape, ra.strides,
                       rb.shape, rb.strides))
    except TypeError:  # an unhashable tag: the normal path names the problem
        return None
    if f is None:
        return None
    ctx = self._ctx
    if other._ctx is not ctx or ctx.closed or (TRACING[0] and _local.tracer is not None):
        return None
    ba = ra.storage.buf
    bb = rb.storage.buf
    d0, d1 = f.in_np
    if ba is None or bb is None or ba.dtype is not d0 or bb.dtype is not d1:
        return None
    if f.swapped:
        ba, bb, oa, ob = bb, ba, rb.offset, ra.offset
    else:
        oa, ob = ra.offset, rb.offset
    a = f.a
    last = a.last  # _Matrix.view, inlined for the kept view of a small operand
    A = last[2] if last is not None and last[0] is ba and last[1] == oa else a.view(ba, oa)
    b = f.b
    last = b.last
    B = last[2] if last is not None and last[0] is bb and last[1] == ob else b.view(bb, ob)
    small = f.small
    if f.fresh:  # the product's own fresh result (the same BLAS call as with out=)
        out = f.gemm(A, B).reshape(-1)
    else:
        dt = f.np_dtype
        out = np.empty(f.count, dt) if small else POOL.take(dt, f.count)
        f.gemm(A, B, out.reshape(f.out_shape))
    return result(f.cls, ctx, out, small, f.dtype, f.shape, f.strides, 0, "contract",
                  f.attrs.copy(), f.tags)


def gemm_route(labels: Any, result: RawTensor, ra: RawTensor, rb: RawTensor) -> Any:
    """How a planned contraction of ``ra`` and ``rb`` (``labels`` as the contract
    node's, ``result`` its value) runs as one product: (left matrix, right matrix,
    swapped, product call, result matrix-stack shape), or None when the plan needs
    copies or an output permutation (the normal path then)."""
    from ..kernels import gemm

    la, lb, lo = (tuple(x) for x in labels)
    if len(la) != len(ra.shape) or len(lb) != len(rb.shape):
        return None  # private axes were summed first, or a scalar operand: the normal path
    p = gemm.plan(ra.shape, ra.strides, la, rb.shape, rb.strides, lb, lo)
    if p.out_perm is not None or "copy" in (p.a.orient, p.b.orient):
        return None
    ba, bb = ra.storage.buf, rb.storage.buf
    if ba is None or bb is None:
        return None
    x, y = ra.array(), rb.array()
    if p.swapped:
        x, y, la, lb = y, x, lb, la
        bx, by, rx, ry = bb, ba, rb, ra
    else:
        bx, by, rx, ry = ba, bb, ra, rb
    A = gemm.matrix_view(x, la, p.batch, p.m, p.k, p.a, p.batch_sizes, p.msize, p.ksize)
    B = gemm.matrix_view(y, lb, p.batch, p.k, p.n, p.b, p.batch_sizes, p.ksize, p.nsize)
    sides = (_Matrix(A, bx, rx), _Matrix(B, by, ry))
    out_shape = p.batch_sizes + (p.msize, p.nsize)
    return sides[0], sides[1], p.swapped, _gemm_call(sides, out_shape, A.dtype), out_shape


def learn_dot(self: Any, other: Any, contract: Any, out: Any) -> None:
    """After the normal path computed ``out = self.dot(other, contract)``: remember the
    signature when it was one plain GEMM of two f32 (or two f64) operands."""
    sn, on, node = self._node_, getattr(other, "_node_", None), out._node_
    if sn is None or on is None or node is None or node.op != "contract" \
            or _local.tracer is not None or sn.requires_grad or on.requires_grad:
        return
    ra, rb = sn.value, on.value
    dt = node.value.dtype
    if ra.dtype is not dt or rb.dtype is not dt or dt.name not in ("f32", "f64"):
        return
    ba, bb = ra.storage.buf, rb.storage.buf
    if ba is None or bb is None:
        return
    route = gemm_route(node.attrs["labels"], node.value, ra, rb)
    if route is None:
        return
    a_side, b_side, swapped, _, out_shape = route
    if len(_FAST) >= FAST_CACHE_SIZE:
        _FAST.clear()
    key = ("dot", contract, type(self), type(other), ra.shape, ra.strides, rb.shape,
           rb.strides)
    _FAST[key] = _FastDot(out, (a_side, b_side), swapped, out_shape, (ba.dtype, bb.dtype))
