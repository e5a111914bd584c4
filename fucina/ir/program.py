"""Programs: traced IR optimized into a sequence of kernel launches.

A program is built once per input signature from the traced nodes:
dead-code and common-subexpression elimination, view folding (views are
layouts, read in place by whichever kernel consumes them), fusion into
generated kernels, and buffer reuse for intermediates. ``run`` binds argument
buffers and executes the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidDataLength
from ..kernels import cache as kcache
from ..kernels import codegen as cg
from ..kernels import gemm, reference, threads
from ..runtime.raw import RawTensor
from ..runtime.storage import POOL, storage_for
from .checks import VALUE_CHECKS, reads_index_values
from .fusion import BuiltKernel, Fuser, build
from .graph import Node, topo_order
from .ops import OPS, extent_message

#: Total elements from which a generated kernel runs its outer loop in parallel.
PARALLEL_MIN = 1 << 18
_NEVER_PARALLEL = 1 << 62  # no thread-safe threading layer: every kernel runs serial
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
                 writes: list[tuple[int, Node]] | tuple[()] = ()):
        self.inputs = inputs
        # per node value: (storage shape, offset, strides) in elements, filled on first
        # use; a decode step builds hundreds of views per run, each from fixed metadata
        self._vmeta: dict[int, tuple[tuple[int, ...], int, tuple[int, ...]]] = {}
        roots = list(outputs) + [v for _, v in writes]
        order = topo_order(roots)
        order, roots = _cse(order, roots)
        outputs = roots[:len(outputs)]
        self.outputs = outputs
        self.writes = [(k, v) for (k, _), v in zip(writes, roots[len(outputs):])]
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
                if reads_index_values(unit):  # index values are checked before any read
                    steps.append(Step("check", node=unit))
                steps.append(Step("ref", node=unit, gemm=gemm_plan(unit)))
                continue
            built = build(unit, fuser, needed,
                          PARALLEL_MIN if threads.THREAD_SAFE else _NEVER_PARALLEL)
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
                if sid not in keep and free.get(key):
                    self.slot[sid] = free[key].pop()
                else:
                    self.slot[sid] = len(self.slot_meta)
                    self.slot_meta.append((n.value.dtype.storage, count))
                    if sid in keep:
                        self.fresh_slots.add(self.slot[sid])
            for sid in {id(v.value.storage) for v in reads}:  # once per buffer
                if last_use.get(sid) == k and sid not in keep and sid in produced_ids:
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
        self._scratch_free: list[dict[int, np.ndarray]] = []

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
        slot = self.slot[sid]
        self.fresh_slots.discard(slot)
        self.slot[sid] = k
        return True

    # -- running -------------------------------------------------------------------

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
        bufs: list[Any] = [None] * len(self.slot_meta)
        for k, a in enumerate(args):
            buf: Any = a.storage.buf  # arguments and constants are concrete
            bufs[k] = buf[a.offset:] if a.offset else buf
        for slot, const in self.const_slots:
            v = const.value
            buf = v.storage.buf
            bufs[slot] = buf[v.offset:] if v.offset else buf
        try:
            scratch = self._scratch_free.pop()
        except IndexError:
            scratch = {}
        try:
            for st in self.steps:
                if st.kind == "kernel":
                    self._launch(st, bufs, scratch)
                else:
                    node: Any = st.node  # ref and check steps have a node
                    if st.kind == "ref":
                        self._ref(node, bufs, scratch, st.gemm)
                    else:
                        self._check(node, bufs)
            for k, w in self.copies:  # in-place updates not written by their kernel
                src = _view(bufs[self.slot[id(w.value.storage)]], w.value)
                np.copyto(_view(bufs[k], self.inputs[k].value), src)
        finally:
            if len(self._scratch_free) < _SCRATCH_SETS:
                self._scratch_free.append(scratch)
        results = []
        for o in self.outputs:
            sid = id(o.value.storage)
            slot = self.slot[sid]
            buf = bufs[slot]
            if slot < len(args):
                storage = args[slot].storage
                base = args[slot].offset
            else:
                storage = storage_for(buf, True)
                base = 0
            v = o.value
            results.append(RawTensor(storage.retain() if slot < len(args) else storage,
                                     v.dtype, v.shape, v.strides, v.offset + base))
        return results

    def _buffer(self, bufs: list[Any], node: Node, scratch: dict[int, np.ndarray]
                ) -> np.ndarray:
        slot = self.slot[id(node.value.storage)]
        buf = bufs[slot]
        if buf is None:
            dtype, count = self.slot_meta[slot]
            if slot in self.fresh_slots:
                buf = POOL.take(dtype, count)
            else:
                buf = scratch.get(slot)
                if buf is None:
                    buf = scratch[slot] = np.empty(count, dtype=dtype)
            bufs[slot] = buf
        return buf

    def _launch(self, st: Step, bufs: list[Any], scratch: dict[int, np.ndarray]) -> None:
        b: Any = st.built  # a kernel step: built and kernel are set
        kernel: Any = st.kernel
        outs = [self._buffer(bufs, n, scratch) for n in b.outputs]
        kernel(*outs, *[bufs[k] for k in st.in_slots], *st.tail)

    def _arrays(self, n: Node, bufs: list[Any]) -> list[np.ndarray]:
        out = []
        for v in n.inputs:
            raw = v.value
            meta = self._vmeta.get(id(raw))
            if meta is None:
                meta = self._vmeta[id(raw)] = (raw.storage_shape(), raw.offset, raw.strides)
            buf = bufs[self.slot[id(raw.storage)]]
            item = buf.itemsize
            out.append(np.ndarray(meta[0], dtype=buf.dtype, buffer=buf, offset=meta[1] * item,
                                  strides=tuple(s * item for s in meta[2])))
        return out

    def _check(self, n: Node, bufs: list[Any]) -> None:
        VALUE_CHECKS[n.op](n.inputs, n.attrs, self._arrays(n, bufs))

    def _ref(self, n: Node, bufs: list[Any], scratch: dict[int, np.ndarray],
             decided: Any = None) -> None:
        arrays = self._arrays(n, bufs)
        target = self._buffer(bufs, n, scratch) if n.op == "contract" else None
        res = reference.run(n.op, n.attrs, arrays, [v.dtype for v in n.inputs], n.dtype,
                            buf=target, decided=decided)
        if target is not None and np.shares_memory(res, target):
            return
        slot = self.slot[id(n.value.storage)]
        dtype, count = self.slot_meta[slot]
        res = np.asarray(res)
        if res.dtype == dtype and res.size == count and res.flags.c_contiguous:
            bufs[slot] = res.reshape(-1)  # adopt the result: no copy into a planned buffer
        else:
            self._buffer(bufs, n, scratch)[...] = np.ascontiguousarray(res, dtype=dtype
                                                                        ).reshape(-1)


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
