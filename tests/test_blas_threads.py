"""OpenBLAS's idle workers: fucina shortens their busy wait at import (kernels/blas_threads),
restarts them safely, and leaves a user's own OPENBLAS_THREAD_TIMEOUT alone."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fucina as F  # the import also shortens the wait
import fucina.gguf as G
from fucina.kernels import blas_threads
from fucina.kernels import qmatmul as Q


def _timeouts() -> list[int]:
    return [ctypes.CDLL(p).openblas_thread_timeout() for p in blas_threads.SHORTENED]


def test_loaded_openblas_waits_briefly_and_still_multiplies():
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        assert blas_threads.SHORTENED == []
        return
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ  # set only while OpenBLAS read it
    assert _timeouts() == [blas_threads.THREAD_TIMEOUT] * len(blas_threads.SHORTENED)
    # the restarted workers compute: a GEMM large enough to be split across threads
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 400))
    b = rng.standard_normal((400, 500))
    want = np.einsum("ik,kj->ij", a, b)
    for _ in range(3):
        np.testing.assert_allclose(a @ b, want, rtol=1e-10, atol=1e-10)


_CHILD = """
import ctypes, os, numpy as np
import fucina
from fucina.kernels import blas_threads, threads
print("shortened", blas_threads.SHORTENED)
print("omp", threads.OMP_LOADED, "OMP_WAIT_POLICY" in os.environ, os.environ.get("OMP_WAIT_POLICY"))
"""


_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY",
            "OPENBLAS_THREAD_TIMEOUT", "NUMBA_THREADING_LAYER")


def _child(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in _CHOICES} | env
    return subprocess.run([sys.executable, "-c", _CHILD], env=full, capture_output=True,
                          text=True, timeout=300, check=True)


def test_user_settings_are_left_alone_and_openmp_waits_passively():
    # No wait policy from the user: Numba's OpenMP layer loads with a passive wait
    # (GNU OpenMP prints what it read with OMP_DISPLAY_ENV), and the variable does
    # not stay behind; the user's own OpenBLAS wait is kept.
    r = _child({"NUMBA_THREADING_LAYER": "omp", "OMP_DISPLAY_ENV": "TRUE",
                "OPENBLAS_THREAD_TIMEOUT": "10"})
    assert "shortened []" in r.stdout
    if "omp True" in r.stdout:
        assert "omp True False None" in r.stdout
        if "OMP_WAIT_POLICY = " in r.stderr:  # GNU OpenMP
            assert "OMP_WAIT_POLICY = 'PASSIVE'" in r.stderr
    # The user's own policy wins.
    r = _child({"NUMBA_THREADING_LAYER": "omp", "OMP_DISPLAY_ENV": "TRUE",
                "OMP_WAIT_POLICY": "ACTIVE"})
    assert "omp True True ACTIVE" in r.stdout or "omp False" in r.stdout
    if "OMP_WAIT_POLICY = " in r.stderr:
        assert "OMP_WAIT_POLICY = 'ACTIVE'" in r.stderr


# --- mid-size products on one OpenBLAS thread (blas_threads.gemm_call) ---

class _Recorder:
    """Stands in for blas_threads._ONE: counts entries and what OpenBLAS ran on."""

    def __init__(self, real):
        self.real, self.entries, self.inside = real, 0, []

    def __enter__(self):
        self.entries += 1
        self.real.__enter__()
        self.inside.append(_counts())

    def __exit__(self, *exc):
        self.real.__exit__(*exc)


def _counts() -> list[int]:
    return [get() for _, get in blas_threads.CONTROLS]


def test_mid_size_products_run_on_one_thread_and_restore_the_count(monkeypatch):
    rec = _Recorder(blas_threads._ONE)
    monkeypatch.setattr(blas_threads, "_ONE", rec)
    before = _counts()
    mid = blas_threads.gemm_call(np.matmul, 256, 64, 64)  # 2**20 multiply-adds
    assert blas_threads.gemm_call(np.matmul, 8, 8, 8) is np.matmul  # OpenBLAS: one thread
    assert blas_threads.gemm_call(np.dot, 2**9, 2**5, 2**5) is np.dot  # 2**19: still one
    wrapped = blas_threads.gemm_call(np.dot, 2**9, 2**5, 2**5 + 1)  # just above: split
    assert wrapped is blas_threads.gemm_call(np.dot, 2**10, 2**6, 2**6)  # 2**22: the last
    split = blas_threads.gemm_call(np.dot, 2**10, 2**6, 2**6 + 1)  # both threads
    assert split is blas_threads._LENDING[np.dot] and split is not wrapped
    assert (wrapped is not np.dot) == bool(blas_threads.CONTROLS)
    big = blas_threads.gemm_call(np.matmul, 1024, 1024, 1024)  # both threads
    assert big is blas_threads._LENDING[np.matmul]
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    out = np.empty((256, 64), np.float32)
    assert mid(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert _counts() == before  # restored after the call
    with pytest.raises(ValueError):  # numpy's own error passes through, the count restored
        mid(a, b, out=np.empty((3, 3), np.float32))
    assert _counts() == before
    if blas_threads.CONTROLS:
        assert mid is not np.matmul
        assert rec.entries == 2 and rec.inside == [[1] * len(before)] * 2
    else:  # no OpenBLAS fucina can steer: the product as it is
        assert mid is np.matmul and rec.entries == 0


def test_overlapping_callers_restore_the_count_once():
    one = blas_threads._OneThread(blas_threads.CONTROLS)
    before = _counts()
    with one:
        with one:  # a second caller (another thread) inside the first
            assert _counts() == [1] * len(before)
        assert _counts() == [1] * len(before)  # the first caller is still inside
    assert _counts() == before
    errors = []

    def work():
        try:
            for _ in range(200):
                with one:
                    assert _counts() == [1] * len(before)
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and _counts() == before


def test_eager_fast_and_compiled_dot_take_the_one_thread_product(monkeypatch):
    rec = _Recorder(blas_threads._ONE)
    monkeypatch.setattr(blas_threads, "_ONE", rec)
    ctx = F.ExecContext()
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((256, 64)).astype(np.float32)
    w0 = rng.standard_normal((64, 48)).astype(np.float32)
    x = F.Tensor("b", "k").from_slice(ctx, x0.shape, x0)
    w = F.Tensor("k", "n").from_slice(ctx, w0.shape, w0)
    want = x0 @ w0
    fn = F.compile(lambda p, q: p.dot(q, "k").scale(2.0))
    plain = F.compile(lambda p, q: p.dot(q, "k"))
    calls = {"eager (its fast path after the first call)": lambda: x.dot(w, "k").numpy(),
             "a program": lambda: fn(x, w).numpy() / np.float32(2),
             "the plain lane's one product": lambda: plain(x, w).numpy()}
    first = {name: call() for name, call in calls.items()}  # learns, traces
    per_call = 1 if blas_threads.CONTROLS else 0
    for name, call in calls.items():
        entries = rec.entries
        got = call()
        assert rec.entries - entries == per_call, name  # this call's product, once
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got, first[name])
        np.testing.assert_array_equal(got, first["eager (its fast path after the first call)"])
    small = F.Tensor("b", "k").from_slice(ctx, (8, 64), x0[:8])
    entries = rec.entries
    small.dot(w, "k").numpy()  # 8 x 64 x 48: OpenBLAS keeps it on one thread itself
    assert rec.entries == entries


def test_products_planned_as_kernels_run_take_it_too(monkeypatch):
    # blas_threads.matmul: the per-call form for products a kernel plans as it runs (the
    # quantized GEMM's panels, conv tiles, the stacked GEMM's BLAS fallback).
    rec = _Recorder(blas_threads._ONE)
    monkeypatch.setattr(blas_threads, "_ONE", rec)
    per_call = 1 if blas_threads.CONTROLS else 0
    rng = np.random.default_rng(3)
    wf = (rng.standard_normal((512, 512)) * 0.05).astype(np.float32)
    blocks = G.encode_f32("q8_0", wf)
    x = rng.standard_normal((8, 512)).astype(np.float32)  # 8 rows: panels + BLAS
    want = x.astype(np.float64) @ G.decode_f32("q8_0", blocks).astype(np.float64).T
    entries = rec.entries
    got = Q.qmatmul(x, blocks, "q8_0")  # one 512-row panel: 8 x 512 x 512, 2**21
    assert rec.entries - entries == per_call
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    a, b = rng.standard_normal((2, 256, 64), dtype=np.float32), \
        rng.standard_normal((2, 64, 64), dtype=np.float32)
    out = np.empty((2, 256, 64), np.float32)
    entries = rec.entries
    assert blas_threads.matmul(a, b, out) is out  # per matrix 2**20
    assert rec.entries - entries == per_call
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-6, atol=1e-5)
    entries = rec.entries
    np.testing.assert_allclose(blas_threads.matmul(a[:, :8], b), np.matmul(a[:, :8], b),
                               rtol=1e-6, atol=1e-5)
    assert rec.entries == entries  # 8 x 64 x 64: OpenBLAS's own one thread


def test_a_fork_inside_the_section_leaves_the_child_a_free_section(monkeypatch):
    # What os.register_at_fork runs in a child forked while another thread of the
    # parent was inside: the saved counts come back and a new section starts unheld.
    before = _counts()
    section = blas_threads._OneThread(blas_threads.CONTROLS)
    monkeypatch.setattr(blas_threads, "_ONE", section)
    section.__enter__()
    assert _counts() == [1] * len(before)
    blas_threads._after_fork()
    assert _counts() == before
    fresh = blas_threads._ONE
    assert fresh is not section and fresh._depth == 0 and not fresh._lock.locked()
    with fresh:
        assert _counts() == [1] * len(before)
    assert _counts() == before


def test_a_split_product_first_sends_spinning_pool_workers_to_sleep():
    from fucina.kernels import pool

    split = blas_threads.gemm_call(np.matmul, 1024, 1024, 1024)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 100)).astype(np.float32)
    out = np.empty((300, 100), np.float32)
    pool._RING.box[2] = 0
    assert split(a, b, out=out) is out
    assert pool._RING.box[2] == 1  # lent: a spinning worker returns to sleep
    np.testing.assert_array_equal(out, np.matmul(a, b))
