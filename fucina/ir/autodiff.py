"""Reverse-mode autodiff as an IR transform.

One vector-Jacobian rule per primitive, each emitting ordinary IR ops through
the executor, and one reverse walk that applies them. In eager mode the
emitted ops run at once; under a tracer they become part of the program.
Gradients are always f32 (f16/bf16 leaves receive f32 gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dtypes import DType
from ..runtime.gradmode import no_grad
from .execute import emit
from .graph import Node, topo_order

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
        # -g a / b^2 as -g ((a / b) / b), torch's order: (g / b) (a / b) overflowed at a
        # subnormal b (inf, and NaN times a zero quotient) where the gradient is finite.
        return _bin("div", g, b), _neg(_bin("mul", g, _bin("div", n, b)))
    if fn in ("maximum", "minimum"):
        win, lose = ("gt", "lt") if fn == "maximum" else ("lt", "gt")
        # The winner takes the gradient; exact ties split it evenly; with a NaN on either
        # side neither loses, so both take it (torch: 1 - lost - tie/2 per operand).
        tie = _scal("mul", _mask("eq", a, b), 0.5)
        wa = _scal("add", _neg(_bin("add", _mask(lose, a, b), tie)), 1.0)
        wb = _scal("add", _neg(_bin("add", _mask(win, a, b), tie)), 1.0)
        return _bin("mul", g, wa), _bin("mul", g, wb)
    if fn == "pow":
        return _pow_base_grad(g, a, b), _pow_exponent_grad(n, g, a, b)
    raise KeyError(f"no gradient rule for binary {fn}")


def _cmp(fn: str, a: Node, v: float) -> Node:
    return emit("compare", (a,), fn=fn, value=v)


def _where_zero(cond: Node, a: Node) -> Node:
    """cond ? 0 : a."""
    return emit("where", (cond, _zeros(a.shape), a))


def _pow_base_grad(g: Node, a: Node, b: Node) -> Node:
    # d(a^b)/da = b a^(b-1); zero where b == 0 (torch: no 0 * inf at a = 0)
    t = _bin("mul", b, _bin("pow", a, _scal("add", b, -1.0)))
    return _where_zero(_cmp("eq", b, 0.0), _bin("mul", g, t))


def _pow_exponent_grad(n: Node, g: Node, a: Node, b: Node) -> Node:
    # d(a^b)/db = a^b ln a; zero where a == 0 and b >= 0 (torch's convention)
    t = _bin("mul", g, _bin("mul", n, emit("unary", (a,), fn="log")))
    cond = emit("binary", (_cmp("eq", a, 0.0), _cmp("ge", b, 0.0)), fn="logical_and")
    return _where_zero(cond, t)


#: unary fn -> (operand the derivative reads: "x" input / "out" output, derivative fn,
#: fixed params or None to reuse the forward node's params)
_UNARY_D: dict[str, tuple[str, str, tuple[float, ...] | None]] = {
    "relu": ("x", "d_relu", ()),
    "leaky_relu": ("x", "d_leaky_relu", None),
    "sigmoid": ("out", "d_sigmoid_out", ()),
    "silu": ("x", "d_silu", ()),
    "softplus": ("x", "d_softplus", ()),
    "tanh": ("out", "d_tanh_out", ()),
    "softcap_30": ("out", "d_softcap_out", (30.0,)),
    "softcap_15": ("out", "d_softcap_out", (15.0,)),
    "sqrt": ("out", "d_sqrt_out", ()),
    "log1p": ("x", "d_log1p", ()),
    "sin": ("x", "cos", ()),
    "cos": ("x", "d_cos", ()),
    "fast_tanh": ("x", "d_fast_tanh", ()),
    "gelu": ("x", "d_gelu", ()),
    "gelu_quant": ("x", "d_gelu", ()),  # inference op; the exact-gelu derivative
    "quick_gelu": ("x", "d_quick_gelu", ()),
    "elu": ("x", "d_elu", ()),
    "gelu_erf": ("x", "d_gelu_erf", ()),
    "abs": ("x", "sign", ()),  # torch: sgn(x), 0 at 0
    "clamp": ("x", "d_clamp", None),
}

#: Piecewise-constant ops: zero gradient almost everywhere (torch convention).
_UNARY_ZERO = frozenset({"floor", "ceil", "round", "sign"})


@rule("unary")
def _unary(n: Node, g: Node) -> Grads:
    from ..kernels.elementwise import UNARY

    fn = n.attrs["fn"]
    x = n.inputs[0]
    if fn == "neg":
        return (_neg(g),)
    if fn == "exp":
        return (_bin("mul", g, n),)
    if fn == "log":  # g / x, as g * (1/x): +-inf at 0 without a division trap
        return (_bin("mul", g, emit("unary", (x,), fn="reciprocal")),)
    if fn == "dropout":  # self-adjoint: the same (seed, p) mask regenerated over g
        return (emit("unary", (g,), fn="dropout", params=n.attrs["params"]),)
    if fn in ("rsqrt", "reciprocal"):
        # -0.5 g y^3 and -g y^2 as g times y once per power: y^3 alone over/underflows
        # float32 for |y| beyond 1e13 or below 1e-13 (layer_norm of rows spread ~1e15 or
        # ~1e-14), where the product with g is still in range.
        t = _bin("mul", _bin("mul", g, n), n)
        return (_scal("mul", _bin("mul", t, n), -0.5) if fn == "rsqrt" else _neg(t),)
    if fn in _UNARY_ZERO:
        return (_zeros(x.shape),)
    if UNARY[fn].out_bool:
        return (None,)
    if fn in _UNARY_D:
        src, dfn, params = _UNARY_D[fn]
        if params is None:
            params = tuple(n.attrs.get("params", ()))
        kw: dict[str, Any] = {"params": params} if params else {}
        d = emit("unary", (x if src == "x" else n,), fn=dfn, **kw)
        return (_bin("mul", g, d),)
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
        if v == 0:
            return (_zeros(x.shape),)  # torch: exactly zero (no 0 * inf at x = 0)
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
    if fn in ("max", "min"):
        return (_extremum_grad(n, g, x, axes),)
    if fn == "prod":
        return (_prod_grad(n, g, x, axes),)
    raise KeyError(f"no gradient rule for reduce {fn}")


def _extremum_grad(n: Node, g: Node, x: Node, axes: tuple[int, ...]) -> Node:
    """max/min VJP. The winners are the elements equal to the result, or NaN (a NaN
    result came from a NaN). ``ties="first"`` (torch.max over a dim, the default for
    one axis) routes the gradient to the first winner along the axis; ``"split"``
    (torch.amax, vector_norm's inf order) shares it evenly among the winners."""
    gb = broadcast_back(g, x.shape, axes)
    hit = emit("binary", (emit("compare", (x, broadcast_back(n, x.shape, axes)), fn="eq"),
                          emit("compare", (x, x), fn="ne")), fn="logical_or")
    if n.attrs.get("ties", "first") == "first" and len(axes) == 1:
        seen = emit("scan", (_f32(hit),), axis=axes[0], fn="cumsum")
        first = emit("binary", (hit, _cmp("eq", seen, 1.0)), fn="logical_and")
        return emit("where", (first, gb, _zeros(x.shape)))
    hf = _f32(hit)
    count = emit("reduce", (hf,), fn="sum", axes=axes, dtype=DType.f32)
    share = _bin("div", gb, broadcast_back(count, x.shape, axes))
    return _bin("mul", share, hf)


def _prod_grad(n: Node, g: Node, x: Node, axes: tuple[int, ...]) -> Node:
    """torch.prod's VJP: no zero in the lane -> g * prod / x; exactly one zero ->
    g * (product of the others) at the zero, 0 elsewhere; two or more -> 0."""
    zero = _cmp("eq", x, 0.0)
    ones = emit("fill", (), shape=x.shape, dtype=DType.f32, value=1.0)
    nonzero = emit("where", (zero, ones, x))
    rest = broadcast_back(emit("reduce", (nonzero,), fn="prod", axes=axes, dtype=DType.f32),
                          x.shape, axes)
    nzeros = broadcast_back(emit("reduce", (_f32(zero),), fn="sum", axes=axes,
                                 dtype=DType.f32), x.shape, axes)
    no_zero = _bin("div", rest, nonzero)
    one_zero = emit("where", (zero, rest, _zeros(x.shape)))
    factor = emit("where", (_cmp("eq", nzeros, 0.0), no_zero,
                            emit("where", (_cmp("eq", nzeros, 1.0), one_zero,
                                           _zeros(x.shape)))))
    return _bin("mul", broadcast_back(g, x.shape, axes), factor)


@rule("scan")
def _scan(n: Node, g: Node) -> Grads:
    x = n.inputs[0]
    axis, fn = n.attrs["axis"], n.attrs["fn"]
    rev = bool(n.attrs.get("reverse", False))
    if fn == "cumsum":
        # the adjoint of a prefix sum is the suffix sum (and vice versa)
        return (emit("scan", (g,), axis=axis, fn="cumsum", reverse=not rev),)
    if fn == "cumprod" and not rev:
        return (_cumprod_grad(n, g, x, axis),)
    raise KeyError(f"no gradient rule for scan {fn} (reverse={rev})")


def _cumprod_grad(n: Node, g: Node, x: Node, axis: int) -> Node:
    """torch.cumprod's VJP, exact with zeros, O(n) per lane.

    With z the first zero of a lane: positions before it get
    suffix_sum(g * out) / x; the first zero gets suffix_sum(g * out') where out'
    is the running product with that zero replaced by 1; positions after it get 0.
    A zero-free lane is all "before".
    """
    def suffix(v: Node) -> Node:
        return emit("scan", (v,), axis=axis, fn="cumsum", reverse=True)

    zero = _cmp("eq", x, 0.0)
    seen = emit("scan", (_f32(zero),), axis=axis, fn="cumsum")
    before = _cmp("eq", seen, 0.0)
    first = emit("binary", (zero, _cmp("eq", seen, 1.0)), fn="logical_and")
    ones = emit("fill", (), shape=x.shape, dtype=DType.f32, value=1.0)
    out1 = emit("scan", (emit("where", (first, ones, x)),), axis=axis, fn="cumprod")
    lead = _bin("div", suffix(_bin("mul", g, n)), emit("where", (before, x, ones)))
    at_zero = suffix(_bin("mul", g, out1))
    return emit("where", (before, lead, emit("where", (first, at_zero, _zeros(x.shape)))))


@rule("contract")
def _contract(n: Node, g: Node) -> Grads:
    a, b = n.inputs
    la, lb, lo = n.attrs["labels"]
    ga = emit("contract", (g, b), labels=(lo, lb, la), shape=a.shape, dtype=DType.f32)
    gb = emit("contract", (a, g), labels=(la, lo, lb), shape=b.shape, dtype=DType.f32)
    return ga, gb


@rule("gather")
def _gather(n: Node, g: Node) -> Grads:
    x, *index = n.inputs  # positions: the attribute, or a traced i64 input (no gradient)
    axis = n.attrs["axis"]
    gx = emit("scatter_axis_add", (g, *index), axis=axis, index=n.attrs.get("index"),
              dim=x.shape[axis])
    return (gx, None) if index else (gx,)


@rule("scatter_axis_add")
def _scatter_axis_add(n: Node, g: Node) -> Grads:
    _, *index = n.inputs
    gx = emit("gather", (g, *index), axis=n.attrs["axis"], index=n.attrs.get("index"))
    return (gx, None) if index else (gx,)


@rule("index_add")
def _index_add(n: Node, g: Node) -> Grads:
    _, _, *index = n.inputs  # rows: the attribute, or a traced i64 input (no gradient)
    gu = emit("gather", (g, *index), axis=n.attrs["axis"], index=n.attrs["index"])
    return (g, gu, None) if index else (g, gu)


@rule("set_index")
def _set_index(n: Node, g: Node) -> Grads:
    _, upd, *index = n.inputs
    kw = {"axis": n.attrs["axis"], "index": n.attrs["index"]}
    gx = emit("set_index", (g, _zeros(upd.shape), *index), **kw)
    gu = emit("gather", (g, *index), **kw)
    return (gx, gu, None) if index else (gx, gu)


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


def accumulate(leaf: Node, g: Node) -> None:
    """Add ``g`` into the leaf's gradient, always into a fresh buffer.

    While a function is being traced, the gradient is a program value: the
    tracer records it, and the compiled program accumulates it when it runs.
    """
    from .execute import current_tracer

    g = _f32(g)
    tracer = current_tracer()
    if tracer is not None:
        tracer.gradient(leaf, g)
        return
    if leaf.grad is None:
        leaf.grad = g.value.contiguous_copy()
    else:  # the add writes a new buffer: a held grad_view() keeps the old value
        leaf.grad = emit("binary", (Node("const", (), {}, leaf.grad, None, False), g),
                         fn="add").value


def backward(root: Node, seed: Node,
             deliver: Callable[[Node, Node], None] | None = None) -> None:
    """Propagate ``seed`` (d loss / d root) to every variable leaf below ``root``.

    ``deliver(leaf, g)`` replaces :func:`accumulate` at the leaves (a checkpoint's
    recompute collects its inputs' gradients through sinks and delivers nothing).
    """
    if deliver is None:
        deliver = accumulate
    order = topo_order([root], grad_only=True)
    grads: dict[int, Node] = {id(root): seed}
    with no_grad():
        for node in reversed(order):
            g = grads.pop(id(node), None)
            if g is None:
                continue
            if node.op in ("variable", "input"):  # input: a traced argument
                deliver(node, g)
                continue
            if node.is_leaf:
                continue
            for inp, gi in zip(node.inputs, VJP[node.op](node, g)):
                if gi is None or not inp.requires_grad:
                    continue
                prev = grads.get(id(inp))
                grads[id(inp)] = gi if prev is None else _bin("add", prev, gi)
