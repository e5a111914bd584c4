"""elemental_unary / elemental_binary against PyTorch autograd of the same scalar math:
forward, gradients of every operand, eager and compiled."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from multi_oracle import Arg, check_op  # noqa: E402

RNG = np.random.default_rng(3)


class Softsign:
    """extra * x / (1 + |x|)."""

    @staticmethod
    def forward(x, extra):
        return extra * x / (1.0 + abs(x))

    @staticmethod
    def backward(x, y, grad_y, extra):
        d = 1.0 + abs(x)
        return grad_y * extra / (d * d)


class LogAddExp:
    """log(exp(a) + exp(b)) - extra[0], stable; gradients are the softmax weights."""

    @staticmethod
    def forward(a, b, extra):
        m = max(a, b)
        return m + math.log(math.exp(a - m) + math.exp(b - m)) - extra[0]

    @staticmethod
    def backward(a, b, y, grad_y, extra):
        wa = math.exp(a - (y + extra[0]))
        return grad_y * wa, grad_y * (1.0 - wa)


def test_elemental_unary_matches_torch():
    x = (RNG.standard_normal((5, 7)) * 3).astype(np.float32)
    check_op(lambda x: x.elemental_unary(Softsign, 1.5),
             lambda x: 1.5 * x / (1 + x.abs()),
             [Arg(("r", "c"), x)], kernels=1)


def test_elemental_binary_matches_torch():
    a = (RNG.standard_normal((4, 6)) * 4).astype(np.float32)
    b = (RNG.standard_normal((4, 6)) * 4).astype(np.float32)
    check_op(lambda a, b: a.elemental_binary(b, LogAddExp, (0.5,)),
             lambda a, b: torch.logaddexp(a, b) - 0.5,
             [Arg(("r", "c"), a), Arg(("r", "c"), b)], kernels=1, rtol=1e-5, atol=1e-5)


def test_elemental_binary_broadcast_gradients_match_torch():
    a = (RNG.standard_normal((4, 6)) * 2).astype(np.float32)
    b = (RNG.standard_normal(6) * 2).astype(np.float32)
    check_op(lambda a, b: a.elemental_binary(b, LogAddExp, (0.0,)),
             lambda a, b: torch.logaddexp(a, b[None, :]),
             [Arg(("r", "c"), a), Arg(("c",), b)], kernels=1, rtol=1e-5, atol=1e-5)


def test_elemental_on_a_strided_view_matches_torch():
    x = (RNG.standard_normal((6, 5)) * 2).astype(np.float32)
    check_op(lambda x: x.permute_to(("c", "r")).elemental_unary(Softsign, 1.0),
             lambda x: (x / (1 + x.abs())).T,
             [Arg(("r", "c"), x)], kernels=1)
