"""``python -m fucina.embed`` via subprocess on the synthetic BERT model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bert_synth import reference, write_model

import fucina.models.bert as bert

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fucina.embed", *args], input=stdin,
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("embed_model")
    return d, write_model(d, seed=7)


def test_embeds_a_file_and_stdin(model_dir, tmp_path: Path) -> None:
    d, w = model_dir
    src = tmp_path / "lines.txt"
    src.write_text("the cat sat on the mat.\n\nhello world!\n  a big red dog  \n")
    out = tmp_path / "e.npy"
    r = _run(str(src), "-o", str(out), "-m", str(d), "-b", "2")
    assert r.returncode == 0, r.stderr
    assert "3/3 lines" in r.stderr and "sentences/s" in r.stderr and r.stdout == ""
    got = np.load(out)
    lines = ["the cat sat on the mat.", "hello world!", "a big red dog"]
    ids = bert.load(d).tokenize(lines)
    assert got.dtype == np.float32 and got.shape == (3, 16)
    np.testing.assert_allclose(got, np.stack([reference(w, i) for i in ids]), atol=1e-5)
    out2 = tmp_path / "s.npy"
    r = _run("-o", str(out2), "-m", str(d), "-q", stdin="hello world!\n")
    assert r.returncode == 0 and r.stderr == ""
    np.testing.assert_allclose(np.load(out2), got[1:2], atol=1e-6)


def test_help_and_errors(model_dir, tmp_path: Path) -> None:
    r = _run("--help")
    assert r.returncode == 0 and "one sentence per line" in r.stdout and "--model" in r.stdout
    missing = tmp_path / "no_such_model"
    r = _run("-o", str(tmp_path / "x.npy"), "-m", str(missing), stdin="hello\n")
    assert r.returncode == 2 and str(missing) in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad_model"
    write_model(bad)
    (bad / "config.json").write_text("[1, 2")
    r = _run("-o", str(tmp_path / "x.npy"), "-m", str(bad), stdin="hello\n")
    assert r.returncode == 2 and "config.json" in r.stderr and "Traceback" not in r.stderr
    r = _run(str(tmp_path / "absent.txt"), "-o", str(tmp_path / "x.npy"), "-m",
             str(model_dir[0]))
    assert r.returncode == 2 and "absent.txt" in r.stderr
    assert not (tmp_path / "x.npy").exists()
