"""The adjoint of a view accumulates where windows overlap (conv-style views).

Affine views (the ``view`` primitive) and explicit strided views may read one
element many times; its gradient is the sum over every position that read
it. Checked eager and compiled against a numpy scatter-add oracle.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fucina as F
from fucina.ir.execute import emit


def _affine(x, tags, shape, coeffs, base):
    """An affine view of ``x`` (in_index = base + coeffs^T out_index) as a tensor."""
    node = emit("view", (x._node,), shape=tuple(shape), coeffs=tuple(map(tuple, coeffs)),
                base=tuple(base))
    return F.Tensor(*tags)._from_node(node, x._ctx)


def _grad(loss_fn, x0, tags, compiled):
    ctx = F.ExecContext()
    x = F.Tensor(*tags).variable_from_slice(ctx, x0.shape, x0)

    def step(x):
        loss = loss_fn(x)
        loss.backward()
        return loss

    (F.compile(step) if compiled else step)(x)
    return x.grad().numpy()


def _oracle(in_shape, shape, coeffs, base, g):
    """numpy: scatter-add g[p] into position base + coeffs^T p, for every p."""
    out = np.zeros(in_shape, dtype=np.float64)
    c = np.array(coeffs, dtype=np.int64).reshape(len(shape), len(in_shape))
    for p in np.ndindex(*shape):
        out[tuple(np.array(base) + np.array(p) @ c)] += g[p]
    return out


def test_overlapping_windows_accumulate():
    # Windows of 3 over 5 elements: element i is read by min(i+1, 3, 5-i) windows.
    x0 = np.arange(5, dtype=np.float32)

    def loss(x):
        return _affine(x, ("w", "k"), (3, 3), [[1], [1]], [0]).sum_all()

    for compiled in (False, True):
        np.testing.assert_array_equal(_grad(loss, x0, ("t",), compiled), [1, 2, 3, 2, 1])

    def strided(x):
        return x.view_with_strides(("w", "k"), (3, 3), (1, 1)).sum_all()

    for compiled in (False, True):
        np.testing.assert_array_equal(_grad(strided, x0, ("t",), compiled), [1, 2, 3, 2, 1])


@st.composite
def _affine_case(draw):
    in_rank = draw(st.integers(1, 3))
    out_rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(out_rank)]
    coeffs = [[draw(st.integers(0, 2)) for _ in range(in_rank)] for _ in range(out_rank)]
    base = [draw(st.integers(0, 2)) for _ in range(in_rank)]
    in_shape = [base[j] + sum((shape[k] - 1) * coeffs[k][j] for k in range(out_rank))
                + 1 + draw(st.integers(0, 2)) for j in range(in_rank)]
    return in_shape, shape, coeffs, base, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None)
@given(_affine_case())
def test_random_affine_view_adjoint_matches_scatter_add(case):
    in_shape, shape, coeffs, base, seed = case
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(in_shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    in_tags = tuple(f"i{j}" for j in range(len(in_shape)))
    out_tags = tuple(f"o{k}" for k in range(len(shape)))
    want = _oracle(in_shape, shape, coeffs, base, g)

    def loss(x):
        v = _affine(x, out_tags, shape, coeffs, base)
        return v.mul(F.Tensor(*out_tags).from_slice(x._ctx, tuple(shape), g)).sum_all()

    for compiled in (False, True):
        np.testing.assert_allclose(_grad(loss, x0, in_tags, compiled), want, rtol=1e-5,
                                   atol=1e-5)


@st.composite
def _strided_case(draw):
    rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    strides = [draw(st.integers(0, 4)) for _ in range(rank)]
    extent = sum((d - 1) * s for d, s in zip(shape, strides)) + 1
    n = extent + draw(st.integers(0, 3))
    return n, shape, strides, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None)
@given(_strided_case())
def test_random_strided_view_adjoint_matches_scatter_add(case):
    n, shape, strides, seed = case
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    tags = tuple(f"o{k}" for k in range(len(shape)))
    want = _oracle((n,), shape, [[s] for s in strides], [0], g)

    def loss(x):
        v = x.view_with_strides(tags, tuple(shape), tuple(strides))
        return v.mul(F.Tensor(*tags).from_slice(x._ctx, tuple(shape), g)).sum_all()

    for compiled in (False, True):
        np.testing.assert_allclose(_grad(loss, x0, ("t",), compiled), want, rtol=1e-5,
                                   atol=1e-5)
