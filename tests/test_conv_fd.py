"""Convolution-family gradients against central finite differences (no torch needed).

Every differentiable operand of every route is perturbed: conv2d's Winograd,
im2col and grouped routes (input, weight, bias), pooling, unfold/fold, the
1-D convs, the transposed conv, upsampling, channel affine and the relative
shift.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fd import fd_check

import fucina as F

_CTX = F.ExecContext()  # the operands closed over by a check live here too


def _fd_check(tags: tuple[str, ...], shape: tuple[int, ...], build: Callable[[Any], Any],
              seed: int = 0, eps: float = 1e-3, tol: float = 2e-2) -> None:
    fd_check(_CTX, tags, shape, build, seed, eps, tol)


def _const(tags: tuple[str, ...], shape: tuple[int, ...], seed: int) -> Any:
    v = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return F.Tensor(*tags).from_slice(_CTX, shape, v)


OUT = ("oh", "ow", "oc")


@pytest.mark.parametrize("route", [
    # (x shape, w shape, stride, pad, groups)
    ((4, 4, 4), (3, 3, 3, 4), 1, 1, 1),   # Winograd F(2x2, 3x3)
    ((8, 9, 4), (2, 3, 3, 4), 1, 1, 1),   # Winograd F(4x4, 3x3)
    ((5, 4, 2), (2, 3, 2, 2), 2, 1, 1),   # im2col + GEMM, stride 2 (col2im gradient)
    ((4, 4, 4), (4, 3, 3, 2), 1, 1, 2),   # grouped
])
def test_fd_conv2d_every_operand(route):
    xs, ws, stride, pad, groups = route
    x = _const(("h", "w", "c"), xs, 1)
    w = _const(("o", "kh", "kw", "i"), ws, 2)
    b = _const(("o",), (ws[0],), 3)
    _fd_check(("h", "w", "c"), xs, lambda t: t.conv2d(w, b, stride, pad, groups, OUT))
    _fd_check(("o", "kh", "kw", "i"), ws, lambda t: x.conv2d(t, b, stride, pad, groups, OUT))
    _fd_check(("o",), (ws[0],), lambda t: x.conv2d(w, t, stride, pad, groups, OUT))


def test_fd_pooling_upsample_patches():
    _fd_check(("h", "w", "c"), (5, 4, 2), lambda t: t.max_pool2d(3, 2, 1))
    _fd_check(("h", "w", "c"), (5, 4, 2), lambda t: t.avg_pool2d((3, 2), (2, 1), (1, 1)))
    _fd_check(("h", "w", "c"), (2, 3, 2), lambda t: t.upsample2x_nearest())
    _fd_check(("h", "w", "c"), (4, 3, 2), lambda t: t.unfold(2, 1, 1, ("p", "e")))
    _fd_check(("p", "e"), (16, 8), lambda t: t.fold((3, 3), 2, 1, 1, ("h", "w", "c")))


def test_fd_one_dimensional_family():
    w = _const(("tap", "in", "out"), (3, 2, 2), 4)
    x = _const(("time", "in"), (5, 4), 5)
    _fd_check(("time", "in"), (5, 4),
              lambda t: t.conv1d("time", "in", "tap", "out", w, 2, 1, 1, 2))
    _fd_check(("tap", "in", "out"), (3, 2, 2),
              lambda t: x.conv1d("time", "in", "tap", "out", t, 1, 1, 2, 2))
    wc = _const(("tap", "in", "out"), (2, 4, 3), 6)
    _fd_check(("time", "in"), (5, 4),
              lambda t: t.causal_conv1d("time", "in", "tap", "out", wc, 2, [0.5] * 8))
    k = _const(("in", "tap"), (4, 3), 7)
    _fd_check(("in", "tap"), (4, 3),
              lambda t: x.causal_depthwise_conv1d("time", "in", "tap", t, 1))
    _fd_check(("time", "in"), (5, 4),
              lambda t: t.causal_depthwise_conv1d("time", "in", "tap", k, 2))
    w2 = _const(("kout", "in"), (6, 4), 8)
    bias = _const(("out",), (2,), 9)
    _fd_check(("time", "in"), (5, 4), lambda t: t.conv_transpose1d(
        "time", "in", "kout", "out", w2, bias, 2, 3, 2, 1, 1))
    _fd_check(("kout", "in"), (6, 4), lambda t: x.conv_transpose1d(
        "time", "in", "kout", "out", t, bias, 2, 3, 2, 1, 1))


def test_fd_channel_affine_and_relpos_shift():
    s = _const(("c",), (3,), 10)
    _fd_check(("h", "c"), (2, 3), lambda t: t.channel_affine(s, s))
    x = _const(("h", "c"), (2, 3), 11)
    _fd_check(("c",), (3,), lambda t: x.channel_affine(t, t))
    _fd_check(("h", "q", "p"), (2, 3, 5), lambda t: t.relpos_shift(3, ("h", "q", "k")))
