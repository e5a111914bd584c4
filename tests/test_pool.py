"""The kernel thread pool: chunks cover the outer loop once, errors reach the caller,
the thread count follows Numba's, and parallel kernels give the serial bits."""

from __future__ import annotations

import os
import threading
import time

import numba
import numpy as np
import pytest

import fucina as F
from fucina.kernels import atomics, pool


@numba.njit(nogil=True, cache=True)
def _count(ctl, nch, n, hits):
    # The protocol of a parallel generated kernel: take chunks, count each one done.
    while True:
        c = atomics.fetch_add(ctl, 0, 1)
        if c >= nch:
            break
        for i in range(n * c // nch, n * (c + 1) // nch):
            hits[i] += 1
        atomics.fetch_add(ctl, 1, 1)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 100, 1001])
def test_chunks_cover_the_outer_loop_exactly_once(n):
    for _ in range(20):
        hits = np.zeros(n, np.int64)
        pool.run(_count, n, (n, hits))
        np.testing.assert_array_equal(hits, np.ones(n, np.int64))


def test_one_thread_runs_the_kernel_once_on_the_caller():
    calls: list[tuple[int, int]] = []
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        pool.run(lambda ctl, nch: calls.append((nch, threading.get_ident())), 50, ())
    finally:
        numba.set_num_threads(old)
    assert calls == [(1, threading.get_ident())]


def test_a_workers_error_reaches_the_caller():
    if numba.get_num_threads() < 2:
        pytest.skip("needs two threads")
    caller = threading.get_ident()

    def entry(ctl, nch):
        if threading.get_ident() == caller:
            end = time.monotonic() + 10.0  # wait for the worker to take its chunk (a
            while ctl[0] == 0 and time.monotonic() < end:  # busy machine wakes it late)
                time.sleep(0.001)
            while ctl[0] < nch:  # (under the GIL: a plain add is atomic here)
                ctl[0] += 1
                ctl[1] += 1
        else:
            ctl[0] += 1  # takes a chunk and fails before finishing it
            raise ValueError("chunk failed in a worker")

    with pytest.raises(ValueError, match="in a worker"):
        pool.run(entry, 100, ())


def test_concurrent_callers_each_get_all_their_chunks():
    errors: list[BaseException] = []
    ok: list[bool] = []

    def caller() -> None:
        try:
            for _ in range(50):
                hits = np.zeros(257, np.int64)
                pool.run(_count, 257, (257, hits))
                ok.append(bool((hits == 1).all()))
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=caller) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(ok) == 200 and all(ok)


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
