"""Gated activations, snake and prelu against PyTorch: forward, gradients of every operand,
eager and compiled."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
from multi_oracle import Arg, check_op  # noqa: E402

RNG = np.random.default_rng(5)
UP = (RNG.standard_normal((4, 10)) * 3).astype(np.float32)
GATE = (RNG.standard_normal((4, 10)) * 3).astype(np.float32)
ROW = (RNG.standard_normal(10) * 3).astype(np.float32)

TORCH_GATES = {
    "glu": lambda u, g: u * torch.sigmoid(g),
    "swiglu": lambda u, g: u * TF.silu(g),
    "geglu": lambda u, g: u * TF.gelu(g, approximate="tanh"),
    "situ": lambda u, g: 25 * torch.tanh(u / 25) * 4 * torch.tanh(g / 4) * torch.sigmoid(g),
}


@pytest.mark.parametrize("op", sorted(TORCH_GATES))
def test_gated_matches_torch(op):
    # situ transforms both operands: two independent chains, which the fuser (no
    # horizontal fusion) keeps as two kernels
    check_op(lambda u, g: u.gated(g, op), TORCH_GATES[op],
             [Arg(("t", "d"), UP), Arg(("t", "d"), GATE)], rtol=2e-5, atol=2e-5,
             kernels=2 if op == "situ" else 1)


@pytest.mark.parametrize("op", sorted(TORCH_GATES))
def test_gated_aliases_broadcast_the_gate_by_tag(op):
    # the gate lacks "t": broadcast over it, and its gradient sums over t
    check_op(lambda u, g: getattr(u, op)(g), lambda u, g: TORCH_GATES[op](u, g[None, :]),
             [Arg(("t", "d"), UP), Arg(("d",), ROW)], rtol=2e-5, atol=2e-5,
             kernels=2 if op == "situ" else 1)


def test_gated_result_tags_are_the_union():
    # up [d], gate [t, d] -> result tags (d, t): self's tags then the gate's new ones
    check_op(lambda u, g: u.swiglu(g), lambda u, g: (u[None, :] * TF.silu(g)).T,
             [Arg(("d",), ROW), Arg(("t", "d"), GATE)], rtol=2e-5, atol=2e-5)


def test_split_gated_swiglu_gates_with_the_first_half():
    check_op(lambda x: x.split_gated("swiglu", "f", "d"),
             lambda x: TF.silu(x[:, :5]) * x[:, 5:],
             [Arg(("t", "f"), UP)], kernels=1, rtol=2e-5, atol=2e-5)


def test_split_gated_glu_gates_with_the_second_half():
    check_op(lambda x: x.split_gated("glu", "f", "f"),
             lambda x: TF.glu(x, dim=1),
             [Arg(("t", "f"), UP)], kernels=1, rtol=2e-5, atol=2e-5)


def test_split_gated_over_a_leading_axis():
    check_op(lambda x: x.split_gated("glu", "f", "h"),
             lambda x: TF.glu(x, dim=0),
             [Arg(("f", "t"), UP)], rtol=2e-5, atol=2e-5)


def test_snake():
    alpha = np.abs(RNG.standard_normal(10)).astype(np.float32) + 0.2
    inv_b = (1.0 / (alpha + 1e-9)).astype(np.float32)
    check_op(lambda x, a, b: x.snake("c", a, b),
             lambda x, a, b: x + b * torch.sin(a * x) ** 2,
             [Arg(("t", "c"), UP), Arg(("c",), alpha), Arg(("c",), inv_b)], kernels=1,
             rtol=2e-5, atol=2e-5)


def test_prelu():
    alpha = RNG.uniform(0.05, 0.5, 10).astype(np.float32)
    x = UP.copy()
    x[0, :3] = 0.0  # the kink: slope alpha there, as torch
    check_op(lambda x, a: x.prelu(a), lambda x, a: TF.prelu(x, a),
             [Arg(("t", "c"), x), Arg(("c",), alpha)])


def test_prelu_rank3_channel_last_numeric_alpha():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    alpha = RNG.uniform(0.05, 0.5, 4).astype(np.float32)
    check_op(lambda x, a: x.prelu(a),
             lambda x, a: TF.prelu(x.permute(0, 2, 1), a).permute(0, 2, 1),
             [Arg(("h", "w", "c"), x), Arg(("_0",), alpha)])
