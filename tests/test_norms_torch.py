"""The normalization family against PyTorch: forward, gradients of every operand, eager
and compiled (one row kernel per norm)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
from multi_oracle import Arg, check_op  # noqa: E402

RNG = np.random.default_rng(11)
X = (RNG.standard_normal((6, 16)) * 2 + 0.5).astype(np.float32)
W = RNG.standard_normal(16).astype(np.float32)
B = RNG.standard_normal(16).astype(np.float32)
R = RNG.standard_normal((6, 16)).astype(np.float32)


def test_rms_norm():
    check_op(lambda x: x.rms_norm("d", 1e-6),
             lambda x: TF.rms_norm(x, (16,), eps=1e-6),
             [Arg(("t", "d"), X)], kernels=1)


def test_rms_norm_over_a_leading_axis():
    # normalizing over the outer tag: the statistic runs down columns
    check_op(lambda x: x.rms_norm("t", 1e-5),
             lambda x: TF.rms_norm(x.T, (6,), eps=1e-5).T,
             [Arg(("t", "d"), X)], kernels=1)


def test_rms_norm_mul():
    check_op(lambda x, w: x.rms_norm_mul("d", w, 1e-6),
             lambda x, w: TF.rms_norm(x, (16,), w, eps=1e-6),
             [Arg(("t", "d"), X), Arg(("d",), W)], kernels=1)


def test_rms_norm_mul_add():
    check_op(lambda x, w, r: x.rms_norm_mul_add("d", w, r, 1e-6),
             lambda x, w, r: TF.rms_norm(x, (16,), w, eps=1e-6) + r,
             [Arg(("t", "d"), X), Arg(("d",), W), Arg(("t", "d"), R)], kernels=1)


def test_rms_norm_mul_add_residual_in_other_tag_order():
    check_op(lambda x, w, r: x.rms_norm_mul_add("d", w, r, 1e-6),
             lambda x, w, r: TF.rms_norm(x, (16,), w, eps=1e-6) + r.T,
             [Arg(("t", "d"), X), Arg(("d",), W), Arg(("d", "t"), R.T.copy())])


def test_layer_norm_plain():
    check_op(lambda x: x.layer_norm("d", 1e-5),
             lambda x: TF.layer_norm(x, (16,), eps=1e-5),
             [Arg(("t", "d"), X)], kernels=1, rtol=2e-5, atol=2e-5)


def test_layer_norm_affine():
    check_op(lambda x, w, b: x.layer_norm("d", 1e-5, weight=w, bias=b),
             lambda x, w, b: TF.layer_norm(x, (16,), w, b, eps=1e-5),
             [Arg(("t", "d"), X), Arg(("d",), W), Arg(("d",), B)], kernels=1, rtol=2e-5,
             atol=2e-5)


def test_layer_norm_affine_numeric_tag_params():
    check_op(lambda x, w, b: x.layer_norm("d", 1e-5, weight=w, bias=b),
             lambda x, w, b: TF.layer_norm(x, (16,), w, b, eps=1e-5),
             [Arg(("t", "d"), X), Arg(("_0",), W), Arg(("_0",), B)], rtol=2e-5, atol=2e-5)


def test_layer_norm_of_large_offset_rows_is_accurate():
    # two-pass statistics: a 1e4 offset does not swamp a unit-scale spread
    x = (RNG.standard_normal((4, 32)) + 1e4).astype(np.float32)
    check_op(lambda x: x.layer_norm("d", 1e-5),
             lambda x: TF.layer_norm(x.double(), (32,), eps=1e-5).float(),
             [Arg(("t", "d"), x, grad=False)], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("channel_last", [True, False])
def test_group_norm(channel_last):
    def torch_gn(x, w, b):
        xc = x if not channel_last else x.T  # [C, T]
        y = TF.group_norm(xc[None], 4, w, b, 1e-5)[0]
        return y.T if channel_last else y

    tags = ("t", "c") if channel_last else ("c", "t")
    x = X if channel_last else X.T.copy()
    check_op(lambda x, w, b: x.group_norm("c", 4, 1e-5, w, b), torch_gn,
             [Arg(tags, x), Arg(("c",), W), Arg(("c",), B)], kernels=1, rtol=2e-5,
             atol=2e-5)


def test_group_norm_weight_only_and_plain():
    check_op(lambda x, w: x.group_norm("c", 2, 1e-5, w),
             lambda x, w: TF.group_norm(x.T[None], 2, w, None, 1e-5)[0].T,
             [Arg(("t", "c"), X), Arg(("c",), W)], rtol=2e-5, atol=2e-5)
    check_op(lambda x: x.group_norm("c", 16, 1e-5),
             lambda x: TF.group_norm(x.T[None], 16, None, None, 1e-5)[0].T,
             [Arg(("t", "c"), X)], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("eps_mode", ["outside_sqrt", "inside_sqrt"])
@pytest.mark.parametrize("accumulation", ["f32", "f64"])
def test_standardize_axis(ddof, eps_mode, accumulation):
    eps = 1e-3

    def torch_std(x):
        d = x - x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, correction=ddof)
        den = var.sqrt() + eps if eps_mode == "outside_sqrt" else (var + eps).sqrt()
        return d / den

    check_op(lambda x: x.standardize_axis("d", ddof=ddof, eps=eps, eps_mode=eps_mode,
                                          accumulation=accumulation),
             torch_std, [Arg(("t", "d"), X)], kernels=1, rtol=2e-5, atol=2e-5)


def test_standardize_axis_valid_len():
    n = 10

    def torch_std(x):
        head = x[:, :n]
        y = (head - head.mean(-1, keepdim=True)) / (head.std(-1, keepdim=True) + 1e-4)
        return torch.cat([y, torch.zeros_like(x[:, n:])], dim=1)

    check_op(lambda x: x.standardize_axis("d", ddof=1, eps=1e-4, valid_len=n), torch_std,
             [Arg(("t", "d"), X)], kernels=1, rtol=2e-5, atol=2e-5)


def test_l2_normalize():
    check_op(lambda x: x.l2_normalize("d", 1e-6),
             lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6),
             [Arg(("t", "d"), X)], kernels=1)
