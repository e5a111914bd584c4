"""Strip-mined pointwise kernels: a chain of costly calls runs in stages over blocks.

The staged kernel must give bit for bit the values of the same chain fused into
one loop body (each element computes the same expressions), at every block
boundary, with broadcast operands, several outputs and more than one kept axis.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F
from fucina.kernels import codegen as cg


def _both(fn, *args):
    """(staged result, fused result, staged kernel source) of ``fn`` compiled twice."""
    staged = F.compile(fn)
    got = staged(*args)
    src = staged.kernels(*args)[0].source
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cg, "strip_stages", lambda spec: [])
        fused = F.compile(fn)(*args)
    return got, fused, src


def _as_list(r):
    return [t.numpy() for t in (r if isinstance(r, tuple) else (r,))]


def test_chain_runs_in_stages_and_equals_the_fused_loop(ctx):
    n = 2 * cg.STRIP_BLOCK + 77  # a partial last block
    x = F.Tensor("i").randn(ctx, (n,), 1)
    w = F.Tensor("i").randn(ctx, (n,), 2)

    def chain(x, w):
        return x.mul(w).add_scalar(1.0).tanh().mul(x).sigmoid()

    got, fused, src = _both(chain, x, w)
    assert src.count("for j in range(kl):") == 2 and "t4[j] = v4" in src
    np.testing.assert_array_equal(got.numpy(), fused.numpy())
    np.testing.assert_allclose(got.numpy(), chain(x, w).numpy(), rtol=1e-6, atol=1e-7)


def test_broadcast_operand_two_axes_and_two_outputs(ctx):
    x = F.Tensor("r", "c").randn(ctx, (3, cg.STRIP_BLOCK + 5), 3)
    b = F.Tensor("c").randn(ctx, (cg.STRIP_BLOCK + 5,), 4)

    def two(x, b):
        t = x.add(b).tanh()
        return t, t.mul(x).exp().add(b).sigmoid()

    got, fused, src = _both(two, x, b)
    assert src.count("for j in range(kl):") == 3  # tanh | exp | sigmoid
    for g, f in zip(_as_list(got), _as_list(fused)):
        np.testing.assert_array_equal(g, f)
    for g, e in zip(_as_list(got), _as_list(two(x, b))):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)


def test_one_costly_call_stays_fused(ctx):
    x = F.Tensor("i").randn(ctx, (100,), 5)
    fast = F.compile(lambda x: x.mul(x).tanh().add_scalar(1.0))
    fast(x)
    assert "range(kl)" not in fast.kernels(x)[0].source
