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
