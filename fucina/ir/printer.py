"""Readable text for IR nodes and optimized programs."""

from __future__ import annotations

from typing import Any

import numpy as np

from .checks import check_text
from .graph import Node


def _attrs(n: Node) -> str:
    parts = []
    for k, v in n.attrs.items():
        if k in ("grad_index",) or v is None:
            continue
        if isinstance(v, np.ndarray):
            v = f"<{v.size} indices>" if v.size > 8 else v.tolist()
        elif hasattr(v, "value") and not isinstance(v, (int, float)):
            v = v.value
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _type(n: Node) -> str:
    tags = n.tags if n.tags is not None else ()
    dims = ", ".join(f"{t}={d}" for t, d in zip(tags, n.shape)) if tags else \
        "x".join(str(d) for d in n.shape)
    return f"{n.dtype.value}[{dims}]"


def format_nodes(nodes: list[Node], names: dict[int, str] | None = None) -> list[str]:
    """One line per node: ``%k = op(args; attrs) : dtype[tag=size, ...]``."""
    names = {} if names is None else names
    lines = []
    for n in nodes:
        if id(n) not in names:
            names[id(n)] = f"%{len(names)}"
        args = ", ".join(names.get(id(i), "?") for i in n.inputs)
        attrs = _attrs(n)
        sep = "; " if args and attrs else ""
        lines.append(f"{names[id(n)]} = {n.op}({args}{sep}{attrs}) : {_type(n)}")
    return lines


def format_program(prog: Any, input_notes: list[str] | None = None) -> str:
    """The optimized program: inputs, views, each kernel with the ops it covers, other ops.

    ``input_notes`` says where each input comes from (an argument, a captured tensor).
    """
    names: dict[int, str] = {}
    for k, n in enumerate(prog.inputs):
        names[id(n)] = f"%in{k}"
    for n in prog.nodes:
        if id(n) not in names:
            names[id(n)] = f"%{len(names)}"
    out = ["program:"]
    for k, n in enumerate(prog.inputs):
        note = f"   ({input_notes[k]})" if input_notes and k < len(input_notes) else ""
        out.append(f"  {names[id(n)]} : {_type(n)}{note}")
    for n in prog.nodes:
        if n.op in ("const", "variable"):
            out.append(f"  {names[id(n)]} = {n.op} : {_type(n)}")
        elif n.inputs and n.op in ("view", "reshape", "merge", "strided"):
            out.append("  " + format_nodes([n], names)[0] + "   (view: folded, no copy)")
    for st in prog.steps:
        if st.kind == "kernel":
            b = st.built
            kind = "row" if b.spec.nr else "pointwise"
            par = ", parallel" if b.spec.parallel else ""
            out.append(f"  kernel {st.kernel.name} ({kind}{par}; loops {list(b.loop_sizes)}; "
                       f"{len(b.members)} ops fused):")
            stored = {id(n) for n in b.outputs}
            for line, n in zip(format_nodes(b.members, names), b.members):
                out.append("    " + line + ("   -> stored" if id(n) in stored else ""))
        elif st.kind == "check":
            n = st.node
            at, holds, error = check_text(n)
            idx = ", ".join(names.get(id(i), "?") for i in n.inputs[at:at + 1])
            out.append(f"  check {idx}: {holds} for {names[id(n)]} = {n.op} "
                       f"({error} before any read)")
        else:
            n = st.node
            note = st.gemm.describe() if st.gemm is not None else "reference kernel"
            out.append("  " + format_nodes([n], names)[0] + f"   ({note})")
    copied = {id(v) for _, v in getattr(prog, "copies", ())}
    for k, v in getattr(prog, "writes", ()):
        how = "copied after the last step" if id(v) in copied else "stored in place by its kernel"
        out.append(f"  write %in{k} <- {names.get(id(v), '?')}   ({how})")
    out.append("  return " + ", ".join(names.get(id(o), "?") for o in prog.outputs))
    return "\n".join(out)
