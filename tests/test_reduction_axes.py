"""Reductions over every axis choice (leading, middle, last, pairs) and dtype against numpy,
compiled against eager: covers both loop orders of the generated row kernel (reduced axes
inside, and the swapped order for reductions over strided axes) and the softmax kernel
that stores exp once."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import fucina as F
from fucina.ir import fusion, program
from fucina.kernels import codegen as cg

RNG = np.random.default_rng(13)
TAGS = ("a", "b", "c")
# The innermost kept run spans several swap blocks plus a remainder.
SHAPE = (3, 5, cg.SWAP_MAX * 2 + 37)
AXES = [(t,) for t in TAGS] + list(itertools.combinations(TAGS, 2))


def _values(dtype: str, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) > 0.5
    if dtype in ("f32", "f64"):
        return RNG.standard_normal(shape).astype(np.float32 if dtype == "f32" else np.float64)
    info = {"i8": np.int8, "u8": np.uint8, "i32": np.int32, "i64": np.int64}[dtype]
    lo, hi = (0, 50) if dtype == "u8" else (-50, 50)
    return RNG.integers(lo, hi, shape).astype(info)


def _reduce(t, fn: str, tags: tuple[str, ...]):
    if len(tags) == 2 and fn == "sum" and hasattr(t, "sum_many"):
        return t.sum_many(list(tags))
    for tag in tags:
        t = getattr(t, fn)(tag)
    return t


def _np_reduce(v: np.ndarray, fn: str, tags: tuple[str, ...]) -> np.ndarray:
    axes = tuple(TAGS.index(t) for t in tags)
    if fn in ("sum", "mean") and v.dtype.kind in "iub":
        v = v.astype(np.int64)
    if len(tags) == 2 and fn != "sum":  # chained single-tag reductions
        out = getattr(np, fn)(v, axis=axes[0])
        return getattr(np, fn)(out, axis=axes[1] - 1)
    return getattr(np, fn)(v, axis=axes)


def _check(ctx, v: np.ndarray, dtype: str, fn: str, tags: tuple[str, ...],
           rtol: float) -> None:
    x = F.Tensor(*TAGS, dtype=dtype).from_slice(ctx, v.shape, v)
    want = _np_reduce(v.astype(np.float64) if dtype in ("f32", "f64") else v, fn, tags)
    eager = _reduce(x, fn, tags).numpy()
    compiled = F.compile(lambda t: _reduce(t, fn, tags))(x).numpy()
    if dtype in ("f32", "f64"):
        np.testing.assert_allclose(eager, want, rtol=rtol, atol=rtol * 10)
    else:
        np.testing.assert_array_equal(eager, want)
    np.testing.assert_allclose(compiled, eager, rtol=rtol, atol=rtol * 10)


@pytest.mark.parametrize("tags", AXES, ids=["".join(t) for t in AXES])
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i8", "u8", "bool"])
def test_sum_every_axis_and_dtype(ctx, dtype, tags):
    _check(ctx, _values(dtype), dtype, "sum", tags, 1e-5 if dtype == "f32" else 1e-12)


@pytest.mark.parametrize("tags", AXES, ids=["".join(t) for t in AXES])
@pytest.mark.parametrize("fn", ["mean", "max", "min", "prod"])
def test_float_reductions_every_axis(ctx, fn, tags):
    v = _values("f32")
    if fn == "prod":  # keep products finite and away from underflow
        v = (1.0 + 0.01 * v).astype(np.float32)
    _check(ctx, v, "f32", fn, tags, 1e-5)


def test_mean_f64_leading_axis(ctx):
    _check(ctx, _values("f64"), "f64", "mean", ("a",), 1e-12)


def test_max_nan_propagates_over_a_leading_axis(ctx):
    v = _values("f32")
    v[1, 2, 7] = np.nan
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    got = x.max("a").numpy()
    assert np.isnan(got[2, 7]) and np.isnan(F.compile(lambda t: t.max("a"))(x).numpy()[2, 7])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(v.max(axis=0)))


@pytest.mark.parametrize("fn", ["max", "min"])
def test_max_min_nan_inf_every_axis(ctx, fn):
    # The vectorized max/min (llvm.maximum/minimum) against numpy's NaN-propagating
    # reductions: NaN first, last and mid-vector in a run, infinities, all--inf runs.
    v = _values("f32")
    v[0, 0, :] = -np.inf if fn == "max" else np.inf
    v[0, 1, 0] = v[1, 0, 5] = v[2, 4, -1] = v[1, 3, 1000] = np.nan
    v[2, 0, 9] = np.inf
    v[1, 2, 11] = -np.inf
    v[:, 3, 17] = np.nan
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    for tags in AXES:
        want = _np_reduce(v, fn, tags)
        eager = _reduce(x, fn, tags).numpy()
        np.testing.assert_array_equal(eager, want)
        fast = F.compile(lambda t, tags=tags: _reduce(t, fn, tags))
        np.testing.assert_array_equal(fast(x).numpy(), eager)


def test_swap_block_shares_the_accumulator_budget():
    def spec(*dtypes: str) -> cg.KernelSpec:
        steps = tuple(cg.Step("reduce", "kept", d, arg=0, fn="sum") for d in dtypes)
        return cg.KernelSpec(1, 1, (), (), steps, 0, False)

    assert cg.swap_block(spec("float32")) == cg.SWAP_MAX
    assert cg.swap_block(spec("float64")) == cg.SWAP_BYTES // 8
    assert cg.swap_block(spec(*["float64"] * 8)) == cg.SWAP_MIN


def test_sum_of_a_permuted_view_and_fused_producer(ctx):
    v = _values("f32")
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    for fn in (lambda t: t.permute_to("c", "a", "b").sum("a"),
               lambda t: t.mul(t).sum("a")):
        eager = fn(x).numpy()
        np.testing.assert_allclose(F.compile(fn)(x).numpy(), eager, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.permute_to("c", "a", "b").sum("a").numpy(),
                               v.sum(axis=0).T, rtol=1e-5, atol=1e-5)


def test_parallel_leading_axis_sum(ctx):
    v = _values("f32", (5, 64, 1031))  # past the parallel threshold
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    for tags in (("a",), ("b",)):
        _check(ctx, v, "f32", "sum", tags, 1e-5)
    np.testing.assert_allclose(x.sum("a").numpy(), v.astype(np.float64).sum(axis=0),
                               rtol=1e-5, atol=1e-5)


def _np_softmax(v: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape", [SHAPE, (5, 64, 1031)], ids=["serial", "parallel"])
@pytest.mark.parametrize("tag", TAGS)
def test_softmax_every_axis(ctx, tag, shape):
    v = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    axis = TAGS.index(tag)
    want = _np_softmax(v.astype(np.float64), axis)
    eager = x.softmax(tag).numpy()
    np.testing.assert_allclose(eager, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(F.compile(lambda t: t.softmax(tag))(x).numpy(), eager,
                               rtol=2e-6, atol=1e-7)
    logsm = x.log_softmax(tag).numpy()
    np.testing.assert_allclose(logsm, np.log(want), rtol=1e-5, atol=1e-5)


def _spec(tensor_fn, ctx, monkeypatch, shape):
    """The kernel specs the compiled program of ``tensor_fn`` builds."""
    v = RNG.standard_normal(shape).astype(np.float32)
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    specs: list[cg.KernelSpec] = []

    def spy(*a, **k):
        built = fusion.build(*a, **k)
        specs.append(built.spec)
        return built

    monkeypatch.setattr(program, "build", spy)
    F.compile(tensor_fn)(x)
    monkeypatch.undo()
    return specs


def test_loop_order_and_exp_once_are_chosen_by_layout(ctx, monkeypatch):
    # Sum over the contiguous last axis: reduced axis inside. Over a leading axis: swapped.
    last = [s for s in _spec(lambda t: t.sum("c"), ctx, monkeypatch, (4, 6, 8)) if s.nr]
    lead = [s for s in _spec(lambda t: t.sum("a"), ctx, monkeypatch, (4, 6, 9)) if s.nr]
    assert last and lead
    assert not cg.swapped(last[0]) and cg.swapped(lead[0])
    src = cg.generate(lead[0])
    assert "for j in range(kl):" in src
    # Softmax over the last axis: one kernel, exp evaluated once (stored, then rescaled).
    sm = [s for s in _spec(lambda t: t.softmax("c"), ctx, monkeypatch, (4, 6, 10)) if s.nr]
    assert len(sm) == 1
    k = cg.stored_value(sm[0])
    assert k is not None and "exp" in sm[0].steps[k].expr
    src = cg.generate(sm[0])
    # exp in the row's loop and in the tail's window (lanes.add_last), none after the sum
    assert src.count("sf.exp(") == 2 and "ln.add_last" in src
    assert "sf.exp(" not in src.split("ln.total_add")[1]


def test_swapped_lane_rows_are_allocated_once_per_call(ctx, monkeypatch):
    # Allocated per block, the lane rows of a leading-axis sum were an allocation of
    # up to 256 KB per block; the kernel now allocates them before its chunk loop.
    monkeypatch.setattr(program, "PARALLEL_MIN", 1)  # the parallel form at a small size
    v = _values("f32", (5, 4, cg.SWAP_MAX + 31))  # blocks of SWAP_MAX and of 4 * 2079 % it
    x = F.Tensor(*TAGS).from_slice(ctx, v.shape, v)
    fast = F.compile(lambda t: t.mean("a"))
    got = fast(x).numpy()
    np.testing.assert_allclose(got, v.astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got, x.mean("a").numpy())
    (kernel,) = fast.kernels(x)
    body = kernel.source.split("def kernel(", 1)[1]
    assert "for kb in range(c0, c1)" in body  # the parallel swapped form
    assert body.count("np.empty(") == 1
    assert body.index("np.empty(") < body.index("while True:")


@pytest.mark.parametrize("fn", ["max", "min"])
def test_short_kept_rows_reduce_max_and_min_in_the_row_form(ctx, monkeypatch, fn):
    # A max over a middle axis with a kept row shorter than SHORT_KEPT walks each output's
    # strided run (row form); a float sum of the same shape keeps the swapped form.
    shape = (6, 7, fusion.SHORT_KEPT - 7)
    (short,) = [s for s in _spec(lambda t: getattr(t, fn)("b"), ctx, monkeypatch, shape)
                if s.nr]
    assert short.row_form and not cg.swapped(short)
    (summed,) = [s for s in _spec(lambda t: t.sum("b"), ctx, monkeypatch, shape) if s.nr]
    assert not summed.row_form and cg.swapped(summed)
    (wide,) = [s for s in _spec(lambda t: getattr(t, fn)("b"), ctx, monkeypatch,
                                (6, 7, fusion.SHORT_KEPT)) if s.nr]
    assert cg.swapped(wide)
    v = _values("f32", shape)
    v[0, 3, 2] = v[5, 0, 0] = v[5, 6, 8] = np.nan
    v[1, :, 4] = -np.inf if fn == "max" else np.inf
    v[2, 5, 1] = np.inf
    x = F.Tensor(*TAGS).from_slice(ctx, shape, v)
    eager = getattr(x, fn)("b").numpy()
    np.testing.assert_array_equal(eager, getattr(np, fn)(v, axis=1))
    np.testing.assert_array_equal(F.compile(lambda t: getattr(t, fn)("b"))(x).numpy(), eager)
    # an integer sum takes the row form too (exact in any order)
    iv = _values("i32", shape)
    xi = F.Tensor(*TAGS, dtype="i32").from_slice(ctx, shape, iv)
    np.testing.assert_array_equal(xi.sum("b").numpy(), iv.astype(np.int64).sum(axis=1))
