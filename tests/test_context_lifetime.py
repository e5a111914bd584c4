"""A deinit'ed context refuses use: its tensors, its constructors, compiled calls."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

T = F.Tensor("d")


def test_deinit_context_makes_its_tensors_unusable():
    ctx = F.ExecContext()
    x = T.from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    y = x.scale(2.0)
    fast = F.compile(lambda x: x.add_scalar(1.0))
    np.testing.assert_array_equal(fast(x).numpy(), [2.0, 3.0, 4.0])
    ctx.deinit()
    for use in (lambda: x.numpy(), lambda: y.add(y), lambda: x.scale(3.0), lambda: fast(x),
                lambda: x.shape):
        with pytest.raises(F.Deinitialized):
            use()
    for make in (lambda: T.from_slice(ctx, (1,), [1.0]), lambda: T.zeros(ctx, (2,)),
                 lambda: ctx.from_slice((1,), [1.0])):
        with pytest.raises(F.Deinitialized):
            make()
    with pytest.raises(F.Deinitialized), ctx.exec_scope():
        pass


def test_other_contexts_are_unaffected():
    a, b = F.ExecContext(), F.ExecContext()
    xa, xb = T.from_slice(a, (2,), [1.0, 2.0]), T.from_slice(b, (2,), [3.0, 4.0])
    a.deinit()
    np.testing.assert_array_equal(xb.scale(2.0).numpy(), [6.0, 8.0])
    with pytest.raises(F.Deinitialized):
        xa.numpy()


def test_with_block_deinits_the_context():
    with F.ExecContext() as ctx:
        x = T.from_slice(ctx, (2,), [1.0, 2.0])
        assert x.sum_all().item() == 3.0
    with pytest.raises(F.Deinitialized):
        x.sum_all()
