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

#: Columns of a cross-entropy stats row: the loss, the row's log-sum-exp, the 0/1
#: weight (0 for an ignored position).
STAT_LOSS, STAT_LSE, STAT_KEEP = 0, 1, 2
STATS = 3


@_serial
def _row_lse(x, p):
    """log(sum(exp(x[p]))), shifted by the row max (by 0 when the max is +-inf)."""
    k = x.shape[1]
    m = np.float32(-np.inf)
    for j in range(k):
        v = x[p, j]
        m = v if v > m else m
    shift = m if (m - m) == 0 else np.float32(0.0)
    s = np.float32(0.0)
    for j in range(k):
        s += exp_f32(x[p, j] - shift)
    return shift + log_f32(s)


@_rows
def ce_forward(x, labels, ignore, smooth, out):
    """Per row p: stats ``out[p] = (loss, lse, keep)``.

    loss = lse - (1 - smooth) x[label] - smooth / K * sum(x), 0 when the label
    equals ``ignore`` (pass -1 for none; labels are checked non-negative).
    """
    n, k = x.shape
    on = np.float32(1.0 - smooth)
    off = np.float32(smooth / k)
    for p in prange(n):
        lab = labels[p]
        if lab == ignore:
            out[p, 0] = 0.0
            out[p, 1] = 0.0
            out[p, 2] = 0.0
            continue
        lse = _row_lse(x, p)
        loss = lse - on * x[p, lab]
        if smooth != 0.0:
            t = np.float32(0.0)
            for j in range(k):
                t += x[p, j]
            loss -= off * t
        out[p, 0] = loss
        out[p, 1] = lse
        out[p, 2] = 1.0


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
        lse = stats[p, 1]
        for j in range(k):
            out[p, j] = gp * (exp_f32(x[p, j] - lse) - off)
        out[p, labels[p]] -= gp * on


@_rows
def softmax_panel_inplace(z, labels, ignore, smooth, scale, g, lse):
    """Turn saved logits ``z`` [rows, K] into their gradient in place:
    ``z_p <- scale g_p (softmax(z_p) - (1 - smooth) onehot(label_p) - smooth / K)``,
    zero for rows whose label equals ``ignore`` (-1: none)."""
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
        m = lse[p]
        for j in range(k):
            z[p, j] = gp * (exp_f32(z[p, j] - m) - off)
        z[p, lab] -= gp * on


@_rows
def lse_rows(z, out):
    """Row log-sum-exp of ``z`` [rows, K] into ``out`` [rows]."""
    for p in prange(z.shape[0]):
        out[p] = _row_lse(z, p)


@_rows
def scaled_softmax_inplace(z, lse, scale):
    """``z_p <- scale_p * softmax(z_p)`` in place, with the rows' log-sum-exp given."""
    n, k = z.shape
    for p in prange(n):
        s = scale[p]
        m = lse[p]
        for j in range(k):
            z[p, j] = s * exp_f32(z[p, j] - m)
