"""A short tour of Fucina's named axes: run with ``python examples/tour.py``."""

from __future__ import annotations

import numpy as np

import fucina


def main() -> None:
    """Build a tiny two-layer model by name, run it, and take gradients."""
    ctx = fucina.ExecContext()
    Batch = fucina.Tensor("batch", "in")
    x = Batch.from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    print("x:", type(x), x.shape)

    # Weights stored output-major [h1, in]: the contraction names 'in', no transpose.
    init = fucina.Tensor("h1", "in").randn(ctx, (4, 3), 1)
    w1 = fucina.Tensor("h1", "in").variable(ctx, init.as_raw_tensor())
    b1 = fucina.Tensor("h1").variable_from_slice(ctx, (4,), [0.1, 0.2, 0.3, 0.4])
    w2 = fucina.Tensor("class", "h1").variable(
        ctx, fucina.Tensor("class", "h1").uniform(ctx, (2, 4), 7, -0.5, 0.5).as_raw_tensor())

    z1 = x.dot(w1, "in")           # tags (batch, h1)
    a1 = z1.add(b1).maximum(z1.zeros_like())  # bias broadcasts over batch; relu
    logits = a1.dot(w2, "h1")      # tags (batch, class)
    print("logits:", type(logits), logits.shape)
    print(np.round(logits.numpy(), 4))

    loss = logits.sum_all()
    loss.backward()
    print("d loss / d b1:", np.round(b1.grad().numpy(), 4))

    # Bias-first addition changes the result layout: the union is in operand order.
    print("b1 + z1 tags:", b1.detach().add(z1.detach()).axis_tags)

    # Shape bugs are caught by name.
    try:
        x.dot(fucina.Tensor("n", "j").zeros(ctx, (2, 2)), "in")
    except fucina.TagError as e:
        print("TagError:", e)

    qkv = fucina.Tensor("seq", "qkv").from_slice(ctx, (2, 6), np.arange(12))
    split = qkv.split("qkv", ("head", "d"), (2, 3))
    print("split:", type(split), split.shape)


if __name__ == "__main__":
    main()
