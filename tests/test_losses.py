"""cross_entropy against torch (values and gradients, every option)."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("ignore", [None, 1])
def test_cross_entropy_matches_torch(reduction, smoothing, ignore):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((4, 3, 5)).astype(np.float32)  # batch, class, seq
    labels = rng.integers(0, 3, (4, 5))
    ctx = F.ExecContext()
    x = F.Tensor("batch", "class", "seq").variable_from_slice(ctx, x0.shape, x0)
    loss = x.cross_entropy("class", labels.reshape(-1), reduction=reduction,
                           ignore_index=ignore, label_smoothing=smoothing)
    xt = torch.tensor(x0, requires_grad=True)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    if ignore is not None:
        kw["ignore_index"] = ignore
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(labels), **kw)
    np.testing.assert_allclose(loss.numpy().reshape(lt.shape), lt.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    if reduction == "none":
        assert loss.axis_tags == ("batch", "seq")
        g = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
        loss.backward_with_grad(type(loss).from_slice(ctx, (4, 5), g))
        lt.backward(torch.tensor(g))
    else:
        assert loss.axis_tags == ()
        loss.backward()
        lt.backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_cross_entropy_api_example_and_errors():
    ctx = F.ExecContext()
    logits = F.Tensor("batch", "class").variable_from_slice(ctx, (2, 3), np.zeros((2, 3)))
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
