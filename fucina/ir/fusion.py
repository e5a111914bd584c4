"""Fusion: group IR nodes into generated kernels.

Views are layouts (each value is a storage plus strides and offset), so they
fold into the index maps of whichever kernel reads them. Elementwise nodes
join the kernel of a producer when shapes line up; a reduction joins the
kernel of its elementwise producer (turning it into a row kernel), and
elementwise work on a reduction's result, broadcast back over the reduced
axes, stays in the same row kernel. What cannot fuse (contractions, gathers,
f16/bf16 math) runs through the reference kernels between generated ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import DType
from ..kernels import codegen as cg
from ..kernels import user_fns
from ..kernels.elementwise import BINARY, COMPARE, SCALAR, UNARY
from ..runtime.raw import contiguous_strides
from .graph import Node

EW_OPS = frozenset({"binary", "compare", "unary", "scalar", "where", "cast", "copy",
                    "elemental"})
_NO_FUSE_BINARY = frozenset({"div_trunc", "div_floor", "rem", "mod"})
_REDUCE_FNS = frozenset({"sum", "mean", "max", "min", "prod"})


def np_name(dt: DType) -> str:
    """numpy dtype name of a dtype's storage."""
    return dt.storage.name


def codegen_dtype(dt: DType) -> bool:
    """Whether generated kernels handle this dtype (f16/bf16 stay on the reference path)."""
    return not dt.is_block and np_name(dt) in cg.CODEGEN_DTYPES and dt not in (
        DType.bf16, DType.f8_e4m3, DType.f8_e5m2)


def fusable(n: Node) -> bool:
    """Elementwise nodes the generator can express."""
    if n.op not in EW_OPS:
        return False
    if not codegen_dtype(n.dtype) or not all(codegen_dtype(i.dtype) for i in n.inputs):
        return False
    fn = n.attrs.get("fn")
    if n.op == "binary":
        return fn in BINARY and fn not in _NO_FUSE_BINARY
    if n.op == "unary":
        return fn in UNARY
    if n.op == "scalar":
        return fn in SCALAR
    if n.op == "compare":
        return fn in COMPARE
    if n.op == "elemental":  # a user scalar function: a call in the kernel
        return True
    if n.op == "cast":
        src, dst = n.inputs[0].dtype, n.dtype
        # float->int casts saturate (NaN -> 0): keep them on the reference path.
        return not (src.is_float and dst.is_integer)
    return True


def uses_index(n: Node) -> bool:
    """Elementwise nodes whose template reads the element's flat index."""
    return n.op == "unary" and "{i}" in UNARY[n.attrs["fn"]].template


def fusable_reduce(n: Node) -> bool:
    """Reductions the generator can express."""
    return (n.op == "reduce" and n.attrs["fn"] in _REDUCE_FNS and codegen_dtype(n.dtype)
            and codegen_dtype(n.inputs[0].dtype))


@dataclass
class Group:
    """One generated kernel being assembled."""

    gid: int
    full_shape: tuple[int, ...]
    raxes: tuple[int, ...] = ()
    members: list[Node] = field(default_factory=list)
    level: dict[int, str] = field(default_factory=dict)
    deps: set[tuple[str, int]] = field(default_factory=set)
    has_index: bool = False  # a member reads its flat element index (dropout)

    @property
    def kept_axes(self) -> tuple[int, ...]:
        return tuple(a for a in range(len(self.full_shape)) if a not in self.raxes)

    @property
    def kept_shape(self) -> tuple[int, ...]:
        return tuple(self.full_shape[a] for a in self.kept_axes) or (1,)


class Fuser:
    """Assigns every compute node to a group (kernel) or to the reference path."""

    def __init__(self, owner: dict[int, Node]):
        self.owner = owner  # id(storage) -> node that produces it
        self.groups: list[Group] = []
        self.group_of: dict[int, Group] = {}
        self.ref_deps: dict[int, set[tuple[str, int]]] = {}

    def producer(self, v: Node) -> Node:
        """The node whose buffer ``v`` reads (itself unless ``v`` is a view)."""
        return self.owner[id(v.value.storage)]

    def internal_level(self, v: Node, g: Group) -> str | None:
        """Level at which operand ``v`` is available inside ``g`` without a buffer."""
        p = self.producer(v)
        if self.group_of.get(id(p)) is not g:
            return None
        lvl = g.level[id(p)]
        if v is p:
            return lvl
        if lvl != "kept" or not g.raxes:
            return None
        # A reduction result broadcast back over exactly the reduced axes.
        val = v.value
        if tuple(val.shape) != g.full_shape or val.offset != p.value.offset:
            return None
        kc = contiguous_strides(tuple(g.full_shape[a] for a in g.kept_axes))
        for k, a in enumerate(g.kept_axes):
            if g.full_shape[a] != 1 and val.strides[a] != kc[k]:
                return None
        if any(val.strides[a] != 0 for a in g.raxes if g.full_shape[a] != 1):
            return None
        return "full_bcast"

    # Units are kernels ("g", gid) and reference ops ("r", id(node)); a unit's
    # direct dependencies are the units that produce what it reads.

    def _unit(self, v: Node) -> tuple[str, int] | None:
        p = self.producer(v)
        g = self.group_of.get(id(p))
        if g is not None:
            return ("g", g.gid)
        if id(p) in self.ref_deps:
            return ("r", id(p))
        return None  # an input, constant or variable: produced by no step

    def unit_deps(self, unit: tuple[str, int]) -> set[tuple[str, int]]:
        return self.groups[unit[1]].deps if unit[0] == "g" else self.ref_deps[unit[1]]

    def _depends(self, g: Group, unit: tuple[str, int]) -> bool:
        """Whether ``unit`` reads, directly or through other steps, a value of ``g``.

        Walked on demand over direct dependencies: a kernel's dependencies grow
        as members join it, so a snapshot of transitive ones would go stale.
        """
        target = ("g", g.gid)
        stack, seen = [unit], set()
        while stack:
            u = stack.pop()
            if u == target:
                return True
            if u in seen:
                continue
            seen.add(u)
            stack.extend(self.unit_deps(u))
        return False

    def add(self, n: Node) -> Group | None:
        """Place compute node ``n``; returns its group or None for the reference path."""
        if fusable(n):
            return self._add_ew(n)
        if fusable_reduce(n):
            return self._add_reduce(n)
        self.ref_deps[id(n)] = {u for v in n.inputs if (u := self._unit(v)) is not None}
        return None

    def merge_into_readers(self, placed: list[tuple[Node, Group | None]]) -> None:
        """Fold each pointwise kernel into the one kernel that reads its values.

        Placement joins a node to the kernel of one of its inputs' producers, so a
        chain that starts from program inputs (``v * beta2`` in an optimizer
        update) or from a reference step's result opens a kernel of its own. When
        all of a kernel's values are read, directly (not through views), by one
        other pointwise kernel of the same shape, and nothing it reads depends on
        that kernel, its members move to the front of the reader: one launch and
        no buffer in between. Folds cascade in creation order.
        """
        readers: dict[int, set[tuple[str, int]]] = {}
        direct: dict[int, bool] = {}  # gid -> every outside read of it is direct
        for n, g in placed:
            unit = ("g", g.gid) if g is not None else ("r", id(n))
            for v in n.inputs:
                p = self.producer(v)
                pg = self.group_of.get(id(p))
                if pg is not None and pg is not g:
                    readers.setdefault(pg.gid, set()).add(unit)
                    if v is not p:
                        direct[pg.gid] = False
        moved: dict[int, int] = {}  # gid -> the group its members went to

        def home(gid: int) -> int:
            while gid in moved:
                gid = moved[gid]
            return gid

        for a in self.groups:
            if a.raxes or not a.members:
                continue
            rs = {(kind, home(i) if kind == "g" else i) for kind, i in readers.get(a.gid, ())}
            if len(rs) != 1 or not direct.get(a.gid, True):
                continue
            kind, bid = next(iter(rs))
            b = self.groups[bid] if kind == "g" else None
            if b is None or b is a or b.raxes or b.full_shape != a.full_shape \
                    or b.has_index != a.has_index:
                continue
            if any(self._depends(b, d) for d in a.deps):
                continue  # a reads a step that reads b: folding would make a cycle
            b.members[:0] = a.members
            for m in a.members:
                b.level[id(m)] = "kept"
                self.group_of[id(m)] = b
            b.deps |= a.deps
            b.deps.discard(("g", a.gid))
            a.members = []
            a.deps = set()
            moved[a.gid] = b.gid
            for g in self.groups:  # a's other readers were b's members: now b itself
                if ("g", a.gid) in g.deps:
                    g.deps.discard(("g", a.gid))
                    if g is not b:
                        g.deps.add(("g", b.gid))

    def _join(self, n: Node, g: Group, level: str) -> Group:
        g.members.append(n)
        g.level[id(n)] = level
        self.group_of[id(n)] = g
        for v in n.inputs:
            u = self._unit(v)
            if u is not None and u != ("g", g.gid):
                g.deps.add(u)
        return g

    def _new(self, full_shape: tuple[int, ...], raxes: tuple[int, ...] = ()) -> Group:
        g = Group(len(self.groups), tuple(full_shape), tuple(raxes))
        self.groups.append(g)
        return g

    def _add_ew(self, n: Node) -> Group:
        shape = tuple(n.shape)
        tried: set[int] = set()
        indexed = uses_index(n)
        for v in n.inputs:
            g = self.group_of.get(id(self.producer(v)))
            if g is None or g.gid in tried or (indexed and g.raxes):
                continue
            tried.add(g.gid)
            if not g.raxes:
                target = "kept" if shape == g.full_shape else None
            elif shape == g.full_shape:
                target = "full"
            elif shape == g.kept_shape:
                target = "kept"
            else:
                target = None
            if target is None or not self._levels_fit(n, g, target):
                continue
            units = [self._unit(u) for u in n.inputs]
            if any(u is not None and u != ("g", g.gid) and self._depends(g, u) for u in units):
                continue
            g.has_index |= indexed
            return self._join(n, g, target)
        g = self._new(shape)
        g.has_index = indexed
        return self._join(n, g, "kept")

    def _levels_fit(self, n: Node, g: Group, target: str) -> bool:
        """Every operand internal to ``g`` must be readable at ``target`` level."""
        for u in n.inputs:
            ul = self.internal_level(u, g)
            if ul is None:
                if self.group_of.get(id(self.producer(u))) is g:
                    return False  # a view of a member the kernel cannot fold
                continue
            if not g.raxes:
                continue
            if target == "kept" and ul != "kept":
                return False
            if target == "full" and ul == "kept":
                return False
        return True

    def _add_reduce(self, n: Node) -> Group:
        v = n.inputs[0]
        axes = tuple(n.attrs["axes"])
        p = self.producer(v)
        g = self.group_of.get(id(p))
        if g is not None and v is p and tuple(v.shape) == g.full_shape:
            # Row loops walk the reduced axes innermost, so flat indices would not be
            # the logical ones: an indexed (dropout) group stays pointwise.
            if not g.raxes and not g.has_index and all(lv == "kept" for lv in g.level.values()):
                g.raxes = axes
                for k in g.level:
                    g.level[k] = "full"
                return self._join(n, g, "kept")
            if g.raxes == axes and g.level[id(p)] == "full":
                return self._join(n, g, "kept")
        g = self._new(tuple(v.shape), axes)
        return self._join(n, g, "kept")


@dataclass
class BuiltKernel:
    """A group turned into a spec plus the per-call integer arguments."""

    spec: cg.KernelSpec
    inputs: list[Node]          # value nodes read (views resolved at run time by layout)
    outputs: list[Node]         # member nodes stored
    int_args: list[int]
    params: list[Any]
    members: list[Node]
    loop_sizes: tuple[int, ...]


def _render(n: Node, names: list[str], pidx: list[int]) -> tuple[str, list[Any]]:
    """Expression text for elementwise node ``n`` over operand names."""
    op, fn = n.op, n.attrs.get("fn", "")
    params: list[Any] = []

    def param(value: Any) -> str:
        params.append(value)
        k = pidx[0]
        pidx[0] += 1
        return f"p{k}"

    if op == "binary":
        return BINARY[fn].template.format(a=names[0], b=names[1]), params
    if op == "compare":
        other = names[1] if len(names) > 1 else param(n.attrs["value"])
        return COMPARE[fn].template.format(a=names[0], b=other), params
    if op == "unary":
        d = UNARY[fn]
        ps = {f"p{k}": param(v) for k, v in enumerate(n.attrs.get("params", ()))}
        return d.template.format(x=names[0], i="i", **ps), params
    if op == "scalar":
        return SCALAR[fn].template.format(x=names[0], p0=param(n.attrs["value"])), params
    if op == "where":
        return f"({names[1]} if {names[0]} else {names[2]})", params
    if op == "elemental":
        pnames = [param(v) for v in n.attrs.get("params", ())]
        return f"uf_{fn}({', '.join(names + pnames)})", params
    if op == "cast":
        if n.dtype is DType.bool:
            return f"({names[0]} != 0)", params
        return names[0], params
    return names[0], params  # copy


def param_value(n: Node, value: Any) -> Any:
    """A scalar parameter in the dtype the reference kernel computes with."""
    dt = n.inputs[0].dtype.storage
    if n.op in ("unary", "elemental"):
        return value  # the template (or the user function) decides: seeds stay integers
    if n.op == "compare" and dt.kind in "iub":
        return np.float64(value) if float(value) != int(value) else np.int64(value)
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(dt)[()]


#: Outer loops shorter than this (two threads' chunks) give a pointwise kernel's next,
#: longer loop the outer place (see :func:`build`).
SHORT_OUTER = 16
#: Kept rows shorter than this run a max or min reduction in the row form (see
#: :func:`build`).
SHORT_KEPT = 16


def build(g: Group, fuser: Fuser, needed_outside: set[int], parallel_min: int) -> BuiltKernel:
    """Turn group ``g`` into a kernel spec with its runtime arguments."""
    full = g.full_shape
    kept_axes, raxes = g.kept_axes, tuple(g.raxes)
    loop_axes = kept_axes + raxes
    nk0 = len(kept_axes)
    steps: list[cg.Step] = []
    step_of: dict[int, int] = {}
    inputs: list[tuple[Node, str]] = []
    input_key: dict[tuple[int, str], int] = {}
    params: list[Any] = []
    pidx = [0]
    uses_index = False

    def operand(v: Node, level: str) -> int:
        p = fuser.producer(v)
        if id(p) in step_of and fuser.internal_level(v, g) is not None:
            return step_of[id(p)]
        key = (id(v), level)
        if key not in input_key:
            inputs.append((v, level))
            input_key[key] = len(steps)
            steps.append(cg.Step("load", level, np_name(v.dtype), arg=len(inputs) - 1))
        return input_key[key]

    for n in g.members:
        lvl = g.level[id(n)]
        if n.op == "reduce":
            src = operand(n.inputs[0], "full")
            steps.append(cg.Step("reduce", "kept", np_name(n.dtype), fn=n.attrs["fn"],
                                 arg=src, deps=(src,)))
        else:
            idx = [operand(v, lvl) for v in n.inputs]
            expr, ps = _render(n, [f"v{k}" for k in idx], pidx)
            if n.op == "unary" and "{i}" in UNARY[n.attrs["fn"]].template:
                uses_index = True
            params += [param_value(n, v) for v in ps]
            steps.append(cg.Step("ew", lvl, np_name(n.dtype), expr=expr, deps=tuple(idx)))
        step_of[id(n)] = len(steps) - 1

    outputs = [n for n in g.members if id(n) in needed_outside]
    # Per operand: (strides per loop axis, level, offset). Kept-level operands
    # only walk the kept axes.
    table: list[tuple[list[int], str, int]] = []
    for v, lvl in inputs:
        st: Sequence[int] = v.value.strides
        if lvl == "kept" and g.raxes:
            ks = [st[k] if len(st) == nk0 and full[a] != 1 else 0
                  for k, a in enumerate(kept_axes)]
            table.append((ks, "kept", v.value.offset))
        else:
            table.append(([st[a] if full[a] != 1 else 0 for a in loop_axes], "full",
                          v.value.offset))
    fc = contiguous_strides(full)
    kc = contiguous_strides(tuple(full[a] for a in kept_axes))
    for n in outputs:
        if g.level[id(n)] == "kept" and g.raxes:
            table.append((list(kc), "kept", 0))
        else:
            table.append(([fc[a] for a in loop_axes], "full", 0))

    sizes = [full[a] for a in loop_axes]
    runs_by_group: list[list[list[int]]] = []
    for axes in (list(range(nk0)), list(range(nk0, len(loop_axes)))):
        runs: list[list[int]] = []
        for a in (a for a in axes if sizes[a] != 1):
            if runs and all(_collapsible(st, lv, runs[-1][-1], a, sizes, nk0)
                            for st, lv, _ in table):
                runs[-1].append(a)
            else:
                runs.append([a])
        runs_by_group.append(runs)
    kruns, rruns = runs_by_group
    # A parallel kernel shares out its outer loop in chunks. When that loop is short and
    # the next one longer (rope's batch of 4 over [b, seq, h, 2, d/2]: 4 chunks for two
    # threads), a pointwise kernel swaps the two: only the order of the iterations
    # changes, each output is the same expression of the same inputs. (Not with the
    # flat element index, which follows the loop order, nor the innermost loop.)
    if not g.raxes and not uses_index and len(kruns) >= 3:
        n0, n1 = (math.prod(sizes[a] for a in run) for run in kruns[:2])
        if n0 < SHORT_OUTER <= n1:
            kruns[0], kruns[1] = kruns[1], kruns[0]
    nk, nr = len(kruns), len(rruns)
    all_runs = kruns + rruns
    loop_sizes = tuple(math.prod(sizes[a] for a in run) for run in all_runs)

    int_args: list[int] = []
    operands: list[cg.Operand] = []
    reduced_strides: list[int] = []  # each operand's along the (first) reduced run
    for st, lv, off in table:
        runs = kruns if (lv == "kept" and g.raxes) else all_runs
        cst = [st[run[-1]] for run in runs]
        reduced_strides.append(cst[nk] if len(cst) > nk else 0)
        pattern = []
        for k, s in enumerate(cst):
            last = k == nk - 1 or k == nk + nr - 1
            pattern.append(cg.BCAST if s == 0 else cg.UNIT if (s == 1 and last) else cg.STRIDED)
        operands.append(cg.Operand("", lv if g.raxes else "kept", tuple(pattern)))
        int_args.append(off)
        int_args += [s for s, p in zip(cst, pattern) if p == cg.STRIDED]
    nin = len(inputs)
    in_ops = tuple(cg.Operand(np_name(v.dtype), o.level, o.pattern)
                   for (v, _), o in zip(inputs, operands[:nin]))
    out_ops = tuple((cg.Operand(np_name(n.dtype), o.level, o.pattern), step_of[id(n)])
                    for n, o in zip(outputs, operands[nin:]))
    if not g.raxes:  # a pure pointwise kernel computes everything at one level
        steps = [cg.Step(s.kind, "kept", s.dtype, s.expr, s.arg, s.fn, s.deps) for s in steps]
    # Plain arithmetic is bound by memory: below 4x the threshold its second thread
    # gained less than the pool's hand-off costs (add over 256K f32: 60 us median on
    # one thread, 76-118 us on two; exp over 256K: 155-180 us on one, 105-115 on two;
    # 2-core Zen 3 VM).
    work_min = parallel_min if cg.calls_functions(steps) else 4 * parallel_min
    parallel = nk >= 1 and math.prod(full) >= work_min and loop_sizes[0] >= 2
    user = tuple(sorted({n.attrs["fn"] for n in g.members if n.op == "elemental"}))
    # A max or min (or integer sum) over a middle axis with a short kept row: the row
    # form walks each output's strided run in a register, where the swapped form loops
    # over the kept row once per reduced step (max over b of [4096, 7, 9] f32: 315 ->
    # 100 us, Zen 5). Float sums keep the swapped form: its flat rounds serve them.
    row_form = (nk >= 1 and nr >= 1 and loop_sizes[nk - 1] < SHORT_KEPT
                and not any(cg.lane_reduction(s) for s in steps))
    spec = cg.KernelSpec(nk, nr, in_ops, out_ops, tuple(steps), len(params), parallel,
                         uses_index, user_fns=user,
                         cache=all(user_fns.get(k).cacheable for k in user),
                         row_form=row_form,
                         short_rows=(nk >= 1 and nr >= 1
                                     and loop_sizes[nk - 1] <= cg.FLAT_ROW_MAX))
    if nr == 1 and cg.takes_direct_tree(spec, loop_sizes[nk], reduced_strides):
        spec = dataclasses.replace(spec, direct_rows=True)
    return BuiltKernel(spec, [v for v, _ in inputs], outputs, int_args, params,
                       list(g.members), loop_sizes)


def _collapsible(st: list[int], lv: str, a: int, b: int, sizes: list[int], nk: int) -> bool:
    if lv == "kept" and (a >= nk or b >= nk):
        return True
    return st[a] == st[b] * sizes[b]
