"""Loaded models pickle as a reference to their files plus their configuration.

A model that mixes in :class:`Reopenable` and defines ``reopen_spec()`` pickles
to a few hundred bytes: its class, the absolute paths of the files it reads and
the constructor arguments. Unpickling (on a Dask worker, say) opens the files
again on that machine; weights are memory-mapped there and never travel over the
network. Each process keeps the last few models it reopened, so the many tasks
of one job that carry the same model share one loaded copy (and its compiled
programs) instead of loading it per task.

``copy.copy``/``copy.deepcopy`` go through the same path: a copy of a model is
the model reopened from its files (possibly the instance this process already
reopened), which is what a read-only model needs.

A file missing where the model is unpickled raises ``FileNotFoundError`` naming
the path and the host: every worker needs the model files at the same path.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from ..runtime.lru import LRU

__all__ = ["REOPENED_CACHE_SIZE", "Reopenable", "ReopenSpec", "reopen"]

#: Models kept per process by :func:`reopen` (least recently used dropped).
REOPENED_CACHE_SIZE = 4


@dataclass(frozen=True)
class ReopenSpec:
    """How to open a model again: ``cls(*args, **dict(kwargs))`` after checking that
    every path in ``files`` (absolute) exists."""

    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    files: tuple[str, ...] = ()


_REOPENED = LRU(REOPENED_CACHE_SIZE)
_LOCK = threading.Lock()


def _stamp(files: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    """(mtime, size) per file: a rewritten file is opened again, never served stale."""
    out = []
    for f in files:
        st = os.stat(f)
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


def _missing(cls: type, files: tuple[str, ...]) -> FileNotFoundError | None:
    for f in files:
        if not os.path.exists(f):
            return FileNotFoundError(
                f"{cls.__module__}.{cls.__qualname__}: model file {f!r} does not exist on host "
                f"{socket.gethostname()!r} (process {os.getpid()}); a pickled model is a "
                "reference to its files, so every machine that unpickles it (each Dask "
                "worker) needs them at this same path")
    return None


def reopen(cls: type, spec: ReopenSpec) -> Any:
    """The model ``spec`` describes, opened in this process (shared while cached)."""
    err = _missing(cls, spec.files)
    if err is not None:
        raise err
    key = (cls, spec, _stamp(spec.files))
    with _LOCK:  # one load per model even when several worker threads unpickle it at once
        hit = _REOPENED.get(key)
        if hit is None:
            hit = cls(*spec.args, **dict(spec.kwargs))
            _REOPENED.put(key, hit)
        return hit


class Reopenable:
    """Mixin: pickle (and ``dask.base.tokenize``) a model by reference to its files.

    The class defines ``reopen_spec()`` returning a :class:`ReopenSpec` whose
    ``cls(*args, **kwargs)`` rebuilds an equal model from absolute paths.
    """

    def reopen_spec(self) -> ReopenSpec:
        """The files and constructor arguments that rebuild this model."""
        raise TypeError(f"{type(self).__qualname__} mixes in Reopenable and must define "
                        "reopen_spec()")

    def __reduce__(self) -> tuple[Any, ...]:
        return (reopen, (type(self), self.reopen_spec()))

    def __dask_tokenize__(self) -> Any:
        spec = self.reopen_spec()
        return (type(self).__module__, type(self).__qualname__, spec, _stamp(spec.files))
