"""Selection (REFERENCE §4.16) against torch: top_k, sort, argsort and the router's
softmax top-k; values, indices and gradients, eager and compiled."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_grads import check_op

import fucina as F

torch = pytest.importorskip("torch")


def _distinct(seed, shape):
    """Values with no ties (index order is then unambiguous)."""
    rng = np.random.default_rng(seed)
    return (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.37 - 5).astype(np.float32)


@pytest.mark.parametrize("k", [1, 3, 20, 40])  # small k: candidate buffer; large: sort
def test_top_k_matches_torch(ctx, k):
    x0 = _distinct(0, (3, 40))
    check_op(ctx, [(("row", "col"), x0, True)], lambda x: x.top_k("col", k, "k").values,
             lambda x: torch.topk(x, k, dim=1).values)
    top = F.Tensor("row", "col").from_slice(ctx, x0.shape, x0).top_k("col", k, "k")
    assert top.values.axis_tags == ("row", "k") and top.indices.axis_tags == ("row", "k")
    assert top.indices.dtype is F.i64
    np.testing.assert_array_equal(top.indices.numpy(),
                                  torch.topk(torch.tensor(x0), k, dim=1).indices.numpy())


def test_top_k_along_a_middle_axis(ctx):
    x0 = _distinct(1, (2, 7, 3))
    check_op(ctx, [(("a", "e", "b"), x0, True)], lambda x: x.top_k("e", 2, "k").values,
             lambda x: torch.topk(x, 2, dim=1).values)
    top = F.Tensor("a", "e", "b").from_slice(ctx, x0.shape, x0).top_k("e", 2, "k")
    assert top.values.axis_tags == ("a", "k", "b")
    np.testing.assert_array_equal(top.indices.numpy(),
                                  torch.topk(torch.tensor(x0), 2, dim=1).indices.numpy())


@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_match_torch_stable(ctx, descending):
    rng = np.random.default_rng(2)
    x0 = rng.integers(0, 5, (4, 9)).astype(np.float32)  # many ties: stable order matters
    check_op(ctx, [(("r", "c"), x0, True)], lambda x: x.sort("c", descending).values,
             lambda x: torch.sort(x, dim=1, descending=descending, stable=True).values)
    x = F.Tensor("r", "c").from_slice(ctx, x0.shape, x0)
    want = torch.sort(torch.tensor(x0), dim=1, descending=descending, stable=True).indices
    np.testing.assert_array_equal(x.sort("c", descending).indices.numpy(), want.numpy())
    np.testing.assert_array_equal(x.argsort("c", descending).numpy(), want.numpy())
    fast = F.compile(lambda t: t.argsort("c", descending))
    np.testing.assert_array_equal(fast(x).numpy(), want.numpy())


def test_sort_over_first_axis_matches_torch(ctx):
    x0 = _distinct(3, (6, 4))
    check_op(ctx, [(("r", "c"), x0, True)], lambda x: x.sort("r", True).values,
             lambda x: torch.sort(x, dim=0, descending=True).values)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("k", [2, 8])
def test_router_top_k_matches_torch(ctx, normalize, k):
    x0 = _distinct(4, (5, 8))
    probs = torch.softmax(torch.tensor(x0, dtype=torch.float64), dim=1)
    w, i = torch.topk(probs, k, dim=1)
    if normalize:
        w = w / w.sum(dim=1, keepdim=True)
    sel, wts = F.Tensor("tok", "expert").from_slice(ctx, x0.shape, x0).router_top_k(
        "expert", k, normalize_selected=normalize)
    np.testing.assert_array_equal(sel.reshape(5, k), i.numpy())
    np.testing.assert_allclose(wts.reshape(5, k), w.numpy(), rtol=1e-6, atol=1e-7)
