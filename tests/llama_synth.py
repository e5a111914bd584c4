"""A tiny random Llama GGUF (block-quantized weights, a byte-level BPE vocabulary with a few
merges), written through ``fucina.gguf.write``; shared by the Llama model, CLI and bench
tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import fucina
import fucina.gguf as gg

CONFIG = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ff": 96, "context": 256,
          "rope_base": 10000.0, "eps": 1e-5}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# rank order; "1 2" exists so that digit splitting (smollm) is observable
MERGES = ["h e", "t he", "Ġ c", "a t", "Ġc at", "Ġ t", "Ġt he", "1 2", "Ġ s", "a y"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocab() -> list[str]:
    """Specials, the 256 byte characters, then one token per merge."""
    return SPECIALS + byte_chars() + [m.replace(" ", "") for m in MERGES]


def token_id(tok: str) -> int:
    return vocab().index(tok)


def write_model(path: Path, seed: int = 0, tied: bool = False, pre: str = "smollm",
                formats: tuple[str, str] = ("q4_1", "q8_0"),
                extra_meta: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Write the GGUF at ``path``; returns every weight as the f32 values the file holds
    (block formats decoded), by GGUF name. Attention/MLP weights alternate between the two
    ``formats``; the token embedding is q8_0; the output head is separate (q8_0) unless
    ``tied``."""
    c = CONFIG
    rng = np.random.default_rng(seed)
    ctx = fucina.ExecContext()
    toks = vocab()
    h, ff, hd = c["hidden"], c["ff"], c["hidden"] // c["heads"]
    kd = c["kv_heads"] * hd

    def r(*shape: int, s: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    tensors: dict[str, Any] = {}
    values: dict[str, np.ndarray] = {}

    def put(name: str, a: np.ndarray, fmt: str) -> None:
        if fmt == "f32":
            tensors[name] = a
            values[name] = a
            return
        blocks = gg.encode_f32(fmt, a)
        tensors[name] = fucina.Tensor("out", "in", dtype=fmt).from_blocks(ctx, a.shape, blocks)
        values[name] = gg.decode_f32(fmt, blocks).reshape(a.shape)

    put("token_embd.weight", r(len(toks), h, s=0.5), "q8_0")
    if not tied:
        put("output.weight", r(len(toks), h), "q8_0")
    put("output_norm.weight", 1 + r(h, s=0.1), "f32")
    for i in range(c["layers"]):
        b = f"blk.{i}."
        fa, fb = formats if i % 2 == 0 else formats[::-1]
        put(b + "attn_norm.weight", 1 + r(h, s=0.1), "f32")
        put(b + "attn_q.weight", r(h, h), fa)
        put(b + "attn_k.weight", r(kd, h), fb)
        put(b + "attn_v.weight", r(kd, h), fa)
        put(b + "attn_output.weight", r(h, h), fb)
        put(b + "ffn_norm.weight", 1 + r(h, s=0.1), "f32")
        put(b + "ffn_gate.weight", r(ff, h), fa)
        put(b + "ffn_up.weight", r(ff, h), fb)
        put(b + "ffn_down.weight", r(h, ff), fa)
    types = [3] * len(SPECIALS) + [1] * (len(toks) - len(SPECIALS))
    meta: dict[str, Any] = {
        "general.architecture": "llama", "general.name": "synthetic",
        "llama.block_count": c["layers"], "llama.embedding_length": h,
        "llama.feed_forward_length": ff, "llama.attention.head_count": c["heads"],
        "llama.attention.head_count_kv": c["kv_heads"], "llama.context_length": c["context"],
        "llama.rope.freq_base": c["rope_base"], "llama.rope.dimension_count": hd,
        "llama.attention.layer_norm_rms_epsilon": c["eps"],
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    meta.update(extra_meta or {})
    gg.write(path, meta, tensors)
    return values
