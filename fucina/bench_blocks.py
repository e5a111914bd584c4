"""Benchmark rows for transformer building blocks (issue 13, targets 4 and 6).

- the two batched GEMMs of attention, scores ``q . k`` over the head width and
  values ``p . v`` over the keys, on ``[8 batch, 8 heads, 256, 64]``: fucina eager
  and compiled against torch's batched matmul and ``np.einsum``;
- a post-LN transformer encoder block forward (batch 8 x 128 tokens, d 384,
  6 heads, FFN 1536, erf GELU): fucina compiled against torch's
  ``nn.TransformerEncoderLayer`` (eval, no grad) and, in the notes,
  ``torch.compile``; cold and warm first-call times in new processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import fucina as F

from .bench import Case, _new_process_cold_warm, best_time, side_by_side

try:
    import torch
except ImportError:  # torch is optional: its columns stay empty
    torch = None  # type: ignore[assignment]


def _gemm_cases(quick: bool) -> list[Case]:
    ctx = F.ExecContext()
    b, h, s, d = (2, 4, 128, 64) if quick else (8, 8, 256, 64)
    q = F.Tensor("b", "h", "q", "d").randn(ctx, (b, h, s, d), 21)
    k = F.Tensor("b", "h", "k", "d").randn(ctx, (b, h, s, d), 22)
    v = F.Tensor("b", "h", "k", "d").randn(ctx, (b, h, s, d), 23)
    p = F.Tensor("b", "h", "q", "k").randn(ctx, (b, h, s, s), 24)
    mt = 0.1 if quick else 0.5
    q0, k0, v0, p0 = (x.numpy() for x in (q, k, v, p))
    return [
        _gemm_case(f"attention scores GEMM [{b},{h},{s},{d}] q.k over d",
                   lambda x, y: x.dot(y, "d"), (q, k), "bhqd,bhkd->bhqk", (q0, k0),
                   lambda tx, ty: torch.matmul(tx, ty.transpose(-1, -2)), mt),
        _gemm_case(f"attention values GEMM [{b},{h},{s},{s}] p.v over k",
                   lambda x, y: x.dot(y, "k"), (p, v), "bhqk,bhkd->bhqd", (p0, v0),
                   lambda tx, ty: torch.matmul(tx, ty), mt)]


def _gemm_case(name: str, fn: Callable[..., Any], args: tuple[Any, ...], spec: str,
               np_args: tuple[np.ndarray, ...], torch_fn: Callable[..., Any],
               mt: float) -> Case:
    fast = F.compile(fn)
    c = Case(name)
    targs = tuple(torch.from_numpy(a) for a in np_args) if torch is not None else ()
    side_by_side(c, mt, eager=lambda: fn(*args), compiled=lambda: fast(*args),
                 numpy=lambda: np.einsum(spec, *np_args, optimize=True),
                 torch=(lambda: torch_fn(*targs)) if torch is not None else None)
    c.notes["gemm"] = fast.ir(*args).split("(gemm ")[1].split(")")[0]
    want = np.einsum(spec, *(a.astype(np.float64) for a in np_args), optimize=True)
    c.notes["max_rel_err"] = float(np.abs(fast(*args).numpy() - want).max()
                                   / np.abs(want).max())
    return c


#: Transformer block sizes: batch, tokens, width, heads, FFN width.
BLOCK = (8, 128, 384, 6, 1536)
_EPS = 1e-5


def block_weights(ctx: Any, d: int, ff: int, seed: int) -> dict[str, Any]:
    """Weights of one encoder block, torch's layouts ([out, in] linear weights)."""
    rng = np.random.default_rng(seed)

    def t(tags: tuple[str, ...], shape: tuple[int, ...], scale: float) -> Any:
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        return F.Tensor(*tags).from_slice(ctx, shape, a)

    w: dict[str, Any] = {}
    for name in ("q", "k", "v"):
        w[name] = t(("qd", "d"), (d, d), d ** -0.5)
        w[name + "_b"] = t(("qd",), (d,), 0.02)
    w["o"], w["o_b"] = t(("d", "qd"), (d, d), d ** -0.5), t(("d",), (d,), 0.02)
    w["up"], w["up_b"] = t(("ff", "d"), (ff, d), d ** -0.5), t(("ff",), (ff,), 0.02)
    w["down"], w["down_b"] = t(("d", "ff"), (d, ff), ff ** -0.5), t(("d",), (d,), 0.02)
    for name in ("ln1", "ln2"):
        w[name + "_w"] = t(("d",), (d,), 0.1).add_scalar(1.0)
        w[name + "_b"] = t(("d",), (d,), 0.02)
    return w


def block_forward(w: dict[str, Any], heads: int) -> Any:
    """x ("batch", "seq", "d") -> the post-LN encoder block's output, same tags."""
    d = w["q"].shape[1]
    hd = d // heads
    scale = 1.0 / math.sqrt(hd)

    def proj(x: Any, name: str, seq: str) -> Any:
        y = x.dot(w[name], "d").add(w[name + "_b"]).split("qd", ("head", "hd"), (heads, hd))
        return y.with_tags("batch", seq, "head", "hd")

    def forward(x: Any) -> Any:
        q, k, v = proj(x, "q", "seq"), proj(x, "k", "key"), proj(x, "v", "key")
        p = q.dot(k, "hd").softmax("key", scale=scale)
        a = (p.dot(v, "key").permute_to("batch", "seq", "head", "hd").contiguous()
             .merge("qd", ("head", "hd")))
        x = a.dot(w["o"], "qd").add(w["o_b"]).add(x).layer_norm(
            "d", _EPS, weight=w["ln1_w"], bias=w["ln1_b"])
        f = x.dot(w["up"], "d").add(w["up_b"]).gelu_erf()
        return f.dot(w["down"], "ff").add(w["down_b"]).add(x).layer_norm(
            "d", _EPS, weight=w["ln2_w"], bias=w["ln2_b"])

    return forward


def _torch_block(w: dict[str, Any], d: int, heads: int, ff: int) -> Any:
    layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                             layer_norm_eps=_EPS, batch_first=True)
    layer.eval()

    def t(name: str) -> Any:
        return torch.from_numpy(w[name].numpy().copy())

    with torch.no_grad():
        sa = layer.self_attn
        sa.in_proj_weight.copy_(torch.cat([t("q"), t("k"), t("v")]))
        sa.in_proj_bias.copy_(torch.cat([t("q_b"), t("k_b"), t("v_b")]))
        sa.out_proj.weight.copy_(t("o"))
        sa.out_proj.bias.copy_(t("o_b"))
        layer.linear1.weight.copy_(t("up"))
        layer.linear1.bias.copy_(t("up_b"))
        layer.linear2.weight.copy_(t("down"))
        layer.linear2.bias.copy_(t("down_b"))
        for i in (1, 2):
            getattr(layer, f"norm{i}").weight.copy_(t(f"ln{i}_w"))
            getattr(layer, f"norm{i}").bias.copy_(t(f"ln{i}_b"))
    return layer


_BLOCK_FIRST_CALL = """
import time
import fucina as F
from fucina.bench_blocks import BLOCK, block_forward, block_weights
b, s, d, heads, ff = BLOCK
ctx = F.ExecContext()
w = block_weights(ctx, d, ff, 31)
x = F.Tensor("batch", "seq", "d").randn(ctx, (b, s, d), 32)
t0 = time.perf_counter()
fast = F.compile(block_forward(w, heads))
fast(x).numpy()
print(time.perf_counter() - t0)
"""


def _block_case(quick: bool, cold_warm: bool, torch_compile: bool) -> Case:
    b, s, d, heads, ff = (2, 32, 128, 4, 512) if quick else BLOCK
    ctx = F.ExecContext()
    w = block_weights(ctx, d, ff, 31)
    x = F.Tensor("batch", "seq", "d").randn(ctx, (b, s, d), 32)
    forward = block_forward(w, heads)
    fast = F.compile(forward)
    c = Case(f"transformer block forward [{b}x{s}, d {d}, {heads} heads, ffn {ff}]")
    mt = 0.1 if quick else 0.5
    c.notes["kernels"] = len(fast.kernels(x))
    torch_forward = None
    if torch is not None:
        layer = _torch_block(w, d, heads, ff)
        tx = torch.from_numpy(x.numpy())

        def torch_forward() -> Any:
            with torch.no_grad():
                return layer(tx)

    side_by_side(c, mt, eager=lambda: forward(x), compiled=lambda: fast(x),
                 torch=torch_forward)
    if torch is not None:
        with torch.no_grad():
            want = layer(tx).numpy()
            if torch_compile:
                try:
                    t0 = time.perf_counter()
                    clayer = torch.compile(layer)
                    clayer(tx)
                    c.notes["torch.compile_first_call_s"] = time.perf_counter() - t0
                    c.notes["torch.compile"] = best_time(lambda: clayer(tx), mt)
                except Exception as e:  # torch.compile needs a working C++ toolchain
                    c.notes["torch.compile"] = f"unavailable ({type(e).__name__})"
        c.notes["max_abs_err_vs_torch"] = float(np.abs(fast(x).numpy() - want).max())
    if cold_warm:
        cold, warm = _new_process_cold_warm(_BLOCK_FIRST_CALL)
        c.notes["cold_s"] = cold
        c.notes["warm_s"] = warm
    return c


def block_cases(quick: bool = False, cold_warm: bool = True) -> list[Case]:
    """The attention GEMM rows and the transformer block row (cold/warm and
    torch.compile only in full runs)."""
    return [*_gemm_cases(quick), _block_case(quick, cold_warm and not quick, not quick)]
