"""Dispatch benchmark rows: the per-call cost of tiny ops (issue 13, target 7).

Each row times a tiny eager op against torch's same op (``add``, ``mul``, ``exp``,
``sum`` on 8 elements, ``dot`` of two 8x8 matrices), and a compiled one-op
function (add, mul, exp, sum, dot) against the eager op. The work is negligible,
so the times are the libraries' Python and dispatch overhead. The implementations
are timed in alternation, one batch of each per repeat (``fucina.bench.side_by_side``),
so a burst of load on a shared machine does not land on one side only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import fucina as F


def _bind(ref: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: ref(*args)


def dispatch_cases(case: type, side_by_side: Callable[..., Any], quick: bool) -> list[Any]:
    """The dispatch rows as ``case`` objects (``fucina.bench.Case``), timed with
    ``side_by_side`` (``fucina.bench.side_by_side``; passed in: that module imports
    this one)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the machine
        torch = None  # type: ignore[assignment]
    # per side: 25 batches of 20 ms, in alternation (quick runs: 5 of 4 ms)
    repeats, batch = (5, 0.004) if quick else (25, 0.02)
    ctx = F.ExecContext()
    rng = np.random.default_rng(0)
    x8, y8 = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    m, w = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    D = F.Tensor("d")
    a, b = D.from_numpy(ctx, x8), D.from_numpy(ctx, y8)
    xm, xw = F.Tensor("m", "k").from_numpy(ctx, m), F.Tensor("k", "n").from_numpy(ctx, w)
    ops: list[tuple[str, Callable[[], Any], Callable[[Any, Any, Any, Any], Any]]] = [
        ("add [8]", lambda: a.add(b), lambda t, ta, tb, tm: t.add(ta, tb)),
        ("mul [8]", lambda: a.mul(b), lambda t, ta, tb, tm: t.mul(ta, tb)),
        ("exp [8]", lambda: a.exp(), lambda t, ta, tb, tm: t.exp(ta)),
        ("sum [8]", lambda: a.sum("d"), lambda t, ta, tb, tm: t.sum(ta)),
        ("dot [8x8].[8x8]", lambda: xm.dot(xw, "k"), lambda t, ta, tb, tm: t.matmul(*tm)),
    ]
    cases = []
    for name, eager, ref in ops:
        c = case(f"dispatch eager {name}")
        fns: dict[str, Callable[[], Any]] = {"eager": eager}
        if torch is not None:
            ta, tb = torch.from_numpy(x8), torch.from_numpy(y8)
            tm = (torch.from_numpy(m), torch.from_numpy(w))
            fns["torch"] = _bind(ref, torch, ta, tb, tm)
        side_by_side(c, batch * repeats, repeats, **fns)
        if c.torch is not None:
            c.notes["eager/torch"] = float(c.eager) / float(c.torch)
        cases.append(c)
    compiled: list[tuple[str, Callable[..., Any], tuple[Any, ...], Callable[[], Any]]] = [
        ("add [8]", lambda p, q: p.add(q), (a, b), lambda: a.add(b)),
        ("mul [8]", lambda p, q: p.mul(q), (a, b), lambda: a.mul(b)),
        ("exp [8]", lambda p: p.exp(), (a,), lambda: a.exp()),
        ("sum [8]", lambda p: p.sum("d"), (a,), lambda: a.sum("d")),
        ("dot [8x8].[8x8]", lambda p, q: p.dot(q, "k"), (xm, xw), lambda: xm.dot(xw, "k")),
    ]
    for name, fn, args, eager in compiled:
        one = F.compile(fn)
        c = case(f"dispatch compiled one-op {name}")
        side_by_side(c, batch * repeats, repeats, compiled=_bind(one, *args), eager=eager)
        c.notes["compiled/eager"] = float(c.compiled) / float(c.eager)
        cases.append(c)
    return cases
