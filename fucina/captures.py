"""What a compiled function reads from outside its arguments, and how to read it again.

Before tracing, :func:`discover` walks what the function can reach: its
closure cells, the globals its code names, its defaults, and from there into
lists, tuples, deques, dicts and other mappings (ChainMap, MappingProxyType, weak
dicts), the attributes of objects and of ``threading.local`` (those some reachable
code mentions by name or as a string constant; all of them where the code
uses ``getattr``, ``vars`` or ``__dict__``), user classes (class attributes,
and their methods with what those read), bound methods, ``functools.partial``
and other compiled functions. Each thing found is remembered with the *path* that reached it
(``closure cell 'w'``, ``global 'model' . attr 'layers' [2] . attr 'w'``):

- a tensor becomes a capture slot: if the trace uses it, it is an implicit
  program input, read through its path at every call (rebinding ``w`` and
  calling again reads the new tensor, no retrace);
- a Python value (number, string, tuple/list/dict of them, numpy array, bytearray) and
  the identity of a function or class become guards: at every call the path
  is read again and compared with the value the trace saw; any difference
  retraces.

An object whose class defines ``__fucina_captures__()`` is walked through
the dict that method returns (read again at every call) instead of its
attributes.

The walk stops at library modules (numpy, fucina, the standard library, ...),
library classes and contexts; an object it cannot look into (a library
object) is guarded by identity only. Limits (depth, object count) keep it
bounded.
"""

from __future__ import annotations

import argparse
import collections
import collections.abc
import decimal
import enum
import fractions
import functools
import math
import sys
import threading
import types
from typing import Any

import numpy as np

from .ir.graph import Node
from .runtime.context import ExecContext
from .runtime.raw import RawTensor
from .runtime.storage import Storage

#: Top-level packages whose modules, functions and objects are not walked.
LIBRARY_PACKAGES = frozenset({
    "fucina", "numpy", "numba", "llvmlite", "torch", "scipy", "gguf", "safetensors",
    "tokenizers", "hypothesis", "pytest", "_pytest", "pluggy", "typing_extensions",
}) | frozenset(sys.stdlib_module_names)
#: Bounds of one walk: path length, and objects looked into.
MAX_DEPTH = 16
MAX_OBJECTS = 20000
_NAME_ROUNDS = 6  # walks repeated while newly reached code mentions new attribute names

#: A method an object may define to be walked through what it returns (a dict of
#: tensors and Python values, built afresh on each call) instead of its attributes:
#: tensors in it are captured, values guarded. Optimizers use it so that their
#: hyperparameters and step counts, which change between calls, are not guards.
CAPTURE_VIEW = "__fucina_captures__"

#: Internal objects never looked into (contexts, IR nodes, raw tensors, storages).
_OPAQUE = frozenset({ExecContext, Node, RawTensor, Storage})
#: Special methods of a user class a traced call does not run: not walked.
_NOT_CALLED_BY_TRACE = frozenset({
    "__del__", "__repr__", "__str__", "__init_subclass__", "__set_name__",
    "__class_getitem__", "__getstate__", "__setstate__", "__reduce__", "__reduce_ex__"})
#: A class's constructors: walked where code names the class (it may build instances
#: while tracing), not for a class reached only through an instance of it (a counter its
#: ``__init__`` bumps would retrace every call).
_CONSTRUCTORS = frozenset({"__new__", "__init__", "__post_init__"})

#: Values guarded by equality (a compiled call retraces when one differs).
PRIMITIVES = (int, float, complex, str, bytes, bool, type(None), slice, range, enum.Enum,
              np.generic, decimal.Decimal, fractions.Fraction)
#: Library classes that are plain attribute holders (configs): walked like user objects.
NAMESPACES = (types.SimpleNamespace, argparse.Namespace)
#: Names whose use reads attributes the code does not spell out (``getattr(m, name)``,
#: ``vars(m)[...]``, ``m.__dict__[...]``): where reachable code mentions one, every
#: attribute of the objects walked is followed, not only the mentioned ones.
DYNAMIC_ATTRS = frozenset({"getattr", "vars", "__dict__"})

Step = tuple[str, Any]
Path = tuple[Step, ...]


def is_tensor(x: Any) -> bool:
    """A fucina tensor instance (not a tensor type)."""
    return getattr(type(x), "axis_tags", None) is not None and hasattr(x, "_node_")


def _user_module(name: str | None) -> bool:
    top = (name or "").partition(".")[0]
    return bool(top) and top not in LIBRARY_PACKAGES


def _code_names(code: types.CodeType, out: set[str]) -> None:
    out.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_names(c, out)
        elif isinstance(c, str) and c.isidentifier():  # getattr(m, "w"), d["key"]
            out.add(c)


def _walkable_type(cls: type) -> bool:
    """Instances worth looking into: user classes, and fucina's own (optimizers, models)."""
    top = (getattr(cls, "__module__", None) or "").partition(".")[0]
    return (bool(top) and (top == "fucina" or top not in LIBRARY_PACKAGES)
            and cls not in _OPAQUE)


def _user_class(cls: type) -> bool:
    """A class defined in user code: its class attributes and methods are walked."""
    return _user_module(getattr(cls, "__module__", None)) and cls not in _OPAQUE


def _class_names(cls: type, out: set[str]) -> None:
    """Names mentioned by the methods of a walkable class (what its instances may read)."""
    for klass in cls.__mro__:
        if klass is object or not _walkable_type(klass):
            continue
        for v in vars(klass).values():
            fn = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
            if isinstance(v, property):
                fn = v.fget
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType):
                _code_names(code, out)


# -- reading a path again ------------------------------------------------------------


def step(obj: Any, s: Step) -> Any:
    """Follow one path step from ``obj`` (raises on anything that no longer resolves)."""
    kind, key = s
    if kind == "attr":
        return getattr(obj, key)
    if kind == "item":
        return obj[key]
    if kind == "cell":
        return obj.__closure__[key].cell_contents
    if kind == "global":
        return obj.__globals__[key]
    if kind == "default":
        return obj.__defaults__[key]
    if kind == "kwdefault":
        return obj.__kwdefaults__[key]
    if kind == "view":  # an object's declared capture view (see CAPTURE_VIEW)
        return getattr(obj, key)()
    raise KeyError(kind)


def describe(path: Path) -> str:
    """Readable form of a path (for error messages and ``ir()``)."""
    out = []
    for kind, key in path:
        if kind == "root":
            out.append("fn" if key == 0 else f"<root {key}>")
        elif kind == "arg":
            out.append(f"<arg {key}>")
        elif kind == "attr":
            out.append(f".{key}")
        elif kind == "item":
            out.append(f"[{key!r}]")
        elif kind in ("global", "kwdefault"):
            out.append(f" {kind} {key!r}")
        else:
            out.append(f" {kind} {key}")
    return "".join(out)


# -- snapshots and comparisons ---------------------------------------------------------


def same_value(a: Any, b: Any) -> bool:
    """Equal as values the trace could depend on (type included; NaN equals NaN)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return (a.shape == b.shape and a.dtype == b.dtype
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    try:
        if a == b:
            # 0.0 == -0.0, but code may branch on the sign (math.copysign, 1 / x)
            return not (isinstance(a, (float, np.floating)) and a == 0
                        and math.copysign(1.0, a) != math.copysign(1.0, b))
    except Exception:
        return False
    return isinstance(a, (float, complex, np.floating)) and a != a and b != b


class Check:
    """One guard at the end of a path: what the trace saw there."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any):
        self.kind = kind    # "eq" (value), "seq" (primitive list/tuple), "is" (identity),
        self.value = value  # "type", "len", "keys", "tensor" (capture slot)

    def holds(self, obj: Any) -> bool:
        kind, v = self.kind, self.value
        if kind == "is":
            return obj is v
        if kind == "type":
            return type(obj) is v
        if kind == "eq":
            return same_value(obj, v)
        if kind == "seq":  # (type, items, item types): a C-speed compare first
            typ, items, types_ = v
            if type(obj) is not typ:
                return False
            if obj == items and tuple(map(type, obj)) == types_ and 0.0 not in items:
                return True  # (a zero item may have changed sign: compared below)
            return same_value(list(obj), list(items)) if len(obj) == len(items) else False
        if kind == "len":
            typ, n = v
            return type(obj) is typ and len(obj) == n
        if kind == "keys":
            return type(obj) is dict and tuple(obj) == v
        if kind == "mkeys":  # (type, keys) of a library mapping
            typ, keys = v
            return type(obj) is typ and tuple(obj) == keys
        raise KeyError(kind)


class PathNode:
    """A trie over paths: shared prefixes are read once per call."""

    __slots__ = ("children", "checks", "slot")

    def __init__(self) -> None:
        self.children: dict[Step, PathNode] = {}
        self.checks: list[Check] = []
        self.slot: int | None = None  # a tensor capture slot ends here

    def child(self, s: Step) -> PathNode:
        node = self.children.get(s)
        if node is None:
            node = self.children[s] = PathNode()
        return node


# -- the walk -------------------------------------------------------------------------------


class Captures:
    """Everything one trace reads from outside its tensor arguments."""

    def __init__(self) -> None:
        self.trie = PathNode()
        self.slots: list[Any] = []        # capture slot -> the tensor found at trace time
        self.paths: list[list[Path]] = []  # capture slot -> every path that reached it
        self._by_node: dict[int, int] = {}
        self._by_value: dict[int, int] = {}
        self._by_storage: dict[int, list[int]] = {}
        self.roots: list[Any] = []        # root k (k >= 1): objects walked besides fn/args
        self.guards = 0
        self._plan: list[Any] | None = None

    # -- recording -----------------------------------------------------------------

    def add_tensor(self, path: Path, t: Any) -> None:
        node = t._node_
        slot = self._by_node.get(id(node))
        if slot is None:
            slot = len(self.slots)
            self.slots.append(t)
            self.paths.append([])
            self._by_node[id(node)] = slot
            self._by_value[id(node.value)] = slot
            self._by_storage.setdefault(id(node.value.storage), []).append(slot)
        self.paths[slot].append(path)
        self._at(path).slot = slot

    def add_check(self, path: Path, check: Check) -> None:
        self._at(path).checks.append(check)
        self.guards += 1

    def _at(self, path: Path) -> PathNode:
        self._plan = None
        node = self.trie
        for s in path:
            node = node.child(s)
        return node

    def slots_of_storage(self, storage: Any) -> list[int]:
        """The capture slots whose tensors view ``storage``."""
        return self._by_storage.get(id(storage), [])

    def slot_of(self, node: Any) -> int | None:
        """The capture slot of a tensor node met while tracing, if it was captured."""
        slot = self._by_node.get(id(node))
        if slot is None:
            slot = self._by_value.get(id(node.value))
        return slot

    # -- reading again at call time ------------------------------------------------

    def resolve(self, fn: Any, args: tuple[Any, ...]) -> list[Any] | None:
        """The tensors in every capture slot now, or None if a guard fails (retrace).

        Runs the trie as a flat list of steps (each reads its parent's object), so
        shared path prefixes are read once and a call costs one loop.
        """
        plan = self._plan
        if plan is None:
            plan = self._plan = _flatten(self.trie)
        found: list[Any] = [None] * len(self.slots)
        objs: list[Any] = [None] * len(plan)
        roots = self.roots
        for i, (parent, kind, key, checks, slot) in enumerate(plan):
            if parent < 0:
                obj = (fn if key == 0 else roots[key - 1]) if kind == "root" else args[key]
            else:
                src = objs[parent]
                try:
                    if kind == "attr":
                        obj = getattr(src, key)
                    elif kind == "item":
                        obj = src[key]
                    else:
                        obj = step(src, (kind, key))
                except Exception:
                    return None
            for c in checks:
                kind = c.kind
                if kind == "type":
                    if type(obj) is not c.value:
                        return None
                elif kind == "is":
                    if obj is not c.value:
                        return None
                elif not c.holds(obj):
                    return None
            if slot is not None:
                prev = found[slot]
                if prev is None:
                    found[slot] = obj
                elif prev._node_ is not obj._node_:
                    return None  # paths that reached one tensor now reach two
            objs[i] = obj
        return found


def _flatten(trie: PathNode) -> list[tuple[int, str, Any, tuple[Check, ...], int | None]]:
    """The trie in depth-first order: (parent position or -1, step kind, key, checks, slot)."""
    plan: list[tuple[int, str, Any, tuple[Check, ...], int | None]] = []

    def walk(node: PathNode, parent: int) -> None:
        for (kind, key), child in node.children.items():
            plan.append((parent, kind, key, tuple(child.checks), child.slot))
            walk(child, len(plan) - 1)

    walk(trie, -1)
    return plan


class _Walker:
    def __init__(self, caps: Captures, names: set[str]):
        self.caps = caps
        self.names = names
        self.active: set[int] = set()  # ids of the objects on the current path
        self.count = 0
        self.new_names: set[str] = set()
        # user classes walked -> whether with their constructors
        self.classes: dict[type, bool] = {}
        self.dynamic = bool(names & DYNAMIC_ATTRS)

    def mention(self, code: types.CodeType) -> None:
        _code_names(code, self.new_names)

    def visit(self, obj: Any, path: Path, depth: int) -> None:
        caps = self.caps
        if is_tensor(obj):
            if obj._node_ is None:  # deinit'ed: using it raises; no capture to track
                caps.add_check(path, Check("is", obj))
                return
            caps.add_check(path, Check("type", type(obj)))
            caps.add_tensor(path, obj)
            return
        if isinstance(obj, PRIMITIVES):
            caps.add_check(path, Check("eq", obj))
            return
        if isinstance(obj, type):
            caps.add_check(path, Check("is", obj))  # a rebound class changes what runs
            if _user_class(obj) and not self.classes.get(obj) and depth <= MAX_DEPTH:
                self.classes[obj] = True  # (its attributes are guarded along the first path)
                self._class(obj, path, depth, constructors=True)
            return
        if isinstance(obj, ExecContext) or type(obj) in _OPAQUE or (
                isinstance(obj, types.ModuleType) and not _user_module(obj.__name__)):
            return
        # Cycles stop at an ancestor; an object shared by two paths is walked (and
        # guarded) along both, so rebinding either path is seen.
        if id(obj) in self.active or depth > MAX_DEPTH or self.count > MAX_OBJECTS:
            return
        self.active.add(id(obj))
        self.count += 1
        try:
            self._walk(obj, path, depth)
        finally:
            self.active.discard(id(obj))

    def _walk(self, obj: Any, path: Path, depth: int) -> None:
        caps = self.caps
        if isinstance(obj, np.ndarray):
            caps.add_check(path, Check("eq", obj.copy()))
        elif isinstance(obj, (list, tuple, collections.deque)):
            self._sequence(obj, path, depth)
        elif isinstance(obj, dict):
            self._dict(obj, path, depth)
        elif isinstance(obj, bytearray):  # mutable bytes: guarded by a copy of the value
            caps.add_check(path, Check("eq", bytearray(obj)))
        elif isinstance(obj, threading.local):
            # The attributes the code names, read in the calling thread at every call (a
            # per-thread value guarded by identity was the first thread's for good).
            self._instance(obj, path, depth)
        elif isinstance(obj, collections.abc.Mapping) and not _walkable_type(type(obj)):
            self._mapping(obj, path, depth)  # ChainMap, MappingProxyType, weak dicts...
        elif isinstance(obj, (set, frozenset)):
            if all(isinstance(x, PRIMITIVES) for x in obj):
                caps.add_check(path, Check("eq", frozenset(obj) if isinstance(obj, frozenset)
                                           else set(obj)))
            else:
                caps.add_check(path, Check("is", obj))
        elif isinstance(obj, types.FunctionType):
            self._function(obj, path, depth)
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__self__, path + (("attr", "__self__"),), depth + 1)
            self.visit(obj.__func__, path + (("attr", "__func__"),), depth + 1)
        elif isinstance(obj, functools.partial):
            caps.add_check(path, Check("type", functools.partial))
            self.visit(obj.func, path + (("attr", "func"),), depth + 1)
            self.visit(obj.args, path + (("attr", "args"),), depth + 1)
            self.visit(obj.keywords, path + (("attr", "keywords"),), depth + 1)
        elif isinstance(obj, types.ModuleType):
            for name in sorted(self.names & set(vars(obj))):
                self.visit(vars(obj)[name], path + (("attr", name),), depth + 1)
        elif callable(getattr(type(obj), CAPTURE_VIEW, None)):
            # The object says what a trace may read from it (tensors it updates in place,
            # values that shape the trace) instead of exposing every attribute.
            caps.add_check(path, Check("type", type(obj)))
            self.visit(getattr(obj, CAPTURE_VIEW)(), path + (("view", CAPTURE_VIEW),),
                       depth + 1)
        elif _compiled_fn(obj) is not None:
            if len(path) > 1:
                caps.add_check(path, Check("is", obj))
            self.visit(_compiled_fn(obj), path + (("attr", "fn"),), depth + 1)
        elif _walkable_type(type(obj)) or type(obj) in NAMESPACES:
            self._instance(obj, path, depth)
        else:  # an object the walk cannot look into: rebinding it at least retraces
            caps.add_check(path, Check("is", obj))

    def _sequence(self, obj: list[Any] | tuple[Any, ...] | collections.deque[Any],
                  path: Path, depth: int) -> None:
        if all(isinstance(x, PRIMITIVES) for x in obj):
            self.caps.add_check(path, Check("seq", (type(obj), tuple(obj),
                                                    tuple(map(type, obj)))))
            return
        self.caps.add_check(path, Check("len", (type(obj), len(obj))))
        for k, x in enumerate(obj):
            self.visit(x, path + (("item", k),), depth + 1)

    def _mapping(self, obj: collections.abc.Mapping[Any, Any], path: Path,
                 depth: int) -> None:
        """A library mapping other than dict, walked through its items like a dict."""
        try:
            keys = tuple(obj)
        except Exception:  # (a mapping that cannot be iterated: identity only)
            keys = None
        if keys is None or not all(isinstance(k, PRIMITIVES) for k in keys):
            self.caps.add_check(path, Check("is", obj))
            return
        self.caps.add_check(path, Check("mkeys", (type(obj), keys)))
        for k in keys:
            self.visit(obj[k], path + (("item", k),), depth + 1)

    def _dict(self, obj: dict[Any, Any], path: Path, depth: int) -> None:
        keys = tuple(obj)
        if not all(isinstance(k, PRIMITIVES) for k in keys):
            self.caps.add_check(path, Check("is", obj))  # keys not comparable by value
            return
        if all(isinstance(v, PRIMITIVES) for v in obj.values()):
            self.caps.add_check(path, Check("eq", dict(obj)))
            return
        self.caps.add_check(path, Check("keys", keys))
        for k in keys:
            self.visit(obj[k], path + (("item", k),), depth + 1)

    def _function(self, fn: types.FunctionType, path: Path, depth: int) -> None:
        if len(path) > 1:  # a rebound function changes the code (the root one is fixed)
            self.caps.add_check(path, Check("is", fn))
        if not _user_module(fn.__module__):
            return
        code = fn.__code__
        self.mention(code)
        for k in range(len(code.co_freevars)):
            try:
                value = fn.__closure__[k].cell_contents  # type: ignore[index]
            except ValueError:  # an empty cell (assigned later in the enclosing scope)
                continue
            self.visit(value, path + (("cell", k),), depth + 1)
        names: set[str] = set()
        _code_names(code, names)
        g = fn.__globals__
        for name in sorted(names):
            if name in g:
                self.visit(g[name], path + (("global", name),), depth + 1)
        for k, v in enumerate(fn.__defaults__ or ()):
            self.visit(v, path + (("default", k),), depth + 1)
        for name, v in sorted((fn.__kwdefaults__ or {}).items()):
            self.visit(v, path + (("kwdefault", name),), depth + 1)

    def _instance(self, obj: Any, path: Path, depth: int) -> None:
        self.caps.add_check(path, Check("type", type(obj)))
        _class_names(type(obj), self.new_names)
        attrs: dict[str, Any] = {}
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            attrs.update(d)
        for klass in type(obj).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if isinstance(name, str):
                    try:
                        attrs.setdefault(name, getattr(obj, name))
                    except Exception:  # an unset slot (or a __getattr__ that raises)
                        pass
        every = self.dynamic and (_user_class(type(obj)) or type(obj) in NAMESPACES)
        for name in sorted(set(attrs) if every else self.names & set(attrs)):
            self.visit(attrs[name], path + (("attr", name),), depth + 1)
        cls = type(obj)
        if _user_class(cls) and cls not in self.classes:
            # Class attributes read through the instance (``self.scale``), and what its
            # methods read (module globals), are guarded through the class.
            self.classes[cls] = False
            self._class(cls, path + (("attr", "__class__"),), depth + 1, constructors=False)

    def _class(self, cls: type, path: Path, depth: int, constructors: bool) -> None:
        """A user class: the methods and class attributes reachable code names (methods
        with the globals, closures and defaults they read), and its special methods."""
        if self.count > MAX_OBJECTS:
            return
        self.count += 1
        seen: set[str] = set()
        for klass in cls.__mro__:
            if not _user_class(klass):
                continue
            for name, raw in vars(klass).items():
                if name in seen:
                    continue
                seen.add(name)  # (a subclass's attribute hides its bases')
                dunder = name.startswith("__") and name.endswith("__")
                # Methods that reachable code names, and the special methods Python calls
                # itself (__call__, __getitem__, ...): a method nothing calls (a plot()
                # beside forward()) adds no guards.
                called = (name in self.names or self.dynamic
                          or (dunder and name not in _NOT_CALLED_BY_TRACE
                              and (constructors or name not in _CONSTRUCTORS)))
                if isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
                    if called:
                        self.visit(getattr(cls, name), path + (("attr", name),), depth + 1)
                elif isinstance(raw, property):
                    if raw.fget is not None and called:
                        self.visit(raw.fget, path + (("attr", name), ("attr", "fget")),
                                   depth + 2)
                elif dunder or isinstance(raw, (types.MemberDescriptorType,
                                                types.GetSetDescriptorType)):
                    continue
                elif name in self.names or self.dynamic:
                    self.visit(raw, path + (("attr", name),), depth + 1)


def _compiled_fn(obj: Any) -> Any:
    """The function a ``fucina.compile`` object wraps, else None."""
    try:  # (an object's own __getattr__ may raise anything)
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d.get("__fucina_compiled_fn__") if isinstance(d, dict) else None


def discover(roots: list[tuple[Step, Any]]) -> Captures:
    """Walk from ``roots`` ((("root", k) | ("arg", k)), object) and record what is reachable.

    Object attributes are walked when some reachable code mentions their
    name, so the walk repeats until the set of mentioned names stops growing.
    """
    names: set[str] = set()
    for _, obj in roots:
        fn = getattr(obj, "__func__", obj)
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType):
            _code_names(code, names)
    caps = Captures()
    for _ in range(_NAME_ROUNDS):
        caps = Captures()
        walker = _Walker(caps, names)
        for s, obj in roots:
            walker.visit(obj, (s,), 0)
        if walker.new_names <= names:
            break
        names = names | walker.new_names
    return caps


def add_root(caps: Captures, obj: Any) -> None:
    """Walk one more object (a compiled function inlined into this trace) as a new root.

    Tensors already captured keep their slots (now also reachable this way);
    new ones get slots read through the new root at call time.
    """
    caps.roots.append(obj)
    extra = discover([(("root", len(caps.roots)), obj)])
    for slot, t in enumerate(extra.slots):
        for path in extra.paths[slot]:
            caps.add_tensor(path, t)
    _merge_checks(caps.trie, extra.trie, caps)


def _merge_checks(dst: PathNode, src: PathNode, caps: Captures) -> None:
    caps._plan = None
    for c in src.checks:
        dst.checks.append(c)
        caps.guards += 1
    for s, child in src.children.items():
        _merge_checks(dst.child(s), child, caps)


