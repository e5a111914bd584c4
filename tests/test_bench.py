"""The benchmark harness (the README's main job) runs and reports structure.

Timing is never asserted; this checks that every case runs, that the
compiled programs have the kernel counts the suite reports, and that the
JSON output is well formed.
"""

from __future__ import annotations

import json

from fucina import bench


def test_quick_suite_runs_and_reports(capsys):
    cases = bench.run_suite(quick=True, cold_warm=False)
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert any(n.startswith("conv2d 3x3") for n in names)
    by_name = {c.name.split(" [")[0].split(" ")[0]: c for c in cases}
    assert by_name["sigmoid(tanh(x*w+1)*x)"].notes["kernels"] == 1
    assert by_name["5-op"].notes["kernels"] == 1
    assert by_name["row"].notes["kernels"] == 1
    assert by_name["linear+bias+gelu"].notes["kernels"] == 1
    assert "copied=none" in by_name["dot"].notes["gemm"]
    quant = [c for c in cases if c.name.startswith(("GEMV", "GEMM"))]
    assert [c.name.split()[-1] for c in quant] == ["q8_0", "q4_1", "q4_k", "q4_k"]
    for c in quant:  # the quantized weight moves fewer bytes than its f32 form
        assert c.notes["weight_MB"] < c.notes["f32_MB"] / 3
        assert c.notes["max_rel_err"] < 2e-2  # GEMV rounds the activation to int8
    assert by_name["layer_norm"].notes["kernels"] == 1
    assert by_name["rms_norm"].notes["kernels"] == 1
    for c in cases:
        assert c.eager is None or c.eager > 0
        assert "max_abs_err_vs_numpy" not in c.notes or c.notes["max_abs_err_vs_numpy"] < 1e-5
        assert "max_abs_err_vs_torch" not in c.notes or c.notes["max_abs_err_vs_torch"] < 1e-3
    text = bench.table(cases)
    assert "numpy/fast" in text and len(text.splitlines()) == len(cases) + 2
    assert bench.main(["--quick", "--no-cold-warm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["conditions"]["cpus"] >= 1 and len(out["cases"]) == len(cases)
