"""A bounded least-recently-used map shared by the kernel, plan and program caches.

Lookups are safe from several threads without a lock on the hit path: the
underlying ``OrderedDict`` operations are atomic under the GIL, and a key
evicted by another thread between a lookup and its move-to-end is simply a
miss.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class LRU:
    """At most ``maxsize`` entries; inserting past it drops the least recently used."""

    __slots__ = ("data", "maxsize", "evictions", "_lock")

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"an LRU cache needs maxsize >= 1, got {maxsize}")
        self.data: OrderedDict[Hashable, Any] = OrderedDict()
        self.maxsize = maxsize
        self.evictions = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for ``key`` (marked most recently used), else ``default``."""
        data = self.data
        value = data.get(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            data.move_to_end(key)
        except KeyError:  # evicted meanwhile by another thread: still a valid value
            pass
        return value

    def put(self, key: Hashable, value: Any) -> list[Any]:
        """Insert ``value``; returns the values evicted to make room."""
        evicted = []
        with self._lock:
            data = self.data
            data[key] = value
            data.move_to_end(key)
            while len(data) > self.maxsize:
                evicted.append(data.popitem(last=False)[1])
                self.evictions += 1
        return evicted

    def values(self) -> list[Any]:
        """A snapshot of the values, least recently used first."""
        with self._lock:
            return list(self.data.values())

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self.data.clear()

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.data


_MISSING = object()
