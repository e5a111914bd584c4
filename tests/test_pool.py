"""The kernel thread pool: chunks cover the outer loop once, errors reach the caller,
the thread count follows Numba's, and parallel kernels give the serial bits."""

from __future__ import annotations

import itertools
import os
import threading
import time

import numba
import numpy as np
import pytest

import fucina as F
from fucina.kernels import atomics, pool, spin


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


# ---- spinning workers: the native wait, the quiet-machine judge, the counter ring


def test_wait_post_returns_what_it_saw():
    box, ring = np.zeros(3, np.int64), np.zeros(8, np.int64)
    big = 10**12  # ticks: never reached in these cases
    assert spin.wait_post(box, ring, 0, 10**5, big) == spin.TIMED_OUT  # nothing posted
    box[0], box[1], ring[2] = 1, 1, 1  # posted, and the caller took a chunk of slot 1
    assert spin.wait_post(box, ring, 0, big, big) == spin.POSTED
    box[1] = -1  # an unwatched job: no counter to wait for
    assert spin.wait_post(box, ring, 0, big, big) == spin.POSTED
    box[1], ring[:] = 3, 0  # the caller has not entered its kernel yet: waits the budget
    assert spin.wait_post(box, ring, 0, 10**5, big) == spin.POSTED
    box[0], box[2] = 0, 1  # cores lent out: no spin at all, whatever the budget
    t0 = time.monotonic()
    assert spin.wait_post(box, ring, 0, big, big) == spin.TIMED_OUT
    assert time.monotonic() - t0 < 1.0
    box[2] = 0  # every gap between two counter reads counts as lost time
    assert spin.wait_post(box, ring, 0, big, 0) == spin.PREEMPTED


def test_wait_post_sees_a_post_from_another_thread():
    box, ring = np.zeros(3, np.int64), np.zeros(8, np.int64)
    box[1] = 2

    def post() -> None:
        time.sleep(0.02)
        box[0] = 5
        time.sleep(0.02)
        ring[4] = 1  # the caller's first chunk

    t = threading.Thread(target=post)
    t.start()
    t0 = time.monotonic()
    got = spin.wait_post(box, ring, 0, 10**13, 10**13)  # the budget is hours
    waited = time.monotonic() - t0
    t.join()
    assert got == spin.POSTED and 0.03 < waited < 5.0


def test_quiet_judges_the_run_queue(monkeypatch):
    monkeypatch.setattr(pool, "_QUIET_EVERY", 0.0)
    readings = itertools.chain([2, 2, 2, 3, 2, 3, 3, -1, 2, 2, 2, 2, 2], itertools.repeat(1))
    q = pool._Quiet(read=lambda: next(readings), cores=2)
    # not quiet until three of the last four readings show no more runnable threads
    # than cores; one busy reading among them is a passer-by, two are not
    assert [q() for _ in range(13)] == [False, False, True, True, True, False, False,
                                        False, False, False, True, True, True]
    q.hold()  # a spin that was preempted keeps the workers still for a while
    assert q() is False and q() is False
    q.busy_until = 0.0  # (the hold has passed)
    assert q() is True


def test_job_counters_come_from_the_ring_until_it_runs_out():
    ring = pool._RING
    free = len(ring.free)
    jobs = [pool._Job(_count, 1, ()) for _ in range(free)]
    slots = [j.slot for j in jobs]
    assert len(set(slots)) == free and min(slots) >= 0
    assert all(np.shares_memory(j.ctl, ring.counters) and not j.ctl.any() for j in jobs)
    extra = pool._Job(_count, 1, ())  # none left: a counter of its own, unwatched
    assert extra.slot == -1 and not np.shares_memory(extra.ctl, ring.counters)
    held = jobs.pop()  # a late worker still holding a job keeps its slot
    again = jobs.pop()
    freed = again.slot
    del again
    reused = pool._Job(_count, 1, ())
    assert reused.slot == freed != held.slot
    del jobs, reused, extra, held
    assert len(ring.free) == free


class _Judge:
    """A stand-in for the pool's quiet-machine judge."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self) -> bool:
        return self.quiet

    def hold(self) -> None:
        self.quiet = False


def _spy(monkeypatch):
    seen: list[int] = []
    monkeypatch.setattr(pool, "_GAP_US", 1e7)  # a slow host's hiccups are not preemption
    real = pool.wait_post

    def wait_post(*args):
        got = real(*args)
        seen.append(got)
        return got

    monkeypatch.setattr(pool, "wait_post", wait_post)
    return seen


def test_workers_spin_for_the_next_post_only_on_a_quiet_machine(monkeypatch):
    if numba.get_num_threads() < 2:
        pytest.skip("needs two threads")
    n = 64
    seen = _spy(monkeypatch)
    monkeypatch.setattr(pool, "SPIN_US", 500_000.0)  # long enough for any host
    monkeypatch.setattr(pool, "_QUIET", _Judge(False))
    for _ in range(5):
        hits = np.zeros(n, np.int64)
        pool.run(_count, n, (n, hits))
        assert (hits == 1).all()
        time.sleep(0.005)
    assert seen == []  # busy: workers go to sleep at once
    monkeypatch.setattr(pool, "_QUIET", _Judge(True))
    try:
        for _ in range(5):
            hits = np.zeros(n, np.int64)
            pool.run(_count, n, (n, hits))
            assert (hits == 1).all()
            time.sleep(0.005)
        assert spin.POSTED in seen  # a worker that spun saw the next post
    finally:
        pool.lend_cores()  # the spinning worker goes to sleep


def test_lending_the_cores_stops_a_spinning_worker(monkeypatch):
    if numba.get_num_threads() < 2:
        pytest.skip("needs two threads")
    seen = _spy(monkeypatch)
    monkeypatch.setattr(pool, "SPIN_US", 2_000_000.0)
    monkeypatch.setattr(pool, "_QUIET", _Judge(True))
    hits = np.zeros(64, np.int64)
    pool.run(_count, 64, (64, hits))
    time.sleep(0.05)  # the worker is spinning now (2 s budget)
    n0 = len(seen)
    pool.lend_cores()
    end = time.monotonic() + 1.0
    while len(seen) == n0 and time.monotonic() < end:
        time.sleep(0.001)
    assert seen[n0:] == [spin.TIMED_OUT]


def test_the_spin_setting_comes_from_the_environment():
    assert pool._spin_setting({}) == 50.0
    assert pool._spin_setting({"FUCINA_POOL_SPIN_US": "0"}) == 0.0
    assert pool._spin_setting({"FUCINA_POOL_SPIN_US": "120.5"}) == 120.5
    for bad in ("fast", "-1", "1e7", "nan"):
        with pytest.raises(ValueError, match=f"FUCINA_POOL_SPIN_US .*{bad!r}"):
            pool._spin_setting({"FUCINA_POOL_SPIN_US": bad})
