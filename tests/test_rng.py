"""Tests for fucina.rng: the splitmix64 counter stream and its fills."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fucina import rng

M64 = (1 << 64) - 1


# --- independent pure-Python model of the contract ---------------------------


def py_splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31), state


def py_stream(seed: int, n: int) -> list[int]:
    out = []
    state = seed & M64
    for _ in range(n):
        x, state = py_splitmix64(state)
        out.append(x)
    return out


def py_uniform(seed: int, n: int, lo: float, hi: float) -> np.ndarray:
    lo32, hi32 = np.float32(lo), np.float32(hi)
    span = float(hi32) - float(lo32)
    vals = []
    for x in py_stream(seed, n):
        v = np.float32(float(lo32) + span * ((x >> 11) * 2.0**-53))
        if v >= hi32:
            v = np.nextafter(hi32, lo32)
        vals.append(v)
    return np.array(vals, dtype=np.float32)


def py_gaussian(seed: int, n: int, scale: float) -> np.ndarray:
    xs = py_stream(seed, n + (n % 2))
    out = []
    for j in range(n):
        a, b = xs[j & ~1], xs[(j & ~1) + 1]
        ua = ((a >> 11) + 1) * 2.0**-53
        ub = (b >> 11) * 2.0**-53
        r = math.sqrt(-2.0 * math.log(ua))
        t = 2.0 * math.pi * ub
        trig = math.cos(t) if j % 2 == 0 else math.sin(t)
        out.append(np.float32(r * trig * float(np.float32(scale))))
    return np.array(out, dtype=np.float32)


def py_randint(seed: int, n: int, low: int, high: int) -> np.ndarray:
    span = (high - low) & M64
    vals = []
    for x in py_stream(seed, n):
        v = ((low & M64) + ((x * span) >> 64)) & M64
        vals.append(v - (1 << 64) if v >= 1 << 63 else v)
    return np.array(vals, dtype=np.int64)


def py_randperm(seed: int, n: int) -> list[int]:
    perm = list(range(n))
    for k in range(n - 1, 0, -1):
        j = (rng.at(seed, n - 1 - k) * (k + 1)) >> 64
        perm[k], perm[j] = perm[j], perm[k]
    return perm


# --- scalar stream -------------------------------------------------------------


def test_known_splitmix64_vector() -> None:
    expected = [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert py_stream(1234567, 5) == expected
    state = 1234567
    seq = []
    for _ in range(5):
        x, state = rng.splitmix64(state)
        seq.append(x)
    assert seq == expected
    assert [rng.at(1234567, i) for i in range(5)] == expected


def test_at_matches_sequential_seed_42() -> None:
    state = 42
    for i in range(8):
        x, state = rng.splitmix64(state)
        assert rng.at(42, i) == x
    assert rng.splitmix64(42)[0] == rng.at(42, 0)


def test_at_far_index_and_wrapping() -> None:
    seed = 99
    state = (seed + 1000 * 0x9E3779B97F4A7C15) & M64
    assert rng.at(seed, 1000) == rng.splitmix64(state)[0]
    # i = 2**64 - 1 wraps the counter (i + 1) to 0: the output is mix(seed).
    assert rng.at(5, M64) == py_splitmix64((5 - 0x9E3779B97F4A7C15) & M64)[0]
    with pytest.raises(ValueError):
        rng.at(1, -1)
    with pytest.raises(ValueError):
        rng.at(1, 1 << 64)
    with pytest.raises(TypeError):
        rng.at(1.5, 0)  # type: ignore[arg-type]


def test_seed_reduction() -> None:
    assert rng.at(-1, 3) == rng.at(M64, 3)
    assert rng.at(-(1 << 70) + 5, 0) == rng.at(5, 0)
    assert rng.at((1 << 64) + 7, 2) == rng.at(7, 2)
    assert rng.splitmix64(-1) == rng.splitmix64(M64)
    assert rng.at(np.int64(-3), 1) == rng.at(M64 - 2, 1)
    assert rng.at(np.uint64(M64), 1) == rng.at(M64, 1)
    for seed in (-1, -(1 << 63), (1 << 64) + 9, 1 << 100):
        a = np.empty(9, np.float32)
        b = np.empty(9, np.float32)
        rng.gaussian_fill(seed, a)
        rng.gaussian_fill(seed & M64, b)
        assert a.tobytes() == b.tobytes()
        assert np.all(np.isfinite(a))
        rng.uniform_fill(seed, a, 0, 1)
        np.testing.assert_array_equal(a, py_uniform(seed, 9, 0, 1))


# --- exact mappings against the Python model ----------------------------------


@pytest.mark.parametrize("seed", [0, 7, 42, M64, 0xDEADBEEF])
def test_uniform_exact(seed: int) -> None:
    out = np.empty(257, np.float32)
    rng.uniform_fill(seed, out, -2.5, 3.0)
    assert out.tobytes() == py_uniform(seed, 257, -2.5, 3.0).tobytes()


@pytest.mark.parametrize("seed", [0, 7, 42, M64])
def test_gaussian_matches_model(seed: int) -> None:
    out = np.empty(101, np.float32)
    rng.gaussian_fill(seed, out, 0.75)
    # Same formula, same f64 libm transcendentals: bitwise equal.
    assert out.tobytes() == py_gaussian(seed, 101, 0.75).tobytes()


def test_gumbel_exact() -> None:
    out = np.empty(300, np.float32)
    rng.gumbel_fill(11, out)
    ref = [
        np.float32(-math.log(-math.log(((x >> 11) + 0.5) * 2.0**-53))) for x in py_stream(11, 300)
    ]
    assert out.tobytes() == np.array(ref, np.float32).tobytes()


@pytest.mark.parametrize(
    ("low", "high"),
    [(-3, 5), (0, 1), (10, 11_000_000_007), (-(1 << 63), (1 << 63) - 1), (-(1 << 63), 0)],
)
def test_randint_exact(low: int, high: int) -> None:
    out = np.empty(200, np.int64)
    rng.randint_fill(3, out, low, high)
    np.testing.assert_array_equal(out, py_randint(3, 200, low, high))
    assert out.min() >= low and out.max() < high


def test_randperm_exact() -> None:
    for n in (0, 1, 2, 3, 10, 97):
        out = np.empty(n, np.int64)
        rng.randperm_fill(1234, out)
        assert out.tolist() == py_randperm(1234, n)


# --- chunk invariance ---------------------------------------------------------

SPLITS = [[0, 1, 7], [0, 3, 4, 9, 10], [0, 5, 6, 13], [0, 2, 11, 12, 21]]


def _chunked(fill_at, n: int, cuts: list[int], dtype: type) -> np.ndarray:
    out = np.empty(n, dtype)
    bounds = sorted({c for c in cuts if c < n} | {0, n})
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        piece = np.empty(b - a, dtype)
        fill_at(a, piece)
        out[a:b] = piece
    return out


FLOAT_FILLS = {
    "uniform": (
        lambda s, o: rng.uniform_fill(s, o, -1.0, 4.0),
        lambda s, f, o: rng.uniform_fill_at(s, f, o, -1.0, 4.0),
    ),
    "gaussian": (
        lambda s, o: rng.gaussian_fill(s, o, 1.5),
        lambda s, f, o: rng.gaussian_fill_at(s, f, o, 1.5),
    ),
    "normal": (
        lambda s, o: rng.normal_fill(s, o, 0.25, 2.0),
        lambda s, f, o: rng.normal_fill_at(s, f, o, 0.25, 2.0),
    ),
    "gumbel": (rng.gumbel_fill, rng.gumbel_fill_at),
    "bernoulli": (
        lambda s, o: rng.bernoulli_fill(s, o, 0.3),
        lambda s, f, o: rng.bernoulli_fill_at(s, f, o, 0.3),
    ),
}


@pytest.mark.parametrize("name", sorted(FLOAT_FILLS))
@pytest.mark.parametrize("n", [1, 2, 7, 22, 101])
def test_float_chunk_invariance(name: str, n: int) -> None:
    whole_fill, at_fill = FLOAT_FILLS[name]
    whole = np.empty(n, np.float32)
    whole_fill(77, whole)
    for cuts in SPLITS:
        parts = _chunked(lambda f, o: at_fill(77, f, o), n, cuts, np.float32)
        assert parts.tobytes() == whole.tobytes(), (name, n, cuts)
    # Single-element fills at every index, odd and even.
    for j in range(n):
        one = np.empty(1, np.float32)
        at_fill(77, j, one)
        assert one.tobytes() == whole[j : j + 1].tobytes(), (name, j)


def test_randint_chunk_invariance() -> None:
    whole = np.empty(33, np.int64)
    rng.randint_fill(5, whole, -100, 100)
    for cuts in SPLITS:
        parts = _chunked(lambda f, o: rng.randint_fill_at(5, f, o, -100, 100), 33, cuts, np.int64)
        np.testing.assert_array_equal(parts, whole)


def test_gaussian_reference_chunking_example() -> None:
    whole = np.empty(6, np.float32)
    rng.gaussian_fill_at(7, 0, whole, 1.0)
    parts = np.empty(6, np.float32)
    rng.gaussian_fill_at(7, 0, parts[:2], 1.0)
    rng.gaussian_fill_at(7, 2, parts[2:], 1.0)
    assert whole.tobytes() == parts.tobytes()
    seq = np.empty(6, np.float32)
    rng.gaussian_fill(7, seq, 1.0)
    assert whole.tobytes() == seq.tobytes()


def test_gaussian_large_offset() -> None:
    big = (1 << 40) + 1  # odd, far into the stream
    a = np.empty(5, np.float32)
    rng.gaussian_fill_at(3, big, a)
    b = np.empty(6, np.float32)
    rng.gaussian_fill_at(3, big - 1, b)
    assert a.tobytes() == b[1:].tobytes()


# --- distributions ------------------------------------------------------------


def test_uniform_range_and_moments() -> None:
    out = np.empty(100_000, np.float32)
    rng.uniform_fill(1, out, 2.0, 5.0)
    assert out.min() >= 2.0 and out.max() < 5.0
    assert abs(out.mean() - 3.5) < 0.02
    rng.uniform_fill(2, out, 0.0, 1.0)
    assert out.min() >= 0.0 and out.max() < 1.0
    assert abs(out.var() - 1 / 12) < 0.002


def test_uniform_half_open_clamp() -> None:
    # A span so tiny that every draw rounds to lo or hi: hi must never appear.
    lo = np.float32(1.0)
    hi = np.nextafter(lo, np.float32(2.0))
    out = np.empty(10_000, np.float32)
    rng.uniform_fill(9, out, float(lo), float(hi))
    assert np.all(out == lo)
    rng.uniform_fill(9, out, 3.0, 3.0)
    assert np.all(out == 3.0)


def test_normal_moments() -> None:
    out = np.empty(100_000, np.float32)
    rng.normal_fill(123, out, 3.0, 2.0)
    assert abs(out.mean() - 3.0) < 0.03
    assert abs(out.std() - 2.0) < 0.03
    rng.gaussian_fill(124, out)
    assert abs(out.mean()) < 0.015
    assert abs(out.std() - 1.0) < 0.015
    assert np.all(np.isfinite(out))


def test_normal_is_scaled_gaussian_plus_mean() -> None:
    g = np.empty(50, np.float32)
    rng.gaussian_fill(8, g, 2.0)
    n = np.empty(50, np.float32)
    rng.normal_fill(8, n, 0.0, 2.0)
    assert g.tobytes() == n.tobytes()
    rng.normal_fill(8, n, 1.5, 2.0)
    assert n.tobytes() == (g + np.float32(1.5)).tobytes()


def test_gumbel_finite_and_moments() -> None:
    out = np.empty(100_000, np.float32)
    rng.gumbel_fill(5, out)
    assert np.all(np.isfinite(out))
    assert abs(out.mean() - 0.5772156649) < 0.02
    assert abs(out.var() - math.pi**2 / 6) < 0.05


def test_bernoulli_rate_and_edges() -> None:
    out = np.empty(100_000, np.float32)
    rng.bernoulli_fill(6, out, 0.3)
    assert set(np.unique(out).tolist()) <= {0.0, 1.0}
    assert abs(out.mean() - 0.3) < 0.01
    u = np.empty(100_000, np.float32)
    rng.uniform_fill(6, u, 0.0, 1.0)
    np.testing.assert_array_equal(out, (u < np.float32(0.3)).astype(np.float32))
    rng.bernoulli_fill(6, out, 0.0)
    assert not out.any()
    rng.bernoulli_fill(6, out, 1.0)
    assert out.all()
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError):
            rng.bernoulli_fill(6, out, bad)


def test_randint_bounds_and_coverage() -> None:
    out = np.empty(10_000, np.int64)
    rng.randint_fill(7, out, -3, 5)
    assert out.min() == -3 and out.max() == 4
    assert set(out.tolist()) == set(range(-3, 5))
    rng.randint_fill(7, out, -(1 << 63), (1 << 63) - 1)
    assert (out < 0).any() and (out > 0).any()
    rng.randint_fill(7, out, 4, 5)
    assert np.all(out == 4)
    with pytest.raises(ValueError):
        rng.randint_fill(7, out, 5, 5)
    with pytest.raises(ValueError):
        rng.randint_fill(7, out, 6, 5)
    with pytest.raises(ValueError):
        rng.randint_fill(7, out, 0, 1 << 63)


def test_randperm_permutation_and_determinism() -> None:
    for n in (1, 2, 5, 1000):
        a = np.empty(n, np.int64)
        rng.randperm_fill(42, a)
        assert sorted(a.tolist()) == list(range(n))
        b = np.empty(n, np.int64)
        rng.randperm_fill(42, b)
        np.testing.assert_array_equal(a, b)
    c = np.empty(1000, np.int64)
    rng.randperm_fill(43, c)
    assert not np.array_equal(a, c)


def test_kaiming_uniform_bound() -> None:
    out = np.empty(10_000, np.float32)
    rng.kaiming_uniform_fill(1, out, 64)
    bound = np.float32(math.sqrt(1 / 64))
    assert out.min() >= -bound and out.max() < bound
    ref = np.empty(10_000, np.float32)
    rng.uniform_fill(1, ref, -float(bound), float(bound))
    assert out.tobytes() == ref.tobytes()
    with pytest.raises(ValueError):
        rng.kaiming_uniform_fill(1, out, 0)


# --- buffer handling and validation ------------------------------------------


def test_fills_flat_view_of_any_shape() -> None:
    flat = np.empty(24, np.float32)
    rng.gaussian_fill(10, flat)
    shaped = np.empty((2, 3, 4), np.float32)
    rng.gaussian_fill(10, shaped)
    assert shaped.reshape(-1).tobytes() == flat.tobytes()
    # Non-contiguous output: filled in C (logical) order.
    base = np.zeros((4, 6), np.float32)
    view = base[:, ::2]
    rng.gaussian_fill(10, view)
    np.testing.assert_array_equal(view.reshape(-1), flat[:12])
    assert np.all(base[:, 1::2] == 0)


def test_empty_and_scalar_outputs() -> None:
    rng.uniform_fill(1, np.empty(0, np.float32), 0, 1)
    rng.gaussian_fill_at(1, 3, np.empty(0, np.float32))
    rng.randperm_fill(1, np.empty(0, np.int64))
    s = np.empty((), np.float32)
    rng.uniform_fill(1, s, 0, 1)
    assert s == py_uniform(1, 1, 0, 1)[0]


def test_argument_validation() -> None:
    f = np.empty(4, np.float32)
    with pytest.raises(TypeError):
        rng.uniform_fill(1, np.empty(4, np.float64), 0, 1)
    with pytest.raises(TypeError):
        rng.uniform_fill(1, [0.0, 0.0], 0, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rng.randint_fill(1, f, 0, 3)
    with pytest.raises(TypeError):
        rng.randperm_fill(1, np.empty(3, np.int32))
    with pytest.raises(ValueError):
        rng.uniform_fill(1, f, 2.0, 1.0)
    with pytest.raises(ValueError):
        rng.uniform_fill(1, f, 0.0, float("inf"))
    with pytest.raises(ValueError):
        rng.gaussian_fill(1, f, float("nan"))
    with pytest.raises(ValueError):
        rng.normal_fill(1, f, 0.0, -1.0)
    with pytest.raises(ValueError):
        rng.gaussian_fill_at(1, -1, f)
    ro = np.empty(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        rng.gumbel_fill(1, ro)


def test_jit_helpers_match_scalar_at() -> None:
    for i in (0, 1, 5, 1 << 40):
        x = rng.at_jit(np.uint64(42), np.uint64(i))
        assert int(x) == rng.at(42, i)
        u = rng.uniform53_jit(np.uint64(42), np.uint64(i))
        assert u == (rng.at(42, i) >> 11) * 2.0**-53
