"""f32 x block-quantized contractions: kernels, the qcontract primitive, its VJP,
compile == eager, packed RHS and the ternary straight-through estimator.

The oracle is numpy on the weight dequantized by gguf-py's decoder (the
kernels never build that f32 weight themselves).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import fucina
import fucina.gguf as G
from fucina.errors import (
    GradientPackedMatmulUnsupported,
    GradientQuantizedMatmulUnsupported,
    ShapeMismatch,
    TagError,
    TernaryContractDimNotBlockAligned,
)
from fucina.ir.execute import emit
from fucina.ir.graph import leaf
from fucina.kernels import qmatmul as Q
from fucina.runtime.raw import RawTensor

FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "tq2_0"]
RNG = np.random.default_rng(7)
N, K = 24, 512
W_F32 = RNG.standard_normal((N, K)).astype(np.float32)


def _gguf_dequant(blocks: np.ndarray, fmt: str) -> np.ndarray:
    qt = getattr(gguf.GGMLQuantizationType, fmt.upper())
    return gguf.quants.dequantize(blocks.view(np.uint8).reshape(blocks.shape[0], -1), qt)


def _weight(ctx: fucina.ExecContext, fmt: str) -> tuple[object, np.ndarray]:
    blocks = G.encode_f32(fmt, W_F32)
    w = fucina.Tensor("out", "in", dtype=fmt).from_blocks(ctx, (N, K), blocks)
    return w, _gguf_dequant(blocks, fmt).astype(np.float64)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 9])  # fused GEMV (1, 3) and decoded panels + BLAS (9)
def test_forward_and_input_gradient(ctx: fucina.ExecContext, fmt: str, m: int) -> None:
    w, wd = _weight(ctx, fmt)
    xv = RNG.standard_normal((m, K)).astype(np.float32)
    x = fucina.Tensor("seq", "in").variable_from_slice(ctx, (m, K), xv)
    y = x.dot(w, "in")
    assert y.axis_tags == ("seq", "out")
    exact = xv.astype(np.float64) @ wd.T
    if Q.uses_int8(fmt, m):
        # integer kernels: the activation rounds to int8 per 32 (ggml's scheme) and the
        # rest is exact; against the exact product the rounding costs < 2% of the max
        xq, dx, _ = Q.quantize_rows_q8(xv)
        xhat = (xq.reshape(m, -1, 32) * dx[:, :, None].astype(np.float64)).reshape(m, K)
        want = xhat @ wd.T
        np.testing.assert_allclose(y.numpy(), exact, atol=2e-2 * np.abs(exact).max())
    else:
        want = exact
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    gv = RNG.standard_normal((m, N)).astype(np.float32)
    y.backward_with_grad(fucina.Tensor("seq", "out").from_slice(ctx, (m, N), gv))
    gwant = gv.astype(np.float64) @ wd
    np.testing.assert_allclose(x.grad().numpy(), gwant, rtol=2e-5,
                               atol=2e-5 * np.abs(gwant).max())


def test_cold_format_uses_decoded_panels(ctx: fucina.ExecContext) -> None:
    # q2_k has no encoder: random codes with sane f16 scales are valid blocks
    blocks = np.frombuffer(RNG.integers(0, 256, N * (K // 256) * 84, dtype=np.uint8).tobytes(),
                           dtype=fucina.BlockQ2_K).reshape(N, K // 256).copy()
    blocks["d"] = np.float16(0.01).view(np.uint16)
    blocks["dmin"] = np.float16(0.002).view(np.uint16)
    w = fucina.Tensor("out", "in", dtype="q2_k").from_blocks(ctx, (N, K), blocks)
    xv = RNG.standard_normal((2, K)).astype(np.float32)
    y = fucina.Tensor("b", "in").from_slice(ctx, (2, K), xv).dot(w, "in")
    want = xv.astype(np.float64) @ _gguf_dequant(blocks, "q2_k").T
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_contract_axis_anywhere_and_leading_axes(ctx: fucina.ExecContext) -> None:
    w, wd = _weight(ctx, "q4_k")
    xv = RNG.standard_normal((K, 2, 3)).astype(np.float32)
    x = fucina.Tensor("in", "a", "b").from_slice(ctx, xv.shape, xv)
    y = x.dot(w, "in")
    assert y.axis_tags == ("a", "b", "out")
    want = np.einsum("kab,nk->abn", xv.astype(np.float64), wd)
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_reference_q8_0_example(ctx: fucina.ExecContext) -> None:
    wsrc = np.concatenate([np.ones(32), np.full(32, 2.0)]).astype(np.float32).reshape(2, 32)
    w = fucina.Tensor("out", "in", dtype="q8_0").from_blocks(ctx, (2, 32),
                                                             G.encode_f32("q8_0", wsrc))
    x = fucina.Tensor("batch", "in").from_slice(ctx, (1, 32), np.ones(32))
    np.testing.assert_allclose(x.dot(w, "in").numpy(), [[32, 64]], atol=1e-2)


def test_reference_tq2_0_example(ctx: fucina.ExecContext) -> None:
    wsrc = np.concatenate([np.full(256, 0.5), np.full(256, -0.5)]).astype(np.float32)
    w = fucina.Tensor("out", "in", dtype="tq2_0").from_blocks(
        ctx, (2, 256), G.encode_f32("tq2_0", wsrc.reshape(2, 256)))
    x = fucina.Tensor("batch", "in").from_slice(ctx, (1, 256), np.ones(256))
    np.testing.assert_allclose(x.dot(w, "in").numpy(), [[128, -128]], atol=1e-3)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q6_k"])
def test_compiled_equals_eager_forward_and_backward(ctx: fucina.ExecContext, fmt: str) -> None:
    w, _ = _weight(ctx, fmt)
    xv = RNG.standard_normal((5, K)).astype(np.float32)

    def loss(x: object) -> object:
        return (x.dot(w, "in").relu() * 0.5).sum_all()

    x1 = fucina.Tensor("s", "in").variable_from_slice(ctx, (5, K), xv)
    e = loss(x1)
    e.backward()
    fast = fucina.compile(lambda x: (loss(x), x.dot(w, "in")))
    x2 = fucina.Tensor("s", "in").variable_from_slice(ctx, (5, K), xv)
    c, y = fast(x2)
    np.testing.assert_array_equal(c.numpy(), e.numpy())
    np.testing.assert_array_equal(y.numpy(), x1.dot(w, "in").numpy())
    c.backward()
    np.testing.assert_array_equal(x2.grad().numpy(), x1.grad().numpy())
    plain = fucina.Tensor("s", "in").from_slice(ctx, (5, K), xv)
    assert "qcontract" in fucina.compile(lambda x: x.dot(w, "in")).ir(plain)


def test_gradient_inside_compile(ctx: fucina.ExecContext) -> None:
    w, wd = _weight(ctx, "q5_k")
    xv = RNG.standard_normal((2, K)).astype(np.float32)

    def step(x: object) -> object:
        y = x.dot(w, "in").sum_all()
        y.backward()
        return y

    x = fucina.Tensor("s", "in").variable_from_slice(ctx, (2, K), xv)
    fucina.compile(step)(x)
    want = np.ones((2, N)) @ wd
    np.testing.assert_allclose(x.grad().numpy(), want, rtol=2e-5, atol=1e-4)


def test_weight_gradient_raises(ctx: fucina.ExecContext) -> None:
    # Quantized tensors are never variables; below the facade a gradient asked of
    # the weight must still refuse rather than produce something.
    blocks = G.encode_f32("q8_0", W_F32)
    wn = leaf(RawTensor.from_array(fucina.q8_0, blocks, (N, K)), ("out", "in"), variable=True)
    xn = leaf(RawTensor.from_array(fucina.f32, np.ones((1, K), np.float32), (1, K)),
              ("s", "in"), variable=False)
    from fucina.ir.autodiff import backward

    y = emit("qcontract", (xn, wn), fmt=fucina.q8_0)
    seed = emit("fill", (), shape=y.shape, dtype=fucina.f32, value=1.0)
    with pytest.raises(GradientQuantizedMatmulUnsupported, match="q8_0 weight"):
        backward(y, seed)


def test_tag_and_size_errors(ctx: fucina.ExecContext) -> None:
    w, _ = _weight(ctx, "q8_0")
    x = fucina.Tensor("s", "in").from_slice(ctx, (1, K), np.ones(K))
    with pytest.raises(TagError, match="stored"):  # weight must be [free, contract]
        x.dot(w, "out")
    wt = fucina.Tensor("in", "out", dtype="q8_0").from_blocks(
        ctx, (N, K), G.encode_f32("q8_0", W_F32))
    with pytest.raises(TagError, match=r"\[free, 'in'\]"):
        x.dot(wt, "in")
    xb = fucina.Tensor("out", "in").from_slice(ctx, (N, K), np.ones((N, K)))
    with pytest.raises(TagError, match="shared batch"):
        xb.dot(w, "in")
    x64 = fucina.Tensor("s", "in").from_slice(ctx, (1, 64), np.ones(64))
    with pytest.raises(ShapeMismatch, match="'in'"):
        x64.dot(w, "in")
    xh = fucina.Tensor("s", "in", dtype="f16").from_slice(ctx, (1, K), np.ones(K))
    with pytest.raises(TagError, match="f32 left operand"):
        xh.dot(w, "in")
    act = fucina.Tensor("out", "in", dtype="q8_k").from_blocks(
        ctx, (2, 256), G.encode_f32("q8_k", np.ones((2, 256), np.float32)))
    with pytest.raises(TagError, match="activation format"):
        fucina.Tensor("s", "in").from_slice(ctx, (1, 256), np.ones(256)).dot(act, "in")


# -- packed RHS ------------------------------------------------------------------------


def test_packed_quantized_matches_dot(ctx: fucina.ExecContext) -> None:
    w, _ = _weight(ctx, "q8_0")
    packed = w.pack_rhs()
    assert packed.layout == "blocks" and (packed.n, packed.k) == (N, K)
    xv = RNG.standard_normal((3, K)).astype(np.float32)
    x = fucina.Tensor("batch", "in").from_slice(ctx, (3, K), xv)
    fast = x.dot_packed(packed, "in", "out")
    assert fast.axis_tags == ("batch", "out")
    np.testing.assert_array_equal(fast.numpy(), x.dot(w, "in").numpy())
    w.deinit()  # the pack is an independent snapshot
    np.testing.assert_array_equal(x.dot_packed(packed, "in", "out").numpy(), fast.numpy())
    xg = fucina.Tensor("batch", "in").variable_from_slice(ctx, (3, K), xv)
    with pytest.raises(GradientQuantizedMatmulUnsupported):
        xg.dot_packed(packed, "in", "out")


def test_dense_pack_reference_example(ctx: fucina.ExecContext) -> None:
    w = fucina.Tensor("out", "in").from_slice(ctx, (3, 4), [1, 0, 0, 0, 0, 1, 0, 0,
                                                             0, 0, 1, 1])
    packed = w.pack_rhs()
    x = fucina.Tensor("seq", "in").from_slice(ctx, (2, 4), [2, 3, 4, 5, 7, 11, 13, 17])
    np.testing.assert_array_equal(x.dot_packed(packed, "in", "out").numpy().reshape(-1),
                                  [2, 3, 9, 7, 11, 30])
    xg = fucina.Tensor("seq", "in").variable_from_slice(ctx, (2, 4), np.ones(8))
    with pytest.raises(GradientPackedMatmulUnsupported):
        xg.dot_packed(packed, "in", "out")
    with pytest.raises(TagError, match="layout"):
        w.pack_rhs_layout("blocks")
    fast = fucina.compile(lambda x: x.dot_packed(packed, "in", "out"))
    np.testing.assert_array_equal(fast(x).numpy().reshape(-1), [2, 3, 9, 7, 11, 30])


def test_dense_pack_has_the_bits_of_dot_on_either_route(
        ctx: fucina.ExecContext, monkeypatch: pytest.MonkeyPatch) -> None:
    from fucina.kernels import batched_gemm as bg

    wv = RNG.standard_normal((96, 160)).astype(np.float32)
    for routed in (False, True):  # BLAS, then the blocked kernel (forced on any host)
        # (a shape of its own each time: eager dot keeps the plan of a shape it has seen)
        xv = RNG.standard_normal((40 + 8 * routed, 160)).astype(np.float32)
        monkeypatch.setattr(bg, "LANES", 16)
        monkeypatch.setattr(bg, "BLAS_PINNED_NARROW", routed)
        monkeypatch.setattr(bg, "PLANE_MIN_WORK", 1)
        w = fucina.Tensor("out", "in").from_slice(ctx, wv.shape, wv)
        x = fucina.Tensor("seq", "in").from_slice(ctx, xv.shape, xv)
        got = x.dot_packed(w.pack_rhs(), "in", "out").numpy()
        np.testing.assert_array_equal(got, x.dot(w, "in").numpy())
        np.testing.assert_allclose(got, xv.astype(np.float64) @ wv.T, rtol=1e-5, atol=1e-4)


def test_half_weights_pack_widened(ctx: fucina.ExecContext) -> None:
    vals = RNG.standard_normal((4, 8)).astype(np.float32)
    wh = fucina.Tensor("out", "in", dtype="bf16").from_slice(ctx, (4, 8), vals)
    x = fucina.Tensor("s", "in").from_slice(ctx, (1, 8), np.ones(8))
    got = x.dot_packed(wh.pack_rhs(), "in", "out").numpy()
    np.testing.assert_allclose(got, wh.to("f32").numpy().sum(axis=1)[None], rtol=1e-6)


# -- ternary straight-through estimator --------------------------------------------------


def test_ternary_ste_reference_examples(ctx: fucina.ExecContext) -> None:
    ones = np.ones(256, np.float32)
    x = fucina.Tensor("t", "in").from_slice(ctx, (1, 256), ones)
    w = fucina.Tensor("out", "in").from_slice(ctx, (1, 256), ones)
    np.testing.assert_array_equal(x.dot_ternary_ste(w, "in").numpy(), [[256]])

    xv = (np.arange(256) % 5 * 0.1 - 0.2).astype(np.float32)
    wv = (np.arange(512) % 9 * 0.1 - 0.4).astype(np.float32).reshape(2, 256)
    x = fucina.Tensor("batch", "in").variable_from_slice(ctx, (1, 256), xv)
    w = fucina.Tensor("out", "in").variable_from_slice(ctx, (2, 256), wv)
    y = x.dot_ternary_ste(w, "in")
    d = np.float32(np.abs(wv.astype(np.float64)).mean())
    trits = np.clip(np.sign(wv) * np.floor(np.abs(wv / d) + 0.5), -1, 1)
    wq = trits * np.float32(np.float16(d))
    np.testing.assert_allclose(y.numpy(), xv[None] @ wq.T, rtol=1e-5, atol=1e-5)
    y.sum_all().backward()
    np.testing.assert_allclose(w.grad().numpy(), np.stack([xv, xv]), atol=1e-6)  # STE
    np.testing.assert_allclose(x.grad().numpy(), wq.sum(axis=0)[None], rtol=1e-5, atol=1e-6)


def test_ternary_ste_compiled_and_errors(ctx: fucina.ExecContext) -> None:
    xv = RNG.standard_normal((3, 512)).astype(np.float32)
    wv = RNG.standard_normal((4, 512)).astype(np.float32)

    def run(x: object, w: object) -> object:
        y = x.dot_ternary_ste(w, "in").sum_all()
        y.backward()
        return y

    xs = [fucina.Tensor("b", "in").variable_from_slice(ctx, (3, 512), xv) for _ in range(2)]
    ws = [fucina.Tensor("out", "in").variable_from_slice(ctx, (4, 512), wv) for _ in range(2)]
    e = run(xs[0], ws[0])
    c = fucina.compile(run)(xs[1], ws[1])
    np.testing.assert_array_equal(c.numpy(), e.numpy())
    np.testing.assert_array_equal(ws[1].grad().numpy(), ws[0].grad().numpy())
    np.testing.assert_array_equal(xs[1].grad().numpy(), xs[0].grad().numpy())
    x = fucina.Tensor("b", "in").from_slice(ctx, (1, 300), np.ones(300))
    w = fucina.Tensor("out", "in").from_slice(ctx, (2, 300), np.ones(600))
    with pytest.raises(TernaryContractDimNotBlockAligned, match="300"):
        x.dot_ternary_ste(w, "in")
    xt = fucina.Tensor("in", "b").from_slice(ctx, (256, 1), np.ones(256))
    w2 = fucina.Tensor("out", "in").from_slice(ctx, (2, 256), np.ones(512))
    with pytest.raises(TagError, match="stored"):
        xt.dot_ternary_ste(w2, "in")


def test_kernels_without_the_facade() -> None:
    # qmatmul/qmatmul_t agree with each other's adjoint: <x W^T, g> == <x, g W>
    blocks = G.encode_f32("q4_k", W_F32)
    x = RNG.standard_normal((6, K)).astype(np.float32)
    g = RNG.standard_normal((6, N)).astype(np.float32)
    lhs = float((Q.qmatmul(x, blocks, "q4_k").astype(np.float64) * g).sum())
    rhs = float((x.astype(np.float64) * Q.qmatmul_t(g, blocks, "q4_k", K)).sum())
    assert abs(lhs - rhs) <= 1e-4 * abs(lhs)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q4_k"])
def test_exact_f32_gemv_kernels(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the f32 kernels these formats fall back to without AVX2 (or when switched off)
    monkeypatch.setattr(Q, "INT8_ACTIVATIONS", False)
    blocks = G.encode_f32(fmt, W_F32)
    wd = _gguf_dequant(blocks, fmt).astype(np.float64)
    for m in (1, 3):
        assert not Q.uses_int8(fmt, m)
        x = RNG.standard_normal((m, K)).astype(np.float32)
        want = x.astype(np.float64) @ wd.T
        np.testing.assert_allclose(Q.qmatmul(x, blocks, fmt), want, rtol=2e-5,
                                   atol=2e-5 * np.abs(want).max())


@pytest.mark.skipif(not Q.AVX2, reason="the integer kernels need AVX2")
def test_int8_activation_quantizer() -> None:
    x = np.array([np.linspace(-1, 1, 32), np.zeros(32)], np.float32).reshape(1, 64)
    xq, dx, xsum = Q.quantize_rows_q8(x)
    assert dx[0, 0] == np.float32(1) / np.float32(127) and dx[0, 1] == 0
    assert xq[0] == -127 and xq[31] == 127 and (xq[32:] == 0).all()
    np.testing.assert_array_equal(xsum, [[int(xq[:32].astype(int).sum()), 0]])


def test_int8_activation_quantizer_matches_the_numpy_formula() -> None:
    """The Numba quantizer gives exactly the per-32 absmax codes of the numpy formula."""
    F = np.float32
    x = (RNG.standard_normal((3, 576)) * 7).astype(F)
    x[0, :32] = 0  # an all-zero block: scale 0, codes 0
    x[1, 32:64] = 0.5  # one value per block: codes +-127 exactly
    blocks = x.reshape(3, 18, 32)
    dx = np.abs(blocks).max(axis=2) / F(127)
    inv = np.divide(F(1), dx, out=np.zeros_like(dx), where=dx > 0)
    q = np.rint(blocks * inv[:, :, None]).astype(np.int8)
    xq, got_dx, xsum = Q.quantize_rows_q8(x)
    np.testing.assert_array_equal(xq, q.reshape(-1))
    np.testing.assert_array_equal(got_dx, dx)
    np.testing.assert_array_equal(xsum, q.sum(axis=2, dtype=np.int32))


@pytest.mark.parametrize("fmt", ["q4_k", "q8_0"])
def test_gemm_panels_cover_every_row(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several decoded panels and a short last one (24 rows in panels of 7: 7, 7, 7, 3):
    # every output column and every gradient row comes from the right weight rows.
    monkeypatch.setattr(Q, "PANEL_ROWS", 7)
    monkeypatch.setattr(Q, "PANEL_BYTES", 4 * K * 5)  # 5 rows of f32: below PANEL_ROWS
    assert Q._panel_rows(K, N) == 7
    blocks = G.encode_f32(fmt, W_F32)
    wd = _gguf_dequant(blocks, fmt).astype(np.float64)
    x = RNG.standard_normal((9, K)).astype(np.float32)  # above GEMV_ROWS_MAX: panels
    g = RNG.standard_normal((9, N)).astype(np.float32)
    np.testing.assert_allclose(Q.qmatmul(x, blocks, fmt), x.astype(np.float64) @ wd.T,
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(Q.qmatmul_t(g, blocks, fmt, K), g.astype(np.float64) @ wd,
                               rtol=1e-4, atol=1e-3)
    monkeypatch.setattr(Q, "PANEL_BYTES", 4 * K * 10)
    assert Q._panel_rows(K, N) == 10  # more rows while they fit in PANEL_BYTES
    monkeypatch.setattr(Q, "PANEL_ROWS", 384)
    assert Q._panel_rows(K, N) == N  # one panel when the weight has fewer rows


def test_gemm_panels_run_on_the_blocked_kernel_where_it_is_routed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the blocked f32 kernel serves a product (AVX-512 tiles, OpenBLAS pinned to
    # AVX2), the decoded panels go there too; both directions, several panels.
    from fucina.kernels import batched_gemm as bg

    monkeypatch.setattr(bg, "LANES", 16)
    monkeypatch.setattr(bg, "BLAS_PINNED_NARROW", True)
    monkeypatch.setattr(bg, "PLANE_MIN_WORK", 1)
    monkeypatch.setattr(Q, "PANEL_ROWS", 40)
    monkeypatch.setattr(Q, "PANEL_BYTES", 0)
    n, k, m = 112, 256, 48
    w = RNG.standard_normal((n, k)).astype(np.float32)
    blocks = G.encode_f32("q4_k", w)
    wd = _gguf_dequant(blocks, "q4_k").astype(np.float64)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    g = RNG.standard_normal((m, n)).astype(np.float32)
    planes = []
    plane = bg._plane

    def spy(*args):  # type: ignore[no-untyped-def]
        planes.append(args[3][2:5])  # (M, K, N) as oriented
        return plane(*args)

    monkeypatch.setattr(bg, "_plane", spy)
    np.testing.assert_allclose(Q.qmatmul(x, blocks, "q4_k"), x.astype(np.float64) @ wd.T,
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(Q.qmatmul_t(g, blocks, "q4_k", k), g.astype(np.float64) @ wd,
                               rtol=1e-4, atol=1e-3)
    if bg.THREAD_SAFE:  # a threading layer that is not thread-safe keeps BLAS
        assert len(planes) == 6  # panels of 40, 40 and 32 rows, forward and gradient
