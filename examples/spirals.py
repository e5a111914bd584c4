"""Two interleaved spirals: an MLP with named axes trained by fucina.optim.Adam.

Run ``python examples/spirals.py`` (``--help`` for options). Every epoch
prints a line (loss, accuracy, time). ``--mode eager`` runs each op as it is
called; ``--mode compiled`` compiles the whole training step (``zero_grad``,
forward, backward, ``opt.step()``) into one program with ``fucina.compile``:
the parameters and Adam's moments are updated in place by its kernels, and
every new batch reuses the same program. With
matplotlib installed (``pip install fucina[plot]``) the decision boundary and
the loss curve are saved as a PNG (``--plot``).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fucina as F

Points = F.Tensor("batch", "in")
OneHot = F.Tensor("batch", "class")


def spirals(n: int, seed: int = 0, noise: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points on two interleaved spirals (1.5 turns each): points [n, 2], labels [n]."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.random(n)) * 3 * math.pi
    label = rng.integers(0, 2, n)
    r = t / (3 * math.pi)
    angle = t + label * math.pi
    pts = np.stack([r * np.cos(angle), r * np.sin(angle)], 1) + rng.normal(0, noise, (n, 2))
    return pts.astype(np.float32), label.astype(np.int64)


class MLP:
    """2 -> hidden -> hidden -> 2 with tanh; weights stored [out, in], contracted by name."""

    def __init__(self, ctx: F.ExecContext, hidden: int = 64, seed: int = 1):
        self.ctx = ctx

        def weight(tags: tuple[str, str], shape: tuple[int, int], k: int) -> Any:
            T = F.Tensor(*tags)
            init = T.normal(ctx, shape, seed + k, 0.0, 1.0 / math.sqrt(shape[1]))
            return T.variable(ctx, init.as_raw_tensor())

        def bias(tag: str, n: int) -> Any:
            return F.Tensor(tag).variable_from_slice(ctx, (n,), np.zeros(n))

        self.w1 = weight(("h1", "in"), (hidden, 2), 0)
        self.b1 = bias("h1", hidden)
        self.w2 = weight(("h2", "h1"), (hidden, hidden), 1)
        self.b2 = bias("h2", hidden)
        self.w3 = weight(("class", "h2"), (2, hidden), 2)
        self.b3 = bias("class", 2)

    def params(self) -> list[Any]:
        """The trainable variables."""
        return [self.w1, self.b1, self.w2, self.b2, self.w3, self.b3]

    def __call__(self, x: Points) -> OneHot:
        h = x.dot(self.w1, "in").add(self.b1).tanh()          # (batch, h1)
        h = h.dot(self.w2, "h1").add(self.b2).tanh()          # (batch, h2)
        return h.dot(self.w3, "h2").add(self.b3)              # (batch, class)


def loss_and_grad(model: MLP, x: Points, y: OneHot) -> F.Tensor():
    """Mean cross-entropy against one-hot targets; backward fills the parameters' grads."""
    logits = model(x)
    loss = logits.logsumexp("class").sub(logits.mul(y).sum("class")).mean("batch")
    loss.backward()
    return loss


def accuracy(model: MLP, ctx: F.ExecContext, pts: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of points whose arg-max class is the label."""
    with F.no_grad():
        pred = model(Points.from_slice(ctx, pts.shape, pts)).argmax("class").numpy()
    return float((pred == labels).mean())


@dataclass
class Result:
    """What a training run produced."""

    model: MLP
    losses: list[float] = field(default_factory=list)      # mean loss per epoch
    train_accuracy: float = 0.0
    test_accuracy: float = 0.0
    seconds: float = 0.0


def train(mode: str = "eager", epochs: int = 40, n: int = 2048, batch: int = 256,
          hidden: int = 64, lr: float = 3e-2, seed: int = 0, verbose: bool = True) -> Result:
    """Train on ``n`` spiral points in shuffled minibatches; evaluate on fresh points."""
    if mode not in ("eager", "compiled"):
        raise ValueError(f"mode must be 'eager' or 'compiled', got {mode!r}")
    ctx = F.ExecContext()
    pts, labels = spirals(n, seed)
    test_pts, test_labels = spirals(1024, seed + 100)
    onehot = np.eye(2, dtype=np.float32)[labels]
    model = MLP(ctx, hidden, seed + 1)
    opt = F.optim.Adam(model.params(), lr=lr)
    sched = F.optim.lr.CosineAnnealingLR(opt, T_max=epochs, eta_min=lr * 0.05)

    def step(x: Points, y: OneHot) -> F.Tensor():
        opt.zero_grad()
        loss = loss_and_grad(model, x, y)
        opt.step()
        return loss

    run = F.compile(step) if mode == "compiled" else step
    res = Result(model)
    order_rng = np.random.default_rng(seed + 2)
    start = time.perf_counter()
    for epoch in range(epochs):
        order = order_rng.permutation(n)
        total, count = 0.0, 0
        for k in range(0, n - batch + 1, batch):  # full batches only: one program shape
            idx = order[k:k + batch]
            x = Points.from_slice(ctx, (batch, 2), pts[idx])
            y = OneHot.from_slice(ctx, (batch, 2), onehot[idx])
            total += run(x, y).item()
            count += 1
        sched.step()
        res.losses.append(total / count)
        if verbose:
            acc = accuracy(model, ctx, pts, labels)
            print(f"epoch {epoch + 1:3d}/{epochs}  loss {res.losses[-1]:.4f}  "
                  f"train acc {acc:.3f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"{time.perf_counter() - start:6.2f} s", flush=True)
    res.seconds = time.perf_counter() - start
    res.train_accuracy = accuracy(model, ctx, pts, labels)
    res.test_accuracy = accuracy(model, ctx, test_pts, test_labels)
    if verbose:
        print(f"{mode}: train accuracy {res.train_accuracy:.3f}, test accuracy "
              f"{res.test_accuracy:.3f}, {res.seconds:.1f} s")
    return res


def plot(res: Result, path: str, seed: int = 0) -> bool:
    """Save the decision boundary and the loss curve to ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ctx = res.model.ctx
    grid = np.linspace(-1.2, 1.2, 200, dtype=np.float32)
    gx, gy = np.meshgrid(grid, grid)
    cells = np.stack([gx.ravel(), gy.ravel()], 1)
    with F.no_grad():
        logits = res.model(Points.from_slice(ctx, cells.shape, cells)).numpy()
    z = (logits[:, 1] - logits[:, 0]).reshape(gx.shape)
    pts, labels = spirals(1024, seed + 100)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5))
    a.contourf(gx, gy, z > 0, levels=1, cmap="coolwarm", alpha=0.35)
    a.contour(gx, gy, z, levels=[0.0], colors="k", linewidths=1)
    a.scatter(pts[:, 0], pts[:, 1], c=labels, cmap="coolwarm", s=6)
    a.set_title(f"decision boundary (test accuracy {res.test_accuracy:.3f})")
    a.set_aspect("equal")
    b.plot(np.arange(1, len(res.losses) + 1), res.losses)
    b.set_yscale("log")
    b.set_xlabel("epoch")
    b.set_ylabel("mean cross-entropy")
    b.set_title("training loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> Result:
    """Command line: train, report, plot."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="spirals.png", help="PNG path ('' to skip)")
    args = p.parse_args(argv)
    res = train(args.mode, epochs=args.epochs, hidden=args.hidden, lr=args.lr, seed=args.seed)
    if args.plot:
        if plot(res, args.plot, args.seed):
            print(f"saved {args.plot}")
        else:
            print("matplotlib is not installed (pip install fucina[plot]): no plot")
    return res


if __name__ == "__main__":
    main()
