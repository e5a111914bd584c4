"""User scalar functions (``elemental_unary``/``elemental_binary``) inside generated kernels.

An elemental ``Op`` is a class with static scalar functions. Each one this
module sees becomes a small Numba wrapper with a flat signature
``(*operands, *params)`` (it rebuilds the op's ``extra`` argument from the
params, so a new ``extra`` value never compiles a new kernel) registered
under a key. Generated kernel modules bind the wrapper by key
(``uf_<key> = uf.dispatcher("<key>")``) and call it per element, so the
user's code is compiled into the fused kernel.

The key is a fingerprint of everything the compiled code depends on: the
op's name, the functions' bytecode, constants, defaults, closure values and
the values of the globals they read (recursively through the functions they
call). Two different ops, or one op whose code or globals changed between
processes, never share a kernel, and Numba's on-disk cache stays valid.
Like Numba itself, an op's globals are read once per process, at its first
use. An op reading something that cannot be fingerprinted (an arbitrary
object) gets a per-process key and kernels that are not cached on disk.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import itertools
import re
import threading
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba.core.dispatcher import Dispatcher

from ..dtypes import DType
from .reference import kernel


def _jit(fn: Callable[..., Any]) -> Any:
    """njit with the built-in scalar helpers' flags (``scalar_fns``): IEEE NaN/inf kept,
    division by zero gives inf/NaN instead of raising."""
    return numba.njit(fn, fastmath={"contract", "nsz"}, error_model="numpy", nogil=True)


#: Numbers of operands of each function an op declares.
ARITY = {"unary": {"forward": 2, "backward": 4}, "binary": {"forward": 3, "backward": 5}}


@dataclass(frozen=True)
class UserFn:
    """A registered scalar function: ``fn(*operands, *params) -> number``."""

    key: str
    arity: int
    nparams: int
    fn: Any                      # the Numba wrapper
    cacheable: bool
    grads: tuple[str, ...] = ()  # keys of the per-operand gradient functions (forward only)
    label: str = ""              # "Op.forward" etc., for messages


_REGISTRY: dict[str, UserFn] = {}
_LOCK = threading.RLock()
_UNCACHEABLE = itertools.count(1)


def get(key: str) -> UserFn:
    """The registered function ``key``."""
    return _REGISTRY[key]


def dispatcher(key: str) -> Any:
    """The Numba wrapper of ``key`` (generated kernel modules bind it at import)."""
    return _REGISTRY[key].fn


# -- fingerprints -------------------------------------------------------------------


class _Opaque(Exception):
    """Something the code depends on has no stable fingerprint."""


_SIMPLE = (bool, int, float, complex, str, bytes, type(None), np.number, np.bool_)


def _update(h: Any, *parts: Any) -> None:
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")


def _fp_value(v: Any, h: Any, seen: set[int], names: tuple[str, ...] = ()) -> None:
    if isinstance(v, _SIMPLE):
        _update(h, type(v).__name__, v)
    elif isinstance(v, tuple):
        _update(h, "tuple", len(v))
        for x in v:
            _fp_value(x, h, seen)
    elif isinstance(v, np.ndarray):
        _update(h, "ndarray", v.dtype.str, v.shape)
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, Dispatcher):
        _fp_function(v.py_func, h, seen)
    elif isinstance(v, types.FunctionType):
        _fp_function(v, h, seen)
    elif isinstance(v, types.ModuleType):
        _update(h, "module", v.__name__)
        # module.attribute reads: the names the code uses that the module defines
        for name in names:
            if name in vars(v):
                _update(h, "attr", name)
                _fp_value(vars(v)[name], h, seen)
    elif isinstance(v, (types.BuiltinFunctionType, np.ufunc, type)):
        _update(h, "named", getattr(v, "__module__", None), getattr(v, "__qualname__",
                                                                    getattr(v, "__name__", v)))
    else:
        raise _Opaque(type(v).__name__)


def _fp_code(code: types.CodeType, glb: dict[str, Any], h: Any, seen: set[int]) -> None:
    _update(h, code.co_argcount, code.co_varnames, code.co_names)
    h.update(code.co_code)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _fp_code(c, glb, h, seen)
        else:
            _fp_value(c, h, seen)
    for name in code.co_names:
        if name in glb:
            _update(h, "global", name)
            _fp_value(glb[name], h, seen, code.co_names)
        elif hasattr(builtins, name):
            _update(h, "builtin", name)


def _fp_function(fn: types.FunctionType, h: Any, seen: set[int]) -> None:
    if id(fn) in seen:
        _update(h, "recursion", fn.__qualname__)
        return
    seen.add(id(fn))
    _update(h, "function", fn.__module__, fn.__qualname__)
    _fp_code(fn.__code__, fn.__globals__, h, seen)
    for d in fn.__defaults__ or ():
        _fp_value(d, h, seen)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            raise _Opaque(name) from None
        _update(h, "free", name)
        _fp_value(contents, h, seen)


def fingerprint(fns: list[Any], label: str) -> str | None:
    """A stable hash of ``fns`` (functions or Numba dispatchers) and all they read, or
    None when something they read cannot be fingerprinted."""
    h = hashlib.sha256()
    _update(h, label)
    try:
        for fn in fns:
            _fp_function(getattr(fn, "py_func", fn), h, set())
    except _Opaque:
        return None
    return h.hexdigest()[:24]


# -- wrappers -------------------------------------------------------------------------


def _extra_expr(spec: tuple[Any, ...]) -> str:
    if spec[0] == "none":
        return "None"
    if spec[0] == "num":
        return "p0"
    n = spec[1]
    return "(" + "".join(f"p{k}, " for k in range(n)) + ")"


def _wrap(py_fn: Callable[..., Any], arity: int, spec: tuple[Any, ...],
          index: int | None) -> Any:
    """njit wrapper ``w(a0.., p0..)`` calling ``py_fn(a0.., extra)`` (``[index]`` of a
    tuple result when given)."""
    nparams = 0 if spec[0] == "none" else 1 if spec[0] == "num" else spec[1]
    args = [f"a{k}" for k in range(arity)] + [f"p{k}" for k in range(nparams)]
    call = f"fn({', '.join(f'a{k}' for k in range(arity))}, {_extra_expr(spec)})"
    if index is not None:
        call += f"[{index}]"
    src = f"def w({', '.join(args)}):\n    return {call}\n"
    ns: dict[str, Any] = {"fn": _jit(py_fn)}
    exec(src, ns)  # source from a fixed template: no user text
    return _jit(ns["w"])


def _function(op: Any, name: str, kind: str) -> Callable[..., Any]:
    """``op.<name>`` as a plain Python function, checked for its operand count."""
    fn = getattr(op, name, None)
    label = f"{getattr(op, '__name__', type(op).__name__)}.{name}"
    if fn is None or not callable(fn):
        raise TypeError(f"an elemental {kind} op must define a static {name}(); "
                        f"{label} is missing")
    py = getattr(fn, "py_func", fn)
    if not isinstance(py, types.FunctionType):
        raise TypeError(f"{label} must be a plain Python function (or a numba.njit one), "
                        f"got {type(fn).__name__}")
    want = ARITY[kind][name]
    params = list(inspect.signature(py).parameters.values())
    if len(params) != want or any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                                  for p in params):
        names = "(x, extra)" if (kind, name) == ("unary", "forward") else \
            "(x, y, grad_y, extra)" if kind == "unary" else \
            "(a, b, extra)" if name == "forward" else "(a, b, y, grad_y, extra)"
        raise TypeError(f"{label} must take {want} positional arguments {names}; declare "
                        f"it a @staticmethod")
    return py


_BY_OP: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], UserFn]] = \
    weakref.WeakKeyDictionary()


def register_op(op: Any, kind: str, spec: tuple[Any, ...]) -> UserFn:
    """The forward entry of elemental ``op`` (``kind`` "unary" or "binary") for an extra
    of shape ``spec`` (("none",), ("num",) or ("tuple", n)); its ``grads`` name one
    gradient function per operand. Built once per op and spec in a process."""
    with _LOCK:
        try:
            per_op = _BY_OP.setdefault(op, {})
        except TypeError:  # not weak-referenceable: no per-op memo
            per_op = {}
        hit = per_op.get((kind, spec))
        if hit is not None:
            return hit
        fwd, bwd = _function(op, "forward", kind), _function(op, "backward", kind)
        name = getattr(op, "__qualname__", type(op).__qualname__)
        module = getattr(op, "__module__", "")
        fp = fingerprint([fwd, bwd], f"{module}.{name}|{kind}|{spec}")
        base = f"u{fp}" if fp is not None else f"n{next(_UNCACHEABLE)}"
        cacheable = fp is not None
        arity = 1 if kind == "unary" else 2
        nparams = 0 if spec[0] == "none" else 1 if spec[0] == "num" else spec[1]
        grads = []
        for k in range(arity):
            key = f"{base}_d{k}"
            if key not in _REGISTRY:
                index = None if kind == "unary" else k
                _REGISTRY[key] = UserFn(key, 2 * arity if kind == "binary" else 3, nparams,
                                        _wrap(bwd, ARITY[kind]["backward"] - 1, spec, index),
                                        cacheable, label=f"{name}.backward")
            grads.append(key)
        key = f"{base}_f"
        if key not in _REGISTRY:
            _REGISTRY[key] = UserFn(key, arity, nparams, _wrap(fwd, arity, spec, None),
                                    cacheable, tuple(grads), label=f"{name}.forward")
        per_op[(kind, spec)] = _REGISTRY[key]
        return _REGISTRY[key]


def compile_failure(keys: tuple[str, ...], error: Exception) -> TypeError:
    """The TypeError for a kernel whose user functions Numba could not compile."""
    labels = ", ".join(sorted({_REGISTRY[k].label for k in keys if k in _REGISTRY}))
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()  # Numba's terminal colours
    detail = "\n".join(text.splitlines()[:40])
    return TypeError(f"Numba cannot compile the elemental function(s) {labels} for f32 "
                     f"operands (they must be numba.njit-compatible scalar code returning "
                     f"a number):\n{detail}")


def extra_params(extra: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(spec, params) of an op's ``extra``: None, a real number or a tuple of them."""
    def num(v: Any) -> Any:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                   np.floating)):
            raise TypeError(f"extra must be None, a real number or a tuple of real numbers; "
                            f"got {v!r}")
        if isinstance(v, (int, np.integer)):
            try:
                return np.int64(v)
            except OverflowError:
                raise TypeError(f"extra integer {v!r} does not fit in int64") from None
        return np.float64(v)

    if extra is None:
        return ("none",), ()
    if isinstance(extra, tuple):
        return ("tuple", len(extra)), tuple(num(v) for v in extra)
    return ("num",), (num(extra),)


@kernel("elemental")
def elemental(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """A user scalar function applied elementwise (the numpy-side lowering)."""
    entry = _REGISTRY[attrs["fn"]]
    params = tuple(attrs.get("params", ()))
    fn = np.vectorize(lambda *xs: entry.fn(*(np.float32(x) for x in xs), *params),
                      otypes=[out.storage])
    return fn(*ins)
