"""``python -m fucina.generate`` via subprocess on the synthetic Llama GGUF."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from llama_synth import write_model

import fucina.models.llama as llama

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fucina.generate", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("gen") / "synth.gguf"
    write_model(p, seed=5)
    return p


def test_greedy_and_seeded_sampling_print_the_models_tokens(synth: Path) -> None:
    m = llama.load(synth)
    t = m.tokenizer
    ids = t.encode("the cat")
    want = m.generate(ids, 8)
    r = _run(str(synth), "the cat", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    kept = want[:want.index(m.eos_id)] if m.eos_id in want else want
    assert r.stdout == t.decode(kept) + "\n"
    assert "tokens/s" in r.stderr and "prompt 2 tokens" in r.stderr
    sampled = m.generate(ids, 8, temperature=0.9, top_k=20, top_p=0.95, seed=4)
    kept = sampled[:sampled.index(m.eos_id)] if m.eos_id in sampled else sampled
    r = _run(str(synth), "the cat", "-n", "8", "-t", "0.9", "--top-k", "20", "--top-p",
             "0.95", "--seed", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout == t.decode(kept) + "\n"


def test_chat_applies_the_gguf_template(synth: Path) -> None:
    m = llama.load(synth)
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    want = m.generate(m.tokenizer.encode(text), 4)
    kept = want[:want.index(m.eos_id)] if m.eos_id in want else want
    r = _run(str(synth), "hi", "--chat", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout == m.tokenizer.decode(kept) + "\n"
    assert f"prompt {len(m.tokenizer.encode(text))} tokens" in r.stderr


def test_errors_exit_2_with_a_message(synth: Path, tmp_path: Path) -> None:
    r = _run(str(tmp_path / "nope.gguf"), "hi")
    assert r.returncode == 2 and "nope.gguf" in r.stderr and "does not exist" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but then nothing useful")
    r = _run(str(bad), "hi")
    assert r.returncode == 2 and "cannot load model file" in r.stderr
    r = _run(str(synth), "hi", "--top-p", "0")
    assert r.returncode == 2 and "--top-p" in r.stderr
    r = _run(str(synth), "hi", "-n", "400")
    assert r.returncode == 2 and "context length 256" in r.stderr
    r = _run(str(synth), "hi", "--system", "be brief")
    assert r.returncode == 2 and "--system needs --chat" in r.stderr
    r = _run(str(synth), "hi", "-t", "1e400")  # inf: the sampler's traceback, before
    assert r.returncode == 2 and "--temperature must be a finite number" in r.stderr
    r = _run("--help")
    assert r.returncode == 0 and "--temperature" in r.stdout and "--chat" in r.stdout
