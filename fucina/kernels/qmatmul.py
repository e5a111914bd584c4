"""f32 x block-quantized matmul: ``out[m, n] = sum_k x[m, k] * W[n, k]``.

The weight stays in its GGML blocks (``W`` is ``[n, k]``: row ``r`` of blocks
is output column ``r``, ggml's ``[out, in]`` convention). Two paths:

- GEMV (few activation rows): one Numba kernel per format, parallel over
  output rows, that reads each block's bytes and folds the decode into the
  dot product (scales applied once per sub-block, block minima through the
  activation's per-32 sums), so a weight element is touched once per
  activation row and never stored as f32.
- GEMM (many rows) and the transposed product of the gradient: a row panel
  of the weight (a bounded number of rows) is decoded to f32 by a parallel
  Numba kernel into a reused scratch buffer and multiplied with BLAS, or with
  the blocked f32 kernel where it serves the product (:func:`fucina.kernels.
  batched_gemm.matmul`: AVX-512 tiles while OpenBLAS is pinned to AVX2); every
  block is decoded once per call, and the whole f32 weight never exists.

Formats without a fused kernel (q2_k, q3_k, the IQ and FP4 families) use the
panel path with the numpy decoders of :mod:`fucina.kernels.quant`.

Inputs arrive validated: ``k`` is a whole number of blocks and the block
array has exactly ``k / block_size`` blocks per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from ..blocks import BLOCK_DTYPES
from . import batched_gemm, qdot_avx2
from .quant import dequantize

__all__ = ["FUSED_FORMATS", "PackedRhs", "decode_panel", "gemv_rows_max", "qmatmul", "qmatmul_t",
           "quantize_rows_q8", "uses_int8"]

F = np.float32
U = np.uint64
AVX2 = qdot_avx2.AVX2
# Numba intrinsics (typed Any: their call signature is Numba's, not Python's)
dot_s8: Any = qdot_avx2.dot_s8
dot_nibbles16: Any = qdot_avx2.dot_nibbles16
dot_nibbles32: Any = qdot_avx2.dot_nibbles32

#: f16 bits -> f32 value, passed to kernels (a global array would be baked into each kernel).
F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F)

#: Activation rows up to which the fused GEMV kernels run (above: panel decode + BLAS).
GEMV_ROWS_MAX = 4

#: Whether GEMV on AVX2 hosts quantizes the activation to int8 (ggml's integer dots) for
#: the formats that have integer kernels; False keeps the exact-f32 kernels everywhere.
INT8_ACTIVATIONS = True

#: Weight rows decoded per panel on the GEMM path (the product's N per BLAS call): at
#: least PANEL_ROWS, more while the panel stays within PANEL_BYTES of f32. A bytes-only
#: rule gave a k = 11008 weight 47-row panels, and BLAS on [32, k] x [k, 47] pieces ran
#: [32 x 11008] x [11008 x 4096] q4_k in 91 ms against numpy's 32 on the f32 weight
#: (2-core Zen 4, two OpenBLAS-SkylakeX threads); with 256-512 rows every
#: measured shape ran within noise of numpy's f32 GEMM, and a small k (576) keeps its
#: larger panels, which its short BLAS calls need (docs/BENCHMARKS.md, stop 23).
PANEL_ROWS = 384
PANEL_BYTES = 2 << 20


def gemv_rows_max() -> int:
    """Activation-row count up to which the fused kernels run instead of panels + BLAS."""
    return GEMV_ROWS_MAX


@njit(inline="always")
def _h(tab, w, r, o):
    return tab[np.uint32(w[r, o]) | (np.uint32(w[r, o + U(1)]) << np.uint32(8))]


@njit(inline="always")
def _k4_scale_min(w, r, o, j):
    if j < 4:
        return F(np.int32(w[r, o + U(j)] & 63)), F(np.int32(w[r, o + U(j + 4)] & 63))
    a = w[r, o + U(j + 4)]
    return (F(np.int32((a & 0xF) | ((w[r, o + U(j - 4)] >> 6) << 4))),
            F(np.int32((a >> 4) | ((w[r, o + U(j)] >> 6) << 4))))


# --- fused GEMV kernels ----------------------------------------------------------------
# x: [m, k] f32, xs: [m, k/32] per-32 sums of x, w: [n, row_bytes] uint8, out: [m, n].
# c16/c32 are the literals 16/32 passed at run time: with a constant trip count LLVM
# unrolls the inner loop and vectorizes across blocks (strided gathers) instead.
# Sums go to per-lane accumulators (acc[i, j]) reduced once per row, not per block.


@njit(inline="always")
def _finish(acc, out, r, m, c32):
    for i in range(m):
        t = F(0)
        for j in range(c32):
            t += acc[i, j]
        out[i, r] = t


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q8_0(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 32
    wi = w.view(np.int8)
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        for b in range(nb):
            o = U(34 * b + 2)
            d = _h(tab, w, r, U(34 * b))
            for i in range(m):
                xo = U(32 * b)
                for j in range(c32):
                    acc[i, j] += d * (x[i, xo + U(j)] * F(wi[r, o + U(j)]))
        _finish(acc, out, r, m, c32)


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q4_0(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 32
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        for b in range(nb):
            o = U(18 * b + 2)
            d = _h(tab, w, r, U(18 * b))
            for i in range(m):
                xo = U(32 * b)
                for j in range(c16):
                    q = np.int32(w[r, o + U(j)])
                    acc[i, j] += d * (x[i, xo + U(j)] * F(np.int32((q & 15) - 8)))
                    acc[i, j + 16] += d * (x[i, xo + U(16 + j)] * F(np.int32((q >> 4) - 8)))
        _finish(acc, out, r, m, c32)


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q4_1(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 32
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        tail = np.zeros(m, dtype=np.float32)
        for b in range(nb):
            o = U(20 * b + 4)
            d = _h(tab, w, r, U(20 * b))
            mn = _h(tab, w, r, U(20 * b + 2))
            for i in range(m):
                xo = U(32 * b)
                for j in range(c16):
                    q = np.int32(w[r, o + U(j)])
                    acc[i, j] += d * (x[i, xo + U(j)] * F(np.int32(q & 15)))
                    acc[i, j + 16] += d * (x[i, xo + U(16 + j)] * F(np.int32(q >> 4)))
                tail[i] += mn * xs[i, b]
        _finish(acc, out, r, m, c32)
        for i in range(m):
            out[i, r] += tail[i]


@njit(inline="always")
def _qh32(w, r, o):
    return (np.uint32(w[r, o]) | (np.uint32(w[r, o + U(1)]) << 8)
            | (np.uint32(w[r, o + U(2)]) << 16) | (np.uint32(w[r, o + U(3)]) << 24))


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q5_0(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 32
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        for b in range(nb):
            o = U(22 * b + 6)
            d = _h(tab, w, r, U(22 * b))
            qh = _qh32(w, r, U(22 * b + 2))
            for i in range(m):
                xo = U(32 * b)
                for j in range(c16):
                    q = np.int32(w[r, o + U(j)])
                    lo = (q & 15) | np.int32(((qh >> j) & 1) << 4)
                    hi = (q >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                    acc[i, j] += d * (x[i, xo + U(j)] * F(np.int32(lo - 16)))
                    acc[i, j + 16] += d * (x[i, xo + U(16 + j)] * F(np.int32(hi - 16)))
        _finish(acc, out, r, m, c32)


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q5_1(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 32
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        tail = np.zeros(m, dtype=np.float32)
        for b in range(nb):
            o = U(24 * b + 8)
            d = _h(tab, w, r, U(24 * b))
            mn = _h(tab, w, r, U(24 * b + 2))
            qh = _qh32(w, r, U(24 * b + 4))
            for i in range(m):
                xo = U(32 * b)
                for j in range(c16):
                    q = np.int32(w[r, o + U(j)])
                    lo = (q & 15) | np.int32(((qh >> j) & 1) << 4)
                    hi = (q >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                    acc[i, j] += d * (x[i, xo + U(j)] * F(np.int32(lo)))
                    acc[i, j + 16] += d * (x[i, xo + U(16 + j)] * F(np.int32(hi)))
                tail[i] += mn * xs[i, b]
        _finish(acc, out, r, m, c32)
        for i in range(m):
            out[i, r] += tail[i]


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q4_k(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 256
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        tail = np.zeros(m, dtype=np.float32)
        for b in range(nb):
            o = U(144 * b)
            d = _h(tab, w, r, o)
            dmin = _h(tab, w, r, o + U(2))
            for c in range(4):
                s1, m1 = _k4_scale_min(w, r, o + U(4), 2 * c)
                s2, m2 = _k4_scale_min(w, r, o + U(4), 2 * c + 1)
                d1, d2 = d * s1, d * s2
                qo = o + U(16 + 32 * c)
                sb = 8 * b + 2 * c
                for i in range(m):
                    xo = U(256 * b + 64 * c)
                    for j in range(c32):
                        q = np.int32(w[r, qo + U(j)])
                        acc[i, j] += (d1 * (x[i, xo + U(j)] * F(np.int32(q & 15)))
                                      + d2 * (x[i, xo + U(32 + j)] * F(np.int32(q >> 4))))
                    tail[i] += dmin * (m1 * xs[i, sb] + m2 * xs[i, sb + 1])
        _finish(acc, out, r, m, c32)
        for i in range(m):
            out[i, r] -= tail[i]


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q5_k(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 256
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        tail = np.zeros(m, dtype=np.float32)
        for b in range(nb):
            o = U(176 * b)
            d = _h(tab, w, r, o)
            dmin = _h(tab, w, r, o + U(2))
            for c in range(4):
                s1, m1 = _k4_scale_min(w, r, o + U(4), 2 * c)
                s2, m2 = _k4_scale_min(w, r, o + U(4), 2 * c + 1)
                d1, d2 = d * s1, d * s2
                qo = o + U(48 + 32 * c)
                sb = 8 * b + 2 * c
                for i in range(m):
                    xo = U(256 * b + 64 * c)
                    for j in range(c32):
                        q = np.int32(w[r, qo + U(j)])
                        h = np.int32(w[r, o + U(16 + j)]) >> (2 * c)
                        lo = (q & 15) | ((h & 1) << 4)
                        hi = (q >> 4) | ((h & 2) << 3)
                        acc[i, j] += (d1 * (x[i, xo + U(j)] * F(np.int32(lo)))
                                      + d2 * (x[i, xo + U(32 + j)] * F(np.int32(hi))))
                    tail[i] += dmin * (m1 * xs[i, sb] + m2 * xs[i, sb + 1])
        _finish(acc, out, r, m, c32)
        for i in range(m):
            out[i, r] -= tail[i]


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q6_k(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 256
    wi = w.view(np.int8)
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        sc = np.empty((4, 32), dtype=np.float32)  # per-lane d * scale of the 4 quarters
        for b in range(nb):
            o = U(210 * b)
            d = _h(tab, w, r, o + U(208))
            for h in range(2):
                lo_o = o + U(64 * h)
                hb_o = o + U(128 + 32 * h)
                sc_o = o + U(192 + 8 * h)
                for t in range(4):
                    for j in range(c32):
                        sc[t, j] = d * F(wi[r, sc_o + U(2 * t + j // 16)])
                for i in range(m):
                    xo = U(256 * b + 128 * h)
                    for j in range(c32):
                        a = np.int32(w[r, lo_o + U(j)])
                        c = np.int32(w[r, lo_o + U(32 + j)])
                        hb = np.int32(w[r, hb_o + U(j)])
                        q1 = ((a & 15) | ((hb & 3) << 4)) - 32
                        q2 = ((c & 15) | (((hb >> 2) & 3) << 4)) - 32
                        q3 = ((a >> 4) | (((hb >> 4) & 3) << 4)) - 32
                        q4 = ((c >> 4) | (((hb >> 6) & 3) << 4)) - 32
                        acc[i, j] += (sc[0, j] * (x[i, xo + U(j)] * F(np.int32(q1)))
                                      + sc[1, j] * (x[i, xo + U(32 + j)] * F(np.int32(q2)))
                                      + sc[2, j] * (x[i, xo + U(64 + j)] * F(np.int32(q3)))
                                      + sc[3, j] * (x[i, xo + U(96 + j)] * F(np.int32(q4))))
        _finish(acc, out, r, m, c32)


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_tq2_0(w, x, xs, tab, out, c16, c32):
    n, m, nb = w.shape[0], x.shape[0], x.shape[1] // 256
    for r in prange(n):
        acc = np.zeros((m, 32), dtype=np.float32)
        for b in range(nb):
            o = U(66 * b)
            d = _h(tab, w, r, o + U(64))
            for g in range(2):
                for i in range(m):
                    xo = U(256 * b + 128 * g)
                    for j in range(c32):
                        q = np.int32(w[r, o + U(32 * g + j)])
                        acc[i, j] += d * (x[i, xo + U(j)] * F(np.int32((q & 3) - 1))
                                          + x[i, xo + U(32 + j)] * F(np.int32(((q >> 2) & 3) - 1))
                                          + x[i, xo + U(64 + j)] * F(np.int32(((q >> 4) & 3) - 1))
                                          + x[i, xo + U(96 + j)] * F(np.int32((q >> 6) - 1)))
        _finish(acc, out, r, m, c32)


_GEMV = {"q8_0": _gemv_q8_0, "q4_0": _gemv_q4_0, "q4_1": _gemv_q4_1, "q5_0": _gemv_q5_0,
         "q5_1": _gemv_q5_1, "q4_k": _gemv_q4_k, "q5_k": _gemv_q5_k, "q6_k": _gemv_q6_k,
         "tq2_0": _gemv_tq2_0}

FUSED_FORMATS: frozenset[str] = frozenset(_GEMV)
"""Formats with fused GEMV kernels (every other block format uses decoded panels)."""


# --- integer GEMV kernels (AVX2) -----------------------------------------------------------
# The activation rows are quantized to int8 per 32 elements (xq, scale dx, code sums xsum);
# w is the flat uint8 weight with rb bytes per row, out is [m, n]. Formats: q8_0, q4_0,
# q4_1, q4_k (the bandwidth-critical ones); results carry the activation rounding, as
# ggml's kernels do (about 1e-3 relative).


@njit(inline="always")
def _hb(tab, w, o):
    return tab[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


@njit(parallel=True, cache=True)
def _igemv_q8_0(w, rb, xq, dx, xsum, k, tab, out):
    m, n, nb = out.shape[0], out.shape[1], k // 32
    for r in prange(n):
        for i in range(m):
            acc = F(0)
            for b in range(nb):
                o = r * rb + 34 * b
                acc += _hb(tab, w, o) * (dx[i, b] * F(dot_s8(w, o + 2, xq, i * k + 32 * b)))
            out[i, r] = acc


@njit(parallel=True, cache=True)
def _igemv_q4_0(w, rb, xq, dx, xsum, k, tab, out):
    m, n, nb = out.shape[0], out.shape[1], k // 32
    for r in prange(n):
        for i in range(m):
            acc = F(0)
            for b in range(nb):
                o = r * rb + 18 * b
                s = dot_nibbles16(w, o + 2, xq, i * k + 32 * b) - 8 * xsum[i, b]
                acc += _hb(tab, w, o) * (dx[i, b] * F(s))
            out[i, r] = acc


@njit(parallel=True, cache=True)
def _igemv_q4_1(w, rb, xq, dx, xsum, k, tab, out):
    m, n, nb = out.shape[0], out.shape[1], k // 32
    for r in prange(n):
        for i in range(m):
            acc = F(0)
            for b in range(nb):
                o = r * rb + 20 * b
                s = dot_nibbles16(w, o + 4, xq, i * k + 32 * b)
                acc += dx[i, b] * (_hb(tab, w, o) * F(s) + _hb(tab, w, o + 2) * F(xsum[i, b]))
            out[i, r] = acc


@njit(parallel=True, cache=True)
def _igemv_q4_k(w, rb, xq, dx, xsum, k, tab, out):
    m, n, nb = out.shape[0], out.shape[1], k // 256
    w2 = w.reshape(1, w.shape[0])  # for the shared 2-D scale decoder
    for r in prange(n):
        for i in range(m):
            acc = F(0)
            for b in range(nb):
                o = r * rb + 144 * b
                d = _hb(tab, w, o)
                dmin = _hb(tab, w, o + 2)
                for c in range(4):
                    s1, m1 = _k4_scale_min(w2, 0, U(o + 4), 2 * c)
                    s2, m2 = _k4_scale_min(w2, 0, U(o + 4), 2 * c + 1)
                    sb = 8 * b + 2 * c
                    xo = i * k + 256 * b + 64 * c
                    i1 = dot_nibbles32(w, o + 16 + 32 * c, xq, xo, 0)
                    i2 = dot_nibbles32(w, o + 16 + 32 * c, xq, xo + 32, 1)
                    acc += (d * (s1 * dx[i, sb] * F(i1) + s2 * dx[i, sb + 1] * F(i2))
                            - dmin * (m1 * dx[i, sb] * F(xsum[i, sb])
                                      + m2 * dx[i, sb + 1] * F(xsum[i, sb + 1])))
            out[i, r] = acc


_IGEMV = {"q8_0": _igemv_q8_0, "q4_0": _igemv_q4_0, "q4_1": _igemv_q4_1, "q4_k": _igemv_q4_k}


def uses_int8(fmt: str, m: int) -> bool:
    """Whether ``qmatmul`` of ``m`` activation rows on ``fmt`` runs the integer kernels."""
    return m <= GEMV_ROWS_MAX and AVX2 and INT8_ACTIVATIONS and fmt in _IGEMV


def quantize_rows_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Activation rows -> (int8 codes [m*k], f32 scales [m, k/32], int32 code sums [m, k/32]).

    Per 32 elements: ``dx = max|x| / 127``, ``q = rint(x * (1 / dx))`` (0 where ``dx`` is 0).
    One serial Numba pass: a decode step quantizes one short row per weight, where numpy's
    separate passes and temporaries cost more than the GEMV they feed.
    """
    m, k = x.shape
    xq = np.empty(m * k, dtype=np.int8)
    dx = np.empty((m, k // 32), dtype=F)
    xsum = np.empty((m, k // 32), dtype=np.int32)
    _quantize_rows_q8(np.ascontiguousarray(x, dtype=F), xq, dx, xsum)
    return xq, dx, xsum


@njit(cache=True)
def _quantize_rows_q8(x, xq, dx, xsum):
    m, k = x.shape
    for i in range(m):
        for b in range(k // 32):
            amax = F(0)
            for j in range(32):
                a = abs(x[i, 32 * b + j])
                if a > amax:
                    amax = a
            d = amax / F(127)
            inv = F(1) / d if d > F(0) else F(0)
            dx[i, b] = d
            s = np.int32(0)
            for j in range(32):
                q = np.int32(np.rint(x[i, 32 * b + j] * inv))
                xq[i * k + 32 * b + j] = np.int8(q)
                s += q
            xsum[i, b] = s


# --- panel decode (GEMM and the gradient) ------------------------------------------------
# Decode rows [r0, r0 + out.shape[0]) of w into out (f32 [rows, k]).


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q8_0(w, r0, tab, out, c16, c32):
    wi = w.view(np.int8)
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 32):
            o = U(34 * b)
            d = _h(tab, w, r, o)
            for j in range(c32):
                out[rr, U(32 * b + j)] = d * F(wi[r, o + U(2 + j)])


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q4_0(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 32):
            o = U(18 * b)
            d = _h(tab, w, r, o)
            for j in range(c16):
                q = np.int32(w[r, o + U(2 + j)])
                out[rr, U(32 * b + j)] = d * F(np.int32((q & 15) - 8))
                out[rr, U(32 * b + 16 + j)] = d * F(np.int32((q >> 4) - 8))


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q4_1(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 32):
            o = U(20 * b)
            d = _h(tab, w, r, o)
            mn = _h(tab, w, r, o + U(2))
            for j in range(c16):
                q = w[r, o + U(4 + j)]
                out[rr, U(32 * b + j)] = d * F(np.int32(q & 15)) + mn
                out[rr, U(32 * b + 16 + j)] = d * F(np.int32(q >> 4)) + mn


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q5_0(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 32):
            o = U(22 * b)
            d = _h(tab, w, r, o)
            qh = (np.uint32(w[r, o + U(2)]) | (np.uint32(w[r, o + U(3)]) << 8)
                  | (np.uint32(w[r, o + U(4)]) << 16) | (np.uint32(w[r, o + U(5)]) << 24))
            for j in range(c16):
                q = np.int32(w[r, o + U(6 + j)])
                lo = (q & 15) | np.int32(((qh >> j) & 1) << 4)
                hi = (q >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                out[rr, U(32 * b + j)] = d * F(np.int32(lo - 16))
                out[rr, U(32 * b + 16 + j)] = d * F(np.int32(hi - 16))


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q5_1(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 32):
            o = U(24 * b)
            d = _h(tab, w, r, o)
            mn = _h(tab, w, r, o + U(2))
            qh = (np.uint32(w[r, o + U(4)]) | (np.uint32(w[r, o + U(5)]) << 8)
                  | (np.uint32(w[r, o + U(6)]) << 16) | (np.uint32(w[r, o + U(7)]) << 24))
            for j in range(c16):
                q = np.uint32(w[r, o + U(8 + j)])
                lo = (q & 15) | (((qh >> j) & 1) << 4)
                hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
                out[rr, U(32 * b + j)] = d * F(np.int32(lo)) + mn
                out[rr, U(32 * b + 16 + j)] = d * F(np.int32(hi)) + mn


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q4_k(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 256):
            o = U(144 * b)
            d = _h(tab, w, r, o)
            dmin = _h(tab, w, r, o + U(2))
            for c in range(4):
                s1, m1 = _k4_scale_min(w, r, o + U(4), 2 * c)
                s2, m2 = _k4_scale_min(w, r, o + U(4), 2 * c + 1)
                d1, c1, d2, c2 = d * s1, dmin * m1, d * s2, dmin * m2
                qo = o + U(16 + 32 * c)
                xo = U(256 * b + 64 * c)
                for j in range(c32):
                    q = w[r, qo + U(j)]
                    out[rr, xo + U(j)] = d1 * F(np.int32(q & 15)) - c1
                    out[rr, xo + U(32 + j)] = d2 * F(np.int32(q >> 4)) - c2


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q5_k(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 256):
            o = U(176 * b)
            d = _h(tab, w, r, o)
            dmin = _h(tab, w, r, o + U(2))
            for c in range(4):
                s1, m1 = _k4_scale_min(w, r, o + U(4), 2 * c)
                s2, m2 = _k4_scale_min(w, r, o + U(4), 2 * c + 1)
                d1, c1, d2, c2 = d * s1, dmin * m1, d * s2, dmin * m2
                qo = o + U(48 + 32 * c)
                xo = U(256 * b + 64 * c)
                for j in range(c32):
                    q = w[r, qo + U(j)]
                    h = w[r, o + U(16 + j)] >> (2 * c)
                    out[rr, xo + U(j)] = d1 * F(np.int32((q & 15) | ((h & 1) << 4))) - c1
                    out[rr, xo + U(32 + j)] = d2 * F(np.int32((q >> 4) | ((h & 2) << 3))) - c2


@njit(parallel=True, fastmath=True, cache=True)
def _panel_q6_k(w, r0, tab, out, c16, c32):
    wi = w.view(np.int8)
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 256):
            o = U(210 * b)
            d = _h(tab, w, r, o + U(208))
            for h in range(2):
                lo_o = o + U(64 * h)
                hb_o = o + U(128 + 32 * h)
                sc_o = o + U(192 + 8 * h)
                xo = U(256 * b + 128 * h)
                for j in range(c32):
                    a = np.int32(w[r, lo_o + U(j)])
                    c = np.int32(w[r, lo_o + U(32 + j)])
                    hb = np.int32(w[r, hb_o + U(j)])
                    so = sc_o + U(j // 16)
                    q1 = ((a & 15) | ((hb & 3) << 4)) - 32
                    q2 = ((c & 15) | (((hb >> 2) & 3) << 4)) - 32
                    q3 = ((a >> 4) | (((hb >> 4) & 3) << 4)) - 32
                    q4 = ((c >> 4) | (((hb >> 6) & 3) << 4)) - 32
                    out[rr, xo + U(j)] = d * F(wi[r, so]) * F(np.int32(q1))
                    out[rr, xo + U(32 + j)] = d * F(wi[r, so + U(2)]) * F(np.int32(q2))
                    out[rr, xo + U(64 + j)] = d * F(wi[r, so + U(4)]) * F(np.int32(q3))
                    out[rr, xo + U(96 + j)] = d * F(wi[r, so + U(6)]) * F(np.int32(q4))


@njit(parallel=True, fastmath=True, cache=True)
def _panel_tq2_0(w, r0, tab, out, c16, c32):
    for rr in prange(out.shape[0]):
        r = r0 + rr
        for b in range(out.shape[1] // 256):
            o = U(66 * b)
            d = _h(tab, w, r, o + U(64))
            for g in range(2):
                for j in range(c32):
                    q = np.int32(w[r, o + U(32 * g + j)])
                    xo = U(256 * b + 128 * g + j)
                    out[rr, xo] = d * F(np.int32((q & 3) - 1))
                    out[rr, xo + U(32)] = d * F(np.int32(((q >> 2) & 3) - 1))
                    out[rr, xo + U(64)] = d * F(np.int32(((q >> 4) & 3) - 1))
                    out[rr, xo + U(96)] = d * F(np.int32((q >> 6) - 1))


_PANEL = {"q8_0": _panel_q8_0, "q4_0": _panel_q4_0, "q4_1": _panel_q4_1, "q5_0": _panel_q5_0,
          "q5_1": _panel_q5_1, "q4_k": _panel_q4_k, "q5_k": _panel_q5_k, "q6_k": _panel_q6_k,
          "tq2_0": _panel_tq2_0}


# --- drivers -------------------------------------------------------------------------------


def _as_bytes(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """[n, nb] blocks -> C-contiguous [n, nb * block_bytes] uint8 (a view when possible)."""
    b = np.ascontiguousarray(blocks)
    if b.dtype != BLOCK_DTYPES[fmt]:
        b = b.view(BLOCK_DTYPES[fmt])
    return b.view(np.uint8).reshape(b.shape[0], -1)


def _sums32(x: np.ndarray) -> np.ndarray:
    m, k = x.shape
    return np.ascontiguousarray(x.reshape(m, k // 32, 32).sum(axis=2, dtype=F))


def decode_panel(w: np.ndarray, fmt: str, r0: int, out: np.ndarray) -> None:
    """Decode weight rows [r0, r0 + len(out)) into ``out`` ([rows, k] f32)."""
    kern = _PANEL.get(fmt)
    if kern is not None:
        kern(w, np.int64(r0), F16_TABLE, out, 16, 32)
    else:
        rows = w[r0:r0 + out.shape[0]].view(BLOCK_DTYPES[fmt])
        out[...] = dequantize(rows, fmt)


def _panel_rows(k: int, n: int) -> int:
    """Rows per decoded panel of an ``[n, k]`` weight."""
    return max(1, min(n, max(PANEL_ROWS, PANEL_BYTES // (4 * k))))


def qmatmul(x: np.ndarray, blocks: np.ndarray, fmt: str) -> np.ndarray:
    """``x[m, k] @ dequant(blocks[n, k/bs]).T`` -> f32 ``[m, n]``, never decoding all of W."""
    x = np.ascontiguousarray(x, dtype=F)
    w = _as_bytes(blocks, fmt)
    m, k = x.shape
    n = w.shape[0]
    out = np.empty((m, n), dtype=F)
    if uses_int8(fmt, m):
        xq, dx, xsum = quantize_rows_q8(x)
        _IGEMV[fmt](w.reshape(-1), np.int64(w.shape[1]), xq, dx, xsum, np.int64(k), F16_TABLE,
                    out)
        return out
    if m <= GEMV_ROWS_MAX and fmt in _GEMV:
        _GEMV[fmt](w, x, _sums32(x), F16_TABLE, out, 16, 32)
        return out
    step = _panel_rows(k, n)
    panel = np.empty((step, k), dtype=F)
    for r0 in range(0, n, step):
        rows = min(step, n - r0)
        p = panel[:rows]
        decode_panel(w, fmt, r0, p)
        # The blocked AVX-512 kernel where it beats the pinned OpenBLAS, else BLAS.
        batched_gemm.matmul(x, p.T, out[:, r0:r0 + rows])
    return out


def qmatmul_t(g: np.ndarray, blocks: np.ndarray, fmt: str, k: int) -> np.ndarray:
    """``g[m, n] @ dequant(blocks[n, k/bs])`` -> f32 ``[m, k]`` (the input gradient)."""
    g = np.ascontiguousarray(g, dtype=F)
    w = _as_bytes(blocks, fmt)
    m, n = g.shape
    out = np.zeros((m, k), dtype=F)
    part = np.empty((m, k), dtype=F)
    step = _panel_rows(k, n)
    panel = np.empty((step, k), dtype=F)
    for r0 in range(0, n, step):
        rows = min(step, n - r0)
        p = panel[:rows]
        decode_panel(w, fmt, r0, p)
        out += batched_gemm.matmul(g[:, r0:r0 + rows], p, part)
    return out




class PackedRhs:
    """A load-time snapshot of a rank-2 ``[out, contract]`` weight for ``dot_packed``.

    ``layout`` is ``"dense_f32"`` (f32/f16/bf16 weights, widened once, multiplied
    with BLAS) or ``"blocks"`` (a block-quantized weight: a contiguous copy of its
    GGML rows, run by the quantized kernels). The snapshot is independent of the
    tensor it came from.
    """

    __slots__ = ("layout", "dtype", "n", "k", "data")

    def __init__(self, layout: str, dtype: str, data: np.ndarray, n: int, k: int):
        self.layout = layout
        self.dtype = dtype
        self.data: np.ndarray | None = data
        self.n = n
        self.k = k

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``x[m, k] @ W.T`` -> f32 ``[m, n]``."""
        if self.data is None:
            raise ValueError("dot_packed: the packed RHS was deinit'ed")
        if self.layout == "dense_f32":
            x = np.ascontiguousarray(x, dtype=F)
            out = np.empty((x.shape[0], self.n), dtype=F)
            # dot's own route (the blocked kernel or BLAS), so the two agree bit for bit
            return batched_gemm.matmul(x, self.data.T, out)
        return qmatmul(x, self.data, self.dtype)

    def deinit(self) -> None:
        """Release the snapshot (later use raises ValueError)."""
        self.data = None

    def __repr__(self) -> str:
        return f"PackedRhs(layout={self.layout!r}, dtype={self.dtype}, n={self.n}, k={self.k})"
