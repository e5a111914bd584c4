"""Programs: traced IR optimized into a sequence of kernel launches.

A program is built once per input signature from the traced nodes:
dead-code and common-subexpression elimination, view folding (views are
layouts, read in place by whichever kernel consumes them), fusion into
generated kernels, and buffer reuse for intermediates. ``run`` binds argument
buffers and executes the steps.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import InvalidDataLength
from ..kernels import batched_gemm, blas_threads, gemm, reference
from ..kernels import cache as kcache
from ..kernels import codegen as cg
from ..runtime.raw import RawTensor, contiguous_strides
from ..runtime.storage import (
    POOL,
    POOL_MIN_BYTES,
    PooledStorage,
    Storage,
    storage_for,
)
from .checks import VALUE_CHECKS, needs_value_check
from .fusion import BuiltKernel, Fuser, build
from .gemm_layout import gemm_into_copies
from .graph import Node, topo_order
from .ops import OPS, extent_message

#: Total elements from which a generated kernel that calls functions (exp, tanh...) runs
#: its outer loop in parallel, on fucina.kernels.pool's threads (which need no Numba
#: threading layer); plain arithmetic from 4x as many (see fusion.build).
PARALLEL_MIN = 1 << 18
#: Idle sets of intermediate buffers a program keeps for its next runs.
_SCRATCH_SETS = 4


def _attr_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _attr_key(x)) for k, x in v.items()))
    return v


def _cse(order: list[Node], outputs: list[Node]) -> tuple[list[Node], list[Node]]:
    """Merge nodes with the same op, inputs and attributes (first one wins)."""
    canon: dict[int, Node] = {}
    seen: dict[Any, Node] = {}
    out: list[Node] = []
    for n in order:
        if n.inputs:
            ins = tuple(canon.get(id(i), i) for i in n.inputs)
            if any(a is not b for a, b in zip(ins, n.inputs)):
                rebuilt = Node(n.op, ins, n.attrs, n.value, n.tags, n.requires_grad)
                layout = OPS[n.op].layout
                if layout is not None:
                    # A view's layout is relative to its input's storage: re-derive it.
                    rebuilt.value = layout(ins[0].value, n.attrs)
                n2 = rebuilt
            else:
                n2 = n
            key = (n.op, tuple(id(i) for i in ins), _attr_key(n.attrs))
            hit = seen.get(key)
            if hit is not None:
                canon[id(n)] = hit
                continue
            seen[key] = n2
            canon[id(n)] = n2
            out.append(n2)
        else:
            out.append(n)
    return out, [canon.get(id(o), o) for o in outputs]


@dataclass
class Step:
    """One program step: a generated kernel launch or a reference op."""

    kind: str                      # "kernel", "ref" or "check" (index values of a ref op)
    node: Node | None = None       # ref: the op
    built: BuiltKernel | None = None
    kernel: kcache.Kernel | None = None
    gemm: Any = None               # contract: the GEMM plan decided from traced layouts
    in_slots: tuple[int, ...] = () # kernel: the buffer slot of each input
    tail: tuple[Any, ...] = ()     # kernel: its integer, loop-size and parameter arguments


def _step_outputs(st: Step) -> list[Node]:
    if st.kind == "kernel":
        assert st.built is not None
        return st.built.outputs
    assert st.node is not None
    return [st.node] if st.kind == "ref" else []  # a check step produces nothing


def _step_inputs(st: Step) -> list[Node]:
    if st.kind == "kernel":
        assert st.built is not None
        return st.built.inputs
    assert st.node is not None
    return list(st.node.inputs)


class Program:
    """An optimized, runnable program for one input signature.

    ``writes`` are in-place updates of inputs, ``(input index, value node)``:
    after the run each input holds its value (an optimizer step writing the
    parameters and its state). A value computed by a pointwise kernel that
    is the last reader of its input is written straight into the input's
    buffer; any other value is copied there once every step has run.
    """

    def __init__(self, inputs: list[Node], outputs: list[Node],
                 writes: list[tuple[int, Node]] | tuple[()] = (),
                 checks: list[Node] | tuple[()] = ()):
        self.inputs = inputs
        # ``checks``: ops that check input values (index data, integer divisors), run (and
        # so checked) even when nothing reads their result, as eager checks each one.
        roots = list(outputs) + [v for _, v in writes] + list(checks)
        # Checking ops (in trace order) lead the walk, so their checks run in eager's order
        # where dependencies allow: the first bad value raises the error eager raises.
        order = topo_order(list(checks) + roots)
        order, roots = _cse(order, roots)
        order = gemm_into_copies(order, roots)
        outputs = roots[:len(outputs)]
        self.outputs = outputs
        self.writes = [(k, v) for (k, _), v in
                       zip(writes, roots[len(outputs):len(outputs) + len(writes)])]
        self.nodes = order
        # Buffers: every non-view node owns its value's storage.
        owner: dict[int, Node] = {}
        for n in order:
            if n.op not in OPS or not OPS[n.op].is_view:  # const/variable leaves own theirs
                owner[id(n.value.storage)] = n
        self.owner = owner
        fuser = Fuser(owner)
        placed: list[tuple[Node, Any]] = []
        for n in order:
            if n.op in ("input", "const", "variable") or OPS[n.op].is_view:
                continue
            placed.append((n, fuser.add(n)))
        fuser.merge_into_readers(placed)
        placed = [(n, fuser.group_of[id(n)] if g is not None else None) for n, g in placed]
        # A member's value leaves its kernel when anything outside the kernel reads it.
        needed: set[int] = {id(owner[id(o.value.storage)])
                            for o in outputs + [v for _, v in self.writes]}
        for n, g in placed:
            for v in n.inputs:
                p = owner[id(v.value.storage)]
                pg = fuser.group_of.get(id(p))
                if pg is None:
                    continue
                if g is not pg or fuser.internal_level(v, pg) is None:
                    needed.add(id(p))
        self.steps = self._order(placed, fuser, needed)
        self._plan_buffers()

    def _order(self, placed: list[tuple[Node, Any]], fuser: Fuser,
               needed: set[int]) -> list[Step]:
        """Steps (kernels and reference ops) in an order that respects their data deps.

        The dependencies are the fuser's own units (kernels and reference ops),
        the same graph it kept acyclic while fusing.
        """
        units: dict[tuple[str, int], Any] = {}  # first-appearance order
        for n, g in placed:
            units.setdefault(("g", g.gid) if g is not None else ("r", id(n)),
                             g if g is not None else n)
        order: list[tuple[str, int]] = []
        done: set[tuple[str, int]] = set()

        def visit(u: tuple[str, int], stack: set[tuple[str, int]]) -> None:
            stack.add(u)
            for d in sorted(fuser.unit_deps(u)):
                if d not in done:
                    assert d not in stack, "fusion produced a cycle"
                    visit(d, stack)
            stack.discard(u)
            done.add(u)
            order.append(u)

        for u in units:
            if u not in done:
                visit(u, set())
        steps: list[Step] = []
        for u in order:
            unit = units[u]
            if isinstance(unit, Node):
                if needs_value_check(unit):  # input values are checked before any read
                    steps.append(Step("check", node=unit))
                steps.append(Step("ref", node=unit, gemm=gemm_plan(unit)))
                continue
            built = build(unit, fuser, needed, PARALLEL_MIN)
            if built.outputs:  # a kernel nothing observes is dead
                steps.append(Step("kernel", built=built,
                                  kernel=kcache.load(cg.generate(built.spec))))
        return steps

    # -- buffers -----------------------------------------------------------------

    def _plan_buffers(self) -> None:
        """Assign buffer slots; intermediates whose last use has passed are reused."""
        self.slot: dict[int, int] = {}
        self.slot_meta: list[tuple[np.dtype, int]] = []
        for k, n in enumerate(self.inputs):
            self.slot[id(n.value.storage)] = k
            self.slot_meta.append((n.value.dtype.storage, 0))
        self.const_slots: list[tuple[int, Node]] = []
        produced: list[list[Node]] = []
        for st in self.steps:
            produced.append(_step_outputs(st))
        last_use: dict[int, int] = {}
        for k, st in enumerate(self.steps):
            reads = _step_inputs(st)
            for v in reads:
                last_use[id(v.value.storage)] = k
        keep = {id(o.value.storage) for o in self.outputs + [v for _, v in self.writes]}
        produced_ids = {id(n.value.storage) for ns in produced for n in ns}
        # A constant fill keeps a slot of its own: its values are then computed once
        # per program (see _constant), never overwritten by a value reusing the slot.
        own = {id(st.node.value.storage) for st in self.steps
               if st.kind == "ref" and st.node is not None and st.node.op == "fill"}
        free: dict[tuple[str, int], list[int]] = {}
        self.fresh_slots: set[int] = set()
        for k, st in enumerate(self.steps):
            reads = _step_inputs(st)
            for v in reads:
                sid = id(v.value.storage)
                if sid not in self.slot:
                    self.slot[sid] = len(self.slot_meta)
                    self.slot_meta.append((v.value.dtype.storage, 0))
                    self.const_slots.append((self.slot[sid], self.owner[sid]))
            for n in produced[k]:
                sid = id(n.value.storage)
                count = int(np.prod(n.value.storage_shape()))
                key = (n.value.dtype.storage.str, count)
                if sid not in keep and sid not in own and free.get(key):
                    self.slot[sid] = free[key].pop()
                else:
                    self.slot[sid] = len(self.slot_meta)
                    self.slot_meta.append((n.value.dtype.storage, count))
                    if sid in keep:
                        self.fresh_slots.add(self.slot[sid])
            for sid in {id(v.value.storage) for v in reads}:  # once per buffer
                if (last_use.get(sid) == k and sid not in keep and sid not in own
                        and sid in produced_ids):
                    # Key by the buffer's own size: a reader may see it through a
                    # broadcast view of another shape.
                    slot = self.slot[sid]
                    dtype, count = self.slot_meta[slot]
                    free.setdefault((dtype.str, count), []).append(slot)
        for o in self.outputs + [v for _, v in self.writes]:
            sid = id(o.value.storage)
            if sid not in self.slot:  # an output that is a const captured by the trace
                self.slot[sid] = len(self.slot_meta)
                self.slot_meta.append((o.value.dtype.storage, 0))
                self.const_slots.append((self.slot[sid], self.owner[sid]))
        self._plan_writes()
        for st in self.steps:  # after the writes: a value written in place reads its input
            if st.kind == "kernel":
                b: Any = st.built
                st.in_slots = tuple(self.slot[id(v.value.storage)] for v in b.inputs)
                st.tail = (*b.int_args, *b.loop_sizes, *b.params)
        # Per input: the element count its traced strided views read (0: none).
        self.input_need = [(k, need) for k, n in enumerate(self.inputs)
                           if (need := getattr(n.value.storage, "need", 0))]
        # Intermediate buffers, one set per concurrent run: a run takes a set (or makes
        # one) and gives it back, so threads calling one program never share scratch.
        # (list.pop/append are atomic: no lock needed.)
        self._scratch_free: list[_Scratch] = []
        self._prepare()

    def _plan_writes(self) -> None:
        """Write each in-place value into its input's buffer directly where that is safe.

        Safe: the value is stored by a pointwise kernel, in the input's own layout,
        every read of the input inside that kernel is element-aligned with the
        store, no later step reads the input's old value and the value is not a
        program output. Everything else is copied after the last step (``copies``).
        """
        self.copies: list[tuple[int, Node]] = []
        out_ids = {id(o.value.storage) for o in self.outputs}
        for k, v in self.writes:
            if not self._write_in_place(k, v, out_ids):
                self.copies.append((k, v))

    def _write_in_place(self, k: int, v: Node, out_ids: set[int]) -> bool:
        target = self.inputs[k].value
        sid, tid = id(v.value.storage), id(target.storage)
        if sid in out_ids or sid == tid or self.slot.get(sid, -1) < len(self.inputs):
            return False
        lay = (v.value.shape, v.value.strides, v.value.offset)
        if lay != (target.shape, target.strides, 0) or not target.is_contiguous():
            return False
        at = next((i for i, st in enumerate(self.steps)
                   if any(id(n.value.storage) == sid for n in _step_outputs(st))), None)
        if at is None:
            return False
        st = self.steps[at]
        if st.kind != "kernel" or st.built is None or st.built.spec.nr:
            return False
        for n in st.built.inputs:
            if id(n.value.storage) == tid and (n.value.shape, n.value.strides,
                                               n.value.offset) != lay:
                return False
        for later in self.steps[at + 1:]:  # (reading the value itself later is fine)
            if any(id(n.value.storage) == tid for n in _step_inputs(later)):
                return False
        if sum(id(w.value.storage) == sid for _, w in self.writes) > 1:
            return False  # one value written into two inputs: copy it into both
        if not st.built.spec.staged_stores:
            # Its store now meets its own input's loads in one buffer: the kernel is
            # generated to store each block after loading it (codegen._strip_body).
            st.built.spec = replace(st.built.spec, staged_stores=True)
            st.kernel = kcache.load(cg.generate(st.built.spec))
        slot = self.slot[sid]
        self.fresh_slots.discard(slot)
        self.slot[sid] = k
        return True

    # -- running -------------------------------------------------------------------
    #
    # Everything a run decides from the program alone is decided once, here: each
    # step becomes a runner closure holding its slots, its kernel and (for a GEMM)
    # its operand layouts. A run only binds buffers and calls the runners.

    def _prepare(self) -> None:
        """Build the per-step runners and the tables ``run`` reads."""
        n_in = len(self.inputs)
        self._n_in = n_in
        # Scratch slots a kernel or a planned GEMM writes into: allocated with the set.
        written: set[int] = set()
        self._runners: list[Callable[[list[Any], _Scratch], None]] = []
        # Constant fills held by a slot of their own: computed once, never written again.
        self._constants: list[tuple[int, np.ndarray]] = []
        shared = Counter(self.slot.values())
        for i, st in enumerate(self.steps):
            if st.kind == "ref" and st.node is not None and st.node.op == "fill":
                value = self._constant(st.node, shared)
                if value is not None:
                    self._constants.append((self.slot[id(st.node.value.storage)], value))
                    continue
            if st.kind == "kernel":
                runner, outs = self._kernel_runner(st)
            elif st.kind == "ref":
                runner, outs = self._ref_runner(i, st)
            else:
                runner, outs = self._check_runner(i, st), ()
            written.update(s for s in outs if s >= n_in and s not in self.fresh_slots)
            self._runners.append(runner)
        self._written = sorted(written)
        self._copy_plan = [(self.slot[id(w.value.storage)], w.value, k, self.inputs[k].value)
                           for k, w in self.copies]
        self._out_plan = [(self.slot[id(o.value.storage)], o.value) for o in self.outputs]
        # Outputs that are the whole of a fresh buffer no other output shares: a caller
        # may adopt them (compiled gradients) once it sees nothing else holds the buffer.
        uses = Counter(slot for slot, _ in self._out_plan)
        self.sole_outputs = frozenset(
            j for j, (slot, v) in enumerate(self._out_plan)
            if slot in self.fresh_slots and uses[slot] == 1 and v.offset == 0
            and v.is_contiguous() and v.numel == self.slot_meta[slot][1])

    def _constant(self, n: Node, shared: Counter[int]) -> np.ndarray | None:
        """A fill's values, when its slot is its own (no other value reuses it, no caller
        receives it): the slot then holds one array for every run."""
        slot = self.slot[id(n.value.storage)]
        if shared[slot] != 1 or slot < len(self.inputs) or slot in self.fresh_slots:
            return None
        dtype, count = self.slot_meta[slot]
        res = np.asarray(reference.run(n.op, n.attrs, [], [], n.dtype))
        if res.dtype != dtype or res.size != count:
            return None
        return np.ascontiguousarray(res).reshape(-1)

    def _new_scratch(self) -> _Scratch:
        bufs: list[Any] = [None] * len(self.slot_meta)
        for slot in self._written:
            dtype, count = self.slot_meta[slot]
            bufs[slot] = np.empty(count, dtype=dtype)
        for slot, value in self._constants:
            bufs[slot] = value
        return _Scratch(bufs)

    def _operand(self, i: int, j: int, v: Node) -> Callable[[list[Any], _Scratch], np.ndarray]:
        """A reader of step ``i``'s operand ``j``: its numpy view over the run's buffer.

        Views over intermediate and constant buffers are kept in the scratch set
        (those buffers persist with it); an argument's buffer changes per call,
        so its view is made each time (keeping it would keep the caller's data alive).
        """
        slot = self.slot[id(v.value.storage)]
        raw = v.value
        if slot < self._n_in or slot in self.fresh_slots:
            def fresh_view(bufs: list[Any], scr: _Scratch) -> np.ndarray:
                return _view(bufs[slot], raw)
            return fresh_view
        key = (i, j)

        def kept_view(bufs: list[Any], scr: _Scratch) -> np.ndarray:
            buf = bufs[slot]
            hit = scr.views.get(key)
            if hit is None or hit[0] is not buf:
                hit = scr.views[key] = (buf, _view(buf, raw))
            return hit[1]
        return kept_view

    def _kernel_runner(self, st: Step) -> tuple[Callable[[list[Any], _Scratch], None],
                                                 tuple[int, ...]]:
        b: Any = st.built
        outs = tuple(self.slot[id(n.value.storage)] for n in b.outputs)
        fresh = tuple((s, *self.slot_meta[s]) for s in outs if s in self.fresh_slots)
        slots = outs + st.in_slots
        pick: Callable[[list[Any]], tuple[Any, ...]]
        if len(slots) == 1:  # (itemgetter of one item returns the item, not a tuple)
            only = slots[0]

            def pick(bufs: list[Any]) -> tuple[Any, ...]:
                return (bufs[only],)
        else:
            pick = operator.itemgetter(*slots)
        tail = st.tail
        kernel: Any = st.kernel
        bare: list[Any] = [None]  # the dispatcher itself, once a first call was accounted

        def run(bufs: list[Any], scr: _Scratch) -> None:
            for s, dtype, count in fresh:
                bufs[s] = POOL.take(dtype, count)
            fn = bare[0]
            if fn is None:
                kernel(*pick(bufs), *tail)
                bare[0] = kernel.call
            else:
                fn(*pick(bufs), *tail)
        return run, outs

    def _check_runner(self, i: int, st: Step) -> Callable[[list[Any], _Scratch], None]:
        n: Any = st.node
        check = VALUE_CHECKS[n.op]
        readers = [self._operand(i, j, v) for j, v in enumerate(n.inputs)]

        def run(bufs: list[Any], scr: _Scratch) -> None:
            check(n.inputs, n.attrs, [r(bufs, scr) for r in readers])
        return run

    def _ref_runner(self, i: int, st: Step) -> tuple[Callable[[list[Any], _Scratch], None],
                                                      tuple[int, ...]]:
        n: Any = st.node
        slot = self.slot[id(n.value.storage)]
        dtype, count = self.slot_meta[slot]
        fresh = slot in self.fresh_slots
        p = st.gemm
        if (p is not None and n.dtype in (DType.f32, DType.f64) and p.out_perm is None
                and not p.copies and all(n.attrs["labels"][:2])):
            return self._gemm_runner(i, n, p, slot, fresh), (slot,)
        if n.op == "embed_view":
            embed = self._embed_runner(i, n, slot, fresh)
            if embed is not None:
                return embed, (slot,)
        readers = [self._operand(i, j, v) for j, v in enumerate(n.inputs)]
        op, attrs, out = n.op, n.attrs, n.dtype
        in_dtypes = [v.dtype for v in n.inputs]
        contract = op == "contract"

        def buffer(bufs: list[Any], scr: _Scratch) -> np.ndarray:
            buf = bufs[slot]
            if buf is None:
                if fresh:
                    buf = POOL.take(dtype, count)
                else:
                    buf = scr.bufs[slot]
                    if buf is None:
                        buf = scr.bufs[slot] = np.empty(count, dtype=dtype)
                bufs[slot] = buf
            return buf

        def run(bufs: list[Any], scr: _Scratch) -> None:
            arrays = [r(bufs, scr) for r in readers]
            target = buffer(bufs, scr) if contract else None
            res = reference.run(op, attrs, arrays, in_dtypes, out, buf=target, decided=p)
            if target is not None and np.shares_memory(res, target):
                return
            res = np.asarray(res)
            if res.dtype == dtype and res.size == count and res.flags.c_contiguous:
                # adopt the result: no copy into a planned buffer
                bufs[slot] = res if res.ndim == 1 else res.reshape(-1)
            else:
                buffer(bufs, scr)[...] = np.ascontiguousarray(res, dtype=dtype).reshape(-1)
        return run, ((slot,) if contract else ())

    def _embed_runner(self, i: int, n: Node, slot: int, fresh: bool
                      ) -> Callable[[list[Any], _Scratch], None] | None:
        """The adjoint of a one-to-one view (a bias gradient: a broadcast summed away)
        written straight into its buffer: the reference kernel's own sum, zeros and add,
        with the target layout decided once. None for overlapping views."""
        g, v = n.inputs[0].value, n.value
        if (g.dtype is not v.dtype or v.dtype.block_size != 1 or v.offset
                or not v.is_contiguous() or v.shape != tuple(n.attrs["in_shape"])):
            return None
        coeffs, base = n.attrs["coeffs"], n.attrs["base"]
        bcast = tuple(k for k, row in enumerate(coeffs) if not any(row))
        cstr = contiguous_strides(v.shape)
        shape = tuple(1 if k in bcast else d for k, d in enumerate(g.shape))
        strides = tuple(0 if k in bcast else sum(c * s for c, s in zip(row, cstr))
                        for k, row in enumerate(coeffs))
        if not reference.one_to_one(shape, strides):
            return None
        dtype, count = self.slot_meta[slot]
        item = dtype.itemsize
        off = sum(b * s for b, s in zip(base, cstr)) * item
        bstrides = tuple(s * item for s in strides)
        read = self._operand(i, 0, n.inputs[0])
        kept = not fresh and slot >= self._n_in
        key = (i, 1)

        def run(bufs: list[Any], scr: _Scratch) -> None:
            grad = read(bufs, scr)
            if bcast:
                grad = grad.sum(axis=bcast, keepdims=True)
            if fresh:
                buf = bufs[slot] = POOL.take(dtype, count)
            else:
                buf = bufs[slot]
            buf.fill(0)
            hit = scr.views.get(key) if kept else None
            if hit is None or hit[0] is not buf:
                hit = (buf, np.ndarray(shape, dtype=dtype, buffer=buf, offset=off,
                                       strides=bstrides))
                if kept:
                    scr.views[key] = hit
            target = hit[1]
            target += grad
        return run

    def _gemm_runner(self, i: int, n: Node, p: Any, slot: int, fresh: bool
                     ) -> Callable[[list[Any], _Scratch], None]:
        """A planned f32/f64 GEMM (``np.matmul``, or fucina's kernels for a stack of small
        f32 matrices or a large f32 matrix product: :func:`batched_gemm.matmul`) straight
        into the result's buffer.

        The matrix views are the ones :func:`gemm.contract` makes (the same shapes,
        strides and data); their layout is recorded on the first run and rebuilt
        from it (one ``np.ndarray`` call) when a buffer changes, or kept with the
        scratch set when the buffer is the set's own.
        """
        la, lb, _ = (tuple(x) for x in n.attrs["labels"])
        left, right = n.inputs
        if p.swapped:
            left, right, la, lb = right, left, lb, la
        dtype, count = self.slot_meta[slot]
        out_shape = p.batch_sizes + (p.msize, p.nsize)
        sides = ((left, la, p.m, p.k, p.a, p.msize, p.ksize),
                 (right, lb, p.k, p.n, p.b, p.ksize, p.nsize))
        mats = [self._matrix(i, j, *side, p) for j, side in enumerate(sides)]
        read_a, read_b = mats
        kept_out = not fresh and slot >= self._n_in
        key = (i, 2)
        mine = batched_gemm.routes_here(out_shape, p.ksize, dtype)
        matmul = batched_gemm.matmul if mine else blas_threads.gemm_call(
            np.matmul, p.msize, p.nsize, p.ksize)

        def run(bufs: list[Any], scr: _Scratch) -> None:
            A = read_a(bufs, scr)
            B = read_b(bufs, scr)
            if fresh:
                buf = bufs[slot] = POOL.take(dtype, count)
                matmul(A, B, buf.reshape(out_shape))
                return
            buf = bufs[slot]
            if kept_out:
                hit = scr.views.get(key)
                if hit is None or hit[0] is not buf:
                    hit = scr.views[key] = (buf, buf.reshape(out_shape))
                matmul(A, B, hit[1])
            else:
                matmul(A, B, buf.reshape(out_shape))
        return run

    def _matrix(self, i: int, j: int, v: Node, labels: tuple[int, ...], rows: tuple[int, ...],
                cols: tuple[int, ...], side: Any, nrows: int, ncols: int, p: Any
                ) -> Callable[[list[Any], _Scratch], np.ndarray]:
        slot = self.slot[id(v.value.storage)]
        raw = v.value
        kept = slot >= self._n_in and slot not in self.fresh_slots
        key = (i, j)
        layout: list[Any] = []  # (shape, strides, byte offset into the buffer), once known

        def make(buf: np.ndarray) -> np.ndarray:
            if layout:
                shape, strides, off = layout[0]
                return np.ndarray(shape, dtype=buf.dtype, buffer=buf, offset=off,
                                  strides=strides)
            m = gemm.matrix_view(_view(buf, raw), labels, p.batch, rows, cols, side,
                                 p.batch_sizes, nrows, ncols)
            off = m.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
            layout.append((m.shape, m.strides, off))
            return m

        if not kept:
            def fresh_matrix(bufs: list[Any], scr: _Scratch) -> np.ndarray:
                return make(bufs[slot])
            return fresh_matrix

        def kept_matrix(bufs: list[Any], scr: _Scratch) -> np.ndarray:
            buf = bufs[slot]
            hit = scr.views.get(key)
            if hit is None or hit[0] is not buf:
                hit = scr.views[key] = (buf, make(buf))
            return hit[1]
        return kept_matrix

    def run(self, args: list[RawTensor]) -> list[RawTensor]:
        """Execute on argument raw tensors; returns raw results.

        Safe to call from several threads at once: each run has its own
        buffer table and intermediate buffers.
        """
        for k, need in self.input_need:
            a = args[k]
            size = a.storage.buf.size  # type: ignore[union-attr]  # arguments are concrete
            if a.offset + need > size:
                raise InvalidDataLength(extent_message(a.offset + need - 1, size))
        try:
            scratch = self._scratch_free.pop()
        except IndexError:
            scratch = self._new_scratch()
        bufs = scratch.bufs.copy()
        for k, a in enumerate(args):
            buf: Any = a.storage.buf  # arguments and constants are concrete
            bufs[k] = buf[a.offset:] if a.offset else buf
        for slot, const in self.const_slots:
            v = const.value
            buf = v.storage.buf
            bufs[slot] = buf[v.offset:] if v.offset else buf
        try:
            # inf and NaN are defined values: IEEE results, never numpy warnings
            with np.errstate(all="ignore"):
                for runner in self._runners:
                    runner(bufs, scratch)
            for src, sv, k, tv in self._copy_plan:  # in-place updates not written by a kernel
                np.copyto(_view(bufs[k], tv), _view(bufs[src], sv))
        finally:
            if len(self._scratch_free) < _SCRATCH_SETS:
                self._scratch_free.append(scratch)
        results = []
        n_args = len(args)
        for slot, v in self._out_plan:
            buf = bufs[slot]
            if slot < n_args:
                a = args[slot]
                results.append(RawTensor(a.storage.retain(), v.dtype, v.shape, v.strides,
                                         v.offset + a.offset))
            else:
                results.append(RawTensor(storage_for(buf, True), v.dtype, v.shape, v.strides,
                                         v.offset))
        return results

    def one_kernel_runner(self) -> OneKernel | None:
        """A leaner :meth:`run` for a program that is one kernel reading its arguments
        into one fresh result buffer (no constants, intermediates or in-place writes),
        or None for any other program."""
        if len(self.steps) != 1 or self.steps[0].kind != "kernel" or self.writes \
                or self.const_slots or self._constants or self._copy_plan:
            return None
        st = self.steps[0]
        b: Any = st.built
        n_in = len(self.inputs)
        outs = tuple(self.slot[id(n.value.storage)] for n in b.outputs)
        if len(outs) != 1 or outs[0] not in self.fresh_slots \
                or any(s >= n_in for s in st.in_slots) \
                or any(slot != outs[0] for slot, _ in self._out_plan):
            return None
        return OneKernel(self, st, outs[0])

    def one_gemm_node(self) -> Node | None:
        """The contract node of a program that is one planned GEMM (``np.matmul`` or the
        stacked kernel, no copies or output permutation) of its two arguments, as given,
        into a fresh f32/f64 result it returns as is; None for any other program."""
        if len(self.steps) != 1 or self.writes or self.const_slots or self._constants \
                or self._copy_plan or self.input_need:
            return None
        st = self.steps[0]
        n = st.node
        p = st.gemm
        if st.kind != "ref" or n is None or n.op != "contract" or p is None \
                or p.out_perm is not None or "copy" in (p.a.orient, p.b.orient):
            return None
        ins = self.inputs
        if len(ins) != 2 or tuple(n.inputs) != tuple(ins) or ins[0] is ins[1]:
            return None
        dt = n.value.dtype
        if dt.name not in ("f32", "f64") or any(i.value.dtype is not dt for i in ins):
            return None
        plan = self._out_plan
        slot = self.slot.get(id(n.value.storage))
        if len(plan) != 1 or plan[0][0] != slot or slot not in self.fresh_slots \
                or plan[0][1] is not n.value:
            return None
        return n


class OneKernel:
    """A one-kernel program's run, lean: the checks :meth:`Program.run` makes (each
    argument's extent), one fresh result buffer, and the kernel's compiled entry point
    while the argument buffers have the dtypes of the first call (Numba's dispatcher
    otherwise, and for borrowed storage). A caller may inline the common case: no
    extent checks (``input_need`` empty), then ``entry(out, *buffers, *tail)``."""

    __slots__ = ("kernel", "tail", "in_slots", "dt", "count", "small", "results", "result",
                 "input_need", "entry", "dtypes")

    def __init__(self, program: Program, st: Step, slot: int):
        self.kernel: Any = st.kernel
        self.tail = st.tail
        self.in_slots = st.in_slots
        self.dt = np.dtype(program.slot_meta[slot][0])
        self.count = program.slot_meta[slot][1]
        self.small = self.count * self.dt.itemsize < POOL_MIN_BYTES
        self.results = [v for _, v in program._out_plan]
        self.result = self.results[0]  # the (first) result's layout
        self.input_need = program.input_need
        self.entry: Any = None  # the compiled entry point, once a first call ran
        self.dtypes: tuple[np.dtype, ...] = ()  # the input dtypes it takes

    def __call__(self, args: list[RawTensor]) -> list[RawTensor]:
        """Run on argument raw tensors; returns raw results (as :meth:`Program.run`)."""
        for k, need in self.input_need:
            a = args[k]
            size = a.storage.buf.size  # type: ignore[union-attr]  # concrete arguments
            if a.offset + need > size:
                raise InvalidDataLength(extent_message(a.offset + need - 1, size))
        small = self.small
        out = np.empty(self.count, self.dt) if small else POOL.take(self.dt, self.count)
        fn = self.entry
        dtypes = self.dtypes
        bufs = [out]
        borrowed = False
        for j, s in enumerate(self.in_slots):
            a = args[s]
            st = a.storage
            buf: Any = st.buf
            borrowed = borrowed or st.borrowed
            if fn is not None and buf.dtype is not dtypes[j]:
                fn = None  # not the types the entry was made for: Numba dispatches
            bufs.append(buf[a.offset:] if a.offset else buf)
        if fn is not None and not borrowed:
            fn(*bufs, *self.tail)
        else:
            self.kernel(*bufs, *self.tail)
            if self.entry is None and not borrowed:
                self.dtypes = tuple(x.dtype for x in bufs[1:])
                self.entry = self.kernel.bare((*bufs, *self.tail))
        return [RawTensor(Storage(out) if small else PooledStorage(out), v.dtype, v.shape,
                          v.strides, v.offset) for v in self.results]


class _Scratch:
    """One set of intermediate buffers (slot -> buffer, None where a run binds its own)
    and the operand views made over them, which stay valid while the buffers do."""

    __slots__ = ("bufs", "views")

    def __init__(self, bufs: list[Any]):
        self.bufs = bufs
        self.views: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def gemm_plan(n: Node) -> Any:
    """The GEMM plan of a contract node, decided from its traced layouts (else None)."""
    if n.op != "contract" or any(i.dtype is not n.dtype for i in n.inputs):
        return None
    a, b = n.inputs
    la, lb, lo = (tuple(x) for x in n.attrs["labels"])
    return gemm.plan(a.value.shape if la else (), a.value.strides if la else (), la,
                     b.value.shape if lb else (), b.value.strides if lb else (), lb, lo)


def _view(buf: np.ndarray, v: RawTensor) -> np.ndarray:
    item = buf.itemsize
    return np.ndarray(v.storage_shape(), dtype=buf.dtype, buffer=buf, offset=v.offset * item,
                      strides=tuple(s * item for s in v.strides))
