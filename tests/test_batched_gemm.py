"""The stacked small-matrix GEMM kernel: every orientation, ragged sizes, strided and
broadcast operands, against numpy (float64) and torch; eager == compiled through dot."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import fucina as F
from fucina.kernels import batched_gemm as bg

NB, M, N, K = 4, 37, 29, 20  # ragged: M % 6, N % 16 and K all non-trivial


def _stored(rng: np.random.Generator, shape: tuple[int, int, int], order: str,
            strided: bool) -> np.ndarray:
    """A [b, r, c] view stored row-major ("rc") or transposed ("cr"), optionally with a
    step of 2 along its last stored axis (no unit stride at all)."""
    b, r, c = shape
    store = (b, r, c) if order == "rc" else (b, c, r)
    full = rng.standard_normal(store[:2] + (store[2] * (2 if strided else 1),))
    x = full.astype(np.float32)[:, :, ::2] if strided else full.astype(np.float32)
    return x if order == "rc" else x.transpose(0, 2, 1)


def _ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("a_order,b_order,c_order,strided", [
    *[(a, b, c, False) for a, b, c in itertools.product(("rc", "cr"), repeat=3)],
    ("rc", "rc", "rc", True), ("cr", "cr", "cr", True)])
def test_every_orientation_matches_numpy(a_order, b_order, c_order, strided):
    rng = np.random.default_rng(0)
    a = _stored(rng, (NB, M, K), a_order, strided)
    b = _stored(rng, (NB, K, N), b_order, strided)
    out = np.full((NB, M, N) if c_order == "rc" else (NB, N, M), np.nan, np.float32)
    out = out if c_order == "rc" else out.transpose(0, 2, 1)
    assert bg.serves(a, b, out)
    got = bg.matmul(a, b, out)
    assert got is out
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,n,k", [(1, 16, 64), (6, 1, 300), (5, 17, 33), (64, 48, 64),
                                   (12, 32, 1), (256, 256, 64)])
def test_sizes_around_the_tiles(m, n, k):
    rng = np.random.default_rng(m * 1000 + n)
    nb = 2 + bg.MIN_WORK // (m * n * k)  # enough work to be served
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((nb, n, k)).astype(np.float32).transpose(0, 2, 1)  # k-major
    out = np.empty((nb, m, n), np.float32)
    if not bg.serves(a, b, out):
        pytest.fail(f"{(nb, m, n, k)} should be served by the stacked kernel")
    bg.matmul(a, b, out)
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-4 * max(1, k) ** 0.5)


def test_broadcast_and_offset_operands():
    rng = np.random.default_rng(1)
    big = rng.standard_normal((5, M + 3, K + 2)).astype(np.float32)
    a = big[1:4, 2:2 + M, 1:1 + K]                       # offset into a larger buffer
    w = rng.standard_normal((K, N)).astype(np.float32)
    b = np.broadcast_to(w, (3, K, N))                    # batch stride 0
    out = np.empty((3, M, N), np.float32)
    bg.matmul(a, b, out)
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-4)
    flipped = a[::-1, ::-1]                              # negative strides
    bg.matmul(flipped, b, out)
    np.testing.assert_allclose(out, _ref(flipped, b), rtol=1e-5, atol=1e-4)


def test_declines_what_it_does_not_serve():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, M, K))
    b = rng.standard_normal((4, K, N))
    out = np.empty((4, M, N))
    assert not bg.serves(a, b, out)                      # float64: BLAS
    bg.matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert not bg.serves(a32[:1], b32[:1], out[:1].astype(np.float32))  # one matrix
    big = np.empty((2, bg.MAX_DIM + 1, 8), np.float32)
    assert not bg.serves(big, np.empty((2, 8, 16), np.float32),
                         np.empty((2, bg.MAX_DIM + 1, 16), np.float32))
    same = np.zeros((4, 40, 40), np.float32)             # output aliases an operand
    assert not bg.serves(same, same[:, :, :40], same)


def test_checks_before_the_kernel_runs():
    a = np.ones((4, M, K), np.float32)
    b = np.ones((4, K, N), np.float32)
    with pytest.raises(ValueError, match="do not match"):
        bg.matmul(a, b, np.empty((4, M, N + 1), np.float32))
    ro = np.empty((4, M, N), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        bg.matmul(a, b, ro)


@pytest.fixture(scope="module")
def heads():
    ctx = F.ExecContext()
    q = F.Tensor("b", "h", "q", "d").randn(ctx, (2, 3, 40, 24), 1)
    k = F.Tensor("b", "h", "k", "d").randn(ctx, (2, 3, 40, 24), 2)
    v = F.Tensor("b", "h", "k", "d").randn(ctx, (2, 3, 40, 24), 3)
    return q, k, v


def test_attention_gemms_eager_compiled_numpy(heads):
    q, k, v = heads

    def attend(q, k, v):
        s = q.dot(k, "d")
        return s, s.dot(v, "k"), v.dot(s, "k")  # the last writes [b, h, d, q]

    fast = F.compile(attend)
    q0, k0, v0 = (x.numpy().astype(np.float64) for x in (q, k, v))
    s0 = np.einsum("bhqd,bhkd->bhqk", q0, k0)
    want = (s0, np.einsum("bhqk,bhkd->bhqd", s0, v0), np.einsum("bhkd,bhqk->bhdq", v0, s0))
    eager = attend(q, k, v)
    compiled = fast(q, k, v)
    for e, c, w in zip(eager, compiled, want):
        np.testing.assert_allclose(e.numpy(), w, rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(c.numpy(), e.numpy())


def test_attention_gemms_match_torch(heads):
    torch = pytest.importorskip("torch")
    q, k, v = heads
    tq, tk, tv = (torch.from_numpy(x.numpy()) for x in (q, k, v))
    scores = q.dot(k, "d")
    ts = tq @ tk.transpose(-1, -2)
    np.testing.assert_allclose(scores.numpy(), ts.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scores.dot(v, "k").numpy(), (ts @ tv).numpy(),
                               rtol=1e-4, atol=1e-3)


def test_two_batch_axes_that_do_not_fold():
    # attention's [batch, seq, head, hd] projections: batch and head strides do not fold
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 25, 3, 24)).astype(np.float32)   # [b, s, h, d]
    y = rng.standard_normal((2, 21, 3, 24)).astype(np.float32)
    a = x.transpose(0, 2, 1, 3)                                  # [b, h, s, d]
    b = y.transpose(0, 2, 3, 1)                                  # [b, h, d, t]
    out = np.empty((2, 3, 25, 21), np.float32)
    assert bg.serves(a, b, out)
    bg.matmul(a, b, out)
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-4)
    assert not bg.serves(a, b[:1], out)                          # numpy broadcasts these


def test_attention_from_token_major_projections():
    ctx = F.ExecContext()
    q = F.Tensor("batch", "seq", "head", "hd").randn(ctx, (2, 33, 3, 16), 4)
    k = F.Tensor("batch", "key", "head", "hd").randn(ctx, (2, 35, 3, 16), 5)
    fast = F.compile(lambda q, k: q.dot(k, "hd"))
    want = np.einsum("bshd,bkhd->bhsk", q.numpy().astype(np.float64),
                     k.numpy().astype(np.float64))
    eager = q.dot(k, "hd")
    np.testing.assert_allclose(eager.numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(fast(q, k).numpy(), eager.numpy())


def test_one_compiled_signature_for_every_layout():
    # the kernel sees flat read-only/writable spans: layouts, ranks and read-only
    # inputs must not compile new variants (41 of _product in one run before)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, M, K)).astype(np.float32)
    b = rng.standard_normal((4, K, N)).astype(np.float32)
    ro_a, ro_b = a.copy(), b.copy()
    ro_a.flags.writeable = ro_b.flags.writeable = False
    cases = [(a, b, np.empty((4, M, N), np.float32)),
             (ro_a, ro_b, np.empty((4, N, M), np.float32).transpose(0, 2, 1)),
             (np.asfortranarray(a), b[:, :, :16], np.empty((4, M, 16), np.float32)),
             (a.reshape(2, 2, M, K), b.reshape(2, 2, K, N)[:, :, :, ::-1],
              np.empty((2, 2, M, N), np.float32))]
    for x, y, out in cases:
        bg.matmul(x, y, out)
        np.testing.assert_allclose(out, _ref(x, y), rtol=1e-5, atol=1e-4)
    assert len(bg._stack.signatures) == 1
    assert len(bg._product.signatures) <= 1  # none when _stack came from the disk cache


def test_spans_of_views_into_larger_buffers():
    # a span covers exactly the view's reach, whatever the root buffer around it
    buf = np.arange(1000, dtype=np.float32)
    x = buf[100:400].reshape(3, 10, 10)[:, ::-2, 1:]
    flat, off = bg._span(x, False)
    assert not flat.flags.writeable and flat.flags.c_contiguous and flat.ndim == 1
    el = np.array(x.strides) // 4
    idx = np.indices(x.shape).reshape(x.ndim, -1)
    np.testing.assert_array_equal(flat[off + el @ idx], x.reshape(-1))
    assert flat.size == int(np.ptp(el @ idx)) + 1
    with pytest.raises(ValueError, match="outside its span"):
        bg._check_reach((1, 2, 6, 4, 16, 0, 0, 4, 4, 1, 0, 0, 64, 16, 1,
                         0, 0, 96, 16, 1), 24, 128, 192)


def test_operands_over_byte_buffers_and_strided_roots():
    # a float32 stack viewed from a uint8 buffer, and one whose base chain ends in a
    # strided array (as_strided): both spans are views of the right memory
    rng = np.random.default_rng(6)
    want_a = rng.standard_normal((4, M, K)).astype(np.float32)
    raw = np.zeros(want_a.nbytes + 8, np.uint8)
    a = raw[8:].view(np.float32).reshape(4, M, K)
    a[...] = want_a
    wide = rng.standard_normal((4, K, 2 * N)).astype(np.float32)
    b = np.lib.stride_tricks.as_strided(wide, (4, K, N), (wide.strides[0], wide.strides[1], 8))
    assert not b.flags.c_contiguous
    out = np.empty((4, M, N), np.float32)
    assert bg.serves(a, b, out)
    bg.matmul(a, b, out)
    np.testing.assert_allclose(out, _ref(want_a, wide[:, :, ::2]), rtol=1e-5, atol=1e-4)
    flat, off = bg._span(b, False)
    assert flat.size == (b.shape[0] - 1) * b.strides[0] // 4 + (K - 1) * 2 * N + 2 * (N - 1) + 1


# ---------------------------------------------------------------- one large product
# The blocked kernel (bg._run on 2-D operands) is called directly: matmul routes to
# it only on 16-lane (AVX-512) targets, and every host must test it.

@pytest.mark.parametrize("m,k,n", [(6, 1, 32), (7, 300, 33), (97, 257, 129), (200, 513, 160),
                                   (96, 256, 128)])
@pytest.mark.parametrize("a_order,b_order,c_order", [("rc", "cr", "rc"), ("rc", "rc", "rc"),
                                                     ("cr", "cr", "cr"), ("cr", "rc", "cr")])
def test_blocked_product_around_the_blocks(m, k, n, a_order, b_order, c_order):
    rng = np.random.default_rng(m + k + n)
    a = _stored(rng, (1, m, k), a_order, False)[0]
    b = _stored(rng, (1, k, n), b_order, False)[0]
    out = np.full((m, n) if c_order == "rc" else (n, m), np.nan, np.float32)
    out = out if c_order == "rc" else out.T
    got = bg._run(a, b, out)
    assert got is out
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-4 * max(1, k) ** 0.5)


def test_blocked_product_strided_and_offset_views():
    rng = np.random.default_rng(5)
    big = rng.standard_normal((3, 300, 400)).astype(np.float32)
    a = big[1, 3:203:2, 5:305]  # row step 2, offset
    b = big[2, :, 7:397:3]  # column step 3: packed
    out = np.zeros((120, 300), np.float32)[10:110, 3:3 + 130]  # rows of a wider buffer
    bg._run(a, b, out)
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=2e-3)


def test_blocked_product_same_bits_in_both_orientations_and_thread_counts():
    """Each element is one fixed chain of multiply-adds: the orientation the kernel picks
    and the number of threads never change a bit (eager == compiled relies on it)."""
    import numba

    rng = np.random.default_rng(9)
    a = rng.standard_normal((150, 700)).astype(np.float32)
    w = rng.standard_normal((90, 700)).astype(np.float32)
    c1 = bg._run(a, w.T, np.empty((150, 90), np.float32))
    c2 = bg._run(w, a.T, np.empty((90, 150), np.float32)).T
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        c3 = bg._run(a, w.T, np.empty((150, 90), np.float32))
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_array_equal(c1, c3)
    np.testing.assert_allclose(c1, _ref(a, w.T), rtol=1e-5, atol=1e-3)


def test_blocked_product_routing_follows_the_vector_width(monkeypatch):
    # The host's own flags decide in production; here each is set, so every rule is
    # checked on every host.
    a = np.ones((256, 256), np.float32)
    out = np.zeros((256, 256), np.float32)
    monkeypatch.setattr(bg, "THREAD_SAFE", True)
    monkeypatch.setattr(bg, "LANES", 16)
    monkeypatch.setattr(bg, "BLAS_PINNED_NARROW", True)
    assert bg.serves(a, a, out) and bg.routes_here((256, 256), 256, np.float32)
    assert not bg.serves(a[:, :16], a[:16], out)  # too little work: BLAS
    wide = np.ones((512, 4096), np.float32)  # 2**25 multiply-adds, but 16 rows: BLAS
    assert not bg.serves(np.ones((16, 512), np.float32), wide,
                         np.zeros((16, 4096), np.float32))
    assert bg.serves(np.ones((32, 512), np.float32), wide, np.zeros((32, 4096), np.float32))
    assert not bg.serves(a.astype(np.float64), a.astype(np.float64), out.astype(np.float64))
    assert bg.routes_here((2, 8, 8), 8, np.float32)  # every stack goes to matmul
    monkeypatch.setattr(bg, "BLAS_PINNED_NARROW", False)  # OpenBLAS's AVX-512 kernels
    assert not bg.serves(a, a, out) and not bg.routes_here((256, 256), 256, np.float32)
    monkeypatch.setattr(bg, "BLAS_PINNED_NARROW", True)
    monkeypatch.setattr(bg, "LANES", 8)  # AVX2 tiles only match BLAS
    assert not bg.serves(a, a, out)


def test_large_dot_eager_equals_compiled_and_numpy():
    rng = np.random.default_rng(3)
    ctx = F.ExecContext()
    xv = rng.standard_normal((300, 260)).astype(np.float32)
    wv = rng.standard_normal((270, 260)).astype(np.float32)
    x = F.Tensor("tok", "in").from_numpy(ctx, xv)
    w = F.Tensor("out", "in").from_numpy(ctx, wv)
    eager = x.dot(w, "in").numpy()
    compiled = F.compile(lambda x, w: x.dot(w, "in"))(x, w).numpy()
    np.testing.assert_array_equal(eager, compiled)
    np.testing.assert_allclose(eager, _ref(xv, wv.T), rtol=1e-5, atol=1e-3)


def test_blas_pin_read_from_openblas_coretype():
    assert bg.blas_pinned_narrow({"OPENBLAS_CORETYPE": "Haswell"})
    assert bg.blas_pinned_narrow({"OPENBLAS_CORETYPE": "zen"})
    assert not bg.blas_pinned_narrow({"OPENBLAS_CORETYPE": "SkylakeX"})
    assert not bg.blas_pinned_narrow({"OPENBLAS_CORETYPE": " cooperlake "})
    assert not bg.blas_pinned_narrow({})  # OpenBLAS's own choice


@pytest.fixture
def plane_calls(monkeypatch):
    """The blocked kernel's calls as ((M, K, N) as oriented, via_scratch)."""
    calls = []
    plane = bg._plane

    def spy(A, B, C, geo, via_scratch, runs):
        calls.append((tuple(geo[2:5]), via_scratch))
        return plane(A, B, C, geo, via_scratch, runs)

    monkeypatch.setattr(bg, "_plane", spy)
    return calls


@pytest.mark.parametrize("m,k,n", [(70, 40, bg.NR6 + 5), (100, 300, 3 * bg.NR6 - 1),
                                   (200, 33, 5 * bg.NR6 + 1)])
def test_blocked_product_ragged_columns_written_in_place(m, k, n, plane_calls):
    """A ragged N: whole strips go straight into C and only the last through scratch;
    the bits are those of the product padded to whole strips, and nothing outside the
    output view is written (its buffer is wider and taller)."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    np_ = -(-n // bg.NR6) * bg.NR6
    padded = bg._run(a, np.pad(b, ((0, 0), (0, np_ - n))), np.empty((m, np_), np.float32))
    buf = np.full((m + 2, n + 7), 7.0, np.float32)
    out = buf[1:m + 1, 2:n + 2]
    plane_calls.clear()
    bg._run(a, b, out)
    assert plane_calls == [((m, k, n), False)]  # as given, no scratch for the whole product
    np.testing.assert_array_equal(out, padded[:, :n])
    mask = np.ones(buf.shape, bool)
    mask[1:m + 1, 2:n + 2] = False
    assert (buf[mask] == 7.0).all()
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-3)


def test_blocked_product_keeps_a_ragged_n_as_given(plane_calls):
    """Unit-stride B and C with a ragged N stay as given (the blocked kernel computes
    them in place but for the last strip) even where the swapped form would avoid the
    stacked kernel's scratch: the MLP's weight gradient ran 1.17x slower swapped."""
    rng = np.random.default_rng(12)
    m, k, n = 64, 48, 3 * bg.NR6 + 4
    a = rng.standard_normal((k, m)).astype(np.float32).T  # a transposed A (dh^T)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = bg._run(a, b, np.empty((m, n), np.float32))
    assert plane_calls == [((m, k, n), False)]
    np.testing.assert_allclose(out, _ref(a, b), rtol=1e-5, atol=1e-4)


def test_the_kernels_send_spinning_pool_workers_to_sleep_first():
    # Both kernels run on Numba's threads, which want the cores a spinning pool
    # worker would hold.
    from fucina.kernels import pool

    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 64, 32)).astype(np.float32)
    b = rng.standard_normal((2, 32, 48)).astype(np.float32)
    out = np.empty((2, 64, 48), np.float32)
    pool._RING.box[2] = 0
    bg._run(a, b, out)
    assert pool._RING.box[2] == 1
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
