"""The AVX2 path checked on any host that has AVX2 (``fucina.kernels.isa``).

A child process compiled for the host's features minus AVX-512 must give the same
bits as this process: the vecmath functions (every one at most FMA-contracted the
same way on both targets) and generated kernels, eager and compiled (fixed-order
reductions). On an AVX-512 host that compares 256-bit code with 512-bit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from isa_values import chain_stages, values

from fucina import bench
from fucina.kernels import isa
from fucina.kernels import vecmath as vm

_FEATS = {"sse4.2": True, "avx": True, "avx2": True, "fma": True, "avx512f": True,
          "avx512bw": True, "avx512vl": False, "amx-tile": True, "avx10.1-512": True,
          "evex512": True, "f16c": True, "xop": False}


def test_narrowed_features_turn_off_only_what_is_above_avx2():
    got = isa.narrowed_features("avx2", _FEATS).split(",")
    assert got == sorted(got, key=lambda f: f[1:])
    assert set(got) == {"+sse4.2", "+avx", "+avx2", "+fma", "-avx512f", "-avx512bw",
                        "-avx512vl", "-amx-tile", "-avx10.1-512", "-evex512", "+f16c", "-xop"}
    assert isa.vector_bits(",".join(got)) == 256
    assert isa.vector_bits("+avx2,+avx512f") == 512
    assert isa.vector_bits("+avx,-avx512f") == 256
    assert isa.vector_bits("+sse4.2,-avx") == 128


def test_narrowing_needs_the_level_and_knows_its_levels():
    with pytest.raises(ValueError, match="lacks avx2, fma"):
        isa.narrowed_features("avx2", {"sse4.2": True, "avx": True, "avx2": False})
    with pytest.raises(ValueError, match="unknown ISA level 'avx512'"):
        isa.narrowed_features("avx512", _FEATS)


def test_narrowed_env_sets_every_library_and_keeps_the_rest():
    env = isa.narrowed_env("avx2", {"PATH": "/bin", "OPENBLAS_CORETYPE": "SkylakeX"}, _FEATS)
    assert env["PATH"] == "/bin"
    assert env["NUMBA_CPU_FEATURES"] == isa.narrowed_features("avx2", _FEATS)
    assert (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"],
            env["MKL_ENABLE_INSTRUCTIONS"], env["OPENBLAS_CORETYPE"]) == (
        "avx2", "AVX2", "AVX2", "Haswell")
    assert env[isa.MARK] == "avx2"


def test_bench_relaunch_and_its_error(monkeypatch):
    monkeypatch.setattr(isa, "host_features", lambda: dict(_FEATS))
    cmd, env = bench.isa_relaunch("avx2", ["--quick", "--no-save"])
    assert cmd == [sys.executable, "-m", "fucina.bench", "--quick", "--no-save"]
    assert env[isa.MARK] == "avx2"
    assert env["NUMBA_CPU_FEATURES"] == isa.narrowed_features("avx2", _FEATS)
    monkeypatch.setattr(isa, "host_features", lambda: {"avx": True, "avx2": False})
    with pytest.raises(SystemExit, match="--isa avx2: this CPU cannot run the avx2 path"):
        bench.isa_relaunch("avx2", [])


def test_header_names_the_kernel_target_and_its_vector_width():
    cond = bench.conditions()
    _, cpu, features = vm.codegen_target()
    assert cond["kernel_target"] == f"{cpu}, {isa.vector_bits(features)}-bit vectors"
    assert cond["isa_level"] == "host"
    assert f"kernels: {cond['kernel_target']}" in bench.header(cond)
    narrowed = dict(cond, isa_level="avx2", kernel_target="znver3, 256-bit vectors")
    assert "kernels: znver3, 256-bit vectors (--isa avx2)" in bench.header(narrowed)


def _has_avx2() -> bool:
    feats = isa.host_features()
    return bool(feats.get("avx2") and feats.get("fma"))


_CHILD = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from fucina.kernels import vecmath as vm
import isa_values
_, cpu, features = vm.codegen_target()
print(vm.wide_vectors(), "+avx512f" in features.split(","), isa_values.chain_stages())
np.savez({path!r}, **isa_values.values())
"""


def test_the_avx2_path_gives_the_host_paths_bits(tmp_path):
    if not _has_avx2():
        pytest.skip("the host has no AVX2 + FMA: no AVX2 path to build")
    path = tmp_path / "narrow.npz"
    script = _CHILD.format(tests=str(Path(__file__).parent), path=str(path))
    env = isa.narrowed_env("avx2", os.environ)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    # no 512-bit vectors, no AVX-512F; the chain staged as on the host
    assert res.stdout.split() == ["False", "False", "2"]
    assert chain_stages() == 2
    narrow = np.load(path)
    host = values()  # this process: the host's target
    assert sorted(narrow.files) == sorted(host)
    for name, want in host.items():
        got = narrow[name]
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (name, int((~same).sum()))
