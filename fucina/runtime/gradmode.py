"""Thread-local gradient switch (``fucina.no_grad``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _State(threading.local):
    # The class default makes a thread's first read a plain attribute read: a missing
    # thread-local attribute costs an AttributeError per read (~0.6 us).
    depth = 0


_state = _State()

#: ``no_grad`` blocks open on all threads together, in a one-element list (hot paths
#: import the list and read ``[0]``). While it is 0 no thread has recording off, so
#: a hot path reads this global (~10 ns) and skips the thread-local (~60 ns):
#: ``not NO_GRAD_OPEN[0] or _state.depth == 0`` is :func:`is_grad_enabled`. It rises
#: before a thread's depth does and falls after, so a thread whose depth is above 0
#: always sees it above 0; a lock keeps the threads' updates from losing each other.
NO_GRAD_OPEN = [0]
_open_lock = threading.Lock()


def is_grad_enabled() -> bool:
    """True unless a ``no_grad()`` block is active on this thread."""
    return not NO_GRAD_OPEN[0] or _state.depth == 0


@contextmanager
def no_grad() -> Iterator[None]:
    """Disable gradient recording inside the block (nests; thread-local)."""
    with _open_lock:
        NO_GRAD_OPEN[0] += 1
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        with _open_lock:
            NO_GRAD_OPEN[0] -= 1


@contextmanager
def enable_grad() -> Iterator[None]:
    """Re-enable gradient recording inside the block, whatever ``no_grad`` depth is active.

    A checkpointed block re-runs with recording on while the backward walk
    that triggered it runs under ``no_grad``.
    """
    # (Setting the depth to 0 and back needs no count: a depth above 0 to restore
    # belongs to no_grad blocks still open, which hold the count above 0.)
    saved = _state.depth
    _state.depth = 0
    try:
        yield
    finally:
        _state.depth = saved
