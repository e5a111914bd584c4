"""Reverse-mode autodiff as an IR transform.

One vector-Jacobian rule per primitive, each emitting ordinary IR ops through
the executor, and one reverse walk that applies them. In eager mode the
emitted ops run at once; under a tracer they become part of the program.
Gradients are always f32 (f16/bf16 leaves receive f32 gradients).
"""

from __future__ import annotations

from collections.abc import Callable

from ..dtypes import DType
from ..runtime.gradmode import no_grad
from .execute import emit
from .graph import Node

Grads = tuple[Node | None, ...]
Rule = Callable[[Node, Node], Grads]
VJP: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    """Register the VJP rule of primitive ``name``."""

    def deco(fn: Rule) -> Rule:
        VJP[name] = fn
        return fn

    return deco


# -- small emitters ------------------------------------------------------------


def _bin(fn: str, a: Node, b: Node) -> Node:
    return emit("binary", (a, b), fn=fn)


def _scal(fn: str, a: Node, v: float) -> Node:
    return emit("scalar", (a,), fn=fn, value=v)


def _neg(a: Node) -> Node:
    return emit("unary", (a,), fn="neg")


def _zeros(shape: tuple[int, ...], dtype: DType = DType.f32) -> Node:
    return emit("fill", (), shape=shape, dtype=dtype, value=0)


def _f32(a: Node) -> Node:
    return a if a.dtype is DType.f32 else emit("cast", (a,), dtype=DType.f32, src=a.dtype)


def _mask(fn: str, a: Node, b: Node) -> Node:
    return _f32(emit("compare", (a, b), fn=fn))


def _contig(a: Node) -> Node:
    return a if a.value.is_contiguous() else emit("copy", (a,))


def broadcast_back(g: Node, in_shape: tuple[int, ...], axes: tuple[int, ...]) -> Node:
    """View a reduced gradient over the reduced axes again (stride 0, no copy)."""
    kept = [k for k in range(len(in_shape)) if k not in axes]
    g_rank = len(g.shape)
    coeffs = []
    for k in range(len(in_shape)):
        row = [0] * g_rank
        if k in kept:
            row[kept.index(k)] = 1
        coeffs.append(tuple(row))
    return emit("view", (g,), shape=tuple(in_shape), coeffs=tuple(coeffs), base=(0,) * g_rank)


# -- rules -----------------------------------------------------------------------


@rule("view")
def _view(n: Node, g: Node) -> Grads:
    a = n.attrs
    return (emit("embed_view", (g,), in_shape=n.inputs[0].shape, coeffs=a["coeffs"],
                 base=a["base"]),)


@rule("embed_view")
def _embed_view(n: Node, g: Node) -> Grads:
    a = n.attrs
    return (emit("view", (g,), shape=n.inputs[0].shape, coeffs=a["coeffs"], base=a["base"]),)


@rule("merge")
def _merge(n: Node, g: Node) -> Grads:
    # The adjoint of folding axes is splitting them again: a view of g.
    from ..runtime.raw import contiguous_strides

    a, cnt = n.attrs["start"], n.attrs["count"]
    in_shape = n.inputs[0].shape
    inner = contiguous_strides(in_shape[a:a + cnt])
    g_rank = len(g.shape)
    coeffs = []
    for k in range(len(in_shape)):
        row = [0] * g_rank
        if k < a:
            row[k] = 1
        elif k < a + cnt:
            row[a] = inner[k - a]
        else:
            row[k - cnt + 1] = 1
        coeffs.append(tuple(row))
    return (emit("view", (g,), shape=in_shape, coeffs=tuple(coeffs), base=(0,) * g_rank),)


@rule("reshape")
def _reshape(n: Node, g: Node) -> Grads:
    return (emit("reshape", (_contig(g),), shape=n.inputs[0].shape),)


@rule("strided")
def _strided(n: Node, g: Node) -> Grads:
    return (emit("scatter_flat_add", (g,), index=n.attrs["grad_index"],
                 shape=n.inputs[0].shape),)


@rule("copy")
def _copy(n: Node, g: Node) -> Grads:
    return (g,)


@rule("cast")
def _cast(n: Node, g: Node) -> Grads:
    return (g,)


@rule("binary")
def _binary(n: Node, g: Node) -> Grads:
    a, b = n.inputs
    fn = n.attrs["fn"]
    if fn == "add":
        return g, g
    if fn == "sub":
        return g, _neg(g)
    if fn == "mul":
        return _bin("mul", g, b), _bin("mul", g, a)
    if fn == "div":
        ga = _bin("div", g, b)
        return ga, _neg(_bin("mul", ga, n))
    if fn in ("maximum", "minimum"):
        win, lose = ("gt", "lt") if fn == "maximum" else ("lt", "gt")
        # The winner takes the gradient; exact ties split it evenly (torch).
        tie = _scal("mul", _mask("eq", a, b), 0.5)
        wa = _bin("add", _mask(win, a, b), tie)
        wb = _bin("add", _mask(lose, a, b), tie)
        return _bin("mul", g, wa), _bin("mul", g, wb)
    raise KeyError(f"no gradient rule for binary {fn}")


@rule("unary")
def _unary(n: Node, g: Node) -> Grads:
    fn = n.attrs["fn"]
    if fn == "neg":
        return (_neg(g),)
    raise KeyError(f"no gradient rule for unary {fn}")


@rule("scalar")
def _scalar(n: Node, g: Node) -> Grads:
    fn, v = n.attrs["fn"], n.attrs["value"]
    x = n.inputs[0]
    if fn == "add":
        return (g,)
    if fn == "mul":
        return (_scal("mul", g, v),)
    if fn == "rsub":
        return (_neg(g),)
    if fn == "div":
        return (_scal("div", g, v),)
    if fn == "rdiv":
        # d(v/x) = -v/x^2 = -(out/x)
        return (_neg(_bin("mul", g, _bin("div", n, x))),)
    if fn == "pow":
        return (_bin("mul", g, _scal("mul", _scal("pow", x, v - 1), v)),)
    raise KeyError(f"no gradient rule for scalar {fn}")


@rule("where")
def _where(n: Node, g: Node) -> Grads:
    c = n.inputs[0]
    z = _zeros(g.shape)
    return None, emit("where", (c, g, z)), emit("where", (c, z, g))


@rule("reduce")
def _reduce(n: Node, g: Node) -> Grads:
    x = n.inputs[0]
    axes = tuple(n.attrs["axes"])
    fn = n.attrs["fn"]
    if fn in ("sum", "mean"):
        gb = broadcast_back(g, x.shape, axes)
        if fn == "mean":
            count = 1
            for ax in axes:
                count *= x.shape[ax]
            gb = _scal("div", gb, float(count))
        return (gb,)
    raise KeyError(f"no gradient rule for reduce {fn}")


@rule("contract")
def _contract(n: Node, g: Node) -> Grads:
    a, b = n.inputs
    la, lb, lo = n.attrs["labels"]
    ga = emit("contract", (g, b), labels=(lo, lb, la), shape=a.shape, dtype=DType.f32)
    gb = emit("contract", (a, g), labels=(la, lo, lb), shape=b.shape, dtype=DType.f32)
    return ga, gb


@rule("gather")
def _gather(n: Node, g: Node) -> Grads:
    x = n.inputs[0]
    axis = n.attrs["axis"]
    return (emit("scatter_axis_add", (g,), axis=axis, index=n.attrs["index"],
                 dim=x.shape[axis]),)


@rule("scatter_axis_add")
def _scatter_axis_add(n: Node, g: Node) -> Grads:
    return (emit("gather", (g,), axis=n.attrs["axis"], index=n.attrs["index"]),)


@rule("index_add")
def _index_add(n: Node, g: Node) -> Grads:
    return g, emit("gather", (g,), axis=n.attrs["axis"], index=n.attrs["index"])


@rule("set_index")
def _set_index(n: Node, g: Node) -> Grads:
    upd = n.inputs[1]
    kw = {"axis": n.attrs["axis"], "index": n.attrs["index"]}
    return (emit("set_index", (g, _zeros(upd.shape)), **kw), emit("gather", (g,), **kw))


@rule("concat")
def _concat(n: Node, g: Node) -> Grads:
    axis = n.attrs["axis"]
    out, start = [], 0
    for x in n.inputs:
        out.append(narrow_view(g, axis, start, x.shape[axis]))
        start += x.shape[axis]
    return tuple(out)


@rule("pad")
def _pad(n: Node, g: Node) -> Grads:
    x = n.inputs[0]
    axis = n.attrs["axis"]
    return (narrow_view(g, axis, n.attrs["before"], x.shape[axis]),)


@rule("take_along")
def _take_along(n: Node, g: Node) -> Grads:
    x, idx = n.inputs
    return emit("scatter_add", (_zeros(x.shape), idx, g), axis=n.attrs["axis"]), None


@rule("scatter_add")
def _scatter_add(n: Node, g: Node) -> Grads:
    _, idx, src = n.inputs
    ax = n.attrs["axis"]
    return g, None, emit("take_along", (g, idx), axis=ax, shape=src.shape, dtype=DType.f32)


@rule("scatter")
def _scatter(n: Node, g: Node) -> Grads:
    _, idx, src = n.inputs
    ax = n.attrs["axis"]
    gbase = emit("scatter", (g, idx, _zeros(src.shape)), axis=ax)
    return gbase, None, emit("take_along", (g, idx), axis=ax, shape=src.shape, dtype=DType.f32)


@rule("gather_flat")
def _gather_flat(n: Node, g: Node) -> Grads:
    return (emit("scatter_flat_add", (g,), index=n.attrs["index"], shape=n.inputs[0].shape),)


@rule("scatter_flat_add")
def _scatter_flat_add(n: Node, g: Node) -> Grads:
    return (emit("gather_flat", (g,), index=n.attrs["index"], shape=n.inputs[0].shape,
                 has_fill=True, fill=0.0),)


def narrow_view(x: Node, axis: int, start: int, length: int) -> Node:
    """Zero-copy window [start, start+length) along ``axis``."""
    r = len(x.shape)
    shape = tuple(length if k == axis else d for k, d in enumerate(x.shape))
    coeffs = tuple(tuple(1 if j == k else 0 for j in range(r)) for k in range(r))
    base = tuple(start if k == axis else 0 for k in range(r))
    return emit("view", (x,), shape=shape, coeffs=coeffs, base=base)


# -- the reverse walk --------------------------------------------------------------


def _topo(root: Node) -> list[Node]:
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for inp in node.inputs:
            if inp.requires_grad and id(inp) not in seen:
                stack.append((inp, False))
    return order


def accumulate(leaf: Node, g: Node) -> None:
    """Add ``g`` into the leaf's gradient, always into a fresh buffer."""
    from ..runtime.raw import RawTensor

    g = _f32(g)
    fresh = g.value.contiguous_copy() if leaf.grad is None else None
    if fresh is None:
        prev = Node("const", (), {}, leaf.grad, None, False)
        fresh = emit("binary", (prev, g), fn="add").value
        if fresh.storage is g.value.storage:
            fresh = fresh.contiguous_copy()
    assert isinstance(fresh, RawTensor)
    leaf.grad = fresh


def backward(root: Node, seed: Node) -> None:
    """Propagate ``seed`` (d loss / d root) to every variable leaf below ``root``."""
    order = _topo(root)
    grads: dict[int, Node] = {id(root): seed}
    with no_grad():
        for node in reversed(order):
            g = grads.pop(id(node), None)
            if g is None:
                continue
            if node.op == "variable":
                accumulate(node, g)
                continue
            if node.is_leaf:
                continue
            for inp, gi in zip(node.inputs, VJP[node.op](node, g)):
                if gi is None or not inp.requires_grad:
                    continue
                prev = grads.get(id(inp))
                grads[id(inp)] = gi if prev is None else _bin("add", prev, gi)
