"""Deterministic counter-based random numbers (splitmix64).

Every random value fucina produces comes from this module. The stream started
at a 64-bit ``seed`` is the splitmix64 sequence, and its ``i``-th output can be
computed directly with :func:`at` (no need to run the previous ``i`` steps).
Every fill below therefore maps *element index* to value as a pure function of
``(seed, index)``: filling a buffer in one call, or in any number of chunks
with the ``*_at`` variants, produces bitwise identical results.

These (seed -> values) mappings are stable contracts: a stored seed must
regenerate exactly the same tensor in every future version. Do not change the
arithmetic of any function in this module.

Mappings (``x`` is one 64-bit stream output):

* uniform ``[lo, hi)``: ``u = (x >> 11) * 2**-53`` in f64,
  ``v = f32(lo + (hi - lo) * u)``; a ``v`` that rounded up to ``hi`` is
  replaced by the largest f32 below ``hi``.
* gaussian (Box-Muller): element ``j`` uses the aligned pair of outputs
  ``a = at(seed, j & ~1)``, ``b = at(seed, (j & ~1) + 1)``;
  ``ua = ((a >> 11) + 1) * 2**-53`` in ``(0, 1]``, ``ub = (b >> 11) * 2**-53``,
  ``r = sqrt(-2 ln ua)``, ``t = 2 pi ub``; even ``j`` is ``r cos t * scale``,
  odd ``j`` is ``r sin t * scale`` (all in f64, rounded once to f32).
* normal: the gaussian value with ``scale = std``, then ``+ mean`` in f32.
* gumbel: ``u = ((x >> 11) + 0.5) * 2**-53`` (strictly inside ``(0, 1)``),
  ``-ln(-ln u)`` in f64, rounded to f32.
* bernoulli: ``1.0`` iff the uniform ``[0, 1)`` f32 value is ``< p``.
* randint: ``low + ((x * span) >> 64)`` with ``span = high - low`` in
  two's-complement 64-bit arithmetic (full int64 ranges work).
* randperm: Fisher-Yates over ``0..n-1``; for ``k = n-1`` down to ``1`` swap
  positions ``k`` and ``(at(seed, n-1-k) * (k+1)) >> 64``.

The heavy lifting is done by Numba kernels; the Python wrappers validate their
arguments (raising ``TypeError``/``ValueError``) and reduce seeds modulo 2**64.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numba import njit

__all__ = [
    "MASK64",
    "splitmix64",
    "at",
    "at_jit",
    "uniform53_jit",
    "uniform_fill",
    "uniform_fill_at",
    "gaussian_fill",
    "gaussian_fill_at",
    "normal_fill",
    "normal_fill_at",
    "gumbel_fill",
    "gumbel_fill_at",
    "bernoulli_fill",
    "bernoulli_fill_at",
    "randint_fill",
    "randint_fill_at",
    "randperm_fill",
    "kaiming_uniform_fill",
]

MASK64 = (1 << 64) - 1
"""Mask reducing a Python int modulo 2**64."""

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

# uint64 constants for the Numba kernels (mixing them with int64 values would
# promote to float64, so every integer in the kernels is kept uint64).
_U_GAMMA = np.uint64(_GAMMA)
_U_MIX1 = np.uint64(_MIX1)
_U_MIX2 = np.uint64(_MIX2)
_U_ONE = np.uint64(1)
_U_NOT_ONE = np.uint64(MASK64 ^ 1)
_U_LO32 = np.uint64(0xFFFFFFFF)
_U_S11 = np.uint64(11)
_U_S27 = np.uint64(27)
_U_S30 = np.uint64(30)
_U_S31 = np.uint64(31)
_U_S32 = np.uint64(32)
_TWO_M53 = 2.0**-53
_TWO_PI = 2.0 * math.pi


# ---------------------------------------------------------------------------
# Pure-Python scalar access
# ---------------------------------------------------------------------------


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MIX1) & MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & MASK64
    return z ^ (z >> 31)


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


def _seed(seed: object) -> int:
    return _as_int(seed, "seed") & MASK64


def _counter(value: object, name: str) -> int:
    v = _as_int(value, name)
    if v < 0 or v > MASK64:
        raise ValueError(f"{name} must be in [0, 2**64), got {v}")
    return v


def splitmix64(state: int) -> tuple[int, int]:
    """Advance a splitmix64 state by one step.

    Args:
        state: the current state (any integer; reduced modulo 2**64).

    Returns:
        ``(output, next_state)``: the 64-bit output of this step and the state
        to pass to the next call. Starting from ``seed``, the ``i``-th output
        equals ``at(seed, i)``.
    """
    nxt = (_as_int(state, "state") + _GAMMA) & MASK64
    return _mix(nxt), nxt


def at(seed: int, i: int) -> int:
    """Return the ``i``-th output (0-based) of the splitmix64 stream at ``seed``.

    O(1): computed directly as ``mix(seed + (i + 1) * gamma)`` modulo 2**64.

    Args:
        seed: stream seed (any integer; reduced modulo 2**64).
        i: output index, ``0 <= i < 2**64``.

    Returns:
        The output as a Python int in ``[0, 2**64)``.
    """
    s = _seed(seed)
    k = _counter(i, "i")
    return _mix((s + (k + 1) * _GAMMA) & MASK64)


# ---------------------------------------------------------------------------
# Numba kernels
# ---------------------------------------------------------------------------


@njit(cache=True, inline="always")
def at_jit(seed: np.uint64, i: np.uint64) -> np.uint64:
    """Numba-callable ``at``: both arguments and the result are ``np.uint64``."""
    z = seed + (i + _U_ONE) * _U_GAMMA
    z = (z ^ (z >> _U_S30)) * _U_MIX1
    z = (z ^ (z >> _U_S27)) * _U_MIX2
    return z ^ (z >> _U_S31)


@njit(cache=True, inline="always")
def uniform53_jit(seed: np.uint64, i: np.uint64) -> float:
    """Numba-callable 53-bit ``[0, 1)`` f64 uniform of ``at(seed, i)`` (uint64 args)."""
    return np.float64(at_jit(seed, i) >> _U_S11) * _TWO_M53


@njit(cache=True, inline="always")
def _mulhi64(a, b):
    """High 64 bits of the 128-bit product of two uint64 values."""
    a_lo = a & _U_LO32
    a_hi = a >> _U_S32
    b_lo = b & _U_LO32
    b_hi = b >> _U_S32
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _U_S32) + (p1 & _U_LO32) + (p2 & _U_LO32)
    return p3 + (p1 >> _U_S32) + (p2 >> _U_S32) + (mid >> _U_S32)


@njit(cache=True)
def _uniform_kernel(seed, first, out, lo64, span, hi, below_hi):
    for k in range(out.shape[0]):
        u = np.float64(at_jit(seed, first + np.uint64(k)) >> _U_S11) * _TWO_M53
        v = np.float32(lo64 + span * u)
        if v >= hi:
            v = below_hi
        out[k] = v


@njit(cache=True)
def _bernoulli_kernel(seed, first, out, p):
    one = np.float32(1.0)
    below_one = np.float32(np.nextafter(np.float32(1.0), np.float32(0.0)))
    for k in range(out.shape[0]):
        u = np.float64(at_jit(seed, first + np.uint64(k)) >> _U_S11) * _TWO_M53
        v = np.float32(u)
        if v >= one:
            v = below_one
        out[k] = one if v < p else np.float32(0.0)


@njit(cache=True, inline="always")
def _box_muller(seed, pair):
    """Radius and angle of the Box-Muller pair whose even counter is ``pair``."""
    a = at_jit(seed, pair)
    b = at_jit(seed, pair + _U_ONE)
    ua = (np.float64(a >> _U_S11) + 1.0) * _TWO_M53  # (0, 1]
    ub = np.float64(b >> _U_S11) * _TWO_M53  # [0, 1)
    return math.sqrt(-2.0 * math.log(ua)), _TWO_PI * ub


@njit(cache=True)
def _gaussian_kernel(seed, first, out, scale, mean):
    n = out.shape[0]
    add_mean = mean != np.float32(0.0)
    o = 0
    j = first
    if n > 0 and (j & _U_ONE) == _U_ONE:
        # Odd start: only the sin half of the preceding pair.
        radius, angle = _box_muller(seed, j & _U_NOT_ONE)
        out[0] = np.float32(radius * math.sin(angle) * scale)
        o = 1
        j = j + _U_ONE
    while o < n:
        radius, angle = _box_muller(seed, j)
        out[o] = np.float32(radius * math.cos(angle) * scale)
        if o + 1 < n:
            out[o + 1] = np.float32(radius * math.sin(angle) * scale)
        o += 2
        j = j + np.uint64(2)
    if add_mean:
        for k in range(n):
            out[k] = out[k] + mean


@njit(cache=True)
def _gumbel_kernel(seed, first, out):
    for k in range(out.shape[0]):
        x = at_jit(seed, first + np.uint64(k))
        u = (np.float64(x >> _U_S11) + 0.5) * _TWO_M53  # (0, 1) strictly
        out[k] = np.float32(-math.log(-math.log(u)))


@njit(cache=True)
def _randint_kernel(seed, first, out, low_bits, span):
    for k in range(out.shape[0]):
        offset = _mulhi64(at_jit(seed, first + np.uint64(k)), span)
        out[k] = np.int64(low_bits + offset)


@njit(cache=True)
def _randperm_kernel(seed, out):
    n = out.shape[0]
    for i in range(n):
        out[i] = i
    counter = np.uint64(0)
    for k in range(n - 1, 0, -1):
        j = np.int64(_mulhi64(at_jit(seed, counter), np.uint64(k + 1)))
        counter = counter + _U_ONE
        tmp = out[k]
        out[k] = out[j]
        out[j] = tmp


# ---------------------------------------------------------------------------
# Argument handling
# ---------------------------------------------------------------------------


def _flat_target(out: object, dtype: type) -> tuple[np.ndarray, np.ndarray | None]:
    """Return a contiguous 1-D buffer to fill and, if it is a copy, the array to write back."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != np.dtype(dtype):
        raise TypeError(f"out must have dtype {np.dtype(dtype).name}, got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out must be writable")
    if out.flags.c_contiguous:
        return out.reshape(-1), None
    return np.empty(out.size, dtype=dtype), out


def _finish(flat: np.ndarray, writeback: np.ndarray | None) -> None:
    if writeback is not None:
        writeback[...] = flat.reshape(writeback.shape)


def _f32(value: object, name: str) -> np.float32:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    with np.errstate(over="ignore"):
        v = np.float32(value)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite as float32, got {value!r}")
    return v


def _i64(value: object, name: str) -> int:
    v = _as_int(value, name)
    if v < _I64_MIN or v > _I64_MAX:
        raise ValueError(f"{name} must fit in int64, got {v}")
    return v


def _uniform_impl(seed: int, first: int, out: np.ndarray, lo: float, hi: float) -> None:
    s = _seed(seed)
    f = _counter(first, "first")
    lo32 = _f32(lo, "lo")
    hi32 = _f32(hi, "hi")
    if lo32 > hi32:
        raise ValueError(f"uniform requires lo <= hi, got lo={lo!r}, hi={hi!r}")
    flat, writeback = _flat_target(out, np.float32)
    lo64 = np.float64(lo32)
    span = np.float64(hi32) - lo64
    below_hi = np.nextafter(hi32, lo32)
    _uniform_kernel(np.uint64(s), np.uint64(f), flat, lo64, span, hi32, below_hi)
    _finish(flat, writeback)


def _gaussian_impl(
    seed: int, first: int, out: np.ndarray, scale: np.float32, mean: np.float32
) -> None:
    s = _seed(seed)
    f = _counter(first, "first")
    flat, writeback = _flat_target(out, np.float32)
    _gaussian_kernel(np.uint64(s), np.uint64(f), flat, scale, mean)
    _finish(flat, writeback)


# ---------------------------------------------------------------------------
# Public fills
# ---------------------------------------------------------------------------


def uniform_fill(seed: int, out: np.ndarray, lo: float, hi: float) -> None:
    """Fill float32 ``out`` in place with uniform draws on ``[lo, hi)``.

    Element ``i`` (of ``out``'s C-order flat view) is a pure function of
    ``(seed, i)``; see :func:`uniform_fill_at` for the mapping. ``hi`` is never
    produced (the rare round-up is clamped to the largest float32 below
    ``hi``); ``lo == hi`` fills with ``lo``.

    Raises:
        TypeError: ``out`` is not a float32 ndarray, or a non-numeric argument.
        ValueError: non-finite bounds, ``lo > hi``, or a read-only ``out``.
    """
    _uniform_impl(seed, 0, out, lo, hi)


def uniform_fill_at(seed: int, first: int, out: np.ndarray, lo: float, hi: float) -> None:
    """Fill ``out`` with elements ``first .. first + out.size`` of the uniform stream.

    Element ``j`` is ``f32(lo + (hi - lo) * u)`` with
    ``u = (at(seed, j) >> 11) * 2**-53`` computed in float64 (``lo``/``hi``
    rounded to float32 first), clamped below ``hi``. Bitwise equal to the
    matching slice of :func:`uniform_fill` under any chunking.
    """
    _uniform_impl(seed, first, out, lo, hi)


def gaussian_fill(seed: int, out: np.ndarray, scale: float = 1.0) -> None:
    """Fill float32 ``out`` in place with standard normals times ``scale`` (Box-Muller).

    Two stream outputs per value pair; see :func:`gaussian_fill_at`.
    """
    gaussian_fill_at(seed, 0, out, scale)


def gaussian_fill_at(seed: int, first: int, out: np.ndarray, scale: float = 1.0) -> None:
    """Fill ``out`` with elements ``first .. first + out.size`` of the gaussian stream.

    Element ``j`` belongs to the Box-Muller pair built from
    ``at(seed, j & ~1)`` and ``at(seed, (j & ~1) + 1)``: even ``j`` takes the
    cosine half, odd ``j`` the sine half. So a fill starting at an odd
    ``first`` is bitwise equal to the corresponding slice of a whole fill.

    Raises:
        TypeError: ``out`` is not a float32 ndarray, or a non-numeric argument.
        ValueError: non-finite ``scale``, ``first`` outside ``[0, 2**64)``, or a
            read-only ``out``.
    """
    _gaussian_impl(seed, first, out, _f32(scale, "scale"), np.float32(0.0))


def normal_fill(seed: int, out: np.ndarray, mean: float, std: float) -> None:
    """Fill float32 ``out`` with ``mean + std * z`` where ``z`` is :func:`gaussian_fill`'s draw.

    Computed as the gaussian value with ``scale = std`` plus ``mean`` in
    float32 (no addition when ``mean == 0``).
    """
    normal_fill_at(seed, 0, out, mean, std)


def normal_fill_at(seed: int, first: int, out: np.ndarray, mean: float, std: float) -> None:
    """Counter-based :func:`normal_fill`: elements ``first .. first + out.size``.

    Raises:
        ValueError: non-finite ``mean``/``std`` or negative ``std`` (plus the
            :func:`gaussian_fill_at` errors).
    """
    mean32 = _f32(mean, "mean")
    std32 = _f32(std, "std")
    if std32 < 0:
        raise ValueError(f"std must be >= 0, got {std!r}")
    _gaussian_impl(seed, first, out, std32, mean32)


def gumbel_fill(seed: int, out: np.ndarray) -> None:
    """Fill float32 ``out`` with standard Gumbel(0, 1) draws (always finite).

    See :func:`gumbel_fill_at` for the mapping.
    """
    gumbel_fill_at(seed, 0, out)


def gumbel_fill_at(seed: int, first: int, out: np.ndarray) -> None:
    """Counter-based :func:`gumbel_fill`: elements ``first .. first + out.size``.

    Element ``j`` is ``f32(-ln(-ln(u)))`` with
    ``u = ((at(seed, j) >> 11) + 0.5) * 2**-53`` in float64, strictly inside
    ``(0, 1)``.
    """
    s = _seed(seed)
    f = _counter(first, "first")
    flat, writeback = _flat_target(out, np.float32)
    _gumbel_kernel(np.uint64(s), np.uint64(f), flat)
    _finish(flat, writeback)


def bernoulli_fill(seed: int, out: np.ndarray, p: float) -> None:
    """Fill float32 ``out`` with 0/1 Bernoulli(``p``) draws.

    Element ``i`` is ``1.0`` iff the ``[0, 1)`` value of
    ``uniform_fill(seed, ..., 0, 1)`` at ``i`` is below ``p`` (as float32).

    Raises:
        ValueError: ``p`` outside ``[0, 1]`` (or NaN).
    """
    bernoulli_fill_at(seed, 0, out, p)


def bernoulli_fill_at(seed: int, first: int, out: np.ndarray, p: float) -> None:
    """Counter-based :func:`bernoulli_fill`: elements ``first .. first + out.size``."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"p must be a real number, got {type(p).__name__}")
    if not (0.0 <= float(p) <= 1.0):
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    s = _seed(seed)
    f = _counter(first, "first")
    flat, writeback = _flat_target(out, np.float32)
    _bernoulli_kernel(np.uint64(s), np.uint64(f), flat, np.float32(p))
    _finish(flat, writeback)


def randint_fill(seed: int, out: np.ndarray, low: int, high: int) -> None:
    """Fill int64 ``out`` with uniform integers on ``[low, high)``.

    Element ``i`` is ``low + ((at(seed, i) * span) >> 64)`` with
    ``span = high - low`` (64-bit two's complement, so the full int64 range
    is allowed).

    Raises:
        TypeError: ``out`` is not an int64 ndarray, or non-integer bounds.
        ValueError: ``low >= high`` or bounds outside int64.
    """
    randint_fill_at(seed, 0, out, low, high)


def randint_fill_at(seed: int, first: int, out: np.ndarray, low: int, high: int) -> None:
    """Counter-based :func:`randint_fill`: elements ``first .. first + out.size``."""
    lo = _i64(low, "low")
    hi = _i64(high, "high")
    if lo >= hi:
        raise ValueError(f"randint requires low < high, got low={lo}, high={hi}")
    s = _seed(seed)
    f = _counter(first, "first")
    flat, writeback = _flat_target(out, np.int64)
    span = (hi - lo) & MASK64
    _randint_kernel(np.uint64(s), np.uint64(f), flat, np.uint64(lo & MASK64), np.uint64(span))
    _finish(flat, writeback)


def randperm_fill(seed: int, out: np.ndarray) -> None:
    """Fill int64 ``out`` with a permutation of ``0 .. out.size - 1`` (Fisher-Yates).

    Starting from the identity, for ``k = n-1`` down to ``1`` positions ``k``
    and ``(at(seed, n-1-k) * (k+1)) >> 64`` are swapped. Deterministic in
    ``(seed, n)``; not chunkable (there is no ``_at`` form).
    """
    s = _seed(seed)
    flat, writeback = _flat_target(out, np.int64)
    _randperm_kernel(np.uint64(s), flat)
    _finish(flat, writeback)


def kaiming_uniform_fill(seed: int, out: np.ndarray, fan_in: int) -> None:
    """PyTorch's default ``nn.Linear`` init (``kaiming_uniform_`` with ``a = sqrt(5)``).

    Fills float32 ``out`` via :func:`uniform_fill` on ``[-b, b)`` with
    ``b = f32(sqrt(1 / fan_in))``.

    Raises:
        ValueError: ``fan_in <= 0``.
    """
    n = _as_int(fan_in, "fan_in")
    if n <= 0:
        raise ValueError(f"fan_in must be positive, got {n}")
    bound = float(np.float32(math.sqrt(1.0 / n)))
    _uniform_impl(seed, 0, out, -bound, bound)
