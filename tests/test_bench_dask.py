"""The Dask rows of ``python -m fucina.bench`` (fucina/bench_dask.py) on the small
synthetic BERT: the rows run and report; timing is never asserted."""

from __future__ import annotations

import sys

import numpy as np
from bert_synth import write_model

from fucina import bench
from fucina.bench_dask import dask_cases, sentences


def test_generated_sentences_are_deterministic() -> None:
    a = sentences(50)
    assert a == sentences(50) and a != sentences(50, seed=1)
    assert all(3 <= len(s.split()) <= 40 for s in a)


def test_dask_rows_run_and_agree(tmp_path) -> None:
    write_model(tmp_path, seed=2)
    rows = dask_cases(bench.Case, n=40, model_dir=tmp_path)
    assert [r.name for r in rows] == [
        "MiniLM embed 40 sentences, 1 process x 2 threads",
        "MiniLM embed 40 sentences, LocalCluster 1 worker x 1 thread",
        "MiniLM embed 40 sentences, LocalCluster 2 workers x 1 thread"]
    assert all(r.compiled > 0 and r.notes["sent_per_s"] > 0 for r in rows)
    two = rows[-1].notes
    assert two["max_abs_diff_1_vs_2_workers"] == 0.0  # same partitions: bit-identical
    assert two["max_abs_diff_vs_1_process"] < 1e-5
    assert np.isclose(two["overhead_vs_1_process"], rows[2].compiled / rows[0].compiled - 1)
    assert np.isclose(two["scaling_1_to_2_workers"], rows[1].compiled / rows[2].compiled)
    assert "overhead_vs_1_process" in bench.table(rows)


def test_without_dask_the_row_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import raises ImportError
    (row,) = dask_cases(bench.Case, n=10)
    assert row.compiled is None
    assert row.notes["note"].startswith("dask/distributed not installed")
