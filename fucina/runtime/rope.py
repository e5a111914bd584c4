"""Rotary position embedding tables and the position-run value ``AxisRange``.

A :class:`RopeTable` holds, per position row and rotary pair ``i``, the cosine
and sine of the rotation angle. Its ``feature_dim`` is the rotary span (two
features per pair). Tables are built on the host once and reused by every
``rope`` call; ``cos``/``sin`` are writable float32 arrays ``[positions,
feature_dim / 2]`` a caller may fill by hand (custom schedules, 2-D vision
RoPE). ``rope`` reads them at call time (compiled programs included), so a
table edited in place is never stale.

Angle arithmetic: the ``prepare_rope_table*`` builders compute f32 angles
(``f32(position) * f32(inv_freq)``, one f32 rounding), the
``*_inv_freqs_f64`` builder accumulates in f64 and rounds the angle once;
cosine and sine are then taken in f64 and rounded to f32. A position run
given as an :class:`AxisRange` and the same run given as an array go through
the same arithmetic, so their tables are bitwise identical.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Deinitialized, IndexOutOfBounds, InvalidDataLength, InvalidShape
from .raw import MAX_ELEMENTS, MAX_ELEMENTS_TEXT


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {v!r}")
    return int(v)


def _real(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {v!r}")
    try:
        return float(v)
    except OverflowError:  # an int beyond float
        raise ValueError(f"{what} must be within the float range, got {v!r}") from None


@dataclass(frozen=True, kw_only=True)
class AxisRange:
    """A run of absolute positions ``[origin, origin + len)``: an axis with an origin.

    ``AxisRange(len=n)`` is a prefill over ``0..n``; ``AxisRange(origin=p0,
    len=n)`` a decode step starting at absolute position ``p0``.
    """

    origin: int = 0
    len: int

    def __post_init__(self) -> None:
        _int(self.origin, "AxisRange.origin")
        if _int(self.len, "AxisRange.len") < 0:
            raise InvalidShape(f"AxisRange.len must be >= 0, got {self.len}")

    def at(self, i: int) -> int:
        """The absolute position of the axis's ``i``-th element."""
        i = _int(i, "i")
        if not 0 <= i < self.len:
            raise IndexOutOfBounds(f"index {i} out of range for an AxisRange of len {self.len}")
        return self.origin + i

    def end(self) -> int:
        """One past the last absolute position."""
        return self.origin + self.len

    def narrowed(self, start: int, count: int) -> AxisRange:
        """The sub-run ``[start, start + count)`` of this axis, keeping absolute positions."""
        start, count = _int(start, "start"), _int(count, "count")
        if start < 0 or count < 0 or start + count > self.len:
            raise IndexOutOfBounds(
                f"narrowed({start}, {count}) exceeds an AxisRange of len {self.len}")
        return AxisRange(origin=self.origin + start, len=count)

    def shifted(self, delta: int) -> AxisRange:
        """The same run moved by ``delta`` positions."""
        return AxisRange(origin=self.origin + _int(delta, "delta"), len=self.len)

    def rebased(self, new_origin: int) -> AxisRange:
        """The same length starting at ``new_origin``."""
        return AxisRange(origin=_int(new_origin, "new_origin"), len=self.len)

    def contains(self, absolute: int) -> bool:
        """Whether absolute position ``absolute`` lies in the run."""
        return self.origin <= _int(absolute, "absolute") < self.origin + self.len

    def write_into(self, out: np.ndarray) -> None:
        """Fill the int32 array ``out`` (exactly ``len`` elements) with the positions."""
        if not isinstance(out, np.ndarray):
            raise TypeError(f"write_into needs a numpy array, got {type(out).__name__}")
        if out.size != self.len:
            raise InvalidDataLength(f"out holds {out.size} elements, the run has {self.len}")
        lo, hi = self.origin, self.origin + self.len - 1
        info = np.iinfo(np.int32)
        if self.len and (lo < info.min or hi > info.max):
            raise InvalidShape(f"positions {lo}..{hi} do not fit in int32")
        out.reshape(-1)[...] = np.arange(lo, lo + self.len, dtype=np.int64)

    def positions(self) -> np.ndarray:
        """The positions as an int64 array (the materialization it usually avoids)."""
        return np.arange(self.origin, self.origin + self.len, dtype=np.int64)


@dataclass(frozen=True, kw_only=True, eq=False)
class RopeTheta:
    """On-the-fly RoPE factors: pair ``i`` at position ``p`` turns by ``p / theta_base**(2i/d)``.

    ``positions`` is a sequence, a numpy integer array or an integer fucina
    tensor (a traced input under ``compile``); it rotates the whole feature axis.
    """

    positions: Any
    theta_base: float

    def __post_init__(self) -> None:
        if _real(self.theta_base, "RopeTheta.theta_base") <= 0:
            raise InvalidShape(f"RopeTheta.theta_base must be > 0, got {self.theta_base}")


def host_positions(positions: Any, what: str = "positions") -> np.ndarray:
    """Host position data (sequence or numpy integers) as an int64 array."""
    try:
        arr = np.asarray(positions)
    except (TypeError, ValueError):
        raise InvalidDataLength(f"{what} must be a sequence of ints") from None
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        if arr.size and arr.dtype.kind == "f" and np.all(np.isfinite(arr)) \
                and np.all(arr == np.floor(arr)):
            arr = arr.astype(np.int64)
        else:
            raise InvalidDataLength(f"{what} must be integers, got {arr.dtype}")
    if arr.size == 0:
        raise InvalidShape(f"no {what} given")
    return arr.astype(np.int64)


def pow_inv_freqs(feature_dim: int, theta_base: float) -> np.ndarray:
    """``theta_base ** (-2i / feature_dim)`` for each pair ``i``, in f64."""
    i = np.arange(feature_dim // 2, dtype=np.float64)
    return np.power(np.float64(theta_base), -2.0 * i / feature_dim)


def _check_dim(feature_dim: Any) -> int:
    d = _int(feature_dim, "feature_dim")
    if d <= 0 or d % 2 or d > MAX_ELEMENTS:
        raise InvalidShape(f"feature_dim must be a positive even number up to "
                           f"{MAX_ELEMENTS_TEXT}, got {d}")
    return d


class RopeTable:
    """Prepared RoPE factors: ``cos``/``sin`` float32 ``[positions, feature_dim / 2]``.

    Build with ``ctx.prepare_rope_table*``. ``feature_dim`` is the rotary span:
    equal to the feature axis rotates it fully, smaller rotates the leading
    (``half``, ``interleaved``) or trailing (``interleaved_tail``) features and
    passes the rest through. ``deinit()`` releases the buffers.
    """

    __slots__ = ("_cos", "_sin", "feature_dim", "inverse", "__weakref__")

    def __init__(self, cos: np.ndarray, sin: np.ndarray, feature_dim: int,
                 inverse: bool = False):
        d = _check_dim(feature_dim)
        cos = np.ascontiguousarray(cos, dtype=np.float32)
        sin = np.ascontiguousarray(sin, dtype=np.float32)
        if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[1] != d // 2:
            raise InvalidShape(f"cos/sin tables {cos.shape}/{sin.shape} are not "
                               f"[positions, {d // 2}]")
        self._cos: np.ndarray | None = cos
        self._sin: np.ndarray | None = sin
        self.feature_dim = d
        self.inverse = bool(inverse)

    @property
    def cos(self) -> np.ndarray:
        """Cosines ``[positions, feature_dim / 2]`` (writable)."""
        if self._cos is None:
            raise Deinitialized("RopeTable was deinit'ed")
        return self._cos

    @property
    def sin(self) -> np.ndarray:
        """Sines ``[positions, feature_dim / 2]`` (writable; negated angles if ``inverse``)."""
        if self._sin is None:
            raise Deinitialized("RopeTable was deinit'ed")
        return self._sin

    @property
    def positions(self) -> int:
        """Number of position rows."""
        return self.cos.shape[0]

    def deinit(self) -> None:
        """Release the tables; any later use raises ``Deinitialized``."""
        if self._cos is None:
            raise Deinitialized("RopeTable was already deinit'ed")
        self._cos = None
        self._sin = None

    def __enter__(self) -> RopeTable:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cos is not None:
            self.deinit()

    def __repr__(self) -> str:
        if self._cos is None:
            return "RopeTable(deinit'ed)"
        return (f"RopeTable(positions={self.positions}, feature_dim={self.feature_dim}, "
                f"inverse={self.inverse})")


def _table_f32(pos: np.ndarray, inv_freq: np.ndarray, feature_dim: int,
               inverse: bool) -> RopeTable:
    """Angles ``f32(p) * f32(inv_freq)`` rounded once to f32; cos/sin in f64, rounded."""
    ang = pos.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    return _from_angles(ang, feature_dim, inverse)


def _from_angles(ang: np.ndarray, feature_dim: int, inverse: bool) -> RopeTable:
    a64 = ang.astype(np.float64)
    cos = np.cos(a64).astype(np.float32)
    sin = np.sin(a64).astype(np.float32)
    if inverse:
        sin = -sin
    return RopeTable(cos, sin, feature_dim, inverse)


def _freq_factors(freq_factors: Any, feature_dim: int) -> np.ndarray:
    try:
        ff = np.asarray(freq_factors, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError, OverflowError):  # (an int beyond float)
        raise InvalidDataLength("freq_factors must be a sequence of numbers") from None
    if ff.size != feature_dim // 2:
        raise InvalidDataLength(
            f"freq_factors has {ff.size} entries, feature_dim {feature_dim} needs "
            f"{feature_dim // 2}")
    if not np.all(np.isfinite(ff)) or np.any(ff == 0):
        raise InvalidShape("freq_factors must be finite and nonzero")
    return ff


def prepare(positions: Any, feature_dim: Any, theta_base: Any, inverse: bool = False,
            freq_factors: Any = None) -> RopeTable:
    """Table for explicit positions (f32 angles); ``freq_factors`` divides each pair's
    frequency (ggml ``rope_ext``)."""
    d = _check_dim(feature_dim)
    base = _real(theta_base, "theta_base")
    if base <= 0:
        raise InvalidShape(f"theta_base must be > 0, got {base}")
    pos = positions.positions() if isinstance(positions, AxisRange) else \
        host_positions(positions)
    if pos.size == 0:
        raise InvalidShape("a RoPE table needs at least one position")
    inv = pow_inv_freqs(d, base)
    if freq_factors is not None:
        inv = inv / _freq_factors(freq_factors, d)
    return _table_f32(pos, inv, d, bool(inverse))


def prepare_inv_freqs_f64(pos0: Any, count: Any, inv_freq: Any, inverse: bool = False
                          ) -> RopeTable:
    """Table for positions ``pos0 .. pos0 + count`` from per-pair f64 inverse
    frequencies; angles ``(pos0 + j) * inv_freq[i]`` in f64, rounded once to f32."""
    p0 = _int(pos0, "pos0")
    n = _int(count, "count")
    if n <= 0 or n > MAX_ELEMENTS:
        raise InvalidShape(f"count must be in [1, {MAX_ELEMENTS_TEXT}], got {n}")
    if abs(p0) > 2**53 or abs(p0 + n) > 2**53:  # positions exact in the f64 angles
        raise InvalidShape(f"positions {p0} .. {p0 + n} reach beyond 2**53")
    try:
        inv = np.asarray(inv_freq, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError, OverflowError):  # (an int beyond float)
        raise InvalidDataLength("inv_freq must be a sequence of numbers") from None
    if inv.size == 0:
        raise InvalidShape("inv_freq is empty")
    pos = np.arange(p0, p0 + n, dtype=np.float64)
    ang = (pos[:, None] * inv[None, :]).astype(np.float32)
    return _from_angles(ang, 2 * inv.size, bool(inverse))


def yarn_blend_inv_freqs_f64(dim: Any, base: Any, factor: Any, orig_ctx: Any) -> np.ndarray:
    """DeepSeek-family YaRN inverse frequencies (beta_fast 32, beta_slow 1) in f64.

    Pairs rotating faster than ``beta_fast`` turns over ``orig_ctx`` keep their
    frequency, slower than ``beta_slow`` are divided by ``factor``, with a
    linear ramp between; ``factor <= 1`` gives the plain power schedule.
    """
    d = _check_dim(dim)
    b = _real(base, "base")
    f = _real(factor, "factor")
    ctx_len = _real(orig_ctx, "orig_ctx")
    if b <= 0 or ctx_len <= 0:
        raise InvalidShape(f"base and orig_ctx must be > 0, got {b} and {ctx_len}")
    freqs = pow_inv_freqs(d, b)
    if f <= 1.0:
        return freqs

    def correction_dim(rotations: float) -> float:
        return d * math.log(ctx_len / (rotations * 2 * math.pi)) / (2 * math.log(b))

    low = max(math.floor(correction_dim(32.0)), 0)
    high: float = min(math.ceil(correction_dim(1.0)), d - 1)
    if low == high:
        high += 0.001  # a one-pair ramp would divide by zero
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    smooth = 1.0 - ramp
    return freqs / f * (1.0 - smooth) + freqs * smooth

