"""A small random BERT directory (safetensors + tokenizer.json) and a numpy reference
forward, shared by the BERT model and ``fucina.embed`` tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

import fucina
import fucina.safetensors as S

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "big", "red", "ran", "far", "##s",
         "##ed", "hello", "world", ".", ",", "!"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + WORDS
CONFIG = {"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 2,
          "intermediate_size": 24, "max_position_embeddings": 40, "layer_norm_eps": 1e-12,
          "hidden_act": "gelu", "type_vocab_size": 2, "vocab_size": len(VOCAB),
          "model_type": "bert"}


def write_model(d: Path, seed: int = 0, prefix: str = "") -> dict[str, np.ndarray]:
    """Write config.json, model.safetensors and tokenizer.json into ``d``; returns the
    weights by (unprefixed) name."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, ff, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], len(VOCAB)

    def r(*shape: int, s: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": r(v, h),
         "embeddings.position_embeddings.weight": r(CONFIG["max_position_embeddings"], h),
         "embeddings.token_type_embeddings.weight": r(2, h),
         "embeddings.LayerNorm.weight": 1 + r(h, s=0.1), "embeddings.LayerNorm.bias": r(h)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            w[p + f"attention.self.{n}.weight"] = r(h, h)
            w[p + f"attention.self.{n}.bias"] = r(h)
        w[p + "attention.output.dense.weight"] = r(h, h)
        w[p + "attention.output.dense.bias"] = r(h)
        w[p + "attention.output.LayerNorm.weight"] = 1 + r(h, s=0.1)
        w[p + "attention.output.LayerNorm.bias"] = r(h)
        w[p + "intermediate.dense.weight"] = r(ff, h)
        w[p + "intermediate.dense.bias"] = r(ff)
        w[p + "output.dense.weight"] = r(h, ff)
        w[p + "output.dense.bias"] = r(h)
        w[p + "output.LayerNorm.weight"] = 1 + r(h, s=0.1)
        w[p + "output.LayerNorm.bias"] = r(h)
    S.save(d / "model.safetensors", {prefix + k: a for k, a in w.items()},
           metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(CONFIG))
    tok = Tokenizer(WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(d / "tokenizer.json"))
    return w


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    var = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(var + eps) * g + b


_erf = np.vectorize(math.erf)


def reference(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64 numpy forward of one unpadded sentence: the unit-norm mean embedding."""
    w = {k: a.astype(np.float64) for k, a in w.items()}
    nh, eps = CONFIG["num_attention_heads"], CONFIG["layer_norm_eps"]
    n = len(ids)
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][:n]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    hd = x.shape[1] // nh
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(t: np.ndarray, name: str, p: str = p) -> np.ndarray:
            return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q, k, v = (lin(x, f"attention.self.{s}").reshape(n, nh, hd).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = a.transpose(1, 0, 2).reshape(n, nh * hd)
        x = _ln(lin(a, "attention.output.dense") + x, w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"], eps)
        f = lin(x, "intermediate.dense")
        f = 0.5 * f * (1 + _erf(f / math.sqrt(2)))
        x = _ln(lin(f, "output.dense") + x, w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"], eps)
    e = x.mean(0)
    return e / np.linalg.norm(e)


__all__ = ["CONFIG", "VOCAB", "fucina", "reference", "write_model"]
