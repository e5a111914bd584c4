"""How compiled programs run: per-step runners, buffers and views kept between runs,
gradients handed over without copies. Every run must equal eager, call after call."""

from __future__ import annotations

import threading

import numpy as np

import fucina as F
from fucina.kernels import gemm

RNG = np.random.default_rng(7)


def _mlp(ctx):
    rng = np.random.default_rng(3)
    w1 = F.Tensor("h", "in").variable_from_slice(ctx, (8, 3), rng.standard_normal((8, 3)))
    b1 = F.Tensor("h").variable_from_slice(ctx, (8,), rng.standard_normal(8))
    w2 = F.Tensor("c", "h").variable_from_slice(ctx, (2, 8), rng.standard_normal((2, 8)))
    return [w1, b1, w2]


def _loss(params, x):
    w1, b1, w2 = params
    loss = x.dot(w1, "in").add(b1).tanh().dot(w2, "h").sum_all()
    loss.backward()
    return loss


def test_delivered_gradients_are_fresh_buffers_equal_to_eager(ctx):
    xs = [RNG.standard_normal((5, 3)).astype(np.float32) for _ in range(3)]
    eager, comp = _mlp(ctx), _mlp(ctx)

    fast = F.compile(lambda x: _loss(comp, x))
    held = []
    for x0 in xs:
        x = F.Tensor("b", "in").from_slice(ctx, x0.shape, x0)
        for p, q in zip(eager, comp):
            p.zero_grad()
            q.zero_grad()
        _loss(eager, x)
        fast(x)
        for p, q in zip(eager, comp):
            np.testing.assert_allclose(q.grad().numpy(), p.grad().numpy(), rtol=1e-5,
                                       atol=1e-6)
        held.append([(q.grad_view(), q.grad().numpy().copy()) for q in comp])
    # A gradient held from an earlier call keeps its values: each call's gradient is a
    # buffer of its own, never one a later run writes into.
    for views in held:
        for view, values in views:
            np.testing.assert_array_equal(view.numpy(), values)
    assert len({id(v.as_raw_tensor().storage.buf) for views in held for v, _ in views}) == 9


def test_weight_gradients_gemm_straight_into_their_order(ctx):
    # dW[out, in] = sum_b dh[b, out] x[b, in]: the GEMM swaps its operands to write
    # [out, in] itself (no transposed result copied); compiled equals eager bit for bit.
    x0 = RNG.standard_normal((16, 3)).astype(np.float32)
    grads = []
    for mode in ("eager", "compiled"):
        params = _mlp(ctx)
        x = F.Tensor("b", "in").from_slice(ctx, x0.shape, x0)
        fn = F.compile(lambda x, params=params: _loss(params, x))
        if mode == "compiled":
            assert "operands=swapped" in fn.ir(x)
            for p in params:
                p.zero_grad()
            fn(x)
        else:
            _loss(params, x)
        grads.append([p.grad().numpy() for p in params])
    for g_eager, g_comp in zip(*grads):
        np.testing.assert_array_equal(g_comp, g_eager)
    w1, b1, w2 = (p.numpy() for p in _mlp(ctx))
    h = np.tanh(x0 @ w1.T + b1)
    dh = (1 - h * h) * w2.sum(axis=0)
    np.testing.assert_allclose(grads[0][0], dh.T @ x0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[0][2], np.tile(h.sum(axis=0), (2, 1)), rtol=1e-5,
                               atol=1e-5)


def test_swapped_gemm_plan_batched_and_strided():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5, 4)).astype(np.float32)            # [b, m, k]
    b = rng.standard_normal((3, 6, 4)).astype(np.float32).transpose(0, 2, 1)  # [b, k, n]
    p = gemm.plan(a.shape, tuple(s // 4 for s in a.strides), (0, 1, 2),
                  b.shape, tuple(s // 4 for s in b.strides), (0, 2, 3), (0, 3, 1))
    assert p.swapped and p.out_perm is None and p.copies == ()
    out = np.empty(3 * 6 * 5, np.float32)
    got = gemm.contract(a, b, (0, 1, 2), (0, 2, 3), (0, 3, 1), np.dtype(np.float32), out=out)
    assert np.shares_memory(got, out) and got.shape == (3, 6, 5)
    np.testing.assert_allclose(got, np.einsum("bmk,bkn->bnm", a, b), rtol=1e-5, atol=1e-5)
    # Without a buffer the same plan returns the [b, n, m] result.
    np.testing.assert_array_equal(
        gemm.contract(a, b, (0, 1, 2), (0, 2, 3), (0, 3, 1), np.dtype(np.float32)), got)


def test_view_adjoints_in_compiled_runs_equal_eager_run_after_run(ctx):
    # A narrowed and a strided view (their adjoints fill part of the gradient, zeros
    # elsewhere) and a broadcast bias (its adjoint sums the batch away): each compiled run
    # writes the gradient buffers afresh, equal to eager bit for bit.
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((6, 5)).astype(np.float32)
    b0 = rng.standard_normal(5).astype(np.float32)

    def loss(w, v, b, x):
        part = w.narrow("r", 1, 4).mul(x)
        every = v.slice_step("r", 0, 3, 2).mul(v.slice_step("r", 0, 3, 2)).sum_all()
        out = part.add(b).tanh().sum_all().add(every)
        out.backward()
        return out

    runs = []
    for mode in ("eager", "compiled"):
        w = F.Tensor("r", "c").variable_from_slice(ctx, w0.shape, w0)
        v = F.Tensor("r", "c").variable_from_slice(ctx, w0.shape, w0)
        b = F.Tensor("c").variable_from_slice(ctx, b0.shape, b0)
        fn = F.compile(loss) if mode == "compiled" else loss
        got = []
        for k in range(3):
            x0 = rng.standard_normal((4, 5)).astype(np.float32) if mode == "eager" else \
                runs[0][k][2]
            for p in (w, v, b):
                p.zero_grad()
            fn(w, v, b, F.Tensor("r", "c").from_slice(ctx, x0.shape, x0))
            got.append((w.grad().numpy(), b.grad().numpy(), x0, v.grad().numpy()))
        runs.append(got)
    for (we, be, x0, ve), (wc, bc, _, vc) in zip(*runs):
        # (the fused tanh derivative may round one ulp apart from eager's)
        np.testing.assert_allclose(wc, we, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(bc, be, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(vc, ve)
        want_v = np.zeros_like(w0)
        want_v[0:6:2] = 2 * w0[0:6:2]
        np.testing.assert_allclose(ve, want_v, rtol=1e-6)
        t = np.tanh(w0[1:5] * x0 + b0)
        np.testing.assert_allclose(be, (1 - t * t).sum(axis=0), rtol=1e-5, atol=1e-6)
        want = np.zeros_like(w0)
        want[1:5] = (1 - t * t) * x0
        np.testing.assert_allclose(we, want, rtol=1e-5, atol=1e-6)


def test_constant_fills_hold_their_values_run_after_run(ctx):
    # logsumexp's fallback for a row with no finite max is a constant fill, computed once
    # per program: every run (and every row layout) must still see it.
    def f(x):
        return x.logsumexp("c").mul(x.sum("c"))

    fast = F.compile(f)
    rng = np.random.default_rng(11)
    for k in range(4):
        x0 = rng.standard_normal((6, 3)).astype(np.float32)
        x0[k % 6] = -np.inf
        x = F.Tensor("b", "c").from_slice(ctx, x0.shape, x0)
        want = f(x).numpy()
        got = fast(x).numpy()
        np.testing.assert_array_equal(got, want)
        m = x0.max(axis=1)
        safe = np.where(np.isfinite(m), m, 0.0)
        with np.errstate(divide="ignore"):  # the -inf row: log(0)
            ref = (np.log(np.exp(x0 - safe[:, None]).sum(axis=1)) + safe) * x0.sum(axis=1)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert fast.cache_size() == 1


def test_one_training_program_from_four_threads_equals_eager(ctx):
    # GEMMs (one with swapped operands), bias-gradient sums and a constant fill, run by
    # four threads at once: each run has its own scratch set and views, and each
    # thread's variables receive exactly their own gradients.
    def loss(x, w, b):
        out = x.dot(w, "in").add(b).tanh().logsumexp("h").sum_all()
        out.backward()
        return out

    rng = np.random.default_rng(13)
    data = [(rng.standard_normal((32, 5)).astype(np.float32),
             rng.standard_normal((7, 5)).astype(np.float32),
             rng.standard_normal(7).astype(np.float32)) for _ in range(4)]

    def make(k):
        x0, w0, b0 = data[k]
        return (F.Tensor("b", "in").from_slice(ctx, x0.shape, x0),
                F.Tensor("h", "in").variable_from_slice(ctx, w0.shape, w0),
                F.Tensor("h").variable_from_slice(ctx, b0.shape, b0))

    want = []
    for k in range(4):
        x, w, b = make(k)
        value = loss(x, w, b).item()
        want.append((value, w.grad().numpy(), b.grad().numpy()))
    fast = F.compile(loss)
    fast(*make(0))
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(k):
        try:
            x, w, b = make(k)
            barrier.wait()
            for _ in range(20):
                w.zero_grad()
                b.zero_grad()
                value = fast(x, w, b).item()
                np.testing.assert_allclose(value, want[k][0], rtol=1e-5)
                np.testing.assert_allclose(w.grad().numpy(), want[k][1], rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(b.grad().numpy(), want[k][2], rtol=1e-5, atol=1e-6)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert fast.cache_size() == 1
    assert "operands=swapped" in fast.ir(*make(0))


def test_short_outer_loop_goes_inside_with_the_same_values(ctx):
    # A parallel pointwise kernel over [b=4, seq, h, d] with a table broadcast over b and
    # h: the batch loop (4 chunks for two threads) swaps with seq. Values are eager's;
    # dropout, whose mask follows the flat element index, keeps the logical order.
    x = F.Tensor("b", "s", "h", "d").randn(ctx, (4, 512, 8, 64), 5)
    t = F.Tensor("s", "d").randn(ctx, (512, 64), 6)
    fn = F.compile(lambda a: a.mul(t).add(a))
    assert "loops [512, 4, 8, 64]" in fn.ir(x)
    want = x.numpy() * t.numpy()[None, :, None, :] + x.numpy()
    np.testing.assert_array_equal(fn(x).numpy(), want)
    np.testing.assert_array_equal(fn(x).numpy(), x.mul(t).add(x).numpy())
    drop = F.compile(lambda a: a.mul(t).dropout(0.5, 9))
    assert "loops [4, 512, 8, 64]" in drop.ir(x)
    np.testing.assert_array_equal(drop(x).numpy(), x.mul(t).dropout(0.5, 9).numpy())
