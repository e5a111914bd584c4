"""The benchmark harness (the README's main job) runs and reports structure.

Timing is never asserted; this checks that every case runs, that the
compiled programs have the kernel counts the suite reports, and that the
JSON output is well formed.
"""

from __future__ import annotations

import json

import pytest

from fucina import bench


def test_quick_suite_runs_and_reports(capsys, tmp_path):
    cases = bench.run_suite(quick=True, cold_warm=False)
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert any(n.startswith("conv2d 3x3") for n in names)
    by_name = {c.name.split(" [")[0].split(" ")[0]: c for c in cases}
    assert by_name["sigmoid(tanh(x*w+1)*x)"].notes["kernels"] == 1
    assert by_name["5-op"].notes["kernels"] == 1
    assert by_name["row"].notes["kernels"] == 1
    assert by_name["linear+bias+gelu"].notes["kernels"] == 1
    assert 0 <= by_name["linear+bias+gelu"].notes["max_rel_err_vs_numpy"] < 1e-5
    assert "copied=none" in by_name["dot"].notes["gemm"]
    flash = [c for c in cases if c.name.startswith("causal attention fwd ")][0]
    assert "max_abs_err_vs_torch" not in flash.notes or flash.notes["max_abs_err_vs_torch"] < 1e-5
    rope = [c for c in cases if c.name.startswith("rope")][0]
    assert "max_abs_err_vs_torch" not in rope.notes or rope.notes["max_abs_err_vs_torch"] < 1e-5
    quant = [c for c in cases if c.name.startswith(("GEMV", "GEMM"))]
    assert [c.name.split()[-1] for c in quant] == ["q8_0", "q4_1", "q4_k", "q4_k"]
    for c in quant:  # the quantized weight moves fewer bytes than its f32 form
        assert c.notes["weight_MB"] < c.notes["f32_MB"] / 3
        assert c.notes["max_rel_err"] < 2e-2  # GEMV rounds the activation to int8
    blocks = [c for c in cases if c.name.startswith(("attention scores GEMM",
                                                      "attention values GEMM", "transformer"))]
    assert len(blocks) == 3 and all(c.compiled > 0 and c.eager > 0 for c in blocks)
    assert all(c.numpy > 0 for c in blocks[:2])
    assert all(c.notes["max_rel_err"] < 1e-5 for c in blocks[:2])
    assert by_name["layer_norm"].notes["kernels"] == 1
    assert by_name["rms_norm"].notes["kernels"] == 1
    for c in cases:
        assert c.eager is None or c.eager > 0
        assert "max_abs_err_vs_numpy" not in c.notes or c.notes["max_abs_err_vs_numpy"] < 1e-5
        assert "max_abs_err_vs_torch" not in c.notes or c.notes["max_abs_err_vs_torch"] < 1e-3
    text = bench.table(cases)
    assert "numpy/fast" in text and len(text.splitlines()) == len(cases) + 2
    assert "median" in bench.spread_table(cases)
    saved = tmp_path / "run.json"
    args = ["--quick", "--no-cold-warm", "--no-training", "--json", "--out", str(saved)]
    assert bench.main(args) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["conditions"]["cpus"] >= 1 and len(out["cases"]) == len(cases)
    assert json.loads(saved.read_text())["cases"] == out["cases"]
    # Progress went to stderr, one line per row as it started.
    assert captured.err.count("[bench]") == len(cases)
    for row in out["cases"]:
        for impl, st in row["spread"].items():
            assert st["min"] == row[impl] and st["min"] <= st["median"] <= st["max"]


def test_timing_carries_min_median_max_through_copies():
    import copy

    t = bench.Timing([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (float(t), t.median, t.max) == (1.0, 3.0, 5.0)
    c = bench.Case("row", compiled=t, numpy=2.0)
    assert c.spread() == {"compiled": {"min": 1.0, "median": 3.0, "max": 5.0}}
    u = copy.deepcopy(t)
    assert (float(u), u.median, u.max) == (1.0, 3.0, 5.0)


def test_header_names_cpu_isa_threading_blas_and_versions():
    cond = bench.conditions()
    for key in ("cpu", "isa", "threading_layer", "blas", "numpy", "numba"):
        assert key in cond
    text = bench.header(cond)
    for label in ("CPU:", "ISA:", "threading:", "BLAS:", "versions:"):
        assert label in text
    assert f"numpy {cond['numpy']}" in text and f"numba {cond['numba']}" in text


def _run(cond_date, rows):
    cases = [{"name": n, "eager": e, "compiled": c, "numpy": None, "torch": t, "notes": {},
              "spread": {}} for n, e, c, t in rows]
    return {"conditions": {"date": cond_date, "cpu": "x"}, "cases": cases}


def test_compare_and_ratios_of_saved_runs(tmp_path, capsys):
    a = _run("A", [("softmax", 4.0, 2.0, 3.0), ("only-a", 1.0, None, None)])
    b = _run("B", [("softmax", 4.0, 1.0, 3.0), ("only-b", 1.0, 1.0, None)])
    text, data = bench.compare(a, b)
    assert data == {"softmax": {"eager": 1.0, "compiled": 0.5, "torch": 1.0}}
    assert "only in A: only-a" in text and "0.50x" in text
    assert bench.ratios(a) == {"softmax": {"eager": 2.0, "torch": 1.5},
                               "only-a": {}}
    pa, pb = bench.save(a, tmp_path / "a.json"), bench.save(b, tmp_path / "b.json")
    assert bench.main(["--compare", str(pa), str(pb)]) == 0
    assert "softmax" in capsys.readouterr().out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert bench.plot(data, tmp_path / "r.png", "t") is None
    else:
        assert (tmp_path / "b.compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        import warnings

        with warnings.catch_warnings():  # rows without ratios: no legend to warn about
            warnings.simplefilter("error")
            assert bench.plot({"row": {}}, tmp_path / "empty.png", "t") is not None


def _alive(pid):
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_busy_helpers_spin_during_the_block_and_are_gone_after():
    import time

    from fucina.bench_busy import busy_processes

    with busy_processes(2) as procs:
        pids = [p.pid for p in procs]
        assert len(set(pids)) == 2 and all(p.is_alive() for p in procs)
        t0 = time.perf_counter()
        cpu0 = [_cpu_seconds(pid) for pid in pids]
        time.sleep(0.3)
        spent = [_cpu_seconds(pid) - c for pid, c in zip(pids, cpu0)]
        wall = time.perf_counter() - t0
    assert all(not _alive(pid) for pid in pids)
    if spent[0] is not None:  # /proc: each helper burnt CPU while it ran
        assert all(s > 0.05 * wall for s in spent)
    with pytest.raises(KeyboardInterrupt), busy_processes(1) as procs:
        pid = procs[0].pid
        raise KeyboardInterrupt  # Ctrl-C inside the run
    assert not _alive(pid)
    with pytest.raises(ValueError):
        with busy_processes(-1):
            pass


def _cpu_seconds(pid):
    import os

    try:  # utime + stime, in clock ticks
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _helpers(children):
    return [p.pid for p in children if p.name == "fucina-bench-busy" and p.is_alive()]


def test_main_busy_runs_the_suite_under_spinning_helpers(monkeypatch, capsys, tmp_path):
    import multiprocessing

    seen = []

    def fake_suite(**kw):
        seen.append(_helpers(multiprocessing.active_children()))
        return [bench.Case("row", eager=1e-3)]

    monkeypatch.setattr(bench, "run_suite", fake_suite)
    out = tmp_path / "busy.json"
    assert bench.main(["--busy", "2", "--no-training", "--out", str(out)]) == 0
    assert len(seen[0]) == 2 and not any(_alive(pid) for pid in seen[0])
    assert json.loads(out.read_text())["conditions"]["busy_procs"] == 2
    assert "2 spinning helper processes" in capsys.readouterr().out

    def failing_suite(**kw):
        seen.append(_helpers(multiprocessing.active_children()))
        raise RuntimeError("a row failed")

    monkeypatch.setattr(bench, "run_suite", failing_suite)
    with pytest.raises(RuntimeError):
        bench.main(["--busy", "1", "--no-training", "--no-save"])
    assert len(seen[1]) == 1 and not _alive(seen[1][0])
    assert bench.conditions()["busy_procs"] == 0


def test_paired_load_helpers_spin_only_inside_running_and_are_gone_after():
    import time

    from fucina.bench_busy import paired_load

    with paired_load(1) as load:
        pid = load.procs[0].pid
        assert not load.spinning
        cpu0 = _cpu_seconds(pid)
        time.sleep(0.3)
        paused = None if cpu0 is None else _cpu_seconds(pid) - cpu0
        with load.running():
            assert load.spinning
            cpu1 = _cpu_seconds(pid)
            time.sleep(0.3)
            spun = None if cpu1 is None else _cpu_seconds(pid) - cpu1
        assert not load.spinning
    assert not _alive(pid)
    if paused is not None:  # /proc: CPU burnt only while running
        assert paused < 0.05 and spun > 0.1
    with pytest.raises(KeyboardInterrupt), paired_load(1) as load:
        pid = load.procs[0].pid
        raise KeyboardInterrupt  # Ctrl-C while the helper is paused
    assert not _alive(pid)


class _CountingLoad:
    def __init__(self):
        self.events = []

    def running(self):
        import contextlib

        @contextlib.contextmanager
        def block():
            self.events.append("on")
            yield
            self.events.append("off")

        return block()


def test_best_time_pairs_every_quiet_repeat_with_a_loaded_one(monkeypatch):
    load = _CountingLoad()
    monkeypatch.setattr(bench, "LOAD", [load])
    calls = []
    t = bench.best_time(lambda: calls.append(1), 0.001, repeats=3)
    assert load.events == ["on", "off"] * 3
    assert isinstance(t.busy, bench.Timing) and t.busy > 0 and t > 0
    case = bench.Case("row", compiled=t)
    spread = case.spread()["compiled"]
    assert spread["busy_min"] == float(t.busy) and spread["busy_median"] == t.busy.median
    doc = bench.to_json([case], {})
    assert doc["cases"][0]["spread"]["compiled"]["busy_max"] == t.busy.max
    monkeypatch.setattr(bench, "LOAD", [None])
    assert bench.best_time(lambda: None, 0.001, repeats=2).busy is None


def test_load_table_names_the_rows_above_twice_their_quiet_time():
    from fucina.bench_busy import load_ratios, load_table

    def timing(quiet, busy):
        return bench.Timing([quiet] * 3, bench.Timing([busy] * 3))

    cases = [bench.Case("fine", compiled=timing(1.0, 1.5), torch=timing(1.0, 3.0)),
             bench.Case("slow", compiled=timing(1.0, 2.5)),
             bench.Case("eager only", eager=timing(2.0, 5.0)),
             bench.Case("unpaired", compiled=bench.Timing([1.0]))]
    text = load_table(cases, bench.IMPLS)
    assert "2 of 3: slow 2.50x; eager only 2.50x" in text
    assert "unpaired" not in text
    assert load_ratios(cases, bench.IMPLS) == {"fine": {"compiled": 1.5, "torch": 3.0},
                                               "slow": {"compiled": 2.5},
                                               "eager only": {"eager": 2.5}}


def test_main_paired_load_reports_loaded_over_quiet(monkeypatch, capsys, tmp_path):
    def fake_suite(**kw):
        assert bench.LOAD[0] is not None and not bench.LOAD[0].spinning
        return [bench.Case("row", compiled=bench.best_time(lambda: sum(range(100)), 0.01, 2))]

    monkeypatch.setattr(bench, "run_suite", fake_suite)
    out = tmp_path / "paired.json"
    assert bench.main(["--paired-load", "1", "--no-training", "--out", str(out)]) == 0
    assert bench.LOAD[0] is None
    doc = json.loads(out.read_text())
    assert doc["conditions"]["paired_load"] == 1
    assert "busy_median" in doc["cases"][0]["spread"]["compiled"]
    text = capsys.readouterr().out
    assert "--paired-load" in text and "above 2x their quiet time" in text
    with pytest.raises(SystemExit):
        bench.main(["--paired-load", "1", "--busy", "1", "--no-save"])


@pytest.mark.filterwarnings("ignore:'fucina.bench' found in sys.modules")  # runpy re-runs it
def test_module_entry_runs_the_imported_modules_main(monkeypatch):
    import runpy

    seen = []
    monkeypatch.setattr(bench, "main", lambda argv=None: seen.append(argv) or 0)
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("fucina.bench", run_name="__main__")
    # The row modules read fucina.bench's PROGRESS and LOAD; a __main__ copy's
    # switches would leave their rows without progress lines or paired timing.
    assert seen == [None] and exc.value.code == 0


def test_model_rows_time_each_call_quiet_and_loaded():
    from fucina import bench_bert

    load = _CountingLoad()
    calls = []
    bench.LOAD[0] = load  # the list both modules share (bench_bert imported it by name)
    try:
        t = bench_bert.best_of(lambda: calls.append(1), 3)
    finally:
        bench.LOAD[0] = None
    assert len(calls) == 1 + 3 + 3 and load.events == ["on", "off"] * 3
    assert isinstance(t.busy, bench.Timing) and t <= t.median <= t.max
    t = bench_bert.best_of(lambda: calls.append(1), 2)
    assert t.busy is None and len(calls) == 7 + 3


def test_compare_refuses_files_that_are_not_saved_runs(tmp_path, capsys):
    # A missing file, text that is not JSON, or JSON of another shape printed a traceback
    # (FileNotFoundError, JSONDecodeError, KeyError 'cases'): now a usage error, status 2.
    good = bench.save(_run("A", [("softmax", 4.0, 2.0, 3.0)]), tmp_path / "a.json")
    (tmp_path / "text.json").write_text("{bad")
    (tmp_path / "other.json").write_text('{"a": 1}')
    for bad, says in (("missing.json", "cannot read"), ("text.json", "is not JSON"),
                      ("other.json", "is not a saved run")):
        with pytest.raises(SystemExit) as exit_:
            bench.main(["--compare", str(good), str(tmp_path / bad)])
        assert exit_.value.code == 2
        assert says in capsys.readouterr().err


def test_compare_of_two_paired_runs_lines_up_their_load_ratios(capsys, tmp_path):
    from fucina.bench_busy import load_compare

    def run(loads):
        cases = [bench.Case(name, compiled=bench.Timing([1.0] * 3, bench.Timing([r] * 3)))
                 for name, r in loads.items()]
        cases.append(bench.Case("unpaired", compiled=bench.Timing([1.0])))
        return bench.to_json(cases, {"date": "d", "cpu": "c"})

    a = run({"row": 1.5, "slow": 2.5, "only in a": 3.0})
    b = run({"row": 1.25, "slow": 1.75})
    text = load_compare(a, b)
    assert "rows above 2x: A 1, B 0 of 2" in text
    assert "1.50x      1.25x" in text and "unpaired" not in text and "only in a" not in text
    plain = bench.to_json([bench.Case("row", compiled=bench.Timing([1.0]))], {})
    assert load_compare(plain, b) == "" and load_compare(a, plain) == ""
    pa, pb = bench.save(a, tmp_path / "a.json"), bench.save(b, tmp_path / "b.json")
    assert bench.main(["--compare", str(pa), str(pb)]) == 0
    assert "rows above 2x: A 1, B 0 of 2" in capsys.readouterr().out


def test_side_by_side_alternates_implementations_each_repeat(monkeypatch):
    monkeypatch.setattr(bench, "LOAD", [None])
    order = []
    case = bench.Case("row")
    got = bench.side_by_side(case, 0.0, 3, eager=lambda: order.append("e"),
                             compiled=lambda: order.append("c"), numpy=None,
                             torch=lambda: order.append("t"))
    # one warm-up call and one batch of one call each (min_time 0), then the three
    # repeats take one batch of each implementation in turn
    assert order[:2] == ["e", "e"] and order[2:4] == ["c", "c"] and order[4:6] == ["t", "t"]
    assert order[6:] == ["e", "c", "t"] * 3
    assert set(got) == {"eager", "compiled", "torch"} and case.numpy is None
    assert case.eager is got["eager"] and isinstance(case.torch, bench.Timing)
    assert case.compiled.median >= float(case.compiled) > 0 and case.compiled.busy is None


def test_side_by_side_pairs_each_quiet_batch_under_paired_load(monkeypatch):
    load = _CountingLoad()
    monkeypatch.setattr(bench, "LOAD", [load])
    case = bench.Case("row")
    bench.side_by_side(case, 0.001, 2, eager=lambda: None, compiled=lambda: None)
    assert load.events == ["on", "off"] * 4  # 2 repeats x 2 implementations
    assert isinstance(case.eager.busy, bench.Timing) and case.compiled.busy > 0


def test_side_by_side_names_an_unknown_implementation():
    with pytest.raises(ValueError, match=r"unknown implementation\(s\) \['jax'\]"):
        bench.side_by_side(bench.Case("row"), 0.001, 1, jax=lambda: None)


def test_rows_run_without_torch(monkeypatch):
    # torch is optional: every row then times fucina (and numpy) alone, torch's side None
    from fucina import bench_blocks, bench_rows, bench_unary

    for module in (bench, bench_blocks, bench_rows, bench_unary):
        monkeypatch.setattr(module, "torch", None)
    cases = [bench._rope_case(True), bench_blocks._block_case(True, False, False),
             bench_rows._reduce_case("sum", 0, (8, 64, 64), True),
             bench_unary.unary_cases(1 << 12, True)[0],
             bench._training_case("spirals", (2, 64, 64, 2), 256, "tanh", "Adam", 1e-2, True,
                                  False),
             bench._conv2d_case(True), *bench._flash_attention_cases(True),
             bench._cross_entropy_case(True)]
    for c in cases:
        assert c.torch is None and c.compiled > 0 and c.eager > 0, c.name
        assert not any("torch" in k for k in c.notes), c.name
