"""The kernel cache: generated source on disk, compiled dispatchers in memory.

Generated source is written to ``<cache dir>/k_<hash>.py`` and imported from
there, so Numba's ``cache=True`` stores the machine code next to it and a
second process loads kernels instead of compiling them. The cache directory
is ``$FUCINA_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/fucina/kernels``
(default ``~/.cache/fucina/kernels``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba.core.compiler_lock import global_compiler_lock

from ..runtime.lru import LRU
from . import native_jobs, pool
from .vecmath import target_key

_VERSION = "4"  # bump when generated code conventions change

#: The loop vectorizer's interleave count for generated kernels (LLVM's
#: ``-force-vector-interleave``; 0 leaves it to LLVM's cost model). LLVM interleaves a
#: pointwise loop with a long polynomial body only once (it does so for reductions): the
#: body's latency chain then bounds it. Two interleaved vectors measured 1.2-1.6x faster
#: for exp, tanh and the fused chain on a Zen 3 (issue 13). Set only while a generated
#: kernel compiles, under Numba's compiler lock, so no other code sees it.
INTERLEAVE = int(os.environ.get("FUCINA_INTERLEAVE", "2"))


#: The files whose code generated kernels inline or are written by (paths relative to
#: this package): the modules the kernel source imports, and what those inline in turn
#: (``lanes`` its stack rows, ``scalar_fns`` the counter-based random numbers).
DEPS = ("scalar_fns.py", "vecmath.py", "codegen.py", "user_fns.py", "lanes.py",
        "atomics.py", "stack_rows.py", "../rng.py")


def _deps_hash() -> str:
    """Hash of :data:`DEPS`: a change there invalidates every cached kernel."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in DEPS:
        p = here / name
        if p.exists():
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


_DEPS = _deps_hash()
# The compile target (CPU, features): code for one vector path never serves another.
_TARGET = target_key()


def cache_dir() -> Path:
    """Directory holding generated kernel sources and Numba's cached binaries."""
    env = os.environ.get("FUCINA_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fucina" / "kernels"


@dataclass
class CacheInfo:
    """Cache counters and sizes for this process.

    ``compiled``/``memory_hits``/``disk_hits`` count kernel loads, ``kernels``
    the kernels loaded so far. Every cache is bounded (least recently used
    entries dropped): ``kernel_cache`` (generated kernels held in memory),
    ``plan_cache`` (eager op signatures), ``binary_plan_cache`` (the tag-level
    decisions of binary ops per operand types and shapes), ``gemm_plan_cache`` (GEMM plans per
    shape/stride signature) and ``program_cache`` (traced programs held by live
    compiled functions; the bound is per function) each report ``(size, maxsize)``.
    """

    compiled: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    kernels: int = 0
    kernel_cache: tuple[int, int] = (0, 0)
    plan_cache: tuple[int, int] = (0, 0)
    binary_plan_cache: tuple[int, int] = (0, 0)
    gemm_plan_cache: tuple[int, int] = (0, 0)
    program_cache: tuple[int, int] = (0, 0)

    def __repr__(self) -> str:
        return (f"CacheInfo(compiled={self.compiled}, memory_hits={self.memory_hits}, "
                f"disk_hits={self.disk_hits}, kernels={self.kernels}, "
                f"kernel_cache={self.kernel_cache}, plan_cache={self.plan_cache}, "
                f"binary_plan_cache={self.binary_plan_cache}, "
                f"gemm_plan_cache={self.gemm_plan_cache}, program_cache={self.program_cache})")


_INFO = CacheInfo()
_LOCK = threading.Lock()


class Kernel:
    """A generated kernel: its source, a stable name and the Numba dispatcher.

    A parallel kernel (``outer`` set: the position of ``n0`` in its arguments and
    the outputs per outer iteration) takes a chunk counter and a chunk count before
    the arguments; calling the Kernel runs it on the pool's threads.
    """

    __slots__ = ("name", "source", "fn", "_first", "user_fns", "outer", "call")

    def __init__(self, name: str, source: str, fn: Any, user_fns: tuple[str, ...] = (),
                 outer: tuple[int, int] | None = None):
        self.name = name
        self.source = source
        self.fn = fn
        self._first = True
        self.user_fns = user_fns  # registry keys of the user scalar functions it calls
        self.outer = outer
        #: Runs the kernel through Numba's type dispatch (after a first call, which
        #: :meth:`__call__` makes to account for it): the dispatcher, or for a
        #: parallel kernel the chunked runner over it.
        self.call: Callable[..., None] = fn if outer is None else _chunked(fn, outer)

    def __call__(self, *args: Any) -> None:
        try:
            if self._first:
                _compile(self.fn, (_CTL, 1, *args) if self.outer is not None else args)
            self.call(*args)
        except numba.core.errors.NumbaError as e:
            if not self.user_fns:
                raise
            # user code Numba cannot compile: say whose, as a TypeError
            from .user_fns import compile_failure

            raise compile_failure(self.user_fns, e) from e
        if self._first:
            with _LOCK:  # several threads may finish a first call at once: count it once
                first, self._first = self._first, False
            if first:
                _account(self.fn)

    def bare(self, args: tuple[Any, ...] | list[Any]) -> Callable[..., None]:
        """The compiled entry point for the argument types of ``args`` (a call already
        made through :meth:`__call__`), or the dispatcher when there is none.

        Calling the entry skips Numba's per-call type dispatch (about half the cost of
        a tiny kernel call). Its unboxing still checks each array's rank and item size;
        callers use it only for arguments whose dtypes, ranks and layouts match the
        ones given here (storage buffers are 1-D and C-contiguous by construction).
        """
        fn = self.fn
        if self.outer is not None:
            args = (_CTL, 1, *args)
        try:
            sig = tuple(fn.typeof_pyval(a) for a in args)
        except (ValueError, TypeError):
            sig = None
        cres = None if sig is None else fn.overloads.get(sig)
        entry = fn if cres is None else cres.entry_point
        if self.outer is None:
            return entry
        return _chunked(entry, self.outer, None if cres is None else native_jobs.entry_of(cres))

    def __repr__(self) -> str:
        return f"<kernel {self.name}>"


#: A chunk counter, only to type a parallel kernel's first two arguments.
_CTL = np.zeros(2, np.int64)


def _chunked(entry: Callable[..., None], outer: tuple[int, int],
             native: tuple[int, int] | None = None) -> Callable[..., None]:
    """A runner calling ``entry`` (a parallel kernel) over chunks of its outer loop
    (``native``: see :func:`fucina.kernels.pool.run`)."""
    at, per = outer
    run = pool.run

    def chunked(*args: Any) -> None:
        run(entry, -(-args[at] // per), args, native)

    return chunked


def _compile(fn: Any, args: tuple[Any, ...]) -> None:
    """Compile (or load from the disk cache) ``fn`` for ``args`` with :data:`INTERLEAVE`."""
    try:
        sig = tuple(fn.typeof_pyval(a) for a in args)
    except (ValueError, TypeError):
        return  # the call itself reports the bad argument
    if sig in fn.overloads:
        return
    with global_compiler_lock:
        llvm.set_option("", f"-force-vector-interleave={INTERLEAVE}")
        try:
            fn.compile(sig)
        finally:
            llvm.set_option("", "-force-vector-interleave=0")


def _account(fn: Any) -> None:
    stats = getattr(fn, "stats", None)
    hits = sum(stats.cache_hits.values()) if stats is not None else 0
    with _LOCK:
        if hits:
            _INFO.disk_hits += 1
        else:
            _INFO.compiled += 1


#: Generated kernels kept loaded in memory (least recently used dropped; a program or
#: plan holding a kernel keeps it alive regardless).
KERNEL_CACHE_SIZE = 2048
_MEMORY = LRU(KERNEL_CACHE_SIZE)


def load(source: str) -> Kernel:
    """The kernel for ``source``: from memory, else from (or written to) the disk cache."""
    key = hashlib.sha256((_VERSION + _DEPS + numba.__version__ + _TARGET + str(INTERLEAVE)
                          + source).encode()).hexdigest()[:20]
    k = _MEMORY.get(key)
    if k is not None:
        with _LOCK:
            _INFO.memory_hits += 1
        return k
    with _LOCK:
        k = _MEMORY.get(key)
        if k is not None:
            _INFO.memory_hits += 1
            return k
        path = _write(key, source)
        modname = f"fucina_kernel_{key}"
        spec = importlib.util.spec_from_file_location(modname, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        spec.loader.exec_module(module)
        k = Kernel(f"k_{key}", source, module.kernel, getattr(module, "USER_FNS", ()),
                   getattr(module, "OUTER", None))
        for old in _MEMORY.put(key, k):
            sys.modules.pop(f"fucina_kernel_{old.name[2:]}", None)
        _INFO.kernels += 1
        return k


_FALLBACK: list[Path] = []


def _write(key: str, source: str, retry: bool = True) -> Path:
    """Write ``source`` into the cache directory (a private temp dir if it is unusable)."""
    dirs = [cache_dir()] + _FALLBACK
    for directory in dirs:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"k_{key}.py"
            if not path.exists() or path.read_text() != source:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(source)
                os.replace(tmp, path)  # atomic: concurrent processes never see half a file
            return path
        except OSError:
            continue
    if not retry:
        raise OSError(f"no writable directory for generated kernels (tried {dirs})")
    # No writable cache: kernels still work, compiled afresh in each process.
    _FALLBACK.append(Path(tempfile.mkdtemp(prefix="fucina-kernels-")))
    return _write(key, source, retry=False)


#: name -> () -> (size, maxsize) of a cache kept by a higher layer (eager plans, programs).
SIZE_SOURCES: dict[str, Callable[[], tuple[int, int]]] = {}


def cache_info() -> CacheInfo:
    """Kernel load counters, and the size and bound of every cache."""
    with _LOCK:
        info = CacheInfo(_INFO.compiled, _INFO.memory_hits, _INFO.disk_hits, _INFO.kernels)
    info.kernel_cache = (len(_MEMORY), _MEMORY.maxsize)
    for name, source in SIZE_SOURCES.items():
        setattr(info, name, source())
    return info
