"""Random programs over the public API, for the Hypothesis suite in test_fuzz_api.py.

A program is a list of :class:`Call` s over input tensors (``Ref("in", k)``) and
earlier results (``Ref("out", k)``). It is generated one call at a time while
it runs eagerly: each call's arguments are drawn from what the earlier calls
actually returned (their tags, sizes, dtypes), mostly valid, sometimes not
(``Gen.invalid`` > 0: a bad value, tag, dtype, context or a deinit'ed
tensor in one argument). :func:`replay` runs the same program again, eagerly
or inside ``fucina.compile``, on the same or on new inputs.

:func:`check_documented` is the contract for every exception that escapes:
a ``fucina.TensorError`` subclass or ``TagError``; a ``MemoryError``; or a
``TypeError``/``ValueError`` with a message that fucina raised itself (the
innermost frame is a ``raise`` in the package), plus Python's own operator
protocol message for operands no operator accepts.

Kernel compiles dominate the cost of a run, so the vocabulary is bounded:
four tags with sizes 1..4, a few dtypes, ranks 0..3.
"""

from __future__ import annotations

import dataclasses
import linecache
import math
import operator
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import fucina as F

TAGS = ("a", "b", "c", "d")
NEW_TAGS = ("e", "f")
FLOATS = ("f32", "f16", "bf16", "f64")
INTS = ("u8", "i32", "i64")
#: Input dtypes, f32 most often (it has the whole surface).
DTYPES = ("f32",) * 6 + ("f16", "bf16", "f64", "i32", "i64", "u8", "bool")

NAN, INF = float("nan"), float("inf")
SPECIAL_FLOATS = (NAN, INF, -INF, 0.0, -0.0, 1e30, -1e30, 1e-40, 88.0, -104.0, 65504.0)
#: Values an argument must refuse (never sizes a machine could actually allocate).
BAD_VALUES: tuple[Any, ...] = (
    None, True, "x", "", 2**70, -(2**70), -1, 0, 2**62, 1.5, NAN, INF, [], (), ("zz",),
    [1, "a"], {}, object(), np.int64(-3), np.float32(NAN), slice(None), 10**400,
    np.array([1, 2]), 3 + 4j,
)
PKG_DIR = os.path.dirname(F.__file__)
# Python's own operator-protocol messages: the answer to operands no operator accepts.
_PROTOCOL = ("unsupported operand type", "not supported between instances of",
             "bad operand type for", "does not support ufuncs", "can't multiply sequence")


# -- profiles -------------------------------------------------------------------------------

settings.register_profile(
    "fuzz-ci", deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
settings.register_profile(
    "fuzz-long", deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
#: FUCINA_FUZZ=long runs every test with ``FUCINA_FUZZ_SCALE`` (default 20) times the
#: CI example counts, randomized; the default profile is CI's (derandomized, fixed).
LONG = os.environ.get("FUCINA_FUZZ") == "long"
SCALE = int(os.environ.get("FUCINA_FUZZ_SCALE", "20")) if LONG else 1


def fuzz_settings(examples: int) -> settings:
    """Settings for one test: ``examples`` in CI, ``SCALE`` times more in a long run."""
    return settings(settings.get_profile("fuzz-long" if LONG else "fuzz-ci"),
                    max_examples=examples * SCALE)


# -- the contract for escaping exceptions ---------------------------------------------------


def _raised_by_fucina(exc: BaseException) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    if not os.path.abspath(filename).startswith(PKG_DIR + os.sep):
        return False
    return linecache.getline(filename, tb.tb_lineno).strip().startswith("raise")


def check_documented(exc: BaseException, what: str, operator_call: bool = False) -> None:
    """Fail unless ``exc`` is an exception the API documents (see the module docstring)."""
    if isinstance(exc, (F.TensorError, F.TagError)):
        if not str(exc).strip():
            raise AssertionError(f"{what}: {type(exc).__name__} with an empty message") from exc
        return
    if isinstance(exc, MemoryError):
        return
    if type(exc) is AttributeError and isinstance(exc.obj, F.Tensor) \
            and not exc.name.startswith("_"):
        return  # a method the tensor's dtype branch does not have (API.md section 1)
    if type(exc) in (TypeError, ValueError):
        msg = str(exc)
        if not msg.strip():
            raise AssertionError(f"{what}: {type(exc).__name__} with an empty message") from exc
        if _raised_by_fucina(exc):
            return
        if operator_call and type(exc) is TypeError and any(p in msg for p in _PROTOCOL):
            return
        raise AssertionError(
            f"{what}: {type(exc).__name__} not raised by fucina: {msg}") from exc
    raise AssertionError(f"{what}: undocumented {type(exc).__name__}: {exc}") from exc


# -- programs -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ref:
    """An input (``kind="in"``) or an earlier result (``"out"``) of a program."""

    kind: str
    index: int

    def __repr__(self) -> str:
        return f"{self.kind}{self.index}"


@dataclasses.dataclass
class Call:
    """``recv.method(*args, **kwargs)``; ``recv`` None: ``method`` is a root function,
    an operator (``"op:+"``) or a constructor (``"new:<dtype>:<tags>:<name>"``)."""

    method: str
    recv: Ref | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    host: bool = False  # reads values on the host: eager only

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        head = f"{self.recv!r}.{self.method}" if self.recv is not None else self.method
        return f"{head}({', '.join(parts)})"


@dataclasses.dataclass
class InputSpec:
    """How to build one input tensor (new shapes redraw ``shape``, keep the rest)."""

    dtype: str
    tags: tuple[str, ...]
    shape: tuple[int, ...]
    seed: int
    special: float  # fraction of special values (NaN, inf, extremes)
    layout: str  # "dense", "permuted" (a transposed view) or "narrowed" (an offset view)
    variable: bool
    ctx: int  # 0: the main context, 1: the second one
    index_range: int = 0  # >0: an index tensor with values in [0, index_range) mostly

    def __repr__(self) -> str:
        extra = "".join((f", {self.layout}" if self.layout != "dense" else "",
                         ", var" if self.variable else "", ", ctx2" if self.ctx else "",
                         f", idx<{self.index_range}" if self.index_range else ""))
        return (f"{self.dtype}{list(self.tags)}{list(self.shape)}(seed={self.seed}, "
                f"special={self.special}{extra})")


def host_values(spec: InputSpec) -> np.ndarray:
    """The input's values as a numpy array in logical shape (a pure function of spec)."""
    rng = np.random.default_rng(spec.seed)
    shape = spec.shape if spec.tags else (1,)
    n = math.prod(shape)
    if spec.dtype == "bool":
        return (rng.random(n) < 0.5).reshape(shape)
    if spec.dtype in INTS:
        if spec.index_range:
            vals = rng.integers(0, spec.index_range, n)
            odd = rng.random(n) < spec.special
            vals[odd] = rng.choice([-1, spec.index_range, 2**40], odd.sum())
            return vals.reshape(shape)
        info = np.iinfo(F.DType(spec.dtype).storage)
        lo = 0 if info.min == 0 else -4
        vals = rng.integers(lo, 9, n)
        odd = rng.random(n) < spec.special
        vals[odd] = rng.choice([info.min, info.max, 0, info.max // 2], odd.sum())
        return vals.astype(F.DType(spec.dtype).storage).reshape(shape)
    vals = rng.standard_normal(n) * rng.choice([1.0, 3.0, 50.0])
    odd = rng.random(n) < spec.special
    vals[odd] = rng.choice(SPECIAL_FLOATS, odd.sum())
    return vals.reshape(shape)


def build_input(spec: InputSpec, ctxs: list[F.ExecContext]) -> Any:
    """The input tensor for ``spec`` on ``ctxs[spec.ctx]``."""
    ctx = ctxs[spec.ctx]
    T = F.Tensor(tags=spec.tags, dtype=spec.dtype)
    vals = host_values(spec)
    if spec.layout == "permuted" and len(spec.tags) >= 2:
        rev = tuple(reversed(spec.tags))
        R = F.Tensor(tags=rev, dtype=spec.dtype)
        return R.from_numpy(ctx, np.ascontiguousarray(vals.transpose())).permute_to(spec.tags)
    if spec.layout == "narrowed" and spec.tags:
        wide = np.concatenate([vals, vals[:1]], axis=0)
        return T.from_numpy(ctx, wide).narrow(spec.tags[0], 1, spec.shape[0])
    if spec.variable:
        return T.variable_from_slice(ctx, spec.shape or (1,), vals.reshape(-1))
    if not spec.tags:
        return T.from_slice(ctx, (1,), vals.reshape(-1))
    return T.from_numpy(ctx, vals)


class MissingResult(Exception):
    """A call names a result the replay did not produce: the number of tensors a call
    returns (``unbind``, ``split``) depends on the input shapes, so a program drawn on
    one set of shapes need not apply to another. A harness condition, not an API error."""


def _resolve(v: Any, ins: list[Any], outs: list[Any]) -> Any:
    if isinstance(v, Ref):
        if v.kind == "in":
            return ins[v.index]
        if v.index >= len(outs):
            raise MissingResult(f"out{v.index} not produced (only {len(outs)} results)")
        return outs[v.index]
    if isinstance(v, tuple):
        return tuple(_resolve(u, ins, outs) for u in v)
    if isinstance(v, list):
        return [_resolve(u, ins, outs) for u in v]
    if isinstance(v, dict):
        return {k: _resolve(u, ins, outs) for k, u in v.items()}
    return v


OPERATORS: dict[str, Callable[..., Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge, "&": operator.and_,
    "|": operator.or_, "^": operator.xor, "neg": operator.neg, "abs": operator.abs,
    "~": operator.invert,
}


def run_call(call: Call, ins: list[Any], outs: list[Any], ctxs: list[F.ExecContext]) -> Any:
    """Execute one call; returns its result."""
    args = _resolve(call.args, ins, outs)
    kwargs = _resolve(call.kwargs, ins, outs)
    m = call.method
    if m.startswith("op:"):
        return OPERATORS[m[3:]](*args)
    if m.startswith("new:"):
        _, dtype, tags, name = m.split(":")
        T = F.Tensor(tags=tuple(t for t in tags.split(",") if t), dtype=dtype)
        return getattr(T, name)(ctxs[0], *args, **kwargs)
    if call.recv is None:
        return getattr(F, m)(*args, **kwargs)
    recv = _resolve(call.recv, ins, outs)
    return getattr(recv, m)(*args, **kwargs)


def tensors_of(result: Any) -> list[Any]:
    """The tensors a call returned (one, a list of them, or none)."""
    if isinstance(result, F.Tensor):
        return [result]
    if isinstance(result, (list, tuple)) and result and all(isinstance(r, F.Tensor)
                                                           for r in result):
        return list(result)
    return []


def replay(calls: list[Call], ins: list[Any], ctxs: list[F.ExecContext]) -> tuple[Any, ...]:
    """Run ``calls`` on ``ins``; returns every tensor they produced, in order."""
    outs: list[Any] = []
    for call in calls:
        outs.extend(tensors_of(run_call(call, ins, outs, ctxs)))
    return tuple(outs)


def compiled_program(calls: list[Call], ctxs: list[F.ExecContext]) -> Any:
    """``fucina.compile`` of the program as a function of its inputs."""

    def program(*ins: Any) -> tuple[Any, ...]:
        return replay(calls, list(ins), ctxs)

    return F.compile(program)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", value) or ("err", exception)."""
    try:
        return "ok", fn()
    except Exception as e:  # the caller checks what escaped
        return "err", e


def assert_same_tensors(eager: tuple[Any, ...], compiled: tuple[Any, ...], what: str) -> None:
    """Compiled results equal eager ones: types, shapes, flags, values (NaN where NaN)."""
    assert len(eager) == len(compiled), f"{what}: {len(eager)} vs {len(compiled)} results"
    for k, (e, c) in enumerate(zip(eager, compiled)):
        where = f"{what}: result {k}"
        assert type(e) is type(c), f"{where}: {type(e)!r} vs {type(c)!r}"
        assert e.shape == c.shape, f"{where}: shape {e.shape} vs {c.shape}"
        assert e.requires_grad == c.requires_grad, f"{where}: requires_grad differs"
        a, b = e.numpy(), c.numpy()
        dt = e.dtype
        if dt is F.bf16:
            a, b = _bf16(a), _bf16(b)
        elif dt.is_f8 or not (dt.is_float or dt is F.f16):
            np.testing.assert_array_equal(a, b, err_msg=where)
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(a64), np.isnan(b64), err_msg=where + " (NaN)")
        np.testing.assert_array_equal(np.isinf(a64) * np.sign(a64),
                                      np.isinf(b64) * np.sign(b64), err_msg=where + " (inf)")
        fin = np.isfinite(a64) & np.isfinite(b64)
        scale = float(np.abs(a64[fin]).max()) if fin.any() else 0.0
        tol = {F.f64: 1e-9, F.f32: 2e-5, F.f16: 2e-3, F.bf16: 1e-2}[dt]
        np.testing.assert_allclose(b64[fin], a64[fin], rtol=tol, atol=tol * (1.0 + scale),
                                   err_msg=where)


def _bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


# -- generation --------------------------------------------------------------------------------


def hypothesis_ints(data: Any) -> Callable[[int, int], int]:
    """Integers in [lo, hi] drawn from a Hypothesis ``st.data()`` object (shrinkable)."""
    return lambda lo, hi: data.draw(st.integers(lo, hi))


def seeded_ints(seed: int) -> Callable[[int, int], int]:
    """Integers from a seeded stream: replays a program by seed without Hypothesis."""
    import random

    rnd = random.Random(seed)
    return rnd.randint


class Gen:
    """Draws a program call by call, running each eagerly as it goes.

    ``invalid`` is the chance that a call gets one bad argument (or a dead receiver).
    """

    def __init__(self, ints: Callable[[int, int], int], ctxs: list[F.ExecContext],
                 invalid: float = 0.0, host: bool = False, max_inputs: int = 6):
        self.ints = ints
        self.ctxs = ctxs
        self.invalid = invalid
        self.host = host  # allow host-reading calls (eager-only programs)
        self.max_inputs = max_inputs
        self.sizes = {t: self.int(1, 4) for t in TAGS + NEW_TAGS}
        self.specs: list[InputSpec] = []
        self.ins: list[Any] = []
        self.outs: list[Any] = []
        self.calls: list[Call] = []

    # -- drawing helpers -----------------------------------------------------------------

    def chance(self, p: float) -> bool:
        """True with probability ``p`` (in percent steps)."""
        return self.int(0, 99) < int(p * 100)

    def pick(self, xs: Any) -> Any:
        xs = list(xs)
        return xs[self.int(0, len(xs) - 1)]

    def int(self, lo: int, hi: int) -> int:
        return self.ints(lo, hi)

    def real(self) -> float:
        if self.chance(0.15):
            return self.pick(SPECIAL_FLOATS)
        return self.pick((0.0, 0.5, -1.5, 2.0, 3.0, -0.25, 1e-3, 7.0))

    def value(self, ref: Ref) -> Any:
        return self.ins[ref.index] if ref.kind == "in" else self.outs[ref.index]

    def tag_of(self, x: Any) -> str:
        if not x.axis_tags or self.chance(0.03):
            return self.pick(TAGS + NEW_TAGS)  # a tag the tensor lacks: TagError
        return self.pick(x.axis_tags)

    def fresh_tag(self, x: Any) -> str:
        free = [t for t in TAGS + NEW_TAGS if t not in x.axis_tags]
        return self.pick(free) if free and not self.chance(0.03) else self.pick(TAGS)

    def perm(self, tags: tuple[str, ...]) -> tuple[str, ...]:
        order = list(tags)
        for i in range(len(order) - 1, 0, -1):
            j = self.int(0, i)
            order[i], order[j] = order[j], order[i]
        return tuple(order)

    def subset(self, tags: tuple[str, ...], min_size: int = 0) -> tuple[str, ...]:
        out = tuple(t for t in tags if self.chance(0.6))
        if len(out) < min_size:
            out = tuple(tags[:min_size])
        return out

    # -- inputs --------------------------------------------------------------------------

    def new_input(self, dtype: str, tags: tuple[str, ...], sizes: dict[str, int] | None = None,
                  index_range: int = 0, ctx: int = 0) -> Ref:
        tags = tuple(dict.fromkeys(tags))  # a generator may repeat a tag: inputs stay valid
        sizes = dict(self.sizes, **(sizes or {}))
        if self.ctxs[ctx].closed:
            ctx = 0
        if self.chance(0.04) and tags:  # a size the others do not share: ShapeMismatch
            sizes[self.pick(tags)] = self.int(1, 5)
        variable = dtype in ("f32", "f16", "bf16") and not index_range and self.chance(0.12)
        layout = "dense"
        if len(tags) >= 2 and self.chance(0.15):
            layout = "permuted"
        elif tags and self.chance(0.1):
            layout = "narrowed"
        if variable:
            layout = "dense"
        spec = InputSpec(dtype, tuple(tags), tuple(sizes[t] for t in tags),
                         self.int(0, 2**20), self.pick((0.0, 0.0, 0.1, 0.3)), layout, variable,
                         ctx, index_range)
        self.specs.append(spec)
        self.ins.append(build_input(spec, self.ctxs))
        return Ref("in", len(self.ins) - 1)

    def random_input(self) -> Ref:
        dtype = self.pick(DTYPES)
        rank = self.pick((0, 1, 2, 2, 2, 3, 3))
        tags = self.perm(TAGS)[:rank]
        return self.new_input(dtype, tags)

    def pool(self) -> list[Ref]:
        refs = [Ref("in", k) for k in range(len(self.ins))]
        refs += [Ref("out", k) for k in range(len(self.outs))]
        return [r for r in refs if alive(self.value(r))]

    def receiver(self) -> Ref:
        live = self.pool()
        if not live or (len(self.ins) < self.max_inputs and self.chance(0.2)):
            return self.random_input()
        return self.pick(live)

    def partner(self, x: Any, tags: tuple[str, ...] | None = None, dtype: str | None = None,
                **kw: Any) -> Ref:
        """A tensor with ``tags`` (default: a reordered subset of x's plus maybe a new
        tag), x's sizes on shared tags and x's dtype: an existing one when it fits."""
        if tags is None:
            tags = self.perm(self.subset(x.axis_tags))
            new = self.fresh_tag(x)
            if len(tags) < 3 and new not in tags and self.chance(0.2):
                tags = tags + (new,)
        dtype = dtype or x.dtype.value
        if self.chance(0.04):  # a dtype that does not match
            dtype = self.pick(DTYPES)
        sizes = dict(zip(x.axis_tags, x.shape)) if x.axis_tags else {}
        for r in self.pool():
            v = self.value(r)
            if (v.dtype.value == dtype and v.axis_tags == tags and v._ctx is x._ctx
                    and all(sizes.get(t, d) == d for t, d in zip(tags, v.shape))
                    and self.chance(0.5)):
                return r
        ctx = 1 if self.chance(0.03) else 0  # another context: ContextMismatch
        return self.new_input(dtype, tags, sizes, ctx=ctx, **kw)

    def index_tensor(self, x: Any, tag: str, tags: tuple[str, ...] | None = None,
                     free_size: bool = True) -> Ref:
        """An i64 tensor over ``tags`` (default x's, reordered) with values mostly in
        [0, x.dim(tag))."""
        dim = x.dim(tag) if tag in x.axis_tags else 2
        tags = self.perm(x.axis_tags) if tags is None else tags
        sizes = dict(zip(x.axis_tags, x.shape))
        if free_size and tag in sizes:
            sizes[tag] = self.int(1, 4)
        return self.new_input("i64", tags, sizes, index_range=dim)

    # -- one call --------------------------------------------------------------------------

    def accept(self, call: Call, res: Any) -> None:
        """Keep a successful call and its tensors."""
        self.calls.append(call)
        self.outs.extend(tensors_of(res))

    def mutate(self, call: Call, x: Any, recv: Ref) -> Call:
        """One bad argument, a dead receiver, or a receiver from a closed context."""
        kind = self.pick(("arg", "arg", "arg", "tensor", "dead"))
        slots = [("a", k) for k in range(len(call.args))] + [("k", k) for k in call.kwargs]
        if operator_call(call):  # tensor <op> value: the value or the tensor goes bad
            if len(call.args) != 2 or call.args[0] != recv:
                return call
            slots = [("a", 1)]
        if kind == "dead" or not slots:
            dead = self.new_input(x.dtype.value, x.axis_tags, dict(zip(x.axis_tags, x.shape)))
            if self.chance(0.5):
                self.value(dead).deinit()
            else:
                closed = F.ExecContext()
                self.ctxs.append(closed)
                spec = dataclasses.replace(self.specs[-1], ctx=len(self.ctxs) - 1)
                self.specs[-1] = spec
                self.ins[-1] = build_input(spec, self.ctxs)
                closed.deinit()
            if call.recv is not None:
                return dataclasses.replace(call, recv=dead)
            return dataclasses.replace(call, args=tuple(dead if a == recv else a
                                                        for a in call.args))
        if kind == "tensor":
            bad: Any = self.bad_tensor(x)
        else:
            bad = self.pick(BAD_VALUES)
        where, key = self.pick(slots)
        if where == "a":
            args = list(call.args)
            args[key] = bad
            return dataclasses.replace(call, args=tuple(args))
        return dataclasses.replace(call, kwargs=dict(call.kwargs, **{key: bad}))

    def bad_tensor(self, x: Any) -> Ref:
        """A tensor that should not fit: other dtype or tags, deinit'ed, other context."""
        how = self.pick(("dtype", "tags", "dead", "ctx"))
        tags = x.axis_tags
        sizes = dict(zip(tags, x.shape))
        if how == "dtype":
            return self.new_input(self.pick(DTYPES), tags, sizes)
        if how == "tags":
            return self.new_input(x.dtype.value, self.perm(TAGS)[:self.int(0, 3)], sizes)
        ref = self.new_input(x.dtype.value, tags, sizes, ctx=1 if how == "ctx" else 0)
        if how == "dead":
            self.value(ref).deinit()
        return ref


def alive(x: Any) -> bool:
    """Not deinit'ed and its context open."""
    return x._node_ is not None and not x._ctx.closed


def _has(x: Any, name: str) -> bool:
    if name.startswith("op:") or name.startswith("new:"):
        return OPS[name].applies(x)
    if OPS[name].root:
        return OPS[name].applies(x)
    return hasattr(type(x), name) and OPS[name].applies(x)


# -- the op catalogue ----------------------------------------------------------------------------


@dataclasses.dataclass
class Op:
    """How to draw arguments for one API entry point, given its receiver."""

    gen: Callable[[Gen, Any], tuple[list[Any], dict[str, Any]]]
    host: bool = False  # reads values on the host (eager-only programs)
    root: bool = False  # a root function taking the receiver first
    applies: Callable[[Any], bool] = lambda x: True


OPS: dict[str, Op] = {}


def op(*names: str, host: bool = False, root: bool = False,
       applies: Callable[[Any], bool] = lambda x: True) -> Callable[..., Any]:
    def deco(fn: Callable[[Gen, Any], tuple[list[Any], dict[str, Any]]]) -> Any:
        for n in names:
            OPS[n] = Op(fn, host, root, applies)
        return fn
    return deco


def _none(g: Gen, x: Any) -> tuple[list[Any], dict[str, Any]]:
    return [], {}


op("relu", "exp", "sqrt", "rsqrt", "sigmoid", "silu", "log", "log1p", "abs", "sin", "cos",
   "tanh", "fast_tanh", "softcap30", "softcap15", "gelu", "quick_gelu", "elu", "gelu_erf",
   "floor", "ceil", "round", "sign", "reciprocal", "neg", "isnan", "isinf", "isfinite",
   "logical_not", "materialize", "contiguous", "detach", "sum_all", "any_all", "all_all",
   "op:neg", "op:abs", "op:~")(_none)
op("item", "numpy", "nonzero", "data_const", host=True)(_none)


@op("unary")
def _unary(g: Gen, x: Any) -> Any:
    from fucina.kernels.elementwise import PUBLIC_UNARY
    return [g.pick(PUBLIC_UNARY + ("tan",))], {}


@op("leaky_relu", "scale", "add_scalar", "sub_scalar", "div_scalar", "pow_scalar",
    "clamp_min", "clamp_max", "full_like")
def _one_real(g: Gen, x: Any) -> Any:
    return [g.real()], {}


@op("clamp")
def _clamp(g: Gen, x: Any) -> Any:
    lo = None if g.chance(0.2) else g.real()
    hi = None if g.chance(0.2) else g.real()
    if lo is not None and hi is not None and lo > hi and g.chance(0.8):
        lo, hi = hi, lo
    return [lo, hi], {}


@op("dropout")
def _dropout(g: Gen, x: Any) -> Any:
    return [g.pick((0.0, 0.25, 0.5, 0.9)), g.int(0, 2**64)], {}


@op("to")
def _to(g: Gen, x: Any) -> Any:
    return [g.pick(FLOATS + INTS + ("bool", "f8_e4m3", "f8_e5m2"))], {}


@op("add", "sub", "mul", "div", "maximum", "minimum", "pow", "div_trunc", "div_floor", "rem",
    "mod", "bit_and", "bit_or", "bit_xor")
def _binary(g: Gen, x: Any) -> Any:
    return [g.partner(x)], {}


@op("logical_and", "logical_or", "logical_xor")
def _logical(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags), g.pick((x.dtype.value, "bool")))], {}


_CMPS = ("eq", "ne", "lt", "le", "gt", "ge")


@op("compare")
def _compare(g: Gen, x: Any) -> Any:
    if g.chance(0.5):
        v: Any = g.real() if x.dtype.is_float else g.pick((0, 3, -1, 255, 2**70, 2.5, NAN))
    else:
        v = g.partner(x, g.perm(x.axis_tags))
    return [g.pick(_CMPS), v], {}


_BINOPS = ("+", "-", "*", "/", "//", "%", "**", "<", "<=", ">", ">=", "&", "|", "^")


def _operator_gen(g: Gen, x: Any) -> Any:
    raise AssertionError("operators are drawn by _operator")


for _o in _BINOPS:
    OPS[f"op:{_o}"] = Op(_operator_gen)


@op("where")
def _where(g: Gen, x: Any) -> Any:
    cond = g.partner(x, g.perm(x.axis_tags), g.pick(("bool", "bool", x.dtype.value)))
    return [cond, g.partner(x, g.perm(x.axis_tags))], {}


@op("masked_fill")
def _masked_fill(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags), "bool"), g.real()], {}


@op("sum", "mean", "max", "min")
def _masked_reduce(g: Gen, x: Any) -> Any:
    kw: dict[str, Any] = {}
    if g.chance(0.3):
        kw["mask"] = g.partner(x, g.perm(x.axis_tags), "bool")
        if g.chance(0.4):
            kw["empty"] = g.real()
    return [g.tag_of(x)], kw


@op("prod", "logsumexp", "cumsum", "cumprod", "argmax", "any", "all", "log_softmax", "flip",
    "unbind")
def _one_tag(g: Gen, x: Any) -> Any:
    return [g.tag_of(x)], {}


@op("variance")
def _variance(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.pick((0, 1))], {}


@op("norm")
def _norm(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.pick(("l1", "l2", "inf", 2, 1, math.inf))], {}


@op("norm_all")
def _norm_all(g: Gen, x: Any) -> Any:
    return [g.pick(("l1", "l2", "inf"))], {}


@op("sum_many")
def _sum_many(g: Gen, x: Any) -> Any:
    return [g.perm(g.subset(x.axis_tags, 1))], {}


@op("softmax")
def _softmax(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    scale = g.pick((None, None, 0.5, 2.0))
    mask = None
    if g.chance(0.25):
        mask = g.partner(x, g.perm(g.subset(x.axis_tags)))
    return [tag, scale, mask], {}


@op("permute_to", "transpose")
def _permute(g: Gen, x: Any) -> Any:
    return [g.perm(x.axis_tags)], {}


@op("align_to")
def _align(g: Gen, x: Any) -> Any:
    tags = x.axis_tags + tuple(t for t in TAGS if t not in x.axis_tags and g.chance(0.3))
    return [g.perm(tags)], {}


@op("with_tags")
def _with_tags(g: Gen, x: Any) -> Any:
    return [g.perm(TAGS + NEW_TAGS)[:x.tag_count]], {}


@op("insert_axis")
def _insert_axis(g: Gen, x: Any) -> Any:
    return [g.fresh_tag(x), g.int(0, x.tag_count)], {}


@op("squeeze")
def _squeeze(g: Gen, x: Any) -> Any:
    ones = [t for t, d in zip(x.axis_tags, x.shape) if d == 1]
    return [g.pick(ones) if ones and g.chance(0.8) else g.tag_of(x)], {}


@op("broadcast_to")
def _broadcast(g: Gen, x: Any) -> Any:
    tags = g.perm(x.axis_tags + tuple(t for t in TAGS if t not in x.axis_tags
                                      and g.chance(0.4)))
    have = dict(zip(x.axis_tags, x.shape))
    shape = tuple(g.sizes[t] if have.get(t, 1) == 1 else have[t] for t in tags)
    return [tags, shape], {}


def _window(g: Gen, dim: int) -> tuple[int, int]:
    start = g.int(0, dim - 1) if dim > 1 else 0
    length = g.int(1, dim - start)
    if g.chance(0.05):
        start, length = g.pick(((dim, 1), (-1, 1), (0, dim + 1), (0, 0)))
    return start, length


@op("narrow")
def _narrow(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    start, length = _window(g, x.dim(tag) if tag in x.axis_tags else 1)
    return [tag, start, length], {}


@op("zero_slice")
def _zero_slice(g: Gen, x: Any) -> Any:
    return _narrow(g, x)


@op("select")
def _select(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 1
    return [tag, g.int(-dim - 1, dim)], {}


@op("slice_step")
def _slice_step(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 1
    step = g.int(1, 3)
    start = g.int(0, dim - 1)
    length = max(1, (dim - 1 - start) // step + 1 - g.int(0, 1))
    return [tag, start, length, step], {}


@op("slice")
def _slice(g: Gen, x: Any) -> Any:
    kw: dict[str, Any] = {}
    for t in g.subset(x.axis_tags, 1) if x.axis_tags else ():
        lo = g.pick((None, 0, 1, -1, -3))
        hi = g.pick((None, -1, 2, 4, 9))
        step = g.pick((None, 1, 2))
        kw[t] = slice(lo, hi, step) if g.chance(0.7) else F.SliceRange(lo, hi, step)
    return [], kw


def _factor(g: Gen, n: int) -> tuple[int, int]:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    d = g.pick(divs)
    return d, n // d


@op("split")
def _split(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 2
    parts = tuple(t for t in NEW_TAGS if t not in x.axis_tags) or ("e", "f")
    return [tag, parts, _factor(g, dim)], {}


@op("merge")
def _merge(g: Gen, x: Any) -> Any:
    tags = x.axis_tags
    if len(tags) >= 2:
        i = g.int(0, len(tags) - 2)
        run = tags[i:i + g.int(2, len(tags) - i)]
    else:
        run = tags or ("a",)
    return [g.fresh_tag(x) if g.chance(0.9) else run[0], run], {}


@op("view_with_strides")
def _view_with_strides(g: Gen, x: Any) -> Any:
    n = x.size
    rank = g.int(1, 2)
    tags = g.perm(NEW_TAGS)[:rank]
    if rank == 1:
        shape: tuple[int, ...] = (g.int(1, n),)
        strides: tuple[int, ...] = (g.pick((0, 1, 1, 2)),)
    else:
        shape = (g.int(1, 3), g.int(1, 3))
        strides = (g.pick((0, 1, 2, 3)), g.pick((0, 1)))
    if g.chance(0.05):
        strides = (10**9,) + strides[1:]
    return [tags, shape, strides], {}


@op("diagonal")
def _diagonal(g: Gen, x: Any) -> Any:
    a = g.tag_of(x)
    b = g.pick([t for t in x.axis_tags if t != a] or [a])
    return [a, b, g.fresh_tag(x)], {}


@op("trace")
def _trace(g: Gen, x: Any) -> Any:
    a = g.tag_of(x)
    return [a, g.pick([t for t in x.axis_tags if t != a] or [a])], {}


@op("gather")
def _gather(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 2
    if g.chance(0.4):
        idx: Any = g.index_tensor(x, tag, (g.fresh_tag(x),))
    else:
        idx = [g.int(0, dim - 1) for _ in range(g.int(1, 4))]
        if g.chance(0.08):
            idx[0] = g.pick((-1, dim, 2**63 - 1))
    return [tag, idx, g.fresh_tag(x)], {}


@op("index_select")
def _index_select(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    return [tag, g.index_tensor(x, tag, (g.fresh_tag(x),)), g.fresh_tag(x)], {}


@op("take_along_axis")
def _take_along(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    return [tag, g.index_tensor(x, tag)], {}


@op("scatter", "scatter_add")
def _scatter(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    idx = g.index_tensor(x, tag, x.axis_tags)
    sizes = dict(zip(x.axis_tags, g.value(idx).shape))
    src = g.new_input(x.dtype.value, x.axis_tags, sizes)
    return [tag, idx, src], {}


def _rows(g: Gen, dim: int, unique: bool) -> list[int]:
    rows = [g.int(0, dim - 1) for _ in range(g.int(1, dim))]
    if unique:
        rows = list(dict.fromkeys(rows))
    if g.chance(0.05):
        rows[0] = g.pick((-1, dim))
    return rows


def _row_index(g: Gen, x: Any, tag: str, dim: int, unique: bool) -> tuple[Any, int]:
    """Rows along ``tag`` as a host list or (sometimes) a rank-1 i64 tensor; and their count."""
    if g.chance(0.35):
        n, fresh = g.int(1, 4), g.fresh_tag(x)
        return g.new_input("i64", (fresh,), {fresh: n}, index_range=max(dim, 1)), n
    rows = _rows(g, dim, unique)
    return rows, len(rows)


@op("set_rows", "index_add")
def _set_rows(g: Gen, x: Any, unique: bool = True) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 1
    rows, n = _row_index(g, x, tag, dim, unique)
    sizes = dict(zip(x.axis_tags, x.shape), **{tag: n})
    return [tag, rows, g.new_input(x.dtype.value, x.axis_tags, sizes)], {}


@op("zero_rows")
def _zero_rows(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    return [tag, _row_index(g, x, tag, x.dim(tag) if tag in x.axis_tags else 1, False)[0]], {}


@op("set_slice")
def _set_slice(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 1
    start, length = _window(g, dim)
    sizes = dict(zip(x.axis_tags, x.shape), **{tag: max(length, 1)})
    return [tag, start, g.new_input(x.dtype.value, x.axis_tags, sizes)], {}


@op("masked_select", host=True)
def _masked_select(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags), "bool"), g.fresh_tag(x)], {}


@op("masked_scatter", host=True)
def _masked_scatter(g: Gen, x: Any) -> Any:
    mask = g.partner(x, g.perm(x.axis_tags), "bool")
    count = int(np.count_nonzero(g.value(mask).numpy())) if g.value(mask)._node_ else 1
    vt = g.fresh_tag(x)
    return [mask, vt, g.new_input(x.dtype.value, (vt,), {vt: max(count, 1)})], {}


@op("concat")
def _concat(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    others = []
    for _ in range(g.int(0, 2)):
        sizes = dict(zip(x.axis_tags, x.shape))
        if tag in sizes:
            sizes[tag] = g.int(1, 3)
        others.append(g.new_input(x.dtype.value, x.axis_tags, sizes))
    return [tag, others], {}


@op("stack")
def _stack(g: Gen, x: Any) -> Any:
    others = [g.partner(x, x.axis_tags) for _ in range(g.int(0, 2))]
    return [g.fresh_tag(x), g.int(0, x.tag_count), others], {}


@op("reshape")
def _reshape(g: Gen, x: Any) -> Any:
    n = x.size
    if g.chance(0.5):
        return [(g.pick(NEW_TAGS),), (n,)], {}
    a, b = _factor(g, n)
    return [g.perm(NEW_TAGS), (a, b)], {}


@op("flatten")
def _flatten(g: Gen, x: Any) -> Any:
    return [g.fresh_tag(x)], {}


@op("roll")
def _roll(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.pick((0, 1, -1, 3, 2**70, -(2**63)))], {}


@op("repeat_axis")
def _repeat(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.int(1, 3)], {}


@op("pad")
def _pad(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.int(0, 2), g.int(0, 2), g.real()], {}


@op("zero_pad2d", "constant_pad2d")
def _pad2d(g: Gen, x: Any) -> Any:
    h = g.tag_of(x)
    w = g.pick([t for t in x.axis_tags if t != h] or [h])
    pad: Any = g.int(0, 1) if g.chance(0.3) else tuple(g.int(-1, 2) for _ in range(4))
    return [h, w, pad], {}


OPS["constant_pad2d"] = Op(lambda g, x: ((_pad2d(g, x)[0] + [g.real()]), {}))


@op("roll_by", "shift_by")
def _roll_by(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 1
    sections = x.size // dim
    if g.chance(0.35):  # offsets as a traced i64 tensor
        fresh = g.fresh_tag(x)
        return [tag, g.new_input("i64", (fresh,), {fresh: sections}, index_range=2 * dim + 1)], {}
    return [tag, [g.int(-5, 5) for _ in range(sections)]], {}


@op("diag", applies=lambda x: x.tag_count == 1)
def _diag(g: Gen, x: Any) -> Any:
    return [(g.fresh_tag(x), g.pick(NEW_TAGS))], {}


@op("diag_embed")
def _diag_embed(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), tuple(t for t in NEW_TAGS if t not in x.axis_tags)], {}


@op("band_part")
def _band_part(g: Gen, x: Any) -> Any:
    a, b = _diagonal(g, x)[0][:2]
    return [a, b, g.pick((None, 0, 1, -1)), g.pick((None, 0, 2))], {}


@op("tril", "triu")
def _tri(g: Gen, x: Any) -> Any:
    a, b = _diagonal(g, x)[0][:2]
    return [a, b, g.int(-2, 2)], {}


@op("dot")
def _dot(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    tags = (tag,) + tuple(t for t in TAGS + NEW_TAGS if t != tag and g.chance(0.3))[:2]
    dt = x.dtype.value
    if dt == "f32" and g.chance(0.15):
        dt = g.pick(("f16", "bf16"))
    return [g.partner(x, g.perm(tags), dt), tag], {}


@op("einsum")
def _einsum(g: Gen, x: Any) -> Any:
    other = g.partner(x)
    both = tuple(dict.fromkeys(x.axis_tags + g.value(other).axis_tags))
    return [other, g.perm(g.subset(both))], {}


@op("einsum_many", root=True)
def _einsum_many(g: Gen, x: Any) -> Any:
    return [], {}


@op("matmul", applies=lambda x: x.tag_count >= 2)
def _matmul(g: Gen, x: Any) -> Any:
    kind = g.pick(("plain", "trans_b", "trans_a"))
    m, k = x.axis_tags[-2:]
    n = g.fresh_tag(x)
    batch = x.axis_tags[:-2]
    sizes = dict(zip(x.axis_tags, x.shape))
    if kind == "trans_a":
        k, m = m, k
    if kind == "trans_b":
        other_tags = batch + (n, k)
    else:
        other_tags = batch + (k, n)
    other = g.new_input("f32", other_tags, sizes)
    return [other, kind, batch + (m, n)], {}


@op("add_dot", applies=lambda x: x.tag_count == 2)
def _add_dot(g: Gen, x: Any) -> Any:
    r, c = x.axis_tags
    k = g.fresh_tag(x)
    sizes = dict(zip(x.axis_tags, x.shape))
    return [g.new_input("f32", (r, k), sizes), g.new_input("f32", (k, c), sizes), k], {}


@op("cross_entropy", applies=lambda x: x.tag_count >= 1)
def _cross_entropy(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    rest = tuple(t for t in x.axis_tags if t != tag)
    dim = x.dim(tag) if tag in x.axis_tags else 2
    if g.chance(0.5):
        labels: Any = g.new_input("i64", g.perm(rest), dict(zip(x.axis_tags, x.shape)),
                                  index_range=dim)
    else:
        n = math.prod(d for t, d in zip(x.axis_tags, x.shape) if t != tag)
        labels = [g.int(0, dim - 1) for _ in range(n)]
    kw: dict[str, Any] = {"reduction": g.pick(("mean", "sum", "none"))}
    if g.chance(0.3):
        kw["ignore_index"] = g.int(0, dim - 1)
    if g.chance(0.3):
        kw["label_smoothing"] = g.pick((0.1, 0.5))
    return [tag, labels], kw


@op("argsort", "sort")
def _sort(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.chance(0.5)], {}


@op("top_k")
def _top_k(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 2
    return [tag, g.int(1, dim) if g.chance(0.9) else g.pick((0, dim + 1)), g.fresh_tag(x)], {}


def _vector(g: Gen, x: Any, tag: str) -> Ref:
    """A vector over ``tag`` sized as x's axis (a weight or bias)."""
    return g.partner(x, (tag,))


@op("layer_norm")
def _layer_norm(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    kw: dict[str, Any] = {}
    if g.chance(0.4):
        kw["weight"] = _vector(g, x, tag)
    if g.chance(0.3):
        kw["bias"] = _vector(g, x, tag)
    return [tag, g.pick((1e-5, 0.0, 1.0))], kw


@op("rms_norm", "l2_normalize")
def _rms_norm(g: Gen, x: Any) -> Any:
    return [g.tag_of(x), g.pick((1e-6, 0.0, 0.5))], {}


@op("rms_norm_mul")
def _rms_norm_mul(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    return [tag, _vector(g, x, tag), g.pick((1e-6, 0.0))], {}


@op("rms_norm_mul_add")
def _rms_norm_mul_add(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    return [tag, _vector(g, x, tag), g.partner(x, x.axis_tags), g.pick((1e-6, 0.0))], {}


@op("group_norm")
def _group_norm(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 2
    groups = g.pick([d for d in range(1, dim + 1) if dim % d == 0] + [dim + 1])
    w = _vector(g, x, tag) if g.chance(0.3) else None
    b = _vector(g, x, tag) if w is not None and g.chance(0.5) else None
    return [tag, groups, g.pick((1e-5, 0.0)), w, b], {}


@op("standardize_axis")
def _standardize(g: Gen, x: Any) -> Any:
    return [g.tag_of(x)], {"ddof": g.pick((0, 1)), "eps": g.pick((0.0, 1e-5))}


@op("mse_loss", "huber_loss", "kl_div_loss", "bce_loss")
def _pointwise_loss(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags))], {"reduction": g.pick(("mean", "sum", "none"))}


@op("nll_loss", applies=lambda x: x.tag_count >= 1)
def _nll_loss(g: Gen, x: Any) -> Any:
    tag, labels = _cross_entropy(g, x)[0]
    return [tag, labels], {"reduction": g.pick(("mean", "sum", "none"))}


@op("cosine_similarity")
def _cosine(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags)), g.tag_of(x)], {}


@op("segment_sum")
def _segment_sum(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    dim = x.dim(tag) if tag in x.axis_tags else 1
    cuts = sorted(g.int(0, dim) for _ in range(g.int(0, 2)))
    offsets = [0] + cuts + [dim]
    if g.chance(0.08):
        offsets[g.int(0, len(offsets) - 1)] = g.pick((-1, dim + 1))
    if g.chance(0.3):
        fresh = g.fresh_tag(x)
        ref = g.new_input("i64", (fresh,), {fresh: len(offsets)}, index_range=dim + 1)
        return [tag, ref], {}
    return [tag, offsets], {}


@op("glu", "geglu", "swiglu", "situ")
def _gated_pair(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags))], {}


@op("gated")
def _gated(g: Gen, x: Any) -> Any:
    return [g.partner(x, g.perm(x.axis_tags)), g.pick(("glu", "geglu", "swiglu", "reglu"))], {}


@op("split_gated")
def _split_gated(g: Gen, x: Any) -> Any:
    return [g.pick(("glu", "geglu", "swiglu")), g.tag_of(x), g.fresh_tag(x)], {}


@op("bias_add")
def _bias_add(g: Gen, x: Any) -> Any:
    tag = g.tag_of(x)
    return [_vector(g, x, tag), tag], {}


@op("linear_recurrence")
def _linear_recurrence(g: Gen, x: Any) -> Any:
    kw: dict[str, Any] = {}
    tag = g.tag_of(x)
    if g.chance(0.3):
        kw["initial"] = g.partner(x, tuple(t for t in x.axis_tags if t != tag))
    return [tag, g.partner(x, x.axis_tags)], kw


@op("multinomial", applies=lambda x: 1 <= x.tag_count <= 2)
def _multinomial(g: Gen, x: Any) -> Any:
    tag = x.axis_tags[-1] if g.chance(0.9) else g.tag_of(x)
    return [tag, g.fresh_tag(x), g.int(1, 3), g.int(0, 99), g.chance(0.5)], {}


def _pair_arg(g: Gen, values: tuple[Any, ...]) -> Any:
    return g.pick(values + ((1, 2), (2, 1)))


def _window_args(g: Gen) -> list[Any]:
    return [_pair_arg(g, (1, 2, 3)), _pair_arg(g, (1, 2)), _pair_arg(g, (0, 1))]


def _free_tags(g: Gen, x: Any, keep: int, n: int) -> tuple[str, ...]:
    """``n`` tags for a result that keeps x's first ``keep`` tags (none of those)."""
    lead = x.axis_tags[:keep]
    return g.perm(tuple(t for t in TAGS + NEW_TAGS if t not in lead))[:n]


@op("max_pool2d", "avg_pool2d", applies=lambda x: x.tag_count >= 3)
def _pool(g: Gen, x: Any) -> Any:
    return _window_args(g), {}


op("upsample2x_nearest", applies=lambda x: x.tag_count >= 3)(_none)


@op("unfold", applies=lambda x: x.tag_count >= 3)
def _unfold(g: Gen, x: Any) -> Any:
    return _window_args(g) + [_free_tags(g, x, x.tag_count - 3, 2)], {}


@op("conv2d", "conv2d_relu", applies=lambda x: x.tag_count >= 3)
def _conv2d(g: Gen, x: Any) -> Any:
    c = x.shape[-1]
    groups = g.pick([d for d in (1, 2, c) if c % d == 0])
    cout = groups * g.int(1, 2)
    wtags = g.perm(TAGS)
    weight = g.new_input("f32", wtags, dict(zip(wtags, (cout, g.int(1, 3), g.int(1, 3),
                                                       c // groups))))
    bias = g.new_input("f32", ("e",), {"e": cout}) if g.chance(0.4) else None
    return [weight, bias, _pair_arg(g, (1, 2)), _pair_arg(g, (0, 1)), groups,
            _free_tags(g, x, x.tag_count - 3, 3)], {}


def _conv1d_tags(g: Gen, x: Any) -> tuple[str, str, str, str]:
    time, chan = x.axis_tags[-2:]
    tap, out = [t for t in NEW_TAGS + TAGS if t not in x.axis_tags[:-1]][:2]
    return time, chan, tap, out


@op("conv1d", applies=lambda x: x.tag_count >= 2)
def _conv1d(g: Gen, x: Any) -> Any:
    time, chan, tap, out = _conv1d_tags(g, x)
    cin = x.shape[-1]
    groups = g.pick([d for d in (1, 2, cin) if cin % d == 0])
    weight = g.new_input("f32", (tap, chan, out), {tap: g.int(1, 3), chan: cin // groups,
                                                   out: groups * g.int(1, 2)})
    return [time, chan, tap, out, weight], {"stride": g.int(1, 2), "padding": g.int(0, 2),
                                           "dilation": g.int(1, 2), "groups": groups}


@op("causal_conv1d", applies=lambda x: x.tag_count >= 2)
def _causal_conv1d(g: Gen, x: Any) -> Any:
    time, chan, tap, out = _conv1d_tags(g, x)
    weight = g.new_input("f32", (tap, chan, out), {tap: g.int(1, 3), chan: x.shape[-1],
                                                   out: g.int(1, 3)})
    return [time, chan, tap, out, weight], {"dilation": g.int(1, 2)}


@op("causal_depthwise_conv1d", applies=lambda x: x.tag_count >= 2)
def _depthwise_conv1d(g: Gen, x: Any) -> Any:
    time, chan, tap, _ = _conv1d_tags(g, x)
    kernel = g.new_input("f32", (chan, tap), {chan: x.shape[-1], tap: g.int(1, 3)})
    return [time, chan, tap, kernel], {"dilation": g.int(1, 2)}


@op("channel_affine", applies=lambda x: x.tag_count >= 1)
def _channel_affine(g: Gen, x: Any) -> Any:
    c = x.axis_tags[-1]
    return [_vector(g, x, c), _vector(g, x, c)], {}


@op("prelu", applies=lambda x: x.tag_count >= 1)
def _prelu(g: Gen, x: Any) -> Any:
    return [_vector(g, x, x.axis_tags[-1])], {}


@op("snake")
def _snake(g: Gen, x: Any) -> Any:
    c = g.tag_of(x)
    return [c, _vector(g, x, c), _vector(g, x, c)], {}


@op("rope", applies=lambda x: x.tag_count >= 2)
def _rope(g: Gen, x: Any) -> Any:
    pos, feat = g.perm(x.axis_tags)[:2]
    n = x.dim(pos)
    if g.chance(0.4):
        fresh = g.fresh_tag(x)
        positions: Any = g.new_input("i64", (fresh,), {fresh: n}, index_range=8)
    else:
        positions = [g.int(0, 7) for _ in range(n)]
    source = {"positions": positions, "theta_base": g.pick((10000.0, 2.0))}
    return [pos, feat, source, g.pick(("half", "interleaved"))], {}


def _draw_operator(g: Gen, x: Any, recv: Ref, name: str) -> Call:
    sym = name[3:]
    if sym in ("neg", "abs", "~"):
        return Call(name, None, (recv,), {})
    if g.chance(0.4):
        rhs: Any = g.real() if x.dtype.is_float else g.pick((1, 2, -1))
        if g.chance(0.4):
            return Call(name, None, (rhs, recv), {})  # the reflected form
        return Call(name, None, (recv, rhs), {})
    if sym in ("<", "<=", ">", ">="):
        rhs = g.partner(x, g.perm(x.axis_tags))
    elif sym in ("&", "|", "^") and x.dtype is F.bool_:
        rhs = g.partner(x, g.perm(x.axis_tags))
    else:
        rhs = g.partner(x)
    return Call(name, None, (recv, rhs), {})


def draw_call(g: Gen) -> tuple[Call, str, Any]:
    """One call of any kind (ops, operators, root functions), run eagerly."""
    recv = g.receiver()
    x = g.value(recv)
    names = [n for n in OPS if _has(x, n) and (g.host or not OPS[n].host)]
    name = g.pick(names)
    spec = OPS[name]
    if name.startswith("op:"):
        call = _draw_operator(g, x, recv, name)
    elif name == "einsum_many":
        ops_ = [recv] + [g.partner(x) for _ in range(g.int(1, 2))]
        tags = tuple(dict.fromkeys(t for r in ops_ for t in g.value(r).axis_tags))
        call = Call(name, None, (g.perm(g.subset(tags)), ops_), {})
    else:
        args, kwargs = spec.gen(g, x)
        call = Call(name, recv, tuple(args), dict(kwargs), host=spec.host)
    if g.invalid and g.chance(g.invalid):
        call = g.mutate(call, x, recv)
    status, res = outcome(lambda: run_call(call, g.ins, g.outs, g.ctxs))
    return call, status, res


def operator_call(call: Call) -> bool:
    """Whether ``call`` is a Python operator (Python's protocol errors are documented)."""
    return call.method.startswith("op:")


def compact(calls: list[Call], ins: list[Any], specs: list[InputSpec]
            ) -> tuple[list[Call], list[Any], list[InputSpec]]:
    """Drop the inputs no call uses (renumbering the rest)."""
    used: list[int] = []

    def scan(v: Any) -> None:
        if isinstance(v, Ref) and v.kind == "in" and v.index not in used:
            used.append(v.index)
        elif isinstance(v, (tuple, list)):
            for u in v:
                scan(u)
        elif isinstance(v, dict):
            for u in v.values():
                scan(u)

    for c in calls:
        scan((c.recv, c.args, c.kwargs))
    used.sort()
    new = {old: k for k, old in enumerate(used)}

    def sub(v: Any) -> Any:
        if isinstance(v, Ref) and v.kind == "in":
            return Ref("in", new[v.index])
        if isinstance(v, tuple):
            return tuple(sub(u) for u in v)
        if isinstance(v, list):
            return [sub(u) for u in v]
        if isinstance(v, dict):
            return {k: sub(u) for k, u in v.items()}
        return v

    calls = [dataclasses.replace(c, recv=sub(c.recv), args=sub(c.args), kwargs=sub(c.kwargs))
             for c in calls]
    return calls, [ins[k] for k in used], [specs[k] for k in used]


# -- constructors --------------------------------------------------------------------------------

CONSTRUCTORS = ("from_slice", "from_numpy", "zeros", "ones", "empty", "full", "scalar",
                "arange", "linspace", "eye", "one_hot", "rand", "uniform", "randn", "normal",
                "bernoulli", "gumbel", "randint", "randperm", "band_mask", "variable_from_slice")


#: Constructors that exist only on one branch.
_CONSTRUCTOR_DTYPE = {"randint": "i64", "randperm": "i64", "band_mask": "bool"}
_F32_ONLY = ("full", "scalar", "arange", "linspace", "eye", "one_hot", "rand", "uniform",
             "randn", "normal", "bernoulli", "gumbel", "variable_from_slice")


def draw_constructor(g: Gen, valid: bool, deterministic: bool = False
                     ) -> tuple[Call, str, Any]:
    """A constructor call on the main context (``valid`` False: one argument is bad;
    ``deterministic``: never ``empty``, whose values are whatever memory held)."""
    name = g.pick([c for c in CONSTRUCTORS if not (deterministic and c == "empty")])
    dtype = _CONSTRUCTOR_DTYPE.get(name) or ("f32" if name in _F32_ONLY else g.pick(DTYPES))
    rank = {"arange": 1, "linspace": 1, "randperm": 1, "eye": 2, "one_hot": 2,
            "band_mask": 2}.get(name, g.pick((0, 1, 2)))
    tags = g.perm(TAGS)[:rank]
    shape = tuple(g.sizes[t] for t in tags) or (1,)
    n = math.prod(shape)
    ints = dtype in INTS or dtype == "bool"
    args: list[Any] = {
        "from_slice": [shape, [g.int(-3, 3) if ints else g.real() for _ in range(n)]],
        "from_numpy": [np.zeros(shape if tags else (), dtype=np.float64) + (
            g.int(0, 3) if ints else g.real())],
        "zeros": [shape], "ones": [shape], "empty": [shape],
        "full": [shape, g.real()], "scalar": [g.real()],
        "arange": [g.int(-2, 2), g.int(-2, 6), g.pick((1, 2, 0.5, -1))],
        "linspace": [g.real(), g.real(), g.int(1, 5)],
        "eye": [g.int(1, 4)],
        "one_hot": [[g.int(0, 3) for _ in range(g.int(1, 3))], g.int(1, 4)],
        "rand": [shape, g.int(0, 99)], "randn": [shape, g.int(0, 99)],
        "gumbel": [shape, g.int(0, 99)],
        "uniform": [shape, g.int(0, 99), -1.0, g.pick((1.0, -2.0))],
        "normal": [shape, g.int(0, 99), 0.0, g.pick((1.0, 0.0, -1.0))],
        "bernoulli": [shape, g.int(0, 99), g.pick((0.0, 0.5, 1.0, 1.5))],
        "randint": [shape, g.int(0, 99), g.int(-3, 0), g.int(-1, 5)],
        "randperm": [g.int(1, 5), g.int(0, 99)],
        "band_mask": [shape, g.pick((None, 0, 1)), g.pick((None, 0, 2))],
        "variable_from_slice": [shape, [g.real() for _ in range(n)]],
    }[name]
    if not valid and args:
        args[g.int(0, len(args) - 1)] = g.pick(BAD_VALUES)
    call = Call(f"new:{dtype}:{','.join(tags)}:{name}", None, tuple(args), {})
    status, res = outcome(lambda: run_call(call, g.ins, g.outs, g.ctxs))
    return call, status, res
