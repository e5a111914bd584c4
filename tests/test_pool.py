"""The kernel thread pool: chunks cover the outer loop once, errors reach the caller,
the thread count follows Numba's, and parallel kernels give the serial bits."""

from __future__ import annotations

import os
import threading

import numba
import numpy as np
import pytest

import fucina as F
from fucina.kernels import pool


def _recorder() -> tuple[list[tuple[int, int, str]], object]:
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def entry(c0: int, c1: int, tag: str) -> None:
        with lock:
            seen.append((c0, c1, tag))
    return seen, entry


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 100, 1001])
def test_chunks_cover_the_range_exactly_once(n):
    seen, entry = _recorder()
    pool.run(entry, n, ("t",))
    covered = sorted(i for c0, c1, _ in seen for i in range(c0, c1))
    assert covered == list(range(n))
    assert all(c0 < c1 and tag == "t" for c0, c1, tag in seen)
    threads = min(numba.get_num_threads(), n)
    assert len(seen) == (1 if threads <= 1 else min(n, threads * pool.CHUNKS_PER_THREAD))


def test_one_thread_runs_one_chunk_on_the_caller():
    seen: list[tuple[int, int, int]] = []
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        pool.run(lambda c0, c1: seen.append((c0, c1, threading.get_ident())), 50, ())
    finally:
        numba.set_num_threads(old)
    assert seen == [(0, 50, threading.get_ident())]


def test_an_error_in_any_chunk_reaches_the_caller():
    if numba.get_num_threads() < 2:
        pytest.skip("needs two threads")

    def entry(c0: int, c1: int) -> None:
        if c0 <= 37 < c1:
            raise ValueError(f"chunk {c0}:{c1}")

    for _ in range(20):  # whichever thread takes the failing chunk
        with pytest.raises(ValueError, match="chunk"):
            pool.run(entry, 100, ())


def test_concurrent_callers_each_get_all_their_chunks():
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            for _ in range(50):
                hits = np.zeros(257, np.int64)

                def entry(c0: int, c1: int, hits: np.ndarray) -> None:
                    hits[c0:c1] += 1
                pool.run(entry, 257, (hits,))
                results.setdefault(k, []).append(int(hits.min() == hits.max() == 1))
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert all(all(r) and len(r) == 50 for r in results.values()) and len(results) == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_parallel_kernels():
    ctx = F.ExecContext()
    x = F.Tensor("a", "b").randn(ctx, (1024, 512), 3)  # above the parallel threshold
    want = x.exp().sum("b").numpy()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: its pool has no threads until it needs them
        try:
            got = x.exp().sum("b").numpy()
            os.write(w, b"1" if np.array_equal(got, want) else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)


@pytest.mark.parametrize("shape, axis", [
    ((64, 64, 96), "b"),  # 393K elements: parallel over a, swapped over b
    ((300, 1000, 1), "a"),  # one kept axis in blocks: chunks of blocks (the last partial)
    ((512, 600, 1), "b"),  # rows
])
def test_parallel_kernel_bits_do_not_depend_on_the_thread_count(shape, axis):
    ctx = F.ExecContext()
    x = F.Tensor("a", "b", "c").randn(ctx, shape, 5)

    def f(x):
        return x.mul(x).add(x).tanh().sum(axis).scale(0.01).exp()

    fast = F.compile(f)
    got2 = fast(x).numpy()
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        got1 = fast(x).numpy()
        eager1 = f(x).numpy()
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(got1, got2) and np.array_equal(got1, eager1)
    xn = x.numpy().astype(np.float64)
    want = np.exp(np.tanh(xn * xn + xn).sum("abc".index(axis)) * 0.01)
    np.testing.assert_allclose(got1, want, rtol=5e-5)
