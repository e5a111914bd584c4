"""In-place writes on the facade: the only way ``fucina.optim`` mutates a tensor."""

from __future__ import annotations

from typing import Any

from ..errors import ContextMismatch, TagError
from ..ir.execute import current_tracer
from ..ir.inplace import assign as _assign


def refuse_trace(what: str) -> None:
    """Raise when ``what`` (an in-place update) is called while fucina.compile traces.

    Such updates write through ``assign`` and read gradients the traced
    backward has not delivered yet; this build runs them outside compiled
    functions only, and says so instead of doing nothing.
    """
    if current_tracer() is not None:
        raise TypeError(
            f"{what} inside fucina.compile: in-place updates (the assign primitive) cannot be "
            "traced in this build; call it after the compiled function returns")


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
