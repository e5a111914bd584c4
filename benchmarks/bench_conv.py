"""conv2d 3x3 64->64 channel-last (by tags) against torch in its faster layout.

Run with ``python -m pytest benchmarks/bench_conv.py``; compare rows of one run
(the machine is shared and noisy).
"""

from __future__ import annotations

import pytest

import fucina as F

SHAPE = (8, 56, 56, 64)


def _operands(ctx):
    x = F.Tensor("b", "h", "w", "c").randn(ctx, SHAPE, 11)
    w = F.Tensor("oc", "kh", "kw", "ic").randn(ctx, (64, 3, 3, 64), 12).scale(0.05)
    b = F.Tensor("oc").randn(ctx, (64,), 13)
    return x, w, b


def test_conv2d_compiled(benchmark, ctx):
    x, w, b = _operands(ctx)
    benchmark(F.compile(lambda x, w, b: x.conv2d(w, b, 1, 1, 1, ("oh", "ow", "oc"))), x, w, b)


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_conv2d_torch(benchmark, ctx, layout):
    torch = pytest.importorskip("torch")
    x, w, b = (t.numpy() for t in _operands(ctx))
    tx = torch.from_numpy(x).permute(0, 3, 1, 2)
    tw = torch.from_numpy(w).permute(0, 3, 1, 2)
    if layout == "nchw":
        tx, tw = tx.contiguous(), tw.contiguous()
    tb = torch.from_numpy(b)
    with torch.no_grad():
        benchmark(torch.nn.functional.conv2d, tx, tw, tb, 1, 1)
