"""Training state on disk (fucina.optim.save_state/load_state): resume == uninterrupted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fucina as F

ROOT = Path(__file__).resolve().parents[1]

# One training setup, shared by this process and the resuming one.
SETUP = textwrap.dedent('''
    import numpy as np
    import fucina as F

    def build(ctx):
        rng = np.random.default_rng(7)
        params = {
            "w1": F.Tensor("h", "in").variable_from_slice(ctx, (8, 3), rng.standard_normal((8, 3))),
            "b1": F.Tensor("h").variable_from_slice(ctx, (8,), np.zeros(8)),
            "w2": F.Tensor("c", "h").variable_from_slice(ctx, (2, 8), rng.standard_normal((2, 8))),
        }
        opt = F.optim.AdamW([{"params": [params["w1"], params["w2"]]},
                             {"params": [params["b1"]], "weight_decay": 0.0}], lr=2e-2)

        def step(x, y):
            opt.zero_grad()
            logits = x.dot(params["w1"], "in").add(params["b1"]).tanh().dot(params["w2"], "h")
            loss = logits.logsumexp("c").sub(logits.mul(y).sum("c")).mean("b")
            loss.backward()
            opt.step()
            return loss

        return params, opt, F.compile(step)

    def batch(ctx, k):
        rng = np.random.default_rng(100 + k)
        x = rng.standard_normal((16, 3)).astype(np.float32)
        y = np.eye(2, dtype=np.float32)[rng.integers(0, 2, 16)]
        return F.Tensor("b", "in").from_slice(ctx, x.shape, x), \\
            F.Tensor("b", "c").from_slice(ctx, y.shape, y)
''')

RESUME = SETUP + textwrap.dedent('''
    import sys
    path, out, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ctx = F.ExecContext()
    params, opt, step = build(ctx)
    meta = F.optim.load_state(path, params, opt)
    assert meta == {"epoch": str(first)}, meta
    for k in range(first, last):
        step(*batch(ctx, k))
    np.savez(out, **{name: p.numpy() for name, p in params.items()})
''')


def _setup():
    ns: dict = {}
    exec(compile(SETUP, "setup", "exec"), ns)  # the setup text the other process runs too
    return ns


def test_resume_in_a_new_process_equals_the_uninterrupted_run(tmp_path):
    ns = _setup()
    ctx = F.ExecContext()
    params, opt, step = ns["build"](ctx)
    for k in range(6):
        step(*ns["batch"](ctx, k))
    path = tmp_path / "state.safetensors"
    F.optim.save_state(path, params, opt, {"epoch": "6"})
    for k in range(6, 12):  # the uninterrupted run goes on
        step(*ns["batch"](ctx, k))
    out = tmp_path / "resumed.npz"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", RESUME, str(path), str(out), "6", "12"], check=True,
                   env=env, cwd=tmp_path, timeout=600)
    resumed = np.load(out)
    for name, p in params.items():
        np.testing.assert_array_equal(resumed[name], p.numpy())  # bit for bit


def test_file_layout_and_in_process_round_trip(tmp_path):
    ns = _setup()
    ctx = F.ExecContext()
    params, opt, step = ns["build"](ctx)
    for k in range(3):
        step(*ns["batch"](ctx, k))
    path = tmp_path / "s.safetensors"
    F.optim.save_state(path, params, opt)
    with F.safetensors.open(path) as f:
        assert set(f.tensors) == {"w1", "b1", "w2"} | {
            f"optimizer/{n}/{e}" for n in ("w1", "b1", "w2")
            for e in ("step", "exp_avg", "exp_avg_sq")}
        assert f.array("optimizer/w1/step").item() == 3
        np.testing.assert_array_equal(f.array("optimizer/w2/exp_avg"),
                                      opt.state[params["w2"]]["exp_avg"].numpy())
    params2, opt2, step2 = ns["build"](ctx)
    assert F.optim.load_state(path, params2, opt2) == {}
    for k in range(3, 6):
        step(*ns["batch"](ctx, k))
        step2(*ns["batch"](ctx, k))
    for name in params:
        np.testing.assert_array_equal(params2[name].numpy(), params[name].numpy())
    assert opt2.param_groups[1]["weight_decay"] == 0.0 and opt2.state[params2["b1"]]["step"] == 6


def _bad_file(tmp_path, ctx, edit):
    ns = _setup()
    params, opt, step = ns["build"](ctx)
    step(*ns["batch"](ctx, 0))
    tensors = {n: p for n, p in params.items()}
    for index, entry in opt.state_dict()["state"].items():
        name = ["w1", "w2", "b1"][index]
        for key, v in entry.items():
            tensors[f"optimizer/{name}/{key}"] = np.asarray(v, np.int64) if key == "step" else v
    import json

    groups = opt.state_dict()["param_groups"]
    meta = {"optimizer/param_groups": json.dumps(
        [{**{k: v for k, v in g.items() if k != "params"},
          "params": [["w1", "w2", "b1"][i] for i in g["params"]]} for g in groups]),
        "optimizer/type": "AdamW"}
    edit(tensors, meta)
    path = tmp_path / "bad.safetensors"
    F.safetensors.save(path, tensors, meta)
    return path


@pytest.mark.parametrize("edit,exc,match", [
    (lambda t, m: t.pop("w2"), ValueError, "no parameter 'w2'"),
    (lambda t, m: t.update(w1=np.zeros((3, 8), np.float32)), ValueError, r"shape \(3, 8\)"),
    (lambda t, m: t.update(b1=np.zeros(8, np.float64)), TypeError, "f64"),
    (lambda t, m: t.pop("optimizer/w1/exp_avg"), ValueError, "missing 'exp_avg'"),
    (lambda t, m: t.update({"optimizer/w1/exp_avg": np.zeros((8, 2), np.float32)}), ValueError,
     r"shape \(8, 2\)"),
    (lambda t, m: m.update({"optimizer/type": "SGD"}), TypeError, "holds SGD state"),
    (lambda t, m: m.pop("optimizer/param_groups"), ValueError, "no optimizer state"),
    (lambda t, m: t.update({"optimizer/zz/step": np.asarray(1, np.int64)}), ValueError, "'zz'"),
])
def test_bad_files_change_nothing(tmp_path, edit, exc, match):
    ns = _setup()
    ctx = F.ExecContext()
    path = _bad_file(tmp_path, ctx, edit)
    params, opt, step = ns["build"](ctx)
    for k in range(2):
        step(*ns["batch"](ctx, k))
    before = {n: p.numpy() for n, p in params.items()}
    state_before = opt.state_dict()
    with pytest.raises(exc, match=match):
        F.optim.load_state(path, params, opt)
    for n, p in params.items():
        np.testing.assert_array_equal(p.numpy(), before[n])
    after = opt.state_dict()
    for i, entry in state_before["state"].items():
        assert after["state"][i]["step"] == entry["step"]
        np.testing.assert_array_equal(after["state"][i]["exp_avg"].numpy(),
                                      entry["exp_avg"].numpy())


def test_bad_arguments(tmp_path, ctx):
    w = F.Tensor("d").variable_from_slice(ctx, (2,), [1, 2])
    other = F.Tensor("d").variable_from_slice(ctx, (2,), [3, 4])
    opt = F.optim.SGD([w, other], lr=0.1)
    with pytest.raises(ValueError, match="not among the named params"):
        F.optim.save_state(tmp_path / "a.safetensors", {"w": w}, opt)
    with pytest.raises(ValueError, match="same tensor"):
        F.optim.save_state(tmp_path / "a.safetensors", {"w": w, "v": w})
    with pytest.raises(ValueError, match="without '/'"):
        F.optim.save_state(tmp_path / "a.safetensors", {"a/b": w})
    with pytest.raises(TypeError, match="dict of name"):
        F.optim.save_state(tmp_path / "a.safetensors", [w])
    F.optim.save_state(tmp_path / "p.safetensors", {"w": w})  # parameters only
    with pytest.raises(ValueError, match="holds no optimizer state"):
        F.optim.load_state(tmp_path / "p.safetensors", {"w": w}, F.optim.SGD([w], lr=0.1))
