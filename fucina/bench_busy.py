"""Load for ``python -m fucina.bench --busy N``: helper processes that spin on a core.

Each helper is a pure-Python busy loop in its own process (``multiprocessing``),
the "second process spinning on one core" a shared machine has. They run for
the duration of a ``with busy_processes(n):`` block and are always ended when
it exits, by an exception or Ctrl-C included. A helper also ends by itself
once the process that started it is gone (killed without running its
cleanup), so none is left spinning.
"""

from __future__ import annotations

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


def _spin(parent: int, ready: Any) -> None:
    # Ctrl-C reaches the whole process group: the parent ends us, quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
