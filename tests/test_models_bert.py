"""fucina.models.bert on a small random BERT written by the test (safetensors +
tokenizers), against a numpy reference forward: always runs, no torch needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bert_synth import reference, write_model

import fucina.models.bert as bert
import fucina.safetensors as S
from fucina.errors import ModelFileError, TensorNotFound

SENTENCES = ["the cat sat on the mat.", "hello world!", "a big red dog ran far, far, far",
             "cats", "dogs sat", "the dog", "hello, the big red cat sat on a mat. world!",
             "zebra unknown words"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("bert")
    return d, write_model(d)


@pytest.fixture(scope="module")
def model(model_dir: tuple[Path, dict]) -> bert.BertModel:
    return bert.load(model_dir[0])


def test_encode_matches_the_numpy_reference(model, model_dir) -> None:
    _, w = model_dir
    got = model.encode(SENTENCES, batch_size=3)
    assert got.dtype == np.float32 and got.shape == (len(SENTENCES), 16)
    ids = model.tokenize(SENTENCES)
    assert ids[1] == [2, 17, 18, 21, 3]  # [CLS] hello world ! [SEP]
    assert 1 in ids[7]  # unknown words map to [UNK]
    want = np.stack([reference(w, i) for i in ids])
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_results_do_not_depend_on_batching_or_order(model) -> None:
    one = model.encode(SENTENCES, batch_size=32)
    each = np.concatenate([model.encode([s]) for s in SENTENCES])
    np.testing.assert_allclose(one, each, atol=1e-6)
    rev = model.encode(SENTENCES[::-1], batch_size=2)
    np.testing.assert_allclose(rev[::-1], one, atol=1e-6)


def test_bucket_pads_at_most_an_eighth() -> None:
    assert [bert.bucket(n) for n in (1, 7, 8, 13, 16, 17, 28, 33, 100, 129)] == \
        [1, 7, 8, 13, 16, 18, 28, 36, 104, 144]
    for n in range(1, 5000):
        b = bert.bucket(n)
        assert n <= b and (b - n) * 8 <= b, n
    assert len({bert.bucket(n) for n in range(65, 129)}) == 8  # 8 buckets per octave


def test_new_batches_in_known_buckets_reuse_the_compiled_program(model_dir) -> None:
    m = bert.load(model_dir[0])
    lens = lambda ss: [len(r) for r in m.tokenize(ss)]  # noqa: E731
    first, same = ["the cat sat", "a dog"], ["the dog sat", "a cat"]
    assert lens(first) == lens(same)
    m.encode(first, batch_size=2)
    assert m._forward.cache_size() == 1
    # other sentences, same (tokens, batch, length) buckets: no retrace
    m.encode(same, batch_size=2)
    assert m._forward.cache_size() == 1
    # a longer batch goes to other buckets
    long = " ".join(["the cat"] * 10)
    assert m.bucket_length(len(m.tokenize([long])[0])) == 22
    m.encode([long, "a"], batch_size=2)
    assert m._forward.cache_size() == 2


def test_truncation_and_empty_input(model, model_dir) -> None:
    long = " ".join(["dog"] * 100)  # 102 tokens > 40 positions: truncated to 40
    ids = model.tokenize([long])[0]
    assert len(ids) == 40 and ids[0] == 2 and ids[-1] == 3
    np.testing.assert_allclose(model.encode([long])[0], reference(model_dir[1], ids), atol=1e-5)
    assert model.encode([]).shape == (0, 16)


def test_prefixed_weight_names_load(tmp_path: Path) -> None:
    w = write_model(tmp_path, seed=3, prefix="bert.")
    m = bert.load(tmp_path)
    ids = m.tokenize(["the red cat"])[0]
    np.testing.assert_allclose(m.encode(["the red cat"])[0], reference(w, ids), atol=1e-5)


def test_bad_arguments(model) -> None:
    with pytest.raises(TypeError, match="one str"):
        model.encode("the cat")
    with pytest.raises(TypeError, match=r"sentences\[1\]"):
        model.encode(["the cat", 3])
    with pytest.raises(ValueError, match="batch_size"):
        model.encode(["the cat"], batch_size=0)


def test_missing_and_malformed_model_dirs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        bert.load(tmp_path / "nowhere")
    d = tmp_path / "m"
    write_model(d)
    (d / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        bert.load(d)
    write_model(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="config.json"):
        bert.load(d)
    (d / "config.json").write_text(json.dumps({"hidden_size": 16}))
    with pytest.raises(ModelFileError, match="num_attention_heads"):
        bert.load(d)
    w = write_model(d)
    del w["encoder.layer.1.output.dense.bias"]
    S.save(d / "model.safetensors", w)
    with pytest.raises(TensorNotFound, match=r"encoder\.layer\.1\.output\.dense\.bias"):
        bert.load(d)
    w = write_model(d)
    w["encoder.layer.0.intermediate.dense.weight"] = np.zeros((5, 5), np.float32)
    S.save(d / "model.safetensors", w)
    with pytest.raises(ModelFileError, match=r"expected F32\[24, 16\]"):
        bert.load(d)
    (d / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(ModelFileError, match="tokenizer"):
        bert.load(d)
