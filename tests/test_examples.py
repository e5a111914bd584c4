"""The examples run and do what they claim."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_tour_runs(capsys):
    runpy.run_path(str(EXAMPLES / "tour.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "TagError: tensor tag not found: 'in'" in out


def test_compiled_training_step_learns_and_matches_eager():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_mlp
    finally:
        sys.path.pop(0)
    losses = train_mlp.train(steps=200, verbose=False)
    assert losses[-1] < 0.8 * losses[0]

    import fucina as F

    ctx = F.ExecContext()
    pts, labels = train_mlp.spirals(64)
    x = train_mlp.Batch.from_slice(ctx, pts.shape, pts)
    y = F.Tensor("batch", "class").from_slice(ctx, labels.shape, labels)

    def loss_of(m):
        logits = train_mlp.forward(m, x)
        loss = logits.logsumexp("class").sub(logits.mul(y).sum("class")).mean("batch")
        loss.backward()
        return loss

    eager_model, compiled_model = train_mlp.Model(ctx), train_mlp.Model(ctx)
    want = loss_of(eager_model).item()
    got = F.compile(lambda x, y: loss_of(compiled_model))(x, y).item()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(eager_model.params(), compiled_model.params()):
        np.testing.assert_allclose(b.grad().numpy(), a.grad().numpy(), rtol=1e-4, atol=1e-6)


def _spirals():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import spirals
    finally:
        sys.path.pop(0)
    return spirals


def test_train_mlp_uses_fucina_optim_like_a_hand_written_sgd_step():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_mlp
    finally:
        sys.path.pop(0)
    import fucina as F

    losses = train_mlp.train(steps=3, verbose=False)
    # Replay the same three full-batch steps with the update written out by hand.
    ctx = F.ExecContext()
    pts, labels = train_mlp.spirals(512)
    x = train_mlp.Batch.from_slice(ctx, pts.shape, pts)
    y = F.Tensor("batch", "class").from_slice(ctx, labels.shape, labels)
    m = train_mlp.Model(ctx)
    want = []
    for _ in range(3):
        for p in m.params():
            p.zero_grad()
        logits = train_mlp.forward(m, x)
        loss = logits.logsumexp("class").sub(logits.mul(y).sum("class")).mean("batch")
        loss.backward()
        want.append(loss.item())
        for p in m.params():
            p.as_raw_tensor().array()[...] -= np.float32(0.5) * p.grad().numpy()
    np.testing.assert_allclose(losses, want, rtol=1e-5)


def test_spirals_trains_eager_and_compiled_to_98_percent(capsys):
    spirals = _spirals()
    eager = spirals.train("eager", epochs=20, lr=5e-2, verbose=True)
    out = capsys.readouterr().out
    assert out.count("epoch ") == 20 and "train acc" in out
    compiled = spirals.train("compiled", epochs=20, lr=5e-2, verbose=False)
    for res in (eager, compiled):
        assert res.test_accuracy >= 0.98 and res.train_accuracy >= 0.98
        assert res.losses[-1] < 0.2 * res.losses[0]
    # Same data order, same initial weights: the two runs agree closely.
    np.testing.assert_allclose(compiled.losses, eager.losses, rtol=1e-4)


def test_spirals_plot(tmp_path):
    spirals = _spirals()
    res = spirals.train("eager", epochs=1, n=512, verbose=False)
    path = tmp_path / "spirals.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert spirals.plot(res, str(path)) is False
        assert not path.exists()
        return
    assert spirals.plot(res, str(path)) is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
