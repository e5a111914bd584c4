"""Row kernels of the fused losses: cross-entropy over a class axis, and the
logit-gradient panels of the fused linear losses.

Inputs are validated by the callers (labels in range, shapes consistent);
every array here is C-contiguous float32 (labels int64) with the class axis
last. A class row of a vocabulary-sized axis (32000 f32 = 128 KiB) stays in
L2 between the passes over it, so each kernel costs one trip through memory.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .vecmath import exp_f32, log_f32

# No nnan/ninf: NaN and inf logits keep their meaning (a NaN row gives a NaN loss).
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}
_serial = njit(cache=True, fastmath=_FAST, nogil=True, error_model="numpy")
_rows = njit(parallel=True, cache=True, fastmath=_FAST, nogil=True, error_model="numpy")

#: Columns of a cross-entropy stats row: the loss, the row's shifted exponential sum
#: ``s = sum(exp(x - shift))``, the 0/1 weight (0 for an ignored position), and the shift
#: (the row max). The softmax is ``exp(x - shift) / s``: rebuilt from an absolute
#: log-sum-exp instead, it carried that value's rounding (up to half an ulp of the largest
#: logit) into every probability, so logits near 300 lost the gradient of a 1e-5 loss.
STAT_LOSS, STAT_SUM, STAT_KEEP, STAT_SHIFT = 0, 1, 2, 3
STATS = 4


@_serial
def _row_shift(x, p):
    """The row max, or 0 when it is +-inf or NaN (exp(x - shift) then keeps inf/NaN)."""
    k = x.shape[1]
    m = np.float32(-np.inf)
    for j in range(k):
        v = x[p, j]
        m = v if v > m else m
    return m if (m - m) == 0 else np.float32(0.0)


@_serial
def _row_sum(x, p, shift):
    """sum(exp(x[p] - shift))."""
    s = np.float32(0.0)
    for j in range(x.shape[1]):
        s += exp_f32(x[p, j] - shift)
    return s


@njit(cache=True, nogil=True, error_model="numpy")
def _loss(log_s, shift, picked, on, off, spread):
    """``log_s + on (shift - picked) + off spread``: the loss of a row in terms that stay
    small (no absolute log-sum-exp), in strict float32 (a reassociating caller could
    otherwise fold the shift back into one large term)."""
    return log_s + on * (shift - picked) + off * spread


@_rows
def ce_forward(x, labels, ignore, smooth, out):
    """Per row p: stats ``out[p] = (loss, sum, keep, shift)`` (see :data:`STATS`).

    loss = lse - (1 - smooth) x[label] - smooth / K * sum(x), 0 when the label
    equals ``ignore`` (pass -1 for none; labels are checked non-negative). It is
    computed as ``log(s) + (1 - smooth) (shift - x[label]) + smooth / K * sum(shift - x)``
    (the same value, as ``1 - smooth + K * smooth / K = 1``), whose terms stay small.
    """
    n, k = x.shape
    on = np.float32(1.0 - smooth)
    off = np.float32(smooth / k)
    for p in prange(n):
        lab = labels[p]
        if lab == ignore:
            out[p, 0] = 0.0
            out[p, 1] = 1.0
            out[p, 2] = 0.0
            out[p, 3] = 0.0
            continue
        shift = _row_shift(x, p)
        s = _row_sum(x, p, shift)
        t = np.float32(0.0)
        if smooth != 0.0:
            for j in range(k):
                t += shift - x[p, j]
        out[p, 0] = _loss(log_f32(s), shift, x[p, lab], on, off, t)
        out[p, 1] = s
        out[p, 2] = 1.0
        out[p, 3] = shift


@_rows
def ce_backward(x, labels, smooth, stats, g, out):
    """d loss / d x for per-row loss gradients ``g``:
    ``g_p keep_p (softmax(x_p) - (1 - smooth) onehot - smooth / K)``."""
    n, k = x.shape
    on = np.float32(1.0 - smooth)
    off = np.float32(smooth / k)
    for p in prange(n):
        gp = g[p] * stats[p, 2]
        if stats[p, 2] == 0.0:
            for j in range(k):
                out[p, j] = 0.0
            continue
        shift = stats[p, 3]
        inv = np.float32(1.0) / stats[p, 1]
        for j in range(k):
            out[p, j] = gp * (exp_f32(x[p, j] - shift) * inv - off)
        out[p, labels[p]] -= gp * on


@_rows
def softmax_panel_inplace(z, labels, ignore, smooth, scale, g, shift, total):
    """Turn saved logits ``z`` [rows, K] into their gradient in place:
    ``z_p <- scale g_p (softmax(z_p) - (1 - smooth) onehot(label_p) - smooth / K)``,
    zero for rows whose label equals ``ignore`` (-1: none); ``shift``/``total`` are the
    rows' :data:`STATS` shift and sum."""
    n, k = z.shape
    on = np.float32(1.0 - smooth)
    off = np.float32(smooth / k)
    for p in prange(n):
        lab = labels[p]
        if lab == ignore:
            for j in range(k):
                z[p, j] = 0.0
            continue
        gp = np.float32(scale * g[p])
        m = shift[p]
        inv = np.float32(1.0) / total[p]
        for j in range(k):
            z[p, j] = gp * (exp_f32(z[p, j] - m) * inv - off)
        z[p, lab] -= gp * on


@_rows
def shift_sum_rows(z, shift, total):
    """Per row of ``z`` [rows, K]: the shift (row max) and ``sum(exp(z - shift))``."""
    for p in prange(z.shape[0]):
        m = _row_shift(z, p)
        shift[p] = m
        total[p] = _row_sum(z, p, m)


@_rows
def scaled_softmax_inplace(z, shift, total, scale):
    """``z_p <- scale_p * softmax(z_p)`` in place, from the rows' shift and sum."""
    n, k = z.shape
    for p in prange(n):
        c = scale[p] / total[p]
        m = shift[p]
        for j in range(k):
            z[p, j] = c * exp_f32(z[p, j] - m)
