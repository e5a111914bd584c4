"""The fused packed entries of REFERENCE §4.9: rms_norm_mul_dot_packed,
split_swi_glu_dot_packed, geglu_quant_dot_packed.

Oracles: the unfused ops followed by ``dot_packed`` (equal), and numpy in f64 on
the weight dequantized by gguf-py (the quantized GEMM rounds its activations to
int8 per 32, so that comparison allows 2% of the largest value); compiled
against eager; the reference's errors.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import fucina as F
import fucina.gguf as G
from fucina.errors import (
    GradientPackedMatmulUnsupported,
    GradientQuantizedMatmulUnsupported,
    ShapeMismatch,
    TagError,
)

RNG = np.random.default_rng(11)
N, K = 16, 64
W_F32 = RNG.standard_normal((N, K)).astype(np.float32)


def _pack(ctx, fmt: str, k: int = K):
    w32 = W_F32 if k == K else RNG.standard_normal((N, k)).astype(np.float32)
    blocks = G.encode_f32(fmt, w32)
    w = F.Tensor("out", "in", dtype=fmt).from_blocks(ctx, (N, k), blocks)
    qt = getattr(gguf.GGMLQuantizationType, fmt.upper())
    wd = gguf.quants.dequantize(blocks.view(np.uint8).reshape(N, -1), qt).astype(np.float64)
    return w.pack_rhs(), wd


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, atol=2e-2 * np.abs(want).max())


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "q5_k", "q6_k"])
def test_rms_norm_mul_dot_packed(ctx, fmt):
    k = K if fmt == "q8_0" else 256  # k-quants have 256-element blocks
    pack, wd = _pack(ctx, fmt, k)
    xv = RNG.standard_normal((3, k)).astype(np.float32)
    gv = RNG.uniform(0.5, 1.5, k).astype(np.float32)
    x = F.Tensor("s", "in").from_slice(ctx, (3, k), xv)
    g = F.Tensor("in").from_slice(ctx, (k,), gv)
    y = x.rms_norm_mul_dot_packed(g, 1e-5, pack, "in", "out")
    assert y.axis_tags == ("s", "out") and y.dtype is F.f32
    unfused = x.rms_norm_mul("in", g, 1e-5).dot_packed(pack, "in", "out")
    np.testing.assert_array_equal(y.numpy(), unfused.numpy())
    x64 = xv.astype(np.float64)
    normed = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) * gv
    _close(y.numpy(), normed @ wd.T)
    fast = F.compile(lambda x, g: x.rms_norm_mul_dot_packed(g, 1e-5, pack, "in", "out"))
    np.testing.assert_allclose(fast(x, g).numpy(), y.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["q8_0", "q6_k"])
def test_split_swi_glu_dot_packed(ctx, fmt):
    k = K if fmt == "q8_0" else 256
    pack, wd = _pack(ctx, fmt, k)
    hv = RNG.standard_normal((2, 2 * k)).astype(np.float32)
    h = F.Tensor("s", "ff").from_slice(ctx, (2, 2 * k), hv)
    y = h.split_swi_glu_dot_packed(pack, "ff", "out")
    assert y.axis_tags == ("s", "out")
    unfused = h.split_gated("swiglu", "ff", "ff").dot_packed(pack, "ff", "out")
    np.testing.assert_array_equal(y.numpy(), unfused.numpy())
    a, b = hv[:, :k].astype(np.float64), hv[:, k:].astype(np.float64)
    _close(y.numpy(), (a / (1 + np.exp(-a)) * b) @ wd.T)
    fast = F.compile(lambda h: h.split_swi_glu_dot_packed(pack, "ff", "out"))
    np.testing.assert_allclose(fast(h).numpy(), y.numpy(), rtol=1e-4, atol=1e-4)


def test_geglu_quant_dot_packed(ctx):
    pack, wd = _pack(ctx, "q8_0")
    gv = RNG.standard_normal((4, K)).astype(np.float32) * 3
    uv = RNG.standard_normal((4, K)).astype(np.float32)
    gate = F.Tensor("s", "in").from_slice(ctx, (4, K), gv)
    up = F.Tensor("s", "in").from_slice(ctx, (4, K), uv)
    y = gate.geglu_quant_dot_packed(up, pack, "in", "out")
    assert y.axis_tags == ("s", "out")
    unfused = up.mul(gate.unary("gelu_quant")).dot_packed(pack, "in", "out")
    np.testing.assert_array_equal(y.numpy(), unfused.numpy())
    _close(y.numpy(), (uv * _gelu_tanh(gv.astype(np.float64))) @ wd.T)
    fast = F.compile(lambda g, u: g.geglu_quant_dot_packed(u, pack, "in", "out"))
    np.testing.assert_allclose(fast(gate, up).numpy(), y.numpy(), rtol=1e-4, atol=1e-4)


def test_fused_packed_errors(ctx):
    pack, _ = _pack(ctx, "q8_0")
    q4, _ = _pack(ctx, "q4_0")
    dense = F.Tensor("out", "in").from_slice(ctx, (N, K), W_F32).pack_rhs()
    x = F.Tensor("s", "in").from_slice(ctx, (2, K), np.ones((2, K)))
    g = F.Tensor("in").from_slice(ctx, (K,), np.ones(K))
    xv = F.Tensor("s", "in").variable_from_slice(ctx, (2, K), np.ones((2, K)))
    gv = F.Tensor("in").variable_from_slice(ctx, (K,), np.ones(K))
    # the pack's kind: the reference's compile errors
    for bad in (dense, q4):
        with pytest.raises(TagError, match="q8_0/q4_k/q5_k/q6_k"):
            x.rms_norm_mul_dot_packed(g, 1e-5, bad, "in", "out")
        with pytest.raises(TagError, match="rms_norm_mul_dot_packed|split_swi_glu"):
            x.split_swi_glu_dot_packed(bad, "in", "out")
    k_pack, _ = _pack(ctx, "q4_k", 256)
    with pytest.raises(TagError, match="q8_0 weights only"):
        x.geglu_quant_dot_packed(x, k_pack, "in", "out")
    with pytest.raises(TypeError, match="PackedRhs"):
        x.rms_norm_mul_dot_packed(g, 1e-5, W_F32, "in", "out")
    # operands requiring grad
    with pytest.raises(GradientQuantizedMatmulUnsupported):
        xv.rms_norm_mul_dot_packed(g, 1e-5, pack, "in", "out")
    with pytest.raises(GradientQuantizedMatmulUnsupported):
        x.rms_norm_mul_dot_packed(gv, 1e-5, pack, "in", "out")
    with pytest.raises(GradientQuantizedMatmulUnsupported):
        xv.split_swi_glu_dot_packed(pack, "in", "out")
    with pytest.raises(GradientQuantizedMatmulUnsupported):
        x.geglu_quant_dot_packed(xv, pack, "in", "out")
    # tags and sizes
    with pytest.raises(TagError, match=r"\[free, 'in'\]"):
        x.permute_to(("in", "s")).rms_norm_mul_dot_packed(g, 1e-5, pack, "in", "out")
    with pytest.raises(ShapeMismatch):  # the halved axis (32) against the pack's k (64)
        x.split_swi_glu_dot_packed(pack, "in", "out")
    with pytest.raises(ShapeMismatch, match="up has sizes"):
        x.geglu_quant_dot_packed(F.Tensor("s", "in").zeros(ctx, (3, K)), pack, "in", "out")
    with pytest.raises(TagError, match="up must be"):
        x.geglu_quant_dot_packed(F.Tensor("s", "k").zeros(ctx, (2, K)), pack, "in", "out")
    fast = F.compile(lambda x: x.split_swi_glu_dot_packed(dense, "in", "out"))
    with pytest.raises(TagError, match="split_swi_glu_dot_packed"):
        fast(x)


def test_inference_only_refusals_hold_under_a_no_grad_compile(ctx):
    # traced under no_grad, a variable argument still requires grad (as in eager)
    pack, _ = _pack(ctx, "q8_0")
    dense = F.Tensor("out", "in").from_slice(ctx, (N, K), W_F32).pack_rhs()
    xv = F.Tensor("s", "in").variable_from_slice(ctx, (2, 2 * K), np.ones((2, 2 * K)))
    xk = F.Tensor("s", "in").variable_from_slice(ctx, (2, K), np.ones((2, K)))

    def split(x):
        return x.split_swi_glu_dot_packed(pack, "in", "out")

    def plain(x):
        return x.dot_packed(dense, "in", "out")

    for fn, x, err in ((split, xv, GradientQuantizedMatmulUnsupported),
                       (plain, xk, GradientPackedMatmulUnsupported)):
        for call in (fn, F.compile(fn)):
            with F.no_grad(), pytest.raises(err):
                call(x)
