"""Encoding float32 values into the GGML block formats.

Every encoder follows ggml's reference quantizer (``quantize_row_*_ref`` in
``ggml-quants.c``) in f32 arithmetic:

- the 32-element legacy formats (q4_0, q4_1, q5_0, q5_1, q8_0, q8_1) and the
  ternary/FP4 formats (tq1_0, tq2_0, mxfp4, q2_0) are vectorized numpy, byte
  identical to ``gguf.quants.quantize`` wherever gguf-py implements the
  format (q8_1 and q2_0 it does not: they follow the C reference);
- the K-quants (q4_k, q5_k, q6_k) and q8_k run ggml's iterative scale
  searches per block in Numba, one block per iteration, every operation in
  the C code's f32 order (``nearest_int`` is round-half-to-even, as ggml's
  ``1.5 * 2**23`` trick is), so the bytes equal ggml's reference encoder
  built without FMA contraction.

Inputs must be finite (ggml's encoders assume it); callers check.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import njit, prange

from ..blocks import BLOCK_DTYPES, BLOCK_SIZES
from .quant import _round_half_away, quantize_q8_0

__all__ = ["ENCODE_FORMATS", "encode_blocks"]

_F32 = np.float32
F = np.float32


def _f16_bits(v: np.ndarray) -> np.ndarray:
    """f32 -> IEEE binary16 bits, round to nearest even (ggml's GGML_FP32_TO_FP16)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(v, dtype=_F32).astype(np.float16).view(np.uint16)


def _pack(dtype: str, fields: dict[str, np.ndarray]) -> np.ndarray:
    n = next(iter(fields.values())).shape[0]
    out = np.empty(n, dtype=BLOCK_DTYPES[dtype])
    for name, value in fields.items():
        out[name] = value.reshape(out[name].shape)
    return out


def _absmax_signed(rows: np.ndarray) -> np.ndarray:
    """The element of largest magnitude per row (the first one on ties), keepdims."""
    idx = np.abs(rows).argmax(axis=-1)[:, None]
    return np.take_along_axis(rows, idx, axis=-1)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, _F32(0), _F32(1) / d).astype(_F32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) codes -> (n, 16) bytes: element j low nibble, element j+16 high nibble."""
    return (q[:, :16] & np.uint8(0xF)) | (q[:, 16:] << np.uint8(4))


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 codes, as the 4 little-endian bytes of ggml's ``qh``."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=-1, bitorder="little")


# --- legacy 32-element formats -------------------------------------------------------


def _enc_q4_0(x: np.ndarray) -> np.ndarray:
    d = _absmax_signed(x) / _F32(-8)
    q = np.trunc(x * _inverse(d) + _F32(8.5)).astype(np.uint8).clip(0, 15)
    return _pack("q4_0", {"d": _f16_bits(d), "qs": _nibbles(q)})


def _enc_q4_1(x: np.ndarray) -> np.ndarray:
    mx, mn = x.max(axis=-1, keepdims=True), x.min(axis=-1, keepdims=True)
    d = (mx - mn) / _F32(15)
    q = np.trunc((x - mn) * _inverse(d) + _F32(0.5)).astype(np.uint8).clip(0, 15)
    return _pack("q4_1", {"d": _f16_bits(d), "m": _f16_bits(mn), "qs": _nibbles(q)})


def _enc_q5_0(x: np.ndarray) -> np.ndarray:
    d = _absmax_signed(x) / _F32(-16)
    q = np.trunc(x * _inverse(d) + _F32(16.5)).astype(np.uint8).clip(0, 31)
    return _pack("q5_0", {"d": _f16_bits(d), "qh": _fifth_bits(q), "qs": _nibbles(q)})


def _enc_q5_1(x: np.ndarray) -> np.ndarray:
    mx, mn = x.max(axis=-1, keepdims=True), x.min(axis=-1, keepdims=True)
    d = (mx - mn) / _F32(31)
    q = np.trunc((x - mn) * _inverse(d) + _F32(0.5)).astype(np.uint8).clip(0, 31)
    return _pack("q5_1", {"d": _f16_bits(d), "m": _f16_bits(mn), "qh": _fifth_bits(q),
                          "qs": _nibbles(q)})


def _enc_q8_0(x: np.ndarray) -> np.ndarray:
    return quantize_q8_0(x).reshape(-1)


def _enc_q8_1(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=-1, keepdims=True) / _F32(127)
    q = _round_half_away(x * _inverse(d)).astype(np.int8)
    s = q.astype(np.int32).sum(axis=-1, keepdims=True).astype(_F32) * d
    return _pack("q8_1", {"d": _f16_bits(d), "s": _f16_bits(s), "qs": q})


# --- ternary and FP4 -----------------------------------------------------------------


def _trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-block absmax ``d`` and codes ``round(x / d) + 1`` in {0, 1, 2}."""
    d = np.abs(x).max(axis=-1, keepdims=True)
    q = (_round_half_away(x * _inverse(d)) + _F32(1)).astype(np.uint8)
    return d, q


def _enc_tq2_0(x: np.ndarray) -> np.ndarray:
    d, q = _trits(x)
    q = q.reshape(len(x), 2, 4, 32) << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    qs = (q[:, :, 0] | q[:, :, 1] | q[:, :, 2] | q[:, :, 3]).reshape(len(x), 64)
    return _pack("tq2_0", {"qs": qs, "d": _f16_bits(d)})


def _enc_tq1_0(x: np.ndarray) -> np.ndarray:
    d, q = _trits(x)
    n = len(x)
    p5 = np.array([81, 27, 9, 3, 1], dtype=np.uint8)[:, None]
    q0 = (q[:, :160].reshape(n, 5, 32) * p5).sum(axis=1, dtype=np.uint8)
    q1 = (q[:, 160:240].reshape(n, 5, 16) * p5).sum(axis=1, dtype=np.uint8)
    qh = (q[:, 240:].reshape(n, 4, 4) * p5[:4]).sum(axis=1, dtype=np.uint8)
    # ceil(q * 256 / 243): the byte whose top base-3 digit reads back as q's first trit
    packed = np.concatenate([q0, q1, qh], axis=-1).astype(np.uint16)
    packed = ((packed * 256 + 242) // 243).astype(np.uint8)
    return _pack("tq1_0", {"qs": packed[:, :48], "qh": packed[:, 48:], "d": _f16_bits(d)})


def _enc_q2_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=-1, keepdims=True)
    q = (np.clip(_round_half_away(x * _inverse(d)), -1, 2) + _F32(1)).astype(np.uint8)
    q = q.reshape(len(x), 32, 4) << np.array([0, 2, 4, 6], dtype=np.uint8)
    qs = q[..., 0] | q[..., 1] | q[..., 2] | q[..., 3]
    return _pack("q2_0", {"d": _f16_bits(d), "qs": qs})


_KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=_F32)


def _enc_mxfp4(x: np.ndarray) -> np.ndarray:
    from .quant import _E8M0_HALF

    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    d = _E8M0_HALF[e][:, None, None]
    err = np.abs(d * _KVALUES_FP4 - x[:, :, None])
    best = err.argmin(axis=-1).astype(np.uint8)  # first minimum, as ggml's strict <
    return _pack("mxfp4", {"e": e, "qs": best[:, :16] | (best[:, 16:] << np.uint8(4))})


# --- K-quants (Numba, ggml's per-block scale searches) ---------------------------------

_EPS = F(1e-15)  # ggml's GROUP_MAX_EPS


@njit(cache=True)
def _nearest(v):
    """ggml's nearest_int: round half to even (exact for |v| < 2**22)."""
    return int(np.rint(v))


@njit(cache=True)
def _f16_round(v):
    """The f32 value of fp16(v) (round to nearest even; overflow to inf)."""
    a = abs(float(v))
    if a == 0.0 or a != a:
        return F(v)
    if a >= 65520.0:
        return F(math.copysign(math.inf, v))
    e = math.frexp(a)[1] - 1  # a = m * 2**(e+1), 0.5 <= m < 1
    if e < -14:
        e = -14  # subnormal halves share the 2**-24 quantum
    q = math.ldexp(1.0, e - 10)
    return F(math.copysign(np.rint(a / q) * q, v))


@njit(cache=True)
def _make_qkx2(x, w, L, Laux, nmax, rmin, rdelta, nstep):
    """ggml make_qkx2_quants (use_mad=false): asymmetric scale+min grid search.

    Writes codes into L, returns (scale, the_min) with the_min = -min >= 0.
    """
    n = x.shape[0]
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if mn > F(0):
        mn = F(0)
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return F(0), -mn
    fnmax = F(nmax)
    iscale = fnmax / (mx - mn)
    scale = F(1) / iscale
    best_error = F(0)
    for i in range(n):
        lv = max(0, min(nmax, _nearest(iscale * (x[i] - mn))))
        L[i] = lv
        diff = scale * F(lv) + mn - x[i]
        best_error += w[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F(step) + fnmax) / (mx - mn)
        sum_l = F(0)
        sum_l2 = F(0)
        sum_xl = F(0)
        for i in range(n):
            lv = max(0, min(nmax, _nearest(iscale * (x[i] - mn))))
            Laux[i] = lv
            fl = F(lv)
            sum_l += w[i] * fl
            sum_l2 += w[i] * fl * fl
            sum_xl += w[i] * fl * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > F(0):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > F(0):
                this_min = F(0)
                this_scale = sum_xl / sum_l2
            cur_error = F(0)
            for i in range(n):
                diff = this_scale * F(Laux[i]) + this_min - x[i]
                cur_error += w[i] * (diff * diff)
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=True)
def _make_qx(x, L, nmax):
    """ggml make_qx_quants with rmse_type=1 (weights x*x): symmetric scale search."""
    n = x.shape[0]
    mx = F(0)
    amax = F(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < _EPS:
        for i in range(n):
            L[i] = 0
        return F(0)
    iscale = F(-nmax) / mx
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        lv = max(-nmax, min(nmax - 1, _nearest(iscale * x[i])))
        L[i] = lv + nmax
        wv = x[i] * x[i]
        fl = F(lv)
        sumlx += wv * x[i] * fl
        suml2 += wv * fl * fl
    scale = sumlx / suml2 if suml2 != F(0) else F(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F(nmax) + F(0.1) * F(step)) / mx
        sumlx = F(0)
        suml2 = F(0)
        for i in range(n):
            lv = max(-nmax, min(nmax - 1, _nearest(iscale * x[i])))
            wv = x[i] * x[i]
            fl = F(lv)
            sumlx += wv * x[i] * fl
            suml2 += wv * fl * fl
        if suml2 > F(0) and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, _nearest(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True)
def _scale_min_k4(j, sc):
    """ggml get_scale_min_k4: the 6-bit scale and min of sub-block j."""
    if j < 4:
        return sc[j] & 63, sc[j + 4] & 63
    return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)


@njit(cache=True)
def _kquant_scales(x, L, nmax, rmin, rdelta, nstep, sc_out):
    """Shared first half of q4_K/q5_K: per-32 searches, 6-bit scales/mins, d and dmin."""
    scales = np.empty(8, dtype=np.float32)
    mins = np.empty(8, dtype=np.float32)
    w = np.empty(32, dtype=np.float32)
    Laux = np.empty(32, dtype=np.int64)
    max_scale = F(0)
    max_min = F(0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = F(0)
        for i in range(32):
            sum_x2 += xs[i] * xs[i]
        av_x = np.sqrt(sum_x2 / F(32))
        for i in range(32):
            w[i] = av_x + abs(xs[i])
        s, m = _make_qkx2(xs, w, L[32 * j:32 * j + 32], Laux, nmax, rmin, rdelta, nstep)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = F(63) / max_scale if max_scale > F(0) else F(0)
    inv_min = F(63) / max_min if max_min > F(0) else F(0)
    for j in range(12):
        sc_out[j] = 0
    for j in range(8):
        ls = min(63, _nearest(inv_scale * scales[j]) & 0xFF)
        lm = min(63, _nearest(inv_min * mins[j]) & 0xFF)
        if j < 4:
            sc_out[j] = ls
            sc_out[j + 4] = lm
        else:
            sc_out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc_out[j - 4] |= (ls >> 4) << 6
            sc_out[j] |= (lm >> 4) << 6
    return _f16_round(max_scale / F(63)), _f16_round(max_min / F(63))


@njit(cache=True)
def _kquant_codes(x, L, sc, d, dmin, nmax):
    """Second half of q4_K/q5_K: requantize each sub-block with its stored scale."""
    for j in range(8):
        s, m = _scale_min_k4(j, sc)
        dd = d * F(s)
        if dd == F(0):
            continue
        dm = dmin * F(m)
        for i in range(32):
            L[32 * j + i] = max(0, min(nmax, _nearest((x[32 * j + i] + dm) / dd)))


@njit(parallel=True, cache=True)
def _enc_q4_k_nb(x, d, dmin, scales, qs):
    for b in prange(x.shape[0]):
        L = np.empty(256, dtype=np.int64)
        db, mb = _kquant_scales(x[b], L, 15, F(-1.0), F(0.1), 20, scales[b])
        d[b] = db
        dmin[b] = mb
        _kquant_codes(x[b], L, scales[b], db, mb, 15)
        for c in range(4):
            for i in range(32):
                qs[b, 32 * c + i] = L[64 * c + i] | (L[64 * c + 32 + i] << 4)


@njit(parallel=True, cache=True)
def _enc_q5_k_nb(x, d, dmin, scales, qh, qs):
    for b in prange(x.shape[0]):
        L = np.empty(256, dtype=np.int64)
        db, mb = _kquant_scales(x[b], L, 31, F(-0.5), F(0.1), 15, scales[b])
        d[b] = db
        dmin[b] = mb
        _kquant_codes(x[b], L, scales[b], db, mb, 31)
        for i in range(32):
            qh[b, i] = 0
        for c in range(4):
            for i in range(32):
                lo = L[64 * c + i]
                hi = L[64 * c + 32 + i]
                if lo > 15:
                    lo -= 16
                    qh[b, i] |= 1 << (2 * c)
                if hi > 15:
                    hi -= 16
                    qh[b, i] |= 2 << (2 * c)
                qs[b, 32 * c + i] = lo | (hi << 4)


@njit(parallel=True, cache=True)
def _enc_q6_k_nb(x, d, scales, ql, qh):
    for b in prange(x.shape[0]):
        L = np.empty(256, dtype=np.int64)
        sub = np.empty(16, dtype=np.float32)
        xb = x[b]
        max_scale = F(0)
        max_abs = F(0)
        for j in range(16):
            s = _make_qx(xb[16 * j:16 * j + 16], L[16 * j:16 * j + 16], 32)
            sub[j] = s
            if abs(s) > max_abs:
                max_abs = abs(s)
                max_scale = s
        if max_abs < _EPS:
            d[b] = F(0)
            for j in range(16):
                scales[b, j] = 0
            for i in range(128):
                ql[b, i] = 0
            for i in range(64):
                qh[b, i] = 0
            continue
        iscale = F(-128) / max_scale
        db = _f16_round(F(1) / iscale)
        d[b] = db
        for j in range(16):
            scales[b, j] = min(127, _nearest(iscale * sub[j]))
        for j in range(16):
            dd = db * F(scales[b, j])
            if dd == F(0):
                continue
            for i in range(16):
                L[16 * j + i] = max(-32, min(31, _nearest(xb[16 * j + i] / dd))) + 32
        for h in range(2):
            for i in range(32):
                q1 = L[128 * h + i]
                q2 = L[128 * h + 32 + i]
                q3 = L[128 * h + 64 + i]
                q4 = L[128 * h + 96 + i]
                ql[b, 64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                ql[b, 64 * h + 32 + i] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                qh[b, 32 * h + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) \
                    | ((q4 >> 4) << 6)


@njit(parallel=True, cache=True)
def _enc_q8_k_nb(x, d, qs, bsums):
    for b in prange(x.shape[0]):
        xb = x[b]
        mx = F(0)
        amax = F(0)
        for i in range(256):
            ax = abs(xb[i])
            if ax > amax:
                amax = ax
                mx = xb[i]
        if amax == F(0):
            d[b] = F(0)
            for i in range(256):
                qs[b, i] = 0
            for j in range(16):
                bsums[b, j] = 0
            continue
        iscale = F(-127) / mx
        for i in range(256):
            qs[b, i] = min(127, _nearest(iscale * xb[i]))
        for j in range(16):
            s = 0
            for i in range(16):
                s += qs[b, 16 * j + i]
            bsums[b, j] = s
        d[b] = F(1) / iscale


def _enc_q4_k(x: np.ndarray) -> np.ndarray:
    n = len(x)
    d, dmin = np.empty(n, _F32), np.empty(n, _F32)
    scales, qs = np.empty((n, 12), np.uint8), np.empty((n, 128), np.uint8)
    _enc_q4_k_nb(x, d, dmin, scales, qs)
    return _pack("q4_k", {"d": _f16_bits(d), "dmin": _f16_bits(dmin), "scales": scales,
                          "qs": qs})


def _enc_q5_k(x: np.ndarray) -> np.ndarray:
    n = len(x)
    d, dmin = np.empty(n, _F32), np.empty(n, _F32)
    scales, qh, qs = (np.empty((n, 12), np.uint8), np.empty((n, 32), np.uint8),
                      np.empty((n, 128), np.uint8))
    _enc_q5_k_nb(x, d, dmin, scales, qh, qs)
    return _pack("q5_k", {"d": _f16_bits(d), "dmin": _f16_bits(dmin), "scales": scales,
                          "qh": qh, "qs": qs})


def _enc_q6_k(x: np.ndarray) -> np.ndarray:
    n = len(x)
    d, scales = np.empty(n, _F32), np.empty((n, 16), np.int8)
    ql, qh = np.empty((n, 128), np.uint8), np.empty((n, 64), np.uint8)
    _enc_q6_k_nb(x, d, scales, ql, qh)
    return _pack("q6_k", {"ql": ql, "qh": qh, "scales": scales, "d": _f16_bits(d)})


def _enc_q8_k(x: np.ndarray) -> np.ndarray:
    n = len(x)
    d, qs, bsums = np.empty(n, _F32), np.empty((n, 256), np.int8), np.empty((n, 16), np.int16)
    _enc_q8_k_nb(x, d, qs, bsums)
    return _pack("q8_k", {"d": d, "qs": qs, "bsums": bsums})


_ENCODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q2_0": _enc_q2_0,
    "q4_0": _enc_q4_0,
    "q4_1": _enc_q4_1,
    "q5_0": _enc_q5_0,
    "q5_1": _enc_q5_1,
    "q8_0": _enc_q8_0,
    "q8_1": _enc_q8_1,
    "q4_k": _enc_q4_k,
    "q5_k": _enc_q5_k,
    "q6_k": _enc_q6_k,
    "q8_k": _enc_q8_k,
    "tq1_0": _enc_tq1_0,
    "tq2_0": _enc_tq2_0,
    "mxfp4": _enc_mxfp4,
}

ENCODE_FORMATS: frozenset[str] = frozenset(_ENCODERS)
"""Block formats :func:`encode_blocks` can produce."""


def encode_blocks(dtype: str, values: np.ndarray) -> np.ndarray:
    """Encode finite float32 ``values`` of shape ``(..., n)`` as ``dtype`` blocks.

    ``n`` must be a multiple of the block size; returns the structured blocks
    of shape ``(..., n // block_size)``. Validation (finiteness, lengths,
    known format) is the caller's.
    """
    x = np.ascontiguousarray(values, dtype=_F32)
    bs = BLOCK_SIZES[dtype]
    rows = x.reshape(-1, bs)
    with np.errstate(all="ignore"):  # tiny blocks overflow 1/d to inf, as in ggml
        out = _ENCODERS[dtype](rows)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // bs,))
