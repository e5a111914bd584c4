"""The name -> value mappings the file writers take (tensors, metadata), checked.

A writer given something that is not a mapping, or a key that is not a string, raises
``TypeError`` naming the writer and the argument, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def named_items(value: Any, what: str) -> list[tuple[str, Any]]:
    """``value``'s items when it is a mapping with string keys; TypeError otherwise
    (``what`` names the writer and argument, e.g. ``"gguf.write: tensors"``)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping of names to values, got "
                        f"{type(value).__name__}")
    items = list(value.items())
    for key, _ in items:
        if not isinstance(key, str):
            raise TypeError(f"{what}: the name {key!r} is not a str")
    return items
