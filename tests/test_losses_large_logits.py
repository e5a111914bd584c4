"""Cross-entropy and the fused linear losses at large logits, against float64 (numpy).

Regression: the softmax of the backward was rebuilt as ``exp(x - lse)`` from a float32
log-sum-exp, and the loss as ``lse - x[label]``. Near logits of 300 that value is
rounded to 3e-5, so a loss of 1.1e-5 came out 0 and so did its gradient at the
label. Both now keep the row max apart (torch's float32 error, about one ulp of 1).
Also here: labels whose tags match the logits' but whose sizes do not are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

LOGITS = np.array([[300.0, 288.6, 250.0], [-1000.0, -1011.5, -990.25]], np.float32)
LABELS = [0, 1]


def _softmax64(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _ce64(z: np.ndarray, labels: list[int], smooth: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-row losses and their gradients (reduction "sum") in float64."""
    z64 = z.astype(np.float64)
    m = z64.max(axis=-1, keepdims=True)
    logp = z64 - m - np.log(np.exp(z64 - m).sum(axis=-1, keepdims=True))
    k = z.shape[-1]
    target = np.full(z.shape, smooth / k)
    target[np.arange(len(labels)), labels] += 1.0 - smooth
    return -(target * logp).sum(axis=-1), _softmax64(z) - target


@pytest.mark.parametrize("smooth", [0.0, 0.1])
@pytest.mark.parametrize("compiled", [False, True])
def test_cross_entropy_keeps_small_losses_at_large_logits(smooth, compiled):
    ctx = F.ExecContext()
    want_loss, want_grad = _ce64(LOGITS, LABELS, smooth)
    if smooth == 0.0:
        assert 1e-5 < want_loss[0] < 2e-5  # a loss far below the logits' own ulp (3e-5)

    def per_row(x):
        return x.cross_entropy("c", LABELS, reduction="none", label_smoothing=smooth)

    def total(x):
        return x.cross_entropy("c", LABELS, reduction="sum", label_smoothing=smooth)

    x = F.Tensor("r", "c").variable_from_slice(ctx, LOGITS.shape, LOGITS)
    run_rows, run_sum = (F.compile(per_row), F.compile(total)) if compiled else (per_row, total)
    np.testing.assert_allclose(run_rows(x).numpy(), want_loss, rtol=1e-6, atol=2e-7)
    run_sum(x).backward()
    np.testing.assert_allclose(x.grad().numpy(), want_grad, rtol=0, atol=2e-7)


def _linear_operands() -> tuple[np.ndarray, np.ndarray, F.Tensor, F.Tensor]:
    """x [2, 4] and w [3, 4] with x . w^T = LOGITS: each row of x picks a column of w."""
    ctx = F.ExecContext()
    x0 = np.eye(2, 4, dtype=np.float32)
    w0 = np.zeros((3, 4), np.float32)
    w0[:, :2] = LOGITS.T
    x = F.Tensor("r", "d").variable_from_slice(ctx, x0.shape, x0)
    w = F.Tensor("c", "d").variable_from_slice(ctx, w0.shape, w0)
    return x0, w0, x, w


def test_linear_cross_entropy_at_large_logits():
    x0, w0, x, w = _linear_operands()
    loss = x.linear_cross_entropy(w, LABELS, reduction="none")
    want_loss, dz = _ce64(LOGITS, LABELS, 0.0)
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-6, atol=2e-7)
    x.linear_cross_entropy(w, LABELS, reduction="sum").backward()
    np.testing.assert_allclose(w.grad().numpy(), dz.T @ x0, rtol=0, atol=2e-7)
    np.testing.assert_allclose(x.grad().numpy(), dz @ w0, rtol=1e-6, atol=1e-4)


def test_linear_distill_at_large_logits():
    x0, _, x, w = _linear_operands()
    rows, classes, probs = [0, 1, 0], [0, 1, 1], [1.0, 1.0, 0.0]
    loss = x.linear_distill(w, rows, classes, probs, reduction="sum")
    want_loss, dz = _ce64(LOGITS, LABELS, 0.0)  # the entries with weight 1 are the labels
    np.testing.assert_allclose(loss.item(), want_loss.sum(), rtol=1e-6, atol=2e-7)
    loss.backward()
    np.testing.assert_allclose(w.grad().numpy(), dz.T @ x0, rtol=0, atol=2e-7)


@pytest.mark.parametrize("op", ["cross_entropy", "nll_loss"])
def test_labels_with_the_logits_tags_at_other_sizes_are_refused(op):
    # Regression: labels tagged (r, b) at sizes (3, 2) for logits at (2, 3) have the
    # right count, and were read with r and b broadcast: every position took label 0's.
    ctx = F.ExecContext()
    x0 = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    x = F.Tensor("r", "b", "c").from_slice(ctx, x0.shape, x0)
    bad = F.Tensor("r", "b", dtype="i64").from_slice(ctx, (3, 2), [4, 1, 2, 3, 4, 0])
    good = F.Tensor("b", "r", dtype="i64").from_slice(ctx, (3, 2), [4, 1, 2, 3, 4, 0])

    def fn(x, labels):
        return getattr(x, op)("c", labels, reduction="none")

    for run in (fn, F.compile(fn)):
        with pytest.raises(F.ShapeMismatch, match="labels: tag 'r' has size 3, expected 2"):
            run(x, bad)
    want = np.array([[4, 2, 4], [1, 3, 0]])  # good's labels in (r, b) order
    src = x0 if op == "cross_entropy" else x0.astype(np.float64)
    got = fn(x, good).numpy()
    picked = np.take_along_axis(src, want[..., None], axis=-1)[..., 0]
    if op == "cross_entropy":
        ref = np.log(np.exp(x0.astype(np.float64)).sum(-1)) - picked
    else:
        ref = -picked
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
