"""cross_entropy's labels: host sequences, and integer tensors (a traced input under
compile: new labels never retrace). Needs no torch: the list form is the oracle here,
and test_losses.py checks the list form against torch."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

L = F.Tensor("batch", "class")
LABELS = F.Tensor("batch", dtype="i64")


def test_cross_entropy_api_example_and_errors():
    ctx = F.ExecContext()
    logits = L.variable_from_slice(ctx, (2, 3), np.zeros((2, 3)))
    loss = logits.cross_entropy("class", [2, 0])
    np.testing.assert_allclose(loss.item(), np.log(3), rtol=1e-6)  # uniform logits: ln K
    loss.backward()
    assert logits.grad() is not None
    with pytest.raises(F.IndexOutOfBounds):
        logits.cross_entropy("class", [3, 0])
    with pytest.raises(F.InvalidShape):
        logits.cross_entropy("class", [1])
    with pytest.raises(F.TagError):
        logits.cross_entropy("nope", [1, 0])
    all_ignored = logits.cross_entropy("class", [1, 1], ignore_index=1)
    assert all_ignored.item() == 0.0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("ignore", [None, 1])
def test_tensor_labels_equal_the_list_form(ctx, reduction, smoothing, ignore):
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((4, 3)).astype(np.float32)
    labels = [2, 1, 0, 1]
    kw = {"reduction": reduction, "label_smoothing": smoothing, "ignore_index": ignore}
    grads, values = [], []
    for lab in (labels, LABELS.from_slice(ctx, (4,), labels)):
        x = L.variable_from_slice(ctx, (4, 3), x0)
        loss = x.cross_entropy("class", lab, **kw)
        values.append(loss.numpy())
        (loss.sum_all() if reduction == "none" else loss).backward()
        grads.append(x.grad().numpy())
    np.testing.assert_allclose(values[1], values[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6, atol=1e-7)


def test_tensor_labels_in_other_layouts(ctx):
    x = F.Tensor("b", "class", "t").from_slice(ctx, (2, 3, 2), np.arange(12, dtype=np.float32))
    want = x.cross_entropy("class", [0, 2, 1, 1]).item()
    by_tags = F.Tensor("t", "b", dtype="i32").from_slice(ctx, (2, 2), [[0, 1], [2, 1]])
    flat = F.Tensor("p", dtype="i64").from_slice(ctx, (4,), [0, 2, 1, 1])
    np.testing.assert_allclose(x.cross_entropy("class", by_tags).item(), want, rtol=1e-6)
    np.testing.assert_allclose(x.cross_entropy("class", flat).item(), want, rtol=1e-6)
    with pytest.raises(F.InvalidShape):
        x.cross_entropy("class", F.Tensor("p", dtype="i64").from_slice(ctx, (3,), [0, 1, 2]))
    with pytest.raises(F.InvalidDataLength):
        x.cross_entropy("class", F.Tensor("p").from_slice(ctx, (4,), [0.0, 1.0, 2.0, 1.0]))


def test_compiled_tensor_labels_never_retrace_and_check_ranges(ctx):
    x = L.from_slice(ctx, (3, 3), np.arange(9, dtype=np.float32) / 4)
    fast = F.compile(lambda x, y: x.cross_entropy("class", y))
    for labels in ([0, 1, 2], [2, 2, 0], [1, 0, 1]):
        y = LABELS.from_slice(ctx, (3,), labels)
        np.testing.assert_allclose(fast(x, y).item(), x.cross_entropy("class", labels).item(),
                                   rtol=1e-6)
    assert fast.cache_size() == 1
    for bad in (3, -1):
        y = LABELS.from_slice(ctx, (3,), [0, bad, 1])
        for f in (lambda x, y: x.cross_entropy("class", y), fast):
            with pytest.raises(F.IndexOutOfBounds, match=f"index {bad} out of range for "
                                                         "'class' of size 3"):
                f(x, y)
