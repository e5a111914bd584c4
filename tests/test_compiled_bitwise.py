"""Compiled equals eager bit for bit, where fusion changes the kernel's loop body.

Two measured ways they used to differ (issue 13 review): a fused ``x*w + 1``
contracted into one FMA (one rounding where eager's two kernels round twice),
and a float sum fed by a fused producer added in another order than the same
sum over a materialized tensor (LLVM picked the reassociated lane layout from
the loop body). Float sums and products now follow one documented order
(:mod:`fucina.kernels.lanes`), which :func:`lane_sum` models in numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fucina as F
from fucina.kernels.lanes import LANES


def lane_sum(row: np.ndarray) -> np.float32:
    """The documented order of a float32 sum: lane t % L, then the halving tree."""
    n = LANES["float32"]
    lanes = np.zeros(n, np.float32)
    for t, v in enumerate(row.astype(np.float32)):
        lanes[t % n] = np.float32(lanes[t % n] + v)
    while n > 1:
        n //= 2
        lanes = (lanes[:n] + lanes[n:2 * n]).astype(np.float32)
    return np.float32(lanes[0])


@pytest.fixture(scope="module")
def ctx() -> F.ExecContext:
    return F.ExecContext()


def _x(ctx: F.ExecContext, tags: tuple[str, ...], shape: tuple[int, ...],
       seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return F.Tensor(*tags).from_slice(ctx, shape, (rng.standard_normal(shape) * 3)
                                      .astype(np.float32))


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 100, 1000])
def test_sum_follows_the_lane_order(ctx: F.ExecContext, n: int) -> None:
    x = _x(ctx, ("r", "c"), (3, n), n)
    xv = x.numpy()
    want = np.array([lane_sum(row) for row in xv])
    np.testing.assert_array_equal(x.sum("c").numpy(), want)
    # over a leading axis (the swapped kernel): the same order per output
    xt = F.Tensor("c", "r").from_slice(ctx, (n, 3), np.ascontiguousarray(xv.T))
    np.testing.assert_array_equal(xt.sum("c").numpy(), want)
    # a fused producer, compiled: the same order again
    fast = F.compile(lambda a: a.mul(a).sum("c"))
    sq = (xv * xv).astype(np.float32)
    np.testing.assert_array_equal(fast(x).numpy(), np.array([lane_sum(r) for r in sq]))


@pytest.mark.parametrize("n", [35, 36])
def test_a_rows_tail_leaves_the_other_lanes_bit_for_bit(ctx: F.ExecContext, n: int) -> None:
    """The tail of a row (3 or 4 elements after one whole vector of 32 lanes) is added as
    one masked vector op; lanes past the tail keep their bits: a -0 in lane 5 of a
    product stays -0 (powers of two keep every product exact)."""
    row = np.full(n, 2.0, np.float32)
    row[5] = -0.0
    x = F.Tensor("r", "c").from_slice(ctx, (2, n), np.stack([row, np.full(n, 2.0, np.float32)]))
    got = x.prod("c").numpy()
    assert got[0] == 0 and np.signbit(got[0])
    assert got[1] == np.float32(2.0) ** n
    xv = x.numpy()
    forms = ((lambda a: a.neg().prod("c"), -xv), (lambda a: a.mul(a).prod("c"), xv * xv))
    for fn, np_form in forms:
        want = np.prod(np_form, axis=1)  # exact: powers of two and zeros
        out = F.compile(fn)(x).numpy()
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(want))
        np.testing.assert_array_equal(fn(x).numpy().view(np.uint32), out.view(np.uint32))


@pytest.mark.parametrize("shape", [(7, 9), (40, 9), (64, 256)])
def test_a_sum_of_negative_zeros_is_positive_zero_in_every_kernel_form(
        ctx: F.ExecContext, shape: tuple[int, int]) -> None:
    """Lanes start at +0, so a sum of -0 elements is +0. The swapped kernel (a sum over a
    leading axis) wrote each lane's first element as it was, and gave -0: eager summed
    ``x + xt`` materialized (swapped) to -0, while compiled, whose fused loads read
    ``xt`` along the summed axis (row form), gave +0."""
    neg = -np.zeros(shape, np.float32)
    x = F.Tensor("a", "b").from_slice(ctx, shape, neg)
    xt = F.Tensor("b", "a").from_slice(ctx, shape[::-1], np.ascontiguousarray(neg.T))
    outs = [x.sum("a"), xt.sum("a"), (x + xt).sum("a"), x.mean("a"),
            F.compile(lambda a, b: (a + b).sum("a"))(x, xt),
            F.compile(lambda a: (a * 1.0).sum("a"))(x)]
    for out in outs:
        got = out.numpy()
        np.testing.assert_array_equal(got, np.zeros(shape[1], np.float32))
        assert not np.signbit(got).any()
    # a product's lanes start at 1: the -0 stays (an odd count of -0 factors)
    assert np.signbit(x.prod("a").numpy()).all() == (shape[0] % 2 == 1)


@pytest.mark.parametrize("n", [7, 40, 100])
def test_zero_signs_follow_the_lane_definition_in_the_swapped_form(
        ctx: F.ExecContext, n: int) -> None:
    # The swapped form writes each lane's first element and makes a zero total +0 at the
    # end; the lanes' definition starts every lane at +0. With signed zeros and exact
    # cancellations everywhere, both must give the same bits (short rows of 9 take the
    # flat rounds, rows of 40 the lane-by-lane loop).
    rng = np.random.default_rng(n)
    for c in (9, 40):
        v = rng.choice(np.array([-0.0, 0.0, -1.0, 1.0, -2.0, 2.0], np.float32), (5, n, c))
        v[0] = -0.0
        x = F.Tensor("a", "b", "c").from_slice(ctx, v.shape, v)
        want = _lane_sum_axis1(v)
        got = x.sum("b").numpy()
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert not np.signbit(got[0]).any()  # (the all -0 batch)
        neg = F.compile(lambda a: a.neg().sum("b"))(x).numpy()  # a fused producer
        np.testing.assert_array_equal(neg.view(np.uint32), _lane_sum_axis1(-v).view(np.uint32))


_PROGRAMS: dict[str, tuple[Callable[[Any], Any], tuple[str, ...]]] = {
    "fma chain": (lambda x: x.mul(x).add_scalar(1.0).tanh().mul(x).sigmoid(), ("r", "c")),
    "(x*x+x)*x-x": (lambda x: x.mul(x).add(x).mul(x).sub(x), ("r", "c")),
    "sum last": (lambda x: x.mul(x).add(x).sum("c"), ("r", "c")),
    "sum leading": (lambda x: x.mul(x).add(x).sum("r"), ("r", "c")),
    "mean": (lambda x: x.mul(x).add(x).mean("c"), ("r", "c")),
    "prod": (lambda x: x.scale(0.3).add_scalar(1.0).prod("c"), ("r", "c")),
    "sum_all": (lambda x: (x.relu() * 0.5).sum_all(), ("r", "c")),
    "softmax": (lambda x: x.softmax("c"), ("r", "c")),
    "softmax leading": (lambda x: x.softmax("r"), ("r", "c")),
    "log_softmax": (lambda x: x.log_softmax("c"), ("r", "c")),
    "layer_norm": (lambda x: x.layer_norm("c", 1e-5), ("r", "c")),
    "rms_norm": (lambda x: x.rms_norm("c", 1e-5), ("r", "c")),
    "transposed": (lambda x: x.transpose("c", "r").mul(x.transpose("c", "r")).add(x)
                   .sum("r"), ("r", "c")),
    "two axes": (lambda x: x.scale(1.3).add(x).sum("a").sum("b"), ("a", "b", "c")),
    "exp sum": (lambda x: x.exp().sum("c"), ("a", "b", "c")),
}
_SHAPES = {2: [(64, 96), (7, 1000), (300, 33), (3, 5)], 3: [(8, 16, 40), (5, 7, 3)]}


@pytest.mark.parametrize("name", list(_PROGRAMS))
def test_compiled_equals_eager_bitwise(ctx: F.ExecContext, name: str) -> None:
    fn, tags = _PROGRAMS[name]
    fast = F.compile(fn)
    for shape in _SHAPES[len(tags)]:
        for seed in range(3):
            x = _x(ctx, tags, shape, seed)
            np.testing.assert_array_equal(fast(x).numpy(), fn(x).numpy(),
                                          err_msg=f"{name} {shape} seed {seed}")


def test_fused_relu_sum_all_gradient_bitwise(ctx: F.ExecContext) -> None:
    """The case that caught the first attempt: a fused relu*0.5 into sum_all."""
    xv = np.random.default_rng(7).standard_normal((5, 256)).astype(np.float32) * 10

    def loss(x: Any) -> Any:
        return (x.relu() * 0.5).sum_all()

    x1 = F.Tensor("s", "i").variable_from_slice(ctx, (5, 256), xv)
    e = loss(x1)
    e.backward()
    x2 = F.Tensor("s", "i").variable_from_slice(ctx, (5, 256), xv)
    c = F.compile(loss)(x2)
    c.backward()
    np.testing.assert_array_equal(c.numpy(), e.numpy())
    np.testing.assert_array_equal(x2.grad().numpy(), x1.grad().numpy())


def test_float64_sum_bitwise(ctx: F.ExecContext) -> None:
    xv = np.random.default_rng(3).standard_normal((9, 77))
    x = F.Tensor("r", "c", dtype="f64").from_slice(ctx, xv.shape, xv)
    fast = F.compile(lambda a: a.mul(a).add(a).sum("c"))
    np.testing.assert_array_equal(fast(x).numpy(), x.mul(x).add(x).sum("c").numpy())
    np.testing.assert_allclose(fast(x).numpy(), (xv * xv + xv).sum(1), rtol=1e-12)


def test_transformer_block_compiled_equals_eager(ctx: F.ExecContext) -> None:
    """End to end: attention, softmax, layer norms, gelu and the GEMMs, fused and not."""
    from fucina.bench_blocks import block_forward, block_weights

    w = block_weights(ctx, 96, 160, 31)
    x = F.Tensor("batch", "seq", "d").randn(ctx, (1, 17, 96), 32)
    forward = block_forward(w, 3)
    fast = F.compile(forward)
    want = forward(x).numpy()
    np.testing.assert_array_equal(forward(x).numpy(), want)  # eager repeats itself
    np.testing.assert_array_equal(fast(x).numpy(), want)
    np.testing.assert_array_equal(fast(x).numpy(), want)


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_training_steps_compiled_equal_eager(ctx: F.ExecContext, opt_name: str) -> None:
    """Three optimizer steps of a small MLP: the same loss and parameters, bit for bit."""
    from fucina.bench import _fucina_loss, _fucina_mlp

    rng = np.random.default_rng(5)
    sizes = (12, 24, 5)
    xv = rng.standard_normal((16, sizes[0])).astype(np.float32)
    yv = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], 16)]
    x = F.Tensor("batch", "l0").from_slice(ctx, xv.shape, xv)
    y = F.Tensor("batch", "l2").from_slice(ctx, yv.shape, yv)
    runs = []
    for compiled in (False, True):
        params = _fucina_mlp(ctx, sizes, "relu", 1)
        opt = getattr(F.optim, opt_name)(params, lr=0.05)

        def step(x: Any, y: Any, params: list[Any] = params, opt: Any = opt) -> Any:
            opt.zero_grad()
            loss = _fucina_loss(params, x, y, "relu")
            opt.step()
            return loss

        run = F.compile(step) if compiled else step
        losses = [run(x, y).numpy().copy() for _ in range(3)]
        runs.append((losses, [p.numpy().copy() for p in params]))
    (le, pe), (lc, pc) = runs
    for a, b in zip(le + pe, lc + pc):
        np.testing.assert_array_equal(b, a)


def _lane_sum_axis1(v: np.ndarray, mul: bool = False) -> np.ndarray:
    """:func:`lane_sum` (or the product) over axis 1 of a 3-D array, for every output."""
    n = LANES[str(v.dtype)]
    lanes = np.full((n, v.shape[0], v.shape[2]), 1 if mul else 0, v.dtype)
    for t in range(v.shape[1]):
        lanes[t % n] = lanes[t % n] * v[:, t] if mul else lanes[t % n] + v[:, t]
    while n > 1:
        n //= 2
        lanes = lanes[:n] * lanes[n:2 * n] if mul else lanes[:n] + lanes[n:2 * n]
    return lanes[0]


@pytest.mark.parametrize("shape", [(2, 40, 200), (1, 40, 1100), (1, 600, 48)])
def test_middle_axis_lane_tree_forms(ctx: F.ExecContext, shape: tuple[int, ...]) -> None:
    # The swapped kernel's lane rows: a lane whose first group is one step (n = 40: 8
    # lanes of 2 steps, 24 of 1), all 32 rows summed in registers (rows of 200 or 48
    # outputs) or row by row (rows of 1100, past the register form's 512).
    from fucina.ir.program import PARALLEL_MIN
    assert np.prod(shape) < PARALLEL_MIN
    v = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
    x = F.Tensor("a", "b", "c").from_slice(ctx, shape, v)
    want = _lane_sum_axis1(v)
    np.testing.assert_array_equal(x.sum("b").numpy(), want)
    np.testing.assert_array_equal(F.compile(lambda a: a.mul(a).sum("b"))(x).numpy(),
                                  _lane_sum_axis1(v * v))
    np.testing.assert_allclose(want, v.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 9, 16, 17, 31, 32, 40, 100, 600])
def test_short_kept_rows_read_as_flat_rounds_follow_the_lane_order(
        ctx: F.ExecContext, n: int) -> None:
    # Kept rows of 9 (f32) and 3 (f64) read as flat rounds of L * row elements: fewer
    # steps than lanes (1 to 31 for f32, 1 to 9 for f64: one partial round, and every
    # depth of the level-by-level tree with partners missing), one round (32), a
    # partial round (17 and 40 for f64, 40), several rounds with register groups of 8
    # and 2 (100, 600). A sliced input (reduced stride not the row) takes the
    # lane-by-lane loop; both give the lane order.
    from fucina.ir.program import PARALLEL_MIN
    from fucina.kernels.codegen import FLAT_ROW_MAX
    rng = np.random.default_rng(n)
    for dt, shape in ((np.float32, (3, n, 9)), (np.float64, (2, n, 3))):
        assert np.prod(shape) < PARALLEL_MIN and shape[2] <= FLAT_ROW_MAX
        tag = "f32" if dt == np.float32 else "f64"
        v = rng.standard_normal(shape).astype(dt)
        x = F.Tensor("a", "b", "c", dtype=tag).from_slice(ctx, shape, v)
        want = _lane_sum_axis1(v)
        np.testing.assert_array_equal(x.sum("b").numpy(), want)
        np.testing.assert_array_equal(x.mean("b").numpy(), want / dt(n))
        np.testing.assert_array_equal(F.compile(lambda a: a.mul(a).sum("b"))(x).numpy(),
                                      _lane_sum_axis1(v * v))
        if dt == np.float32:  # (prod: the f32 surface)
            near1 = (1 + v / 256).astype(dt)
            y = F.Tensor("a", "b", "c").from_slice(ctx, shape, near1)
            np.testing.assert_array_equal(y.prod("b").numpy(),
                                          _lane_sum_axis1(near1, mul=True))
        np.testing.assert_allclose(want, v.astype(np.float64).sum(axis=1), rtol=1e-4,
                                   atol=1e-4)
        wide = F.Tensor("a", "b", "c", dtype=tag).from_slice(
            ctx, (shape[0], n, 2 * shape[2]), np.concatenate([v, v], axis=2))
        half = wide.narrow("c", 0, shape[2])
        np.testing.assert_array_equal(half.sum("b").numpy(), want)


def test_rows_spread_counts_rows_per_l1_set() -> None:
    from fucina.kernels.codegen import DIRECT_TREE_WAYS, rows_spread
    assert DIRECT_TREE_WAYS == 8
    assert rows_spread(800, 64)  # 12.5 lines apart: every set at most twice
    assert not rows_spread(4096, 64)  # one set for all
    assert not rows_spread(4096, 9) and rows_spread(4096, 8)
    assert not rows_spread(17408, 64) and rows_spread(17408, 32)  # 16 sets: 4 or 2 per set


@pytest.mark.parametrize("n", [32, 40, 64])
def test_sums_of_one_or_two_steps_per_lane_follow_the_lane_order(
        ctx: F.ExecContext, n: int) -> None:
    # A sum over a middle axis of L to 2L steps (f32: 32 to 64, f64: 16 to 32) whose
    # rows spread over the L1 sets runs each output's lanes and tree in registers
    # (codegen.direct_tree); rows 4 or 8 KB apart keep the lane rows. Both give the
    # lane order, with inf, NaN and signed zeros among the values.
    from fucina.ir.program import PARALLEL_MIN
    rng = np.random.default_rng(n)
    for dt, tag, steps in ((np.float32, "f32", n), (np.float64, "f64", n // 2)):
        for c, direct in ((200, True), (1024 if dt == np.float32 else 512, False)):
            shape = (2, steps, c)
            assert np.prod(shape) < PARALLEL_MIN
            v = rng.standard_normal(shape).astype(dt)
            v[0, :, 5] = -0.0  # all -0: the sum is +0
            v[1, 3, 7], v[1, 4, 8], v[0, steps - 1, 11] = np.inf, np.nan, -np.inf
            x = F.Tensor("a", "b", "c", dtype=tag).from_slice(ctx, shape, v)
            want = _lane_sum_axis1(v)
            f = F.compile(lambda a: a.sum("b"))
            got = f(x).numpy()
            assert ("dx0" in f.kernels(x)[0].source) == direct, (tag, c)
            np.testing.assert_array_equal(got, want)
            assert not np.signbit(got[0, 5])
            np.testing.assert_array_equal(x.sum("b").numpy(), want)
            np.testing.assert_array_equal(x.mean("b").numpy(), want / dt(steps))
            fin = np.isfinite(want)
            np.testing.assert_allclose(want[fin], v.astype(np.float64).sum(axis=1)[fin],
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [7, 100, 600])
def test_middle_axis_reductions_follow_the_lane_order(ctx: F.ExecContext, n: int) -> None:
    # A sum over a middle axis is the swapped kernel, which adds each lane's steps in
    # register groups of SWAP_GROUP, then 2, then 1 (n = 600: 19 steps in the first 24
    # lanes, 18 in the rest; n = 100: 4 and 3; n = 7: fewer lanes than 32). Every shape
    # is below PARALLEL_MIN, so all three share one set of serial kernels (parallel ones
    # compile several times slower); test_reduction_axes covers the block boundaries.
    from fucina.ir.program import PARALLEL_MIN
    from fucina.kernels.codegen import SWAP_GROUP
    assert SWAP_GROUP == 8
    rng = np.random.default_rng(n)
    shape = (2, n, 200)
    assert np.prod(shape) < PARALLEL_MIN
    for dt in (np.float32, np.float64):
        v = rng.standard_normal(shape).astype(dt)
        x = F.Tensor("a", "b", "c", dtype="f32" if dt == np.float32 else "f64") \
            .from_slice(ctx, shape, v)
        want = _lane_sum_axis1(v)
        np.testing.assert_array_equal(x.sum("b").numpy(), want)
        np.testing.assert_allclose(want, v.astype(np.float64).sum(axis=1), rtol=1e-4,
                                   atol=1e-4)
        np.testing.assert_array_equal(x.mean("b").numpy(), want / dt(n))
    v = rng.standard_normal(shape).astype(np.float32)
    x = F.Tensor("a", "b", "c").from_slice(ctx, shape, v)
    # a fused producer, compiled, and the product lanes
    sq = F.compile(lambda a: a.mul(a).sum("b"))
    np.testing.assert_array_equal(sq(x).numpy(), _lane_sum_axis1(v * v))
    near1 = (1 + v / 256).astype(np.float32)
    y = F.Tensor("a", "b", "c").from_slice(ctx, shape, near1)
    np.testing.assert_array_equal(y.prod("b").numpy(), _lane_sum_axis1(near1, mul=True))
    np.testing.assert_allclose(y.prod("b").numpy(), near1.astype(np.float64).prod(axis=1),
                               rtol=1e-4)
    # softmax over the middle axis stores exp in its sum pass (eager equals compiled)
    sm = x.softmax("b").numpy()
    np.testing.assert_array_equal(F.compile(lambda a: a.softmax("b"))(x).numpy(), sm)
    e = np.exp(v.astype(np.float64) - v.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(x.sum("b").numpy(), torch.from_numpy(v).sum(dim=1).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_lane_runs_masked_tail_equals_the_one_by_one_form(monkeypatch) -> None:
    """Both forms of a run's tail (the masked vector op, and the element-by-element
    insert that LLVM before 17 gets) give the same bits, NaN and -0 included, for
    every tail length of both dtypes."""
    from numba import njit

    from fucina.kernels import lanes

    def build():
        @njit
        def runs(a, n, zero, one):
            out = np.empty((n + 1, 2), a.dtype)
            for m in range(n + 1):
                s = lanes.add_run(lanes.splat(zero), a, 0, m)
                p = lanes.mul_run(lanes.splat(one), a, 0, m)
                out[m, 0] = lanes.total_add(s)
                out[m, 1] = lanes.total_mul(p)
            return out
        return runs

    rng = np.random.default_rng(9)
    for dt in (np.float32, np.float64):
        a = (1 + rng.standard_normal(80) * 0.1).astype(dt)
        a[[3, 40, 70]] = -0.0
        a[50] = np.nan
        a[20] = np.inf
        masked = build()(a, 79, dt(0), dt(1))
        monkeypatch.setattr(lanes, "_MASKED_LOADS", False)
        plain = build()(a, 79, dt(0), dt(1))
        monkeypatch.setattr(lanes, "_MASKED_LOADS", True)
        assert np.array_equal(masked.view(np.uint8), plain.view(np.uint8)), dt


def test_vector_passes_equal_numpy_for_every_length(monkeypatch) -> None:
    """lanes.add_into / mul_into / copy_into (vector passes with a masked tail, or one
    element at a time before LLVM 17) against numpy, element for element, for every run
    length up to 3 vectors, at offsets; nothing outside the run is written."""
    from numba import njit

    from fucina.kernels import lanes

    def build():
        @njit
        def passes(dst, src, n):
            lanes.add_into(dst[0], 3, src, 5, n)
            lanes.mul_into(dst[1], 3, src, 5, n)
            lanes.copy_into(dst[2], 3, src, 5, n)
        return passes

    rng = np.random.default_rng(10)
    for masked in (True, False):
        monkeypatch.setattr(lanes, "_MASKED_LOADS", masked)
        passes = build()
        for dt in (np.float32, np.float64):
            src = rng.standard_normal(120).astype(dt)
            src[[6, 30]] = -0.0
            src[40] = np.nan
            for n in range(3 * lanes.LANES[str(np.dtype(dt))] + 1):
                base = rng.standard_normal(120).astype(dt)
                dst = np.stack([base.copy() for _ in range(3)])
                passes(dst, src, n)
                want = np.stack([base.copy() for _ in range(3)])
                want[0, 3:3 + n] += src[5:5 + n]
                want[1, 3:3 + n] *= src[5:5 + n]
                want[2, 3:3 + n] = src[5:5 + n]
                np.testing.assert_array_equal(dst.view(np.uint8), want.view(np.uint8))


def test_lane_window_tail_equals_the_run_tail() -> None:
    """``add_last``/``mul_last`` (the tail taken from a window of the last L elements,
    rotated in registers) give the bits of ``add_run``/``mul_run`` over the whole run,
    for every tail length of both dtypes, NaN, inf and -0 included."""
    from numba import njit

    from fucina.kernels import lanes

    @njit
    def both(a, n, nl, zero, one):
        out = np.empty((2, 2), a.dtype)
        nm = n - n % nl
        s = lanes.add_run(lanes.splat(zero), a, 0, n)
        p = lanes.mul_run(lanes.splat(one), a, 0, n)
        out[0, 0] = lanes.total_add(s)
        out[0, 1] = lanes.total_mul(p)
        s = lanes.add_last(lanes.add_run(lanes.splat(zero), a, 0, nm), a, n - nl, n - nm)
        p = lanes.mul_last(lanes.mul_run(lanes.splat(one), a, 0, nm), a, n - nl, n - nm)
        out[1, 0] = lanes.total_add(s)
        out[1, 1] = lanes.total_mul(p)
        return out

    rng = np.random.default_rng(11)
    for dt in (np.float32, np.float64):
        nl = lanes.LANES[str(np.dtype(dt))]
        for n in range(nl + 1, 3 * nl):
            if n % nl == 0:
                continue
            a = (1 + rng.standard_normal(n) * 0.1).astype(dt)
            a[rng.integers(0, n, 3)] = -0.0
            if n % 5 == 0:
                a[rng.integers(0, n)] = np.nan
            if n % 7 == 0:
                a[rng.integers(0, n)] = np.inf
            got = both(a, n, nl, dt(0), dt(1))
            assert np.array_equal(got[0].view(np.uint8), got[1].view(np.uint8)), (dt, n)


#: Row lengths around the tail window of a fused lane reduction (lanes.add_last):
#: shorter than one group of lanes (the window reaching back before the row), whole
#: groups, tails of 1 and L - 1, tails of L / 2 and L / 2 + 1 (from where a producer that
#: calls a function takes the window), and past one scratch row (256) with a tail.
_WINDOW_N = [1, 5, 16, 17, 31, 32, 33, 40, 48, 49, 63, 64, 65, 95, 257, 300, 543]


@pytest.mark.parametrize("n", _WINDOW_N)
def test_row_tails_through_the_window_follow_the_lane_order(
        ctx: F.ExecContext, n: int) -> None:
    v = (np.random.default_rng(n).standard_normal((8, n)) * 3).astype(np.float32)
    # Rows shorter than 32 that end 32 or more elements into the buffer: the window
    # reaches back into the rows before (non-finite here: their lanes stay masked off).
    v[0, ::2] = np.inf
    v[0, 1::2] = np.nan
    x = F.Tensor("r", "c").from_slice(ctx, (8, n), v)
    square_sum = F.compile(lambda a: a.mul(a).sum("c"))
    # (a reduced axis of 1 is no reduction)
    assert any("ln.add_last" in k.source for k in square_sum.kernels(x)) == (n > 1)
    np.testing.assert_array_equal(square_sum(x).numpy(),
                                  np.array([lane_sum(r) for r in v * v]))
    # A producer that calls a function (the window only above a tail of L / 2): the
    # elements are the eager exp kernel's values.
    e = x.exp().numpy()
    np.testing.assert_array_equal(F.compile(lambda a: a.exp().sum("c"))(x).numpy(),
                                  np.array([lane_sum(r) for r in e]))
    # Softmax sums its stored output (the window also rewrites that output's last L).
    m = v.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        d = (v - m).astype(np.float32)
    ex = F.Tensor("r", "c").from_slice(ctx, (8, n), d).exp().numpy()
    with np.errstate(divide="ignore"):  # (times the reciprocal of the sum, as torch does)
        want = ex * (np.float32(1) / np.array([lane_sum(r) for r in ex]))[:, None]
    for got in (F.compile(lambda a: a.softmax("c"))(x).numpy(), x.softmax("c").numpy()):
        np.testing.assert_array_equal(got, want)
    # float64: 16 lanes; a product keeps its -0 factor's lane out of the window's
    # rotated, masked-off lanes (a second -0 there would flip the sign back).
    v64 = np.random.default_rng(n + 1).standard_normal((2, n, 1))
    x64 = F.Tensor("r", "c", dtype="f64").from_slice(ctx, (2, n), v64[:, :, 0])
    np.testing.assert_array_equal(F.compile(lambda a: a.mul(a).sum("c"))(x64).numpy(),
                                  _lane_sum_axis1(v64 * v64)[:, 0])
    row = np.ones(n, np.float32)
    row[n // 2] = -0.0
    y = F.Tensor("r", "c").from_slice(ctx, (1, n), row[None])
    got = F.compile(lambda a: a.neg().neg().prod("c"))(y).numpy()
    assert got[0] == 0 and np.signbit(got[0])
