"""Fucina on Dask: compiled functions over Dask arrays, model embeddings of text collections.

Needs the optional extra ``fucina[dask]`` (``dask[dataframe]`` and ``distributed``).

- :func:`map_blocks` runs a compiled function on every block of one or more Dask
  arrays whose axes the caller names with tags. Blocks line up by tag (two arrays
  sharing a tag share its chunking); a tag the function contracts or reduces (it is
  not among the output's tags) must be one chunk, and so must a tag the function
  mixes values along (a softmax, scan or norm over it): both are checked on the
  client before anything runs, with an error naming the tag and the chunking.
- :func:`embed` turns a Dask bag, or a Dask DataFrame column, of strings into a Dask
  array of embeddings ``[n, hidden]``: one task per partition, each calling
  ``model.encode`` on the partition (length-aware batching inside it), so the
  results equal a single-process ``model.encode`` of each partition bit for bit.

What travels to the workers: the compiled function pickles as its Python function
(each worker traces it again and loads kernels from its own disk cache) and a model
as a reference to its files (``fucina.models.reopen``); blocks and embeddings are
plain numpy arrays. See docs/DASK.md.
"""

from __future__ import annotations

import pickle
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import dask.array as da
import dask.bag as db
import numpy as np
from dask.delayed import delayed

from . import captures as cap
from .compile import Compiled
from .compile import compile as _compile
from .dtypes import as_dtype
from .runtime.context import ExecContext
from .runtime.lru import LRU

__all__ = ["embed", "map_blocks", "output_tags"]

#: Extent of a split (multi-chunk) axis in the client-side probe traces.
PROBE_SIZE = 3


# -- what travels ---------------------------------------------------------------------------
#
# The function and the model go into the graph as pickled bytes and are unpickled when a
# task runs: the scheduler (which unpickles the graph) then never opens model files, and a
# worker missing them fails its task with the path named. Each process unpickles a payload
# once and keeps it (with its traced programs and loaded weights) for the next tasks.

_LOADED = LRU(16)
_LOADED_LOCK = threading.Lock()


def _dumps(obj: Any, what: str) -> bytes:
    try:
        return cloudpickle.dumps(obj)
    except Exception as e:
        raise TypeError(
            f"{what} must pickle to reach the workers, and it does not ({e}); fucina tensors "
            "do not pickle: capture a model (it pickles as a reference to its files) or pass "
            "weights as a Dask array argument instead") from e


def _loads(data: bytes) -> Any:
    hit = _LOADED.get(data)
    if hit is None:
        with _LOADED_LOCK:  # one unpickle (one model load) when worker threads race
            hit = _LOADED.get(data)
            if hit is None:
                hit = pickle.loads(data)
                _LOADED.put(data, hit)
    return hit


# -- map_blocks -----------------------------------------------------------------------------


def _tag_lists(arrays: tuple[Any, ...], tags: Any) -> list[tuple[str, ...]]:
    if not arrays:
        raise TypeError("map_blocks needs at least one Dask array")
    for k, a in enumerate(arrays):
        if not isinstance(a, da.Array):
            raise TypeError(f"map_blocks: argument {k} must be a dask.array.Array, got "
                            f"{type(a).__name__}")
    if isinstance(tags, str) or (tags and all(isinstance(t, str) for t in tags)):
        tags = [tags]  # one array's tags
    if isinstance(tags, str):
        raise TypeError("map_blocks: tags must be a sequence of tag names per array")
    tags = [(t,) if isinstance(t, str) else tuple(t) for t in tags]
    if len(tags) != len(arrays):
        raise ValueError(f"map_blocks: {len(arrays)} arrays but tags for {len(tags)}: {tags}")
    for k, (a, t) in enumerate(zip(arrays, tags)):
        if len(t) != a.ndim:
            raise ValueError(f"map_blocks: array {k} has {a.ndim} axes (shape {a.shape}), "
                             f"tags {t} name {len(t)}")
        if len(set(t)) != len(t) or not all(isinstance(n, str) and n for n in t):
            raise ValueError(f"map_blocks: array {k}'s tags {t} must be distinct non-empty "
                             "strings")
    return tags


def _axes(arrays: tuple[Any, ...], tags: list[tuple[str, ...]]
          ) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Per tag: its size and its chunking (as in the first array that has it; after
    :func:`_aligned` every array that shares a tag has the same)."""
    sizes: dict[str, int] = {}
    chunks: dict[str, tuple[int, ...]] = {}
    for k, (a, t) in enumerate(zip(arrays, tags)):
        for axis, name in enumerate(t):
            n = a.shape[axis]
            if np.isnan(n):
                raise ValueError(f"map_blocks: array {k}'s axis {name!r} has unknown chunk "
                                 "sizes; call compute_chunk_sizes() first")
            if sizes.setdefault(name, int(n)) != n:
                raise ValueError(f"map_blocks: tag {name!r} has size {sizes[name]} in one "
                                 f"array and {n} in array {k}")
            chunks.setdefault(name, a.chunks[axis])
    return sizes, chunks


def _aligned(arrays: tuple[Any, ...], tags: list[tuple[str, ...]]) -> tuple[Any, ...]:
    """The arrays rechunked so that every tag has one chunking (Dask's unify_chunks)."""
    _axes(arrays, tags)  # sizes agree (named in our error before Dask's)
    if len(arrays) == 1:
        return arrays
    pairs: list[Any] = []
    for a, t in zip(arrays, tags):
        pairs += [a, t]
    return tuple(da.core.unify_chunks(*pairs)[1])


def _tensors(ctx: ExecContext, tags: list[tuple[str, ...]], blocks: Sequence[np.ndarray]
             ) -> list[Any]:
    from .tensor import Tensor

    return [Tensor(*t, dtype=as_dtype(b.dtype.name)).from_numpy(ctx, np.ascontiguousarray(b))
            for t, b in zip(tags, blocks)]


_CONTEXTS: weakref.WeakKeyDictionary[Compiled, ExecContext | None] = \
    weakref.WeakKeyDictionary()


def _context(fn: Compiled) -> ExecContext | None:
    """The context of the tensors ``fn`` captures (a model's weights), None when it
    captures none: block tensors must live on it for ops to combine them."""
    if fn in _CONTEXTS:
        ctx = _CONTEXTS[fn]
        if ctx is None or not ctx.closed:
            return ctx
    ctx = _CONTEXTS[fn] = _find_context(fn)
    return ctx


def _find_context(fn: Compiled) -> ExecContext | None:
    ctxs: list[ExecContext] = []
    for t in cap.discover([(("root", 0), fn.fn)]).slots:
        c = t._ctx
        if not c.closed and not any(c is o for o in ctxs):
            ctxs.append(c)
    if len(ctxs) > 1:
        raise ValueError(f"map_blocks: the function captures tensors on {len(ctxs)} "
                         "different ExecContexts; its blocks can join only one")
    return ctxs[0] if ctxs else None


def _apply(fn: Compiled, tags: list[tuple[str, ...]], blocks: Sequence[np.ndarray],
           out_tags: tuple[str, ...] | None) -> tuple[tuple[str, ...], np.ndarray]:
    """(output tags, output values in ``out_tags`` order) of ``fn`` on numpy blocks."""
    shared = _context(fn)
    ctx = shared if shared is not None else ExecContext()
    try:
        y = fn(*_tensors(ctx, tags, blocks))
        t = getattr(y, "axis_tags", None)
        if t is None:
            raise TypeError(f"map_blocks: the function must return one tensor, got "
                            f"{type(y).__name__}")
        if out_tags is not None:
            y = y.permute_to(*out_tags)
        return tuple(t), np.array(y.numpy(), copy=True)
    finally:
        if shared is None:
            ctx.deinit()


def _call(fn: Compiled, tags: list[tuple[str, ...]], blocks: Sequence[np.ndarray]
          ) -> tuple[tuple[str, ...], np.ndarray]:
    return _apply(fn, tags, blocks, None)


def _samples(arrays: tuple[Any, ...], tags: list[tuple[str, ...]], size: dict[str, int],
             rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for a, t in zip(arrays, tags):
        shape = tuple(size[name] for name in t)
        if np.issubdtype(a.dtype, np.floating):
            out.append(rng.standard_normal(shape).astype(a.dtype))
        else:  # indices and masks: zeros are valid wherever an integer input is
            out.append(np.zeros(shape, a.dtype))
    return out


#: The largest sample (elements over all inputs) the probe traces with whole split axes.
PROBE_WHOLE_LIMIT = 1 << 22


def _plan(fn: Compiled, arrays: tuple[Any, ...], tags: list[tuple[str, ...]]
          ) -> tuple[tuple[str, ...], dict[str, int], Any]:
    """Trace ``fn`` on small samples: (output tags, sizes of its new tags, output dtype).

    Split tags (more than one chunk) get a small extent in the samples (then their
    first chunk's, then, for small arrays, their whole size when the function needs
    it). Raises ValueError when the chunking splits a tag the function contracts,
    reduces, resizes or mixes values along."""
    sizes, chunks = _axes(arrays, tags)
    split = sorted(name for name, c in chunks.items() if len(c) > 1)
    rng = np.random.default_rng(0)

    def refuse(name: str, why: str) -> ValueError:
        return ValueError(
            f"map_blocks: the function {why} tag {name!r}, but the chunking splits {name!r} "
            f"into {len(chunks[name])} chunks {chunks[name]}; rechunk so that {name!r} is "
            f"one chunk (dask: x.rechunk({{axis: -1}}))")

    tries = [{name: PROBE_SIZE for name in split}, {name: chunks[name][0] for name in split}]
    if sum(int(np.prod([sizes[n] for n in t])) for t in tags) <= PROBE_WHOLE_LIMIT:
        tries.append({name: sizes[name] for name in split})
    first: Exception | None = None
    attempt = 0
    for attempt, ext in enumerate(tries):  # noqa: B007 - the attempt that worked is used
        size = {**sizes, **ext}
        sample = _samples(arrays, tags, size, rng)
        try:
            out_t, base = _call(fn, tags, sample)
            break
        except Exception as e:
            if first is None:
                first = e
    else:
        assert first is not None
        desc = [tuple(sizes[name] for name in t) for t in tags]
        msg = (f"map_blocks: tracing the function on sample blocks of shapes {desc} (tags "
               f"{tags}) failed: {first}")
        try:  # the function's own exception class, with the sample named
            err: Exception = type(first)(msg)
        except Exception:
            err = ValueError(msg)
        raise err from first
    if attempt == 2:  # it runs only on whole split axes: say which one it needs whole
        for name in split:
            if name not in out_t:
                raise refuse(name, f"contracts or reduces (output tags {out_t})")
        raise refuse(split[0] if len(split) == 1 else str(split),
                     f"fails on blocks smaller than the whole array ({first}) along")
    for name in split:
        if name not in out_t:
            raise refuse(name, f"contracts or reduces (it is not among the output tags "
                               f"{out_t})")
    for i, name in enumerate(out_t):
        if name in sizes and base.shape[i] != size[name]:
            raise (refuse(name, "changes the size along") if name in split else ValueError(
                f"map_blocks: the function changes the size along tag {name!r} "
                f"({sizes[name]} -> {base.shape[i]}); only new tags may take their own size"))
    new = {name: base.shape[i] for i, name in enumerate(out_t) if name not in sizes}
    if split:
        # Blocks differ in extent along split tags (the last chunk): the output's new tags
        # must not depend on it, and kept split tags must keep their extent.
        size2 = {**size, **{name: size[name] + 1 for name in split}}
        try:
            out_t2, bigger = _call(fn, tags, _samples(arrays, tags, size2, rng))
        except Exception as e:
            raise refuse(str(split[0]), f"fails on blocks one longer ({e}) along") from e
        for i, name in enumerate(out_t2):
            if name in new and bigger.shape[i] != new[name]:
                raise ValueError(f"map_blocks: the size of the new output tag {name!r} "
                                 f"depends on the block size along the split tags {split}")
            if name in split and bigger.shape[i] != size2[name]:
                raise refuse(name, "changes the size along")
    # Mixing probe: change slice 1 (or 0) of every float input along a split tag; every
    # other output slice along it must stay bit-identical (softmax, scans, norms do not).
    for name in split:
        at = 1 if size[name] > 1 else 0
        moved = [s.copy() for s in sample]
        changed = False
        for s, t in zip(moved, tags):
            if name in t and np.issubdtype(s.dtype, np.floating):
                idx: list[Any] = [slice(None)] * s.ndim
                idx[t.index(name)] = at
                s[tuple(idx)] += rng.standard_normal(s[tuple(idx)].shape).astype(s.dtype) + 1
                changed = True
        if not changed or size[name] < 2:
            continue
        _, got = _call(fn, tags, moved)
        axis = out_t.index(name)
        keep = [i for i in range(size[name]) if i != at]
        if not np.array_equal(np.take(got, keep, axis), np.take(base, keep, axis),
                              equal_nan=True):
            raise refuse(name, "mixes values along (a softmax, scan, norm or shift over it)")
    return out_t, new, base.dtype


def output_tags(fn: Callable[..., Any], *arrays: Any, tags: Any) -> tuple[str, ...]:
    """The tags of :func:`map_blocks`'s result for these arrays (checks the chunking)."""
    cfn = fn if isinstance(fn, Compiled) else _compile(fn)
    tag_lists = _tag_lists(arrays, tags)
    return _plan(cfn, _aligned(arrays, tag_lists), tag_lists)[0]


def _run_blocks(*blocks: np.ndarray, fn: bytes, tags: list[tuple[str, ...]],
                out_tags: tuple[str, ...], new: dict[str, int], out_dtype: Any) -> np.ndarray:
    """One output block, on a worker."""
    if any(b.size == 0 for b in blocks):  # an empty chunk: fucina tensors have no 0-length axes
        size = {name: b.shape[i] for t, b in zip(tags, blocks) for i, name in enumerate(t)}
        size.update(new)
        return np.empty(tuple(size[name] for name in out_tags), out_dtype)
    return _apply(_loads(fn), tags, blocks, out_tags)[1]


def map_blocks(fn: Callable[..., Any], *arrays: Any, tags: Any,
               out_tags: Sequence[str] | None = None) -> Any:
    """Apply ``fn`` (a compiled function; a plain one is compiled) to Dask arrays block by
    block and return the Dask array of its results.

    ``tags`` names every array's axes: a tuple of tag names for one array, a list of such
    tuples for several (``fn`` gets one fucina tensor per array, in order, each tagged as
    named). The result's axes follow ``out_tags`` when given (a permutation of the
    function's output tags), else the function's output order (:func:`output_tags`).
    ValueError, naming the tag and the chunking, when a chunking splits a tag the
    function contracts, reduces, resizes or mixes values along.
    """
    if not callable(fn):
        raise TypeError(f"map_blocks needs a callable, got {type(fn).__name__}")
    cfn = fn if isinstance(fn, Compiled) else _compile(fn)
    tag_lists = _tag_lists(arrays, tags)
    arrays = _aligned(arrays, tag_lists)
    fn_tags, new, dtype = _plan(cfn, arrays, tag_lists)
    order = fn_tags if out_tags is None else tuple(out_tags)
    if sorted(order) != sorted(fn_tags):
        raise ValueError(f"map_blocks: out_tags {order} must be a permutation of the "
                         f"function's output tags {fn_tags}")
    pairs: list[Any] = []
    for a, t in zip(arrays, tag_lists):
        pairs += [a, t]
    return da.blockwise(_run_blocks, order, *pairs, new_axes=new, dtype=dtype,
                        concatenate=True, align_arrays=True,
                        meta=np.empty((0,) * len(order), dtype),
                        fn=_dumps(cfn, "map_blocks: the function"), tags=tag_lists,
                        out_tags=order, new=new, out_dtype=dtype)


# -- embed ----------------------------------------------------------------------------------


def _encode_partition(model: bytes, part: Any, batch_size: int) -> np.ndarray:
    """One partition's embeddings, on a worker: the model's own length-aware batching."""
    texts = part.tolist() if hasattr(part, "tolist") else list(part)
    return np.asarray(_loads(model).encode(texts, batch_size=batch_size), np.float32)


def embed(model: Any, texts: Any, batch_size: int = 32) -> Any:
    """A Dask array ``[n, hidden]`` (float32) of ``model.encode`` embeddings of ``texts``,
    a Dask bag or a Dask DataFrame column (Series) of strings, rows in order.

    One task per partition; partition lengths are unknown until computed (the array's
    row chunks are NaN, ``compute_chunk_sizes()`` fills them in).
    """
    if not (callable(getattr(model, "encode", None)) and isinstance(
            getattr(model, "hidden", None), int)):
        raise TypeError(f"embed needs a model with encode() and an int hidden size (e.g. "
                        f"fucina.models.bert.load(...)), got {type(model).__name__}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(texts, db.Bag):
        parts = texts.to_delayed()
    else:
        import dask.dataframe as dd

        if isinstance(texts, dd.DataFrame):
            raise TypeError("embed takes one column of strings (df['text']), not a whole "
                            "DataFrame")
        if not isinstance(texts, dd.Series):
            raise TypeError(f"embed takes a Dask bag or a Dask DataFrame column of strings, "
                            f"got {type(texts).__name__}")
        parts = texts.to_delayed()
    encode = delayed(_encode_partition, pure=True)
    # a Reopenable model: a few hundred bytes naming its files
    ref = _dumps(model, "embed: the model")
    blocks = [da.from_delayed(encode(ref, p, batch_size), shape=(np.nan, model.hidden),
                              dtype=np.float32) for p in parts]
    return da.concatenate(blocks, axis=0)
