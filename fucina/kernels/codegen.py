"""Numba source generation for fused elementwise and row-reduction kernels.

One generator covers pointwise chains, reductions with their producers, and
row programs (softmax/layernorm shapes) in a single kernel. A kernel's loop
nest is ``nk`` kept (outer, parallel) axes followed by ``nr`` reduced (inner)
axes. Every array is passed as its flat 1-D storage buffer plus an offset
and one stride per loop axis, so views fold into index maps. Kernels are
specialized on the operand patterns (per loop axis: broadcast, strided or
unit stride), dtypes, ranks and the expression DAG, never on sizes, strides
or tag names: those arrive as runtime arguments.

Within one outer iteration, reductions run in phases: a reduction whose input
needs an earlier reduction's result (softmax's sum after its max) runs in a
later inner loop over the same row, which is still in cache. Full-level
expressions are recomputed in each inner loop that needs them rather than
stored.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Operand pattern per loop axis.
BCAST, STRIDED, UNIT = "b", "s", "u"

FLOAT_DTYPES = frozenset({"float32", "float64"})
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16"})
CODEGEN_DTYPES = FLOAT_DTYPES | INT_DTYPES | {"bool"}

# Numba spellings of the scalar constructors for each dtype.
_CTOR = {
    "float32": "np.float32", "float64": "np.float64", "int8": "np.int8", "int16": "np.int16",
    "int32": "np.int32", "int64": "np.int64", "uint8": "np.uint8", "uint16": "np.uint16",
    "bool": "np.bool_",
}

# fastmath without nnan/ninf: the NaN and inf semantics of the ops must survive. No arcp
# either: it turns a loop-invariant ``x / d`` into ``x * (1 / d)``, which is inf for a
# tiny d (1e-40) where the quotient itself is finite.
FASTMATH = '{"nsz", "contract", "afn", "reassoc"}'


@dataclass(frozen=True)
class Operand:
    """An array argument: dtype, level ('full' or 'kept') and per-loop-axis pattern."""

    dtype: str
    level: str
    pattern: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """One value computed in the kernel.

    kind 'load': ``arg`` is the input index. kind 'ew': ``expr`` is a Python
    expression over earlier step names ``v<k>``, params ``p<k>`` and ``i``.
    kind 'reduce': ``fn`` in sum/mean/max/min/prod over the inner axes of
    step ``arg`` (a full-level step); the result is kept-level.
    """

    kind: str
    level: str
    dtype: str
    expr: str = ""
    arg: int = -1
    fn: str = ""
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class KernelSpec:
    """Everything that determines a kernel's source text."""

    nk: int
    nr: int
    inputs: tuple[Operand, ...]
    outputs: tuple[tuple[Operand, int], ...]
    steps: tuple[Step, ...]
    nparams: int
    parallel: bool
    uses_index: bool = False
    user_fns: tuple[str, ...] = ()  # keys of user scalar functions the steps call
    cache: bool = True  # False: a user function without a stable fingerprint


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)


def _index_expr(name: str, pattern: tuple[str, ...], axes: list[int], loops: list[str],
                base: str) -> str:
    terms = [base]
    for a, var in zip(axes, loops):
        p = pattern[a]
        if p == BCAST:
            continue
        terms.append(var if p == UNIT else f"{var} * st_{name}_{a}")
    return " + ".join(terms)


def _reduce_init(fn: str, dtype: str) -> str:
    ctor = _CTOR[dtype]
    if fn in ("sum", "mean"):
        return f"{ctor}(0)"
    if fn == "prod":
        return f"{ctor}(1)"
    if fn == "max":
        return f"{ctor}(-np.inf)" if dtype in FLOAT_DTYPES else f"{ctor}(np.iinfo(np.{dtype}).min)"
    if fn == "min":
        return f"{ctor}(np.inf)" if dtype in FLOAT_DTYPES else f"{ctor}(np.iinfo(np.{dtype}).max)"
    raise KeyError(fn)


def _reduce_update(fn: str, acc: str, val: str) -> str:
    if fn in ("sum", "mean"):
        return f"{acc} += {val}"
    if fn == "prod":
        return f"{acc} *= {val}"
    if fn == "max":
        return f"{acc} = sf.maximum_nan({acc}, {val})"
    return f"{acc} = sf.minimum_nan({acc}, {val})"


def _closure(steps: tuple[Step, ...], roots: list[int], level: str) -> list[int]:
    """Steps of ``level`` that ``roots`` need, in step order."""
    need: set[int] = set()
    stack = list(roots)
    while stack:
        k = stack.pop()
        if k in need or steps[k].level != level:
            continue
        need.add(k)
        st = steps[k]
        deps = list(st.deps)
        if st.kind == "reduce":
            deps = []
        stack.extend(deps)
    return sorted(need)


def generate(spec: KernelSpec) -> str:
    """Python source of a module defining ``kernel`` for ``spec``."""
    nk, nr = spec.nk, spec.nr
    steps = spec.steps
    w = _Writer()
    args: list[str] = []
    names_in = [f"in{j}" for j in range(len(spec.inputs))]
    names_out = [f"out{j}" for j in range(len(spec.outputs))]
    operands = list(zip(names_in, spec.inputs)) + list(
        zip(names_out, (o for o, _ in spec.outputs)))
    args += names_out + names_in
    for name, op in operands:
        args.append(f"off_{name}")
        args += [f"st_{name}_{a}" for a, p in enumerate(op.pattern) if p == STRIDED]
    args += [f"n{a}" for a in range(nk + nr)]
    args += [f"p{k}" for k in range(spec.nparams)]

    w(0, "import math")
    w(0, "import numpy as np")
    w(0, "from numba import njit, prange")
    w(0, "from fucina.kernels import scalar_fns as sf")
    w(0, "from fucina.kernels import vecmath as vm")
    if spec.user_fns:
        w(0, "from fucina.kernels import user_fns as uf")
        w(0, "")
        w(0, f"USER_FNS = {spec.user_fns!r}")
        for key in spec.user_fns:  # user scalar functions, bound by registry key
            w(0, f'uf_{key} = uf.dispatcher("{key}")')
    w(0, "")
    w(0, "")
    par = "True" if spec.parallel else "False"
    # error_model numpy: x / 0 is inf or nan, as in the reference kernels, not an exception.
    w(0, f"@njit(cache={spec.cache}, fastmath={FASTMATH}, parallel={par}, nogil=True, "
         'error_model="numpy")')
    w(0, f"def kernel({', '.join(args)}):")
    kloops = [f"k{a}" for a in range(nk)]
    depth = 1
    if nk == 0:
        w(depth, "if True:")
        depth += 1
    for a in range(nk):
        rng = "prange" if (a == 0 and spec.parallel) else "range"
        w(depth, f"for k{a} in {rng}(n{a}):")
        depth += 1
    # Operand bases over the kept loops.
    for name, op in operands:
        w(depth, f"b_{name} = " + _index_expr(name, op.pattern, list(range(nk)), kloops,
                                               f"off_{name}"))
    if spec.uses_index:
        flat = "0"
        for a in range(nk):
            flat = f"({flat}) * n{a} + k{a}" if a else f"k{a}"
        w(depth, f"i = {flat}")

    def emit_step(d: int, k: int, inner: bool) -> None:
        st = steps[k]
        if st.kind == "load":
            name = names_in[st.arg]
            op = spec.inputs[st.arg]
            if inner:
                idx = _index_expr(name, op.pattern, list(range(nk, nk + nr)),
                                  [f"r{a}" for a in range(nr)], f"b_{name}")
            else:
                idx = f"b_{name}"
            # Unsigned indices: a signed index makes Numba emit a wraparound select
            # per access, which stops LLVM from vectorizing (measured: 12x slower).
            w(d, f"v{k} = {_CTOR[st.dtype]}({name}[np.uint64({idx})])")
        elif st.kind == "ew":
            w(d, f"v{k} = {_CTOR[st.dtype]}({st.expr})")

    # Kernel-level (kept) phases.
    kept_phase: dict[int, int] = {}
    for k, st in enumerate(steps):
        if st.level != "kept":
            continue
        if st.kind == "reduce":
            full = _closure(steps, [st.arg], "full")
            kdeps = {d for f in full for d in steps[f].deps if steps[d].level == "kept"}
            kept_phase[k] = 1 + max((kept_phase[d] for d in kdeps), default=0)
        else:
            kept_phase[k] = max((kept_phase[d] for d in st.deps), default=0)
    nphases = max(kept_phase.values(), default=0)
    done: set[int] = set()

    def emit_kept(phase: int) -> None:
        for k, st in enumerate(steps):
            if st.level == "kept" and st.kind != "reduce" and kept_phase[k] == phase \
                    and k not in done:
                emit_step(depth, k, inner=False)
                done.add(k)

    emit_kept(0)
    rloops = [f"r{a}" for a in range(nr)]
    for phase in range(1, nphases + 1):
        reds = [k for k, st in enumerate(steps) if st.kind == "reduce" and kept_phase[k] == phase]
        for k in reds:
            w(depth, f"v{k} = {_reduce_init(steps[k].fn, steps[k].dtype)}")
        d = depth
        for a in range(nr):
            w(d, f"for r{a} in range(n{nk + a}):")
            d += 1
        for f in _closure(steps, [steps[k].arg for k in reds], "full"):
            emit_step(d, f, inner=True)
        for k in reds:
            w(d, _reduce_update(steps[k].fn, f"v{k}", f"v{steps[k].arg}"))
        for k in reds:
            done.add(k)
            if steps[k].fn == "mean":
                count = " * ".join(f"n{nk + a}" for a in range(nr)) or "1"
                w(depth, f"v{k} = v{k} / {_CTOR[steps[k].dtype]}({count})")
        emit_kept(phase)
    # Stores: kept-level outputs, then one inner loop for full-level outputs.
    for (op, k), name in zip(spec.outputs, names_out):
        if op.level == "kept":
            w(depth, f"{name}[np.uint64(b_{name})] = v{k}")
    full_outs = [(op, k, name) for (op, k), name in zip(spec.outputs, names_out)
                 if op.level == "full"]
    if full_outs:
        d = depth
        for a in range(nr):
            w(d, f"for r{a} in range(n{nk + a}):")
            d += 1
        for f in _closure(steps, [k for _, k, _ in full_outs], "full"):
            emit_step(d, f, inner=nr > 0)
        for op, k, name in full_outs:
            idx = _index_expr(name, op.pattern, list(range(nk, nk + nr)), rloops, f"b_{name}")
            w(d, f"{name}[np.uint64({idx})] = v{k}")
    w(0, "")
    return "\n".join(w.lines) + "\n"
