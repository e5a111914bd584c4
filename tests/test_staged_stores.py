"""Pointwise kernels that write a value in place over their own input store each block
after all its loads (``KernelSpec.staged_stores``): same values as the plain loop, the
parameters updated where they live, and the stack rows the blocks run through."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import njit

import fucina as F
from fucina.kernels import codegen as cg
from fucina.kernels import stack_rows

N = 2 * cg.STRIP_BLOCK + 77  # two whole blocks and a partial one
RNG = np.random.default_rng(4)
W0 = RNG.standard_normal((3, N)).astype(np.float32)
X0 = RNG.standard_normal((3, N)).astype(np.float32)


class _Model:
    def __init__(self, ctx):
        self.w = F.Tensor("r", "i").variable_from_slice(ctx, W0.shape, W0)
        self.opt = F.optim.AdamW([self.w], lr=1e-2, weight_decay=1e-2)

    def step(self, x):
        self.opt.zero_grad()
        loss = self.w.mul(x).tanh().sum("i").sum("r")
        loss.backward()
        self.opt.step()
        return loss


def _run(ctx, steps=3):
    eager, comp = _Model(ctx), _Model(ctx)
    fast = F.compile(comp.step)
    buf = comp.w.as_raw_tensor().storage.buf
    for k in range(steps):
        x0 = X0 * (1 + k)
        x = F.Tensor("r", "i").from_slice(ctx, x0.shape, x0)
        np.testing.assert_allclose(fast(x).item(), eager.step(x).item(), rtol=1e-5)
    assert comp.w.as_raw_tensor().storage.buf is buf  # written where it lives
    return eager, comp, fast, x


def test_in_place_update_runs_in_blocks_and_equals_eager(ctx):
    eager, comp, fast, x = _run(ctx)
    text = fast.ir(x)
    # w and AdamW's second moment; the first moment is finished in the gradient's row
    # kernel (a reduction: never written in place) and copied.
    assert text.count("stored in place by its kernel") == 2
    staged = [k.source for k in fast.kernels(x) if "sr.row(" in k.source]
    assert len(staged) == 1
    src = staged[0]
    # A row per output, and one loop that only stores them, after the loop that loads.
    assert src.count("sr.row(") == 2 and src.count("for j in range(kl):") == 2
    store_loop = src[src.rindex("for j in range(kl):"):].splitlines()[1:]
    stores = [ln.strip() for ln in store_loop if ln.strip().startswith("out")]
    assert len(stores) == 2 and all(
        re.fullmatch(r"out\d\[np\.uint64\(b_out\d \+ j\)\] = t\d+\[j\]", x)
        for x in stores)
    # nothing else in that loop but the chunk count after it
    assert all(ln.strip().startswith(("out", "at.fetch_add")) or not ln.strip()
               for ln in store_loop)
    np.testing.assert_allclose(comp.w.numpy(), eager.w.numpy(), rtol=1e-6, atol=1e-7)


def test_staged_stores_have_the_bits_of_the_plain_loop(ctx, monkeypatch):
    _, staged, _, _ = _run(ctx)
    monkeypatch.setattr(cg, "strip_stages", lambda spec: [])  # the plain row loop
    _, plain, fast, x = _run(ctx)
    assert not any("sr.row(" in k.source for k in fast.kernels(x))
    np.testing.assert_array_equal(staged.w.numpy(), plain.w.numpy())
    for name in ("exp_avg", "exp_avg_sq"):
        a = staged.opt.state_dict()["state"][0][name]
        b = plain.opt.state_dict()["state"][0][name]
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_kernel_not_written_in_place_keeps_its_plain_loop(ctx):
    x = F.Tensor("i").randn(ctx, (N,), 5)
    fast = F.compile(lambda x: x.mul(x).add_scalar(1.0))
    fast(x)
    assert "sr.row(" not in fast.kernels(x)[0].source


@njit(cache=True)
def _rows(n):
    f = stack_rows.row(np.float32(0), 8)
    i = stack_rows.row(np.int64(0), 8)
    b = stack_rows.row(np.bool_(False), 8)
    for j in range(n):
        f[j] = np.float32(j) / 2
        i[j] = j * j
        b[j] = j % 3 == 0
    return f[:n].copy(), i[:n].copy(), b[:n].copy()


@pytest.mark.parametrize("n", [1, 8])
def test_stack_rows_hold_floats_integers_and_bools(n):
    f, i, b = _rows(n)
    j = np.arange(n)
    np.testing.assert_array_equal(f, (j / 2).astype(np.float32))
    np.testing.assert_array_equal(i, j * j)
    np.testing.assert_array_equal(b, j % 3 == 0)
    assert f.dtype == np.float32 and i.dtype == np.int64 and b.dtype == np.bool_
