"""The training-step benchmark rows run and report (timing is never asserted)."""

from __future__ import annotations

from fucina import bench


def test_training_rows_run_and_report():
    cases = bench.run_training_suite(quick=True, torch_compile=False)
    assert [c.name.split(",")[0] for c in cases] == ["spirals step", "MLP 784-256-256-10 relu",
                                                     "MLP 784-512-10 relu"]
    for c in cases:
        assert c.eager > 0 and c.compiled > 0
        assert c.notes["kernels"] >= 3  # forward and backward fused into a few kernels
        assert bench.torch is None or c.torch > 0
    text = bench.table(cases)
    assert len(text.splitlines()) == len(cases) + 2 and "spirals step" in text
