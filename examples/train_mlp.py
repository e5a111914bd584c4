"""Train a small MLP on two interleaved spirals with named axes and a compiled step.

Run with ``python examples/train_mlp.py``. The whole training step
(``zero_grad``, forward, loss, backward, ``fucina.optim.SGD.step``) is one
``fucina.compile``d program that updates the variables in place.
(``examples/spirals.py`` is the fuller version: minibatches, Adam, a
schedule and a plot.)
"""

from __future__ import annotations

import math

import numpy as np

import fucina as F

Batch = F.Tensor("batch", "in")


def spirals(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved spirals: points [n, 2] and one-hot labels [n, 2]."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.random(n)) * 3 * math.pi
    cls = rng.integers(0, 2, n)
    r = t / (3 * math.pi)
    angle = t + cls * math.pi
    pts = np.stack([r * np.cos(angle), r * np.sin(angle)], 1) + rng.normal(0, 0.02, (n, 2))
    return pts.astype(np.float32), np.eye(2, dtype=np.float32)[cls]


class Model:
    """Weights stored output-major ([out, in]); every contraction names its axis."""

    def __init__(self, ctx: F.ExecContext, hidden: int = 64, seed: int = 1):
        scale = 1.0 / math.sqrt(2)
        self.w1 = F.Tensor("h1", "in").variable(
            ctx, F.Tensor("h1", "in").normal(ctx, (hidden, 2), seed, 0.0, scale).as_raw_tensor())
        self.b1 = F.Tensor("h1").variable_from_slice(ctx, (hidden,), np.zeros(hidden))
        self.w2 = F.Tensor("class", "h1").variable(
            ctx, F.Tensor("class", "h1").normal(ctx, (2, hidden), seed + 1, 0.0,
                                                1.0 / math.sqrt(hidden)).as_raw_tensor())
        self.b2 = F.Tensor("class").variable_from_slice(ctx, (2,), np.zeros(2))

    def params(self) -> list[F.Tensor]:
        """The trainable variables."""
        return [self.w1, self.b1, self.w2, self.b2]


def forward(m: Model, x: Batch) -> F.Tensor("batch", "class"):
    """Logits for a batch of points."""
    h = x.dot(m.w1, "in").add(m.b1).tanh()      # (batch, h1)
    return h.dot(m.w2, "h1").add(m.b2)          # (batch, class)


def train(steps: int = 2000, n: int = 512, lr: float = 0.5, verbose: bool = True) -> list[float]:
    """Full-batch gradient descent (fucina.optim.SGD); returns the loss after every step."""
    ctx = F.ExecContext()
    pts, labels = spirals(n)
    x = Batch.from_slice(ctx, pts.shape, pts)
    y = F.Tensor("batch", "class").from_slice(ctx, labels.shape, labels)
    m = Model(ctx)

    opt = F.optim.SGD(m.params(), lr=lr)

    def step(x: Batch, y: F.Tensor("batch", "class")) -> F.Tensor():
        opt.zero_grad()
        logits = forward(m, x)
        # Cross-entropy through logsumexp over the named class axis.
        nll = logits.logsumexp("class").sub(logits.mul(y).sum("class"))
        loss = nll.mean("batch")
        loss.backward()
        opt.step()
        return loss

    fast = F.compile(step)
    losses = []
    for k in range(steps):
        losses.append(fast(x, y).item())
        if verbose and (k % 250 == 0 or k == steps - 1):
            print(f"step {k:4d}  loss {losses[-1]:.4f}")
    with F.no_grad():
        pred = forward(m, x).argmax("class").numpy()
    acc = float((pred == labels.argmax(1)).mean())
    if verbose:
        print(f"train accuracy {acc:.3f}")
        print(fast.ir(x, y).splitlines()[0], f"... {len(fast.kernels(x, y))} generated kernels")
    return losses


if __name__ == "__main__":
    train()
