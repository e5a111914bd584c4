"""Threads: one compiled function or one context used from several threads at once,
exec scopes per thread, and the Numba threading layer the kernels run on."""

from __future__ import annotations

import importlib.metadata
import platform
import threading

import numpy as np
import pytest

import fucina as F

THREADS = 4


def _run_threads(work):
    """Run work(k) on THREADS threads started together; re-raise the first failure."""
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def target(k):
        try:
            barrier.wait()
            work(k)
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=target, args=(k,)) for k in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def _block(x, w):
    # Intermediates live in scratch buffers; the contraction is a reference step
    # between kernels; the row kernel reduces.
    h = x.mul(x).add_scalar(1.0).tanh()
    z = h.dot(w, "d").with_tags(("b", "d"))
    e = z.sub(z.max("d")).exp()
    return e.div(e.sum("d")).add(h)


def _np_block(x, w):
    h = np.tanh(x * x + 1.0)
    z = h @ w
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True) + h


@pytest.mark.parametrize("rows", [8, 1024])  # serial kernels, then parallel ones
def test_one_compiled_function_from_four_threads(rows):
    ctx = F.ExecContext()
    rng = np.random.default_rng(0)
    d = 256
    w0 = (rng.standard_normal((d, d)) * 0.1).astype(np.float32)
    w = F.Tensor("d", "e").from_slice(ctx, (d, d), w0)
    fast = F.compile(_block)
    xs = [rng.standard_normal((rows, d)).astype(np.float32) for _ in range(THREADS)]
    inputs = [F.Tensor("b", "d").from_slice(ctx, (rows, d), x) for x in xs]
    fast(inputs[0], w)  # trace and compile once; the threads share the program

    def work(k):
        want = _np_block(xs[k].astype(np.float64), w0.astype(np.float64))
        for _ in range(10):
            np.testing.assert_allclose(fast(inputs[k], w).numpy(), want, rtol=1e-4, atol=1e-5)

    _run_threads(work)
    assert fast.cache_size() == 1


def test_first_calls_from_four_threads_trace_safely():
    ctx = F.ExecContext()
    fast = F.compile(lambda x: x.mul(x).sum("d"))

    def work(k):
        n = k + 3  # a different signature per thread, traced concurrently
        x = F.Tensor("d").from_slice(ctx, (n,), np.arange(n, dtype=np.float32))
        for _ in range(5):
            assert fast(x).item() == sum(i * i for i in range(n))

    _run_threads(work)
    assert fast.cache_size() == THREADS


def test_eager_ops_on_one_context_from_four_threads():
    ctx = F.ExecContext()
    rng = np.random.default_rng(1)
    data = [rng.standard_normal((64, 300)).astype(np.float32) for _ in range(THREADS)]

    def work(k):
        x = F.Tensor("r", "c").from_slice(ctx, data[k].shape, data[k])
        for _ in range(20):
            y = x.mul(x).add_scalar(1.0).sqrt().sum("c").numpy()
            np.testing.assert_allclose(y, np.sqrt(data[k] ** 2 + 1).sum(axis=1), rtol=1e-5)
            g = x.gather("r", [3, 1], "k").numpy()
            np.testing.assert_array_equal(g, data[k][[3, 1]])

    _run_threads(work)


def test_exec_scopes_are_per_thread():
    ctx = F.ExecContext()
    x = F.Tensor("d").from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    opened, made, closed = threading.Event(), threading.Event(), threading.Event()
    kept = []

    def scoped():
        with ctx.exec_scope():
            inner = x.scale(2.0)
            opened.set()
            made.wait()
        closed.set()
        with pytest.raises(F.Deinitialized):
            inner.numpy()  # released by this thread's scope

    def other():
        opened.wait()
        kept.append(x.add_scalar(1.0))  # made while the other thread's scope is open
        made.set()
        closed.wait()

    a, b = threading.Thread(target=scoped), threading.Thread(target=other)
    a.start()
    b.start()
    a.join()
    b.join()
    np.testing.assert_array_equal(kept[0].numpy(), [2.0, 3.0, 4.0])


def _tbb_installed() -> bool:
    try:
        importlib.metadata.distribution("tbb")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_kernels_run_on_the_intended_threading_layer():
    layer = F.internal.threading_layer()
    if platform.machine() in ("x86_64", "AMD64") and _tbb_installed():
        assert layer == "tbb"  # the README install pulls in tbb: it must actually load
    else:
        assert layer in ("tbb", "omp")
