"""How compiled programs run: per-step runners, buffers and views kept between runs,
gradients handed over without copies. Every run must equal eager, call after call."""

from __future__ import annotations

import numpy as np

import fucina as F

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
