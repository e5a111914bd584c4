"""Gradients of views, structural ops and basic math against PyTorch.

Each case builds the op on a variable, contracts the result with fixed
random weights (so every output element's gradient differs) and compares
d loss / d input with torch's autograd on the same program.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import check_against_torch

import fucina as F

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


def _weights(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _check(ctx, tags, shape, fu_op, torch_op, *, atol=1e-5):
    """Forward values and input gradients of fu_op vs torch_op on random data of ``shape``."""
    data = RNG.standard_normal(shape).astype(np.float32)
    check_against_torch(ctx, tags, data, fu_op, torch_op, rng=RNG, rtol=1e-7, atol=atol)




def test_permute_and_align(ctx):
    _check(ctx, ("a", "b", "c"), (2, 3, 4), lambda x: x.permute_to(("c", "a", "b")),
           lambda t: t.permute(2, 0, 1))
    _check(ctx, ("a", "b"), (2, 3), lambda x: x.align_to(("b", "z", "a")).materialize(),
           lambda t: t.permute(1, 0).unsqueeze(1))


def test_split_merge_flatten_reshape(ctx):
    _check(ctx, ("s", "q"), (2, 6), lambda x: x.split("q", ("h", "d"), (2, 3)),
           lambda t: t.reshape(2, 2, 3))
    _check(ctx, ("s", "h", "d"), (2, 2, 3), lambda x: x.merge("q", ("h", "d")),
           lambda t: t.reshape(2, 6))
    _check(ctx, ("a", "b"), (3, 4), lambda x: x.permute_to(("b", "a")).flatten("f"),
           lambda t: t.t().reshape(-1))
    _check(ctx, ("a", "b"), (3, 4), lambda x: x.reshape(("p", "q", "r"), (2, 3, 2)),
           lambda t: t.reshape(2, 3, 2))


def test_narrow_select_slice_step_diagonal(ctx):
    _check(ctx, ("a", "b"), (4, 5), lambda x: x.narrow("b", 1, 3), lambda t: t[:, 1:4])
    _check(ctx, ("a", "b"), (4, 5), lambda x: x.select("a", -1), lambda t: t[-1])
    _check(ctx, ("a", "b"), (4, 5), lambda x: x.slice(a=slice(1, None), b=slice(None, None, 2)),
           lambda t: t[1:, ::2])
    _check(ctx, ("a", "b"), (4, 7), lambda x: x.slice_step("b", 1, 3, 2), lambda t: t[:, 1:7:2])
    _check(ctx, ("a", "b", "c"), (3, 4, 3), lambda x: x.diagonal("a", "c", "d"),
           lambda t: torch.diagonal(t, dim1=0, dim2=2))
    _check(ctx, ("a", "b"), (3, 3), lambda x: x.trace("a", "b"), lambda t: torch.trace(t))


def test_broadcast_and_binary(ctx):
    b0 = RNG.standard_normal((4,)).astype(np.float32)
    bias = F.Tensor("d").from_slice(ctx, (4,), b0)
    _check(ctx, ("n", "d"), (3, 4), lambda x: x.add(bias), lambda t: t + torch.tensor(b0))
    _check(ctx, ("n", "d"), (3, 4), lambda x: x.mul(x), lambda t: t * t)
    _check(ctx, ("n", "d"), (3, 4), lambda x: x.div(bias), lambda t: t / torch.tensor(b0))
    _check(ctx, ("n", "d"), (3, 4), lambda x: bias.sub(x), lambda t: (torch.tensor(b0) - t).t())
    _check(ctx, ("n", "d"), (3, 4), lambda x: x.broadcast_to(("n", "d", "k"), (3, 4, 2)),
           lambda t: t.unsqueeze(-1).expand(3, 4, 2))
    _check(ctx, ("n",), (5,), lambda x: (x * 3.0 - 1.0) / 2.0 + 0.5,
           lambda t: (t * 3 - 1) / 2 + 0.5)
    _check(ctx, ("n",), (5,), lambda x: 2.0 / (x * x + 1.0), lambda t: 2 / (t * t + 1))
    _check(ctx, ("n",), (5,), lambda x: x ** 3, lambda t: t ** 3, atol=1e-4)


def test_maximum_ties_split_gradient(ctx):
    x = F.Tensor("d").variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    y = F.Tensor("d").from_slice(ctx, (3,), [1.0, 5.0, 0.0])
    x.maximum(y).sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [0.5, 0.0, 1.0])
    xt = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    torch.maximum(xt, torch.tensor([1.0, 5.0, 0.0])).sum().backward()
    np.testing.assert_array_equal(x.grad().numpy(), xt.grad.numpy())


def test_reductions(ctx):
    _check(ctx, ("a", "b", "c"), (2, 3, 4), lambda x: x.sum("b"), lambda t: t.sum(1))
    _check(ctx, ("a", "b", "c"), (2, 3, 4), lambda x: x.mean("c"), lambda t: t.mean(2))
    _check(ctx, ("a", "b", "c"), (2, 3, 4), lambda x: x.sum_many(("a", "c")),
           lambda t: t.sum((0, 2)))


def test_gather_family(ctx):
    _check(ctx, ("r", "c"), (4, 3), lambda x: x.gather("r", [3, 0, 3], "s"),
           lambda t: t[[3, 0, 3]])
    _check(ctx, ("r", "c"), (4, 3), lambda x: x.flip("c"), lambda t: t.flip(1))
    _check(ctx, ("r", "c"), (4, 3), lambda x: x.roll("r", -1), lambda t: t.roll(-1, 0))
    _check(ctx, ("r", "c"), (2, 3), lambda x: x.repeat_axis("c", 3), lambda t: t.repeat(1, 3))
    _check(ctx, ("r", "c"), (4, 3), lambda x: x.pad("c", 1, 2, 9.0),
           lambda t: torch.nn.functional.pad(t, (1, 2), value=9.0))
    _check(ctx, ("h", "w"), (3, 4), lambda x: x.zero_pad2d("h", "w", (1, -1, 0, 2)),
           lambda t: torch.nn.functional.pad(t, (1, -1, 0, 2)))
    _check(ctx, ("r", "c"), (3, 2), lambda x: x.concat("r", [x]), lambda t: torch.cat([t, t]))
    _check(ctx, ("r", "c"), (3, 2), lambda x: x.stack("s", 1, [x.scale(2.0)]),
           lambda t: torch.stack([t, t * 2], 1))
    _check(ctx, ("r", "c"), (4, 3), lambda x: x.zero_rows("r", [1, 3]),
           lambda t: t * torch.tensor([1.0, 0, 1, 0]).unsqueeze(1))


def test_set_rows_and_index_add(ctx):
    u0 = RNG.standard_normal((2, 3)).astype(np.float32)
    u = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), u0)
    x = F.Tensor("r", "c").variable_from_slice(ctx, (4, 3), np.ones((4, 3)))
    w = _weights((4, 3))
    x.set_rows("r", [3, 1], u).mul(F.Tensor("r", "c").from_slice(ctx, (4, 3), w)) \
        .sum_all().backward()
    ut = torch.tensor(u0, requires_grad=True)
    xt = torch.ones(4, 3, requires_grad=True)
    out = xt.index_copy(0, torch.tensor([3, 1]), ut)
    (out * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy())
    np.testing.assert_allclose(u.grad().numpy(), ut.grad.numpy())

    u.zero_grad()
    y = F.Tensor("r", "c").from_slice(ctx, (4, 3), np.zeros((4, 3)))
    y.index_add("r", [1, 1], u).mul(F.Tensor("r", "c").from_slice(ctx, (4, 3), w)) \
        .sum_all().backward()
    np.testing.assert_allclose(u.grad().numpy(), np.stack([w[1], w[1]]), rtol=1e-6)


def test_take_along_and_scatter(ctx):
    idx0 = np.array([[2, 0, 1], [1, 1, 0]], dtype=np.int64)
    idx = F.Tensor("r", "c", dtype="i64").from_slice(ctx, (2, 3), idx0)
    _check(ctx, ("r", "c"), (2, 3), lambda x: x.take_along_axis("c", idx),
           lambda t: torch.gather(t, 1, torch.tensor(idx0)))
    base = F.Tensor("r", "c").from_slice(ctx, (2, 3), np.zeros((2, 3)))
    _check(ctx, ("r", "c"), (2, 3), lambda x: base.scatter_add("c", idx, x),
           lambda t: torch.zeros(2, 3).scatter_add(1, torch.tensor(idx0), t))


def test_masked_ops(ctx):
    m0 = np.array([[True, False, True], [False, False, True]])
    mask = F.Tensor("r", "c", dtype="bool").from_slice(ctx, (2, 3), m0)
    _check(ctx, ("r", "c"), (2, 3), lambda x: x.masked_select(mask, "k"),
           lambda t: torch.masked_select(t, torch.tensor(m0)))
    vals0 = np.array([7.0, 8.0, 9.0], dtype=np.float32)
    vals = F.Tensor("k").from_slice(ctx, (3,), vals0)
    _check(ctx, ("r", "c"), (2, 3), lambda x: x.masked_scatter(mask, "k", vals),
           lambda t: t.masked_scatter(torch.tensor(m0), torch.tensor(vals0)))


def test_roll_by_and_shift_by(ctx):
    def torch_roll_by(t, offs):
        return torch.stack([row.roll(int(o)) for row, o in zip(t, offs)])

    _check(ctx, ("r", "c"), (3, 4), lambda x: x.roll_by("c", [1, -1, 2]),
           lambda t: torch_roll_by(t, [1, -1, 2]))
    x = F.Tensor("r", "c").from_slice(ctx, (2, 4), np.arange(8))
    np.testing.assert_array_equal(x.shift_by("c", [1, -2], -1.0).numpy(),
                                  [[-1, 0, 1, 2], [6, 7, -1, -1]])


def test_diag_embed_and_diag(ctx):
    _check(ctx, ("b", "v"), (2, 3), lambda x: x.diag_embed("v", ("i", "j")),
           lambda t: torch.diag_embed(t))
    _check(ctx, ("v",), (3,), lambda x: x.diag(("i", "j")), lambda t: torch.diag(t))


def test_contractions(ctx):
    w0 = RNG.standard_normal((5, 3)).astype(np.float32)
    w = F.Tensor("o", "i").from_slice(ctx, (5, 3), w0)
    _check(ctx, ("b", "i"), (2, 3), lambda x: x.dot(w, "i"), lambda t: t @ torch.tensor(w0).T,
           atol=1e-4)
    _check(ctx, ("b", "i", "e"), (2, 3, 4), lambda x: x.einsum(w, ("o", "b")),
           lambda t: torch.einsum("bie,oi->ob", t, torch.tensor(w0)), atol=1e-4)
    _check(ctx, ("i",), (3,), lambda x: x.dot(x, "i"), lambda t: t @ t, atol=1e-4)


def test_gradient_accumulates_and_zero_grad(ctx):
    x = F.Tensor("d").variable_from_slice(ctx, (2,), [1.0, 2.0])
    x.mul(x).sum_all().backward()
    held = x.grad_view()
    x.mul(x).sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [4.0, 8.0])
    np.testing.assert_array_equal(held.numpy(), [2.0, 4.0])  # stale view, fresh accumulator
    x.zero_grad()
    assert x.grad() is None


def test_f16_leaf_gets_f32_gradient(ctx):
    h = F.Tensor("d", dtype="f16").variable_from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    w = F.Tensor("d").from_slice(ctx, (3,), [0.5, 1.5, 2.5])
    h.to("f32").mul(w).sum_all().backward()
    g = h.grad()
    assert g.dtype is F.f32
    np.testing.assert_array_equal(g.numpy(), [0.5, 1.5, 2.5])


def test_mixed_rhs_dot_f32_by_f16(ctx):
    x = F.Tensor("b", "i").variable_from_slice(ctx, (2, 3), np.arange(6))
    w16 = F.Tensor("o", "i", dtype="f16").from_slice(ctx, (2, 3), [1, 0, 1, 0, 1, 0])
    y = x.dot(w16, "i")
    assert y.dtype is F.f32
    np.testing.assert_array_equal(y.numpy(), [[2, 1], [8, 4]])
    y.sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [[1, 1, 1], [1, 1, 1]])
