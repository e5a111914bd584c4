"""The contraction engine: GEMM orientation from strides, copies, matmul, add_dot."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import fucina as F
from fucina.kernels import gemm


def _plan(a: np.ndarray, la, b: np.ndarray, lb, lo):
    return gemm.plan(a.shape, tuple(s // a.itemsize for s in a.strides), la,
                     b.shape, tuple(s // b.itemsize for s in b.strides), lb, lo)


# -- orientation and the copy-count guarantee ------------------------------------------


@pytest.mark.parametrize("a_layout,b_layout,orientation", [
    ("mk", "kn", "plain"),
    ("km", "kn", "trans_a"),
    ("mk", "nk", "trans_b"),
    ("km", "nk", "trans_ab"),
])
def test_orientation_read_from_strides(a_layout, b_layout, orientation):
    rng = np.random.default_rng(0)
    M, K, N = 5, 7, 3
    sizes = {"m": M, "k": K, "n": N}
    a_store = rng.standard_normal([sizes[c] for c in a_layout]).astype(np.float32)
    b_store = rng.standard_normal([sizes[c] for c in b_layout]).astype(np.float32)
    # Logical views [m, k] and [k, n] over whatever storage order was chosen.
    a = a_store if a_layout == "mk" else a_store.T
    b = b_store if b_layout == "kn" else b_store.T
    p = _plan(a, (0, 1), b, (1, 2), (0, 2))
    assert p.orientation == orientation
    assert p.copies == ()  # one orientation always serves: nothing is copied
    got = gemm.contract(a, b, (0, 1), (1, 2), (0, 2), np.dtype(np.float32))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_operand_without_unit_stride_is_copied_once():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((8, 12)).astype(np.float32)
    a = base[::2, ::3]  # no unit stride in either axis
    b = rng.standard_normal((4, 6)).astype(np.float32)
    p = _plan(a, (0, 1), b, (1, 2), (0, 2))
    assert p.copies == ("a",)
    np.testing.assert_allclose(gemm.contract(a, b, (0, 1), (1, 2), (0, 2), np.float32),
                               a @ b, rtol=1e-5, atol=1e-5)


def test_batch_axes_collapse_and_attention_layout():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)   # b h q d
    k = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)   # b h k d
    p = _plan(q, (0, 1, 2, 3), k, (0, 1, 4, 3), (0, 1, 2, 4))
    assert p.orientation == "trans_b" and p.copies == ()
    assert p.batch_sizes == (6,)  # b and h fold into one batched-GEMM axis, zero-copy
    got = gemm.contract(q, k, (0, 1, 2, 3), (0, 1, 4, 3), (0, 1, 2, 4), np.float32)
    np.testing.assert_allclose(got, np.einsum("bhqd,bhkd->bhqk", q, k), rtol=1e-5, atol=1e-5)
    kh = np.swapaxes(np.ascontiguousarray(np.swapaxes(k, 0, 1)), 0, 1)  # h outer in memory
    p2 = _plan(q, (0, 1, 2, 3), kh, (0, 1, 4, 3), (0, 1, 2, 4))
    assert p2.batch_sizes == (2, 3) and p2.copies == ()  # cannot fold: stays a 2-axis stack
    got = gemm.contract(q, kh, (0, 1, 2, 3), (0, 1, 4, 3), (0, 1, 2, 4), np.float32)
    np.testing.assert_allclose(got, np.einsum("bhqd,bhkd->bhqk", q, kh), rtol=1e-5, atol=1e-5)


def test_every_stride_orientation_of_a_batched_contraction():
    rng = np.random.default_rng(3)
    sizes = {"b": 2, "m": 3, "k": 4, "n": 5}
    for pa in itertools.permutations("bmk"):
        for pb in itertools.permutations("bkn"):
            a_store = rng.standard_normal([sizes[c] for c in pa]).astype(np.float32)
            b_store = rng.standard_normal([sizes[c] for c in pb]).astype(np.float32)
            a = np.transpose(a_store, [pa.index(c) for c in "bmk"])
            b = np.transpose(b_store, [pb.index(c) for c in "bkn"])
            p = _plan(a, (0, 1, 2), b, (0, 2, 3), (0, 1, 3))
            # Dense storage reads in place unless the batch axis is innermost in memory
            # (then no matrix axis has unit stride): that operand is copied, once.
            want = tuple(n for n, st in (("a", pa), ("b", pb)) if st[-1] == "b")
            assert p.copies == want
            got = gemm.contract(a, b, (0, 1, 2), (0, 2, 3), (0, 1, 3), np.float32)
            np.testing.assert_allclose(got, np.einsum("bmk,bkn->bmn", a, b), rtol=1e-5,
                                       atol=1e-5)


# -- the facade -------------------------------------------------------------------------


def test_dot_with_output_major_weight(ctx):
    a = F.Tensor("m", "k").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])
    b = F.Tensor("n", "k").from_slice(ctx, (2, 3), [7, 9, 11, 8, 10, 12])
    np.testing.assert_array_equal(a.dot(b, "k").data_const(), [58, 64, 139, 154])
    fast = F.compile(lambda a, b: a.dot(b, "k"))
    assert "gemm trans_b" in fast.ir(a, b) and "copied=none" in fast.ir(a, b)


def test_contractions_on_permuted_views_match_numpy(ctx):
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((4, 3, 5)).astype(np.float32)
    w0 = rng.standard_normal((5, 6)).astype(np.float32)
    x = F.Tensor("a", "b", "c").from_slice(ctx, x0.shape, x0)
    w = F.Tensor("c", "d").from_slice(ctx, w0.shape, w0)
    for perm in itertools.permutations(("a", "b", "c")):
        xv = x.permute_to(perm)
        got = xv.dot(w.permute_to(("d", "c")), "c")
        want = np.einsum("abc,cd->abd", x0, w0)
        order = [("a", "b").index(t) for t in got.axis_tags[:2]]
        np.testing.assert_allclose(got.numpy(), np.transpose(want, order + [2]), rtol=1e-5,
                                   atol=1e-5)


def test_vector_and_scalar_results(ctx):
    v = F.Tensor("d").from_slice(ctx, (3,), [1, 2, 3])
    m = F.Tensor("r", "d").from_slice(ctx, (2, 3), [1, 0, 0, 0, 1, 1])
    assert v.dot(v, "d").item() == 14
    np.testing.assert_array_equal(m.dot(v, "d").numpy(), [1, 5])
    np.testing.assert_array_equal(v.dot(m, "d").numpy(), [1, 5])


def test_matmul_kinds(ctx):
    x = F.Tensor("m", "k").from_slice(ctx, (1, 2), [1, 2])
    w = F.Tensor("n", "k").from_slice(ctx, (2, 2), [3, 4, 5, 6])
    np.testing.assert_array_equal(x.matmul(w, "trans_b", ("m", "n")).data_const(), [11, 17])
    with pytest.raises(F.TagError, match="trans_a"):
        x.matmul(w, "trans_a", ("m", "n"))
    rng = np.random.default_rng(5)
    a0 = rng.standard_normal((3, 4, 2)).astype(np.float32)
    b0 = rng.standard_normal((4, 5)).astype(np.float32)
    a = F.Tensor("b", "k", "m").from_slice(ctx, a0.shape, a0)
    b = F.Tensor("k", "n").from_slice(ctx, b0.shape, b0)
    y = a.matmul(b, "trans_a", ("b", "m", "n"))  # batch broadcast over a rank-2 RHS
    np.testing.assert_allclose(y.numpy(), np.swapaxes(a0, 1, 2) @ b0, rtol=1e-5, atol=1e-5)
    with pytest.raises(F.ShapeMismatch):
        x.matmul(F.Tensor("k", "n").zeros(ctx, (3, 2)), "plain", ("m", "n"))


def test_add_dot(ctx):
    residual = F.Tensor("t", "out").from_slice(ctx, (2, 2), [1, 1, 2, 2])
    a = F.Tensor("t", "in").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    w = F.Tensor("in", "out").from_slice(ctx, (2, 2), [5, 6, 7, 8])
    np.testing.assert_array_equal(residual.add_dot(a, w, "in").data_const(), [20, 23, 45, 52])
    with pytest.raises(F.TagError):
        residual.add_dot(a, w.permute_to(("out", "in")), "in")


def test_typed_dtype_policy(ctx):
    h = F.Tensor("m", "k", dtype="f16").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    g = F.Tensor("k", "n", dtype="f16").from_slice(ctx, (2, 2), [1, 0, 0, 1])
    y = h.dot(g, "k")
    assert y.dtype is F.f16
    np.testing.assert_array_equal(y.numpy(), [[1, 2], [3, 4]])
    bf = F.Tensor("k", "n").from_slice(ctx, (2, 2), [1, 0, 0, 1]).to("bf16")
    hb = F.Tensor("m", "k").from_slice(ctx, (2, 2), [1, 2, 3, 4]).to("bf16")
    yb = hb.dot(bf, "k")
    assert yb.dtype is F.bf16
    np.testing.assert_array_equal(yb.to("f32").numpy(), [[1, 2], [3, 4]])


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_a_16_bit_operands_dropped_axis_sums_in_f32(ctx, dt):
    # Regression: a private axis the output drops was summed and narrowed back to the
    # operand's dtype before the contraction: 4 x 40000 overflowed f16 to inf, and the
    # small terms of [1, 2^-12, 2^-12, 0] were rounded away. The contraction widens 16-bit
    # operands and narrows once.
    a = F.Tensor("m").from_slice(ctx, (2,), [1.0, 2.0])
    b = F.Tensor("m", "s").from_slice(ctx, (2, 4), np.full((2, 4), 40000.0)).to(dt)
    big = 40000.0 if dt == "f16" else float(np.float32(b.to("f32").numpy()[0, 0]))
    for run in (lambda a, b: a.einsum(b, ("m",)), F.compile(lambda a, b: a.einsum(b, ("m",))),
                lambda a, b: F.einsum_many(("m",), [a, b])):
        np.testing.assert_array_equal(run(a, b).numpy(), [4 * big, 8 * big])
    small = F.Tensor("m", "s").from_slice(ctx, (2, 4), [[1, 2**-12, 2**-12, 0]] * 2).to(dt)
    np.testing.assert_array_equal(a.einsum(small, ("m",)).numpy(),
                                  [1 + 2**-11, 2 * (1 + 2**-11)])


def test_contraction_gradients_match_torch(ctx):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    a0 = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w0 = rng.standard_normal((5, 4)).astype(np.float32)
    a = F.Tensor("b", "t", "in").variable_from_slice(ctx, a0.shape, a0)
    w = F.Tensor("out", "in").variable_from_slice(ctx, w0.shape, w0)
    g0 = rng.standard_normal((2, 3, 5)).astype(np.float32)
    y = a.permute_to(("in", "t", "b")).dot(w, "in")
    y.backward_with_grad(type(y).from_slice(ctx, y.shape, np.transpose(g0, (1, 0, 2))))
    at = torch.tensor(a0, requires_grad=True)
    wt = torch.tensor(w0, requires_grad=True)
    (at @ wt.T).backward(torch.tensor(g0))
    np.testing.assert_allclose(a.grad().numpy(), at.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad().numpy(), wt.grad.numpy(), rtol=1e-5, atol=1e-5)

    x = F.Tensor("b", "k", "m").variable_from_slice(ctx, (2, 4, 3), rng.standard_normal(
        (2, 4, 3)))
    r = F.Tensor("k", "n").variable_from_slice(ctx, (4, 5), rng.standard_normal((4, 5)))
    x.matmul(r, "trans_a", ("b", "m", "n")).sum_all().backward()
    xt = torch.tensor(x.numpy(), requires_grad=True)
    rt = torch.tensor(r.numpy(), requires_grad=True)
    (xt.transpose(1, 2) @ rt).sum().backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r.grad().numpy(), rt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_compiled_linear_epilogue_is_one_kernel(ctx):
    rng = np.random.default_rng(7)
    x = F.Tensor("b", "in").from_slice(ctx, (4, 6), rng.standard_normal((4, 6)))
    w = F.Tensor("out", "in").from_slice(ctx, (5, 6), rng.standard_normal((5, 6)))
    bias = F.Tensor("out").from_slice(ctx, (5,), rng.standard_normal(5))

    def linear(x, w, bias):
        return x.dot(w, "in").add(bias).tanh()

    fast = F.compile(linear)
    np.testing.assert_allclose(fast(x, w, bias).numpy(), linear(x, w, bias).numpy(),
                               rtol=1e-5, atol=1e-6)
    assert len(fast.kernels(x, w, bias)) == 1  # bias + activation fuse after the GEMM
    text = fast.ir(x, w, bias)
    assert "gemm trans_b" in text and "copied=none" in text
