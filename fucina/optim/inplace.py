"""In-place writes on the facade: the only way ``fucina.optim`` mutates a tensor."""

from __future__ import annotations

from typing import Any

from ..errors import ContextMismatch, TagError
from ..ir.execute import current_tracer
from ..ir.inplace import assign as _assign


def refuse_trace(what: str) -> None:
    """Raise when ``what`` runs while fucina.compile traces a function.

    State dicts and state files read or replace host-side values (step counts,
    copies of the state) that a compiled program cannot return or take; run
    between calls instead. Nothing is done silently at trace time only.
    """
    if current_tracer() is not None:
        raise TypeError(
            f"{what} inside fucina.compile: it reads or writes the optimizer's host-side "
            "state, which a compiled program cannot; call it between compiled calls")


def assign(target: Any, value: Any) -> None:
    """Write ``value`` into ``target``'s own storage (same tags, shape and dtype).

    Every holder of that storage sees the new values: the variable itself, its
    views, and compiled programs that read it.
    """
    if tuple(value.axis_tags) != tuple(target.axis_tags):
        raise TagError(f"assign: value tags {value.axis_tags} differ from target tags "
                       f"{target.axis_tags}")
    if value._ctx is not target._ctx:
        raise ContextMismatch("assign: value and target belong to different ExecContexts")
    _assign(target._node, value._node)
