"""Load for ``python -m fucina.bench``: helper processes that spin on a core.

Each helper is a pure-Python busy loop in its own process (``multiprocessing``),
the "second process spinning on one core" a shared machine has. They run for
the duration of a ``with busy_processes(n):`` block (``--busy N``) and are
always ended when it exits, by an exception or Ctrl-C included. A helper also
ends by itself once the process that started it is gone (killed without
running its cleanup), so none is left spinning.

``--paired-load N`` (:func:`paired_load`) keeps the helpers paused (SIGSTOP)
and lets them spin only while a repeat is timed under load, so every row gets
a quiet and a loaded time from the same minutes of the same run: a shared
host drifts by tens of percent between two whole runs, which buried the
loaded/quiet ratio of a ``--busy`` run compared with a separate quiet one.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: How often (loop iterations) a helper checks that its parent still lives: ~0.1 s.
_CHECK_EVERY = 2_000_000


#: prctl's PR_SET_PDEATHSIG (Linux): a signal the kernel sends when the parent dies.
_PR_SET_PDEATHSIG = 1


def _spin(parent: int, ready: Any) -> None:
    # Ctrl-C reaches the whole process group: the parent ends us, quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):  # a paused (stopped) helper cannot check its parent
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    ready.set()
    while True:
        for _ in range(_CHECK_EVERY):
            pass
        if os.getppid() != parent:  # the parent died without ending us
            return


def _context() -> Any:
    # fork starts a helper in milliseconds; spawn would first re-import the
    # benchmark's main module (numba, torch) in every helper. The child only
    # spins, touching no lock a parent thread could hold, so forking is safe on
    # Linux; elsewhere (macOS system libraries, Windows) spawn is the safe choice.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


@contextmanager
def busy_processes(n: int, start_timeout: float = 60.0) -> Iterator[list[Any]]:
    """Run ``n`` spinning helper processes while the block runs; yields them.

    Waits until every helper is spinning before the block starts, and ends
    (terminates, then kills) all of them when it exits, however it exits.
    """
    if n < 0:
        raise ValueError(f"busy_processes needs n >= 0, got {n}")
    ctx = _context()
    procs: list[Any] = []
    try:
        for _ in range(n):
            ready = ctx.Event()
            p = ctx.Process(target=_spin, args=(os.getpid(), ready), daemon=True,
                            name="fucina-bench-busy")
            p.start()
            procs.append(p)
            if not ready.wait(start_timeout):
                raise RuntimeError("a busy helper process did not start")
        yield procs
    finally:
        _stop(procs)


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():  # ignored SIGTERM: no choice left
            p.kill()
            p.join()


class PausedLoad:
    """Helper processes that spin only inside :meth:`running` (SIGCONT / SIGSTOP)."""

    #: Seconds to let resumed helpers reach a core before the timed calls start.
    SETTLE = 0.002

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs
        self.spinning = True

    def pause(self) -> None:
        """Stop every helper (SIGSTOP): the machine is quiet again."""
        self._signal(signal.SIGSTOP)
        self.spinning = False

    def resume(self) -> None:
        """Let every helper spin again (SIGCONT)."""
        self._signal(signal.SIGCONT)
        self.spinning = True

    @contextmanager
    def running(self) -> Iterator[None]:
        """The helpers spin while the block runs and are paused after it, however it exits."""
        self.resume()
        time.sleep(self.SETTLE)
        try:
            yield
        finally:
            self.pause()

    def _signal(self, sig: int) -> None:
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, sig)


@contextmanager
def paired_load(n: int) -> Iterator[PausedLoad]:
    """``n`` helper processes, started paused; yields the switch (:class:`PausedLoad`).

    They are resumed before they are ended (a stopped process would hold a
    SIGTERM until it ran again), and on Linux the kernel kills them if this
    process dies while they are paused.
    """
    if n and not hasattr(signal, "SIGSTOP"):
        raise RuntimeError("paired load needs SIGSTOP and SIGCONT (a POSIX system)")
    with busy_processes(n) as procs:
        load = PausedLoad(procs)
        load.pause()
        try:
            yield load
        finally:
            load.resume()


def _fmt_ratio(x: float) -> str:
    return f"{x:6.2f}x"


def _paired(case: Any, impl: str) -> tuple[Any, Any] | None:
    """A row's quiet timing of ``impl`` and its loaded twin, or None when not paired."""
    t = getattr(case, impl, None)
    busy = getattr(t, "busy", None)
    if t is None or busy is None or not float(t):
        return None
    return t, busy


def load_ratios(cases: list[Any], impls: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per row and implementation, the loaded time over the quiet one (medians over the
    paired repeats, as :func:`load_table` judges them) for every timing that has a loaded
    twin (``.busy``, set by paired timing)."""
    out: dict[str, dict[str, float]] = {}
    for c in cases:
        r = {k: p[1].median / p[0].median for k in impls if (p := _paired(c, k)) is not None}
        if r:
            out[c.name] = r
    return out


def load_table(cases: list[Any], impls: tuple[str, ...], limit: float = 2.0) -> str:
    """Loaded over quiet per row (min and median over the paired repeats), then the rows
    whose fucina time (compiled, else eager) rose above ``limit`` times by median."""
    head = f"{'case':44} " + " ".join(f"{k + ' min/med':>19}" for k in impls)
    lines = [head, "-" * len(head)]
    worst: list[tuple[float, str]] = []
    counted = 0
    for c in cases:
        pairs = {k: p for k in impls if (p := _paired(c, k)) is not None}
        if not pairs:
            continue
        cells = [f"{'-':>19}" if k not in pairs else
                 f"{_fmt_ratio(float(pairs[k][1]) / float(pairs[k][0]))} "
                 f"{_fmt_ratio(pairs[k][1].median / pairs[k][0].median):>8}".rjust(19)
                 for k in impls]
        lines.append(f"{c.name:44} " + " ".join(cells))
        key = "compiled" if getattr(c, "compiled", None) is not None else "eager"
        if key in pairs:
            counted += 1
            t, busy = pairs[key]
            if busy.median / t.median > limit:
                worst.append((busy.median / t.median, c.name))
    worst.sort(reverse=True)
    lines.append(f"fucina rows (compiled, else eager) above {limit:g}x their quiet time by "
                 f"median: {len(worst)} of {counted}"
                 + ("" if not worst else ": " + "; ".join(f"{n} {r:.2f}x" for r, n in worst)))
    return "\n".join(lines)


def _doc_load(row: dict[str, Any]) -> float | None:
    """A saved row's loaded/quiet median ratio for fucina (compiled, else eager), or None
    when that timing was not paired."""
    spread = row.get("spread", {})
    st = spread.get("compiled") or spread.get("eager") or {}
    if "busy_median" not in st or not st.get("median"):
        return None
    return float(st["busy_median"]) / float(st["median"])


def load_compare(a: dict[str, Any], b: dict[str, Any], limit: float = 2.0) -> str:
    """Fucina's loaded/quiet ratio (medians) per row in two saved ``--paired-load`` runs,
    side by side, and how many rows of each rose above ``limit``; "" when either run
    holds no paired row."""
    rows_a = {r["name"]: r for r in a.get("cases", []) + a.get("training", [])}
    lines, above = [], [0, 0]
    for rb in b.get("cases", []) + b.get("training", []):
        ra = rows_a.get(rb["name"])
        la, lb = (None if ra is None else _doc_load(ra)), _doc_load(rb)
        if la is None or lb is None:
            continue
        above[0] += la > limit
        above[1] += lb > limit
        lines.append(f"{rb['name']:44} {la:9.2f}x {lb:9.2f}x")
    if not lines:
        return ""
    head = f"{'case (fucina loaded / quiet, medians)':44} {'A':>10} {'B':>10}"
    return "\n".join([head, "-" * len(head), *lines,
                      f"rows above {limit:g}x: A {above[0]}, B {above[1]} of {len(lines)}"])
