"""Gradients against central finite differences (no torch needed), and contractions
against np.einsum over random role combinations (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from fd import fd_check
from hypothesis import given, settings
from hypothesis import strategies as st

import fucina as F


def _fd_check(tags, shape, build, seed=0, eps=1e-3, tol=2e-2):
    fd_check(F.ExecContext(), tags, shape, build, seed, eps, tol)


def test_fd_pointwise_and_reductions():
    _fd_check(("a", "b"), (2, 3), lambda x: x.mul(x).div(x.add_scalar(5.0)))
    _fd_check(("a", "b"), (3, 2), lambda x: x.maximum(x.scale(-0.5)).mean("a"))
    _fd_check(("a", "b", "c"), (2, 2, 3), lambda x: x.sum_many(("a", "c")).mul(x.sum("b")))


def test_fd_views_and_structure():
    _fd_check(("s", "q"), (2, 6),
              lambda x: x.split("q", ("h", "d"), (2, 3)).permute_to(("h", "s", "d"))
              .materialize().merge("m", ("s", "d")))
    _fd_check(("r", "c"), (3, 4),
              lambda x: x.slice(r=slice(0, None, 2)).roll("c", 1).pad("r", 1, 0, 2.0))
    _fd_check(("r", "c"), (3, 3), lambda x: x.gather("r", [2, 2, 0], "g").flip("c"))
    _fd_check(("r", "c"), (3, 3), lambda x: x.mul(x.diagonal("r", "c", "d")))


def test_fd_contractions():
    _fd_check(("b", "i", "j"), (2, 3, 2),
              lambda x: x.einsum(x.with_tags(("b", "k", "j")), ("b", "i", "k")))
    _fd_check(("i",), (4,), lambda x: x.dot(x, "i"))


# -- contractions against np.einsum --------------------------------------------------

_POOL = "abcdef"


@st.composite
def _contraction(draw):
    """Random left/right/out tag sets covering batch, contract, free and summed roles."""
    left = draw(st.lists(st.sampled_from(_POOL), min_size=1, max_size=4, unique=True))
    right = draw(st.lists(st.sampled_from(_POOL), min_size=1, max_size=4, unique=True))
    present = sorted(set(left) | set(right))
    out = draw(st.lists(st.sampled_from(present), max_size=len(present), unique=True))
    sizes = {t: draw(st.integers(1, 3)) for t in present}
    perm_l = draw(st.permutations(left))
    perm_r = draw(st.permutations(right))
    return list(perm_l), list(perm_r), out, sizes


@settings(max_examples=60, deadline=None)
@given(_contraction(), st.integers(0, 2**32 - 1))
def test_einsum_matches_numpy(case, seed):
    left, right, out, sizes = case
    rng = np.random.default_rng(seed)
    a0 = rng.standard_normal([sizes[t] for t in left]).astype(np.float32)
    b0 = rng.standard_normal([sizes[t] for t in right]).astype(np.float32)
    ctx = F.ExecContext()
    a = F.Tensor(*left).from_slice(ctx, a0.shape, a0)
    b = F.Tensor(*right).from_slice(ctx, b0.shape, b0)
    got = a.einsum(b, tuple(out))
    assert got.axis_tags == tuple(out)
    want = np.einsum(f"{''.join(left)},{''.join(right)}->{''.join(out)}",
                     a0.astype(np.float64), b0.astype(np.float64))
    np.testing.assert_allclose(got.numpy().reshape(want.shape), want, rtol=1e-4, atol=1e-4)


def test_dot_roles_and_shape_errors():
    ctx = F.ExecContext()
    a = F.Tensor("b", "m", "k").from_slice(ctx, (2, 3, 4), np.arange(24))
    w = F.Tensor("b", "k", "n").from_slice(ctx, (2, 4, 5), np.arange(40))
    c = a.dot(w, "k")
    assert c.axis_tags == ("b", "m", "n")
    np.testing.assert_allclose(c.numpy(), np.einsum("bmk,bkn->bmn", np.arange(24).reshape(
        2, 3, 4), np.arange(40).reshape(2, 4, 5)))
    v = F.Tensor("d").from_slice(ctx, (3,), [1, 2, 3])
    s = v.dot(v, "d")
    assert s.axis_tags == () and s.item() == 14
    with pytest.raises(F.ShapeMismatch):
        v.dot(F.Tensor("d").zeros(ctx, (2,)), "d")
    with pytest.raises(F.ShapeMismatch):  # batch sizes never broadcast in a dot
        a.dot(F.Tensor("b", "k").zeros(ctx, (1, 4)), "k")
    with pytest.raises(F.TagError):
        a.einsum(w, ("b", "zz"))


def test_einsum_many_matches_numpy():
    ctx = F.ExecContext()
    rng = np.random.default_rng(1)
    x0, y0, z0 = (rng.standard_normal(s).astype(np.float32) for s in [(2, 3), (3, 4), (4, 2)])
    x = F.Tensor("i", "j").from_slice(ctx, x0.shape, x0)
    y = F.Tensor("j", "k").from_slice(ctx, y0.shape, y0)
    z = F.Tensor("k", "l").from_slice(ctx, z0.shape, z0)
    r = F.einsum_many(("l", "i"), [x, y, z])
    np.testing.assert_allclose(r.numpy(), np.einsum("ij,jk,kl->li", x0, y0, z0), rtol=1e-5,
                               atol=1e-6)
    tr = F.einsum_many((), [F.Tensor("i", "i2").from_slice(ctx, (2, 2), [1, 2, 3, 4])])
    assert tr.item() == 10
