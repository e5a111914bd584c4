"""Selection kernels: per-row top-k, sort order, categorical sampling, router top-k.

Every kernel works on rows: a C-contiguous 2-D float32 array with the
selected axis last (callers move it there). Callers validate shapes, ``k``
and the sampling weights first; nothing here reads outside its rows.

Ordering rules (the reference's, see ``fucina.tensor.selection``): NaN never
enters a top-k (unfilled slots get index -1, the caller turns them into
value -inf, index 0); a sort puts NaN last in either direction; equal values
keep their original order (a stable order satisfies the reference's
"unstable" contract and makes results reproducible).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..rng import uniform53_jit

_serial = njit(cache=True, nogil=True, error_model="numpy")
_rows = njit(parallel=True, cache=True, nogil=True, error_model="numpy")

@_serial
def _worse(va, ia, vb, ib):
    """Whether (value a, index a) ranks below (value b, index b) in a descending top-k."""
    return va < vb or (va == vb and ia > ib)


@_serial
def _topk_heap(row, k, out_idx):
    """Largest k non-NaN values of ``row`` (descending, ties by index) into ``out_idx``
    through a k-entry min-heap of candidates (O(n log k) in any input order); returns
    how many slots were filled."""
    vals = np.empty(k, np.float32)
    idx = np.empty(k, np.int64)
    filled = 0
    for j in range(row.shape[0]):
        v = row[j]
        if v != v:
            continue
        if filled < k:  # grow the heap: sift the newcomer up
            pos = filled
            filled += 1
            while pos > 0:
                parent = (pos - 1) >> 1
                if not _worse(v, j, vals[parent], idx[parent]):
                    break
                vals[pos] = vals[parent]
                idx[pos] = idx[parent]
                pos = parent
        elif v > vals[0]:  # beats the worst candidate (a tie loses: its index is larger)
            pos = 0
            while True:
                c = 2 * pos + 1
                if c >= k:
                    break
                if c + 1 < k and _worse(vals[c + 1], idx[c + 1], vals[c], idx[c]):
                    c += 1
                if not _worse(vals[c], idx[c], v, j):
                    break
                vals[pos] = vals[c]
                idx[pos] = idx[c]
                pos = c
        else:
            continue
        vals[pos] = v
        idx[pos] = j
    by_index = np.argsort(idx[:filled])
    v2 = vals[:filled][by_index]
    i2 = idx[:filled][by_index]
    order = np.argsort(-v2, kind="mergesort")  # stable: equal values keep index order
    for q in range(filled):
        out_idx[q] = i2[order[q]]
    return filled


@_serial
def _order(row, descending):
    """Stable argsort of one row, NaN last in either direction."""
    if descending:
        return np.argsort(-row, kind="mergesort")
    return np.argsort(row, kind="mergesort")


@_rows
def topk_rows(x, k, out):
    """``out[p]``: indices of the k largest non-NaN values of ``x[p]``, descending;
    -1 marks slots left unfilled (fewer than k non-NaN values)."""
    n = x.shape[1]
    small = k * 8 < n  # a heap of candidates; sorting whole rows wins for larger k
    for p in prange(x.shape[0]):
        if small:
            filled = _topk_heap(x[p], k, out[p])
        else:
            order = _order(x[p], True)
            filled = 0
            for j in range(k):
                i = order[j]
                v = x[p, i]
                if v != v:
                    break
                out[p, j] = i
                filled += 1
        for j in range(filled, k):
            out[p, j] = -1


@_rows
def sort_rows(x, descending, out):
    """``out[p]``: the stable sort order of ``x[p]`` (NaN last)."""
    for p in prange(x.shape[0]):
        out[p] = _order(x[p], descending)


@_rows
def multinomial_rows(w, num, seed, replacement, out):
    """Categorical draws from unnormalized non-negative rows (validated by the caller).

    Draw (p, s) reads the counter stream at ``(seed, p * num + s)``: ``u`` in
    [0, 1) times the row's remaining mass, and the first class whose running sum
    (f64) exceeds it. Without replacement the chosen class's mass is removed.
    """
    n = w.shape[1]
    for p in prange(w.shape[0]):
        mass = np.empty(n, np.float64)
        for j in range(n):
            mass[j] = w[p, j]
        for s in range(num):
            total = 0.0
            for j in range(n):
                total += mass[j]
            target = uniform53_jit(seed, np.uint64(p * num + s)) * total
            pick = -1
            acc = 0.0
            last = -1
            for j in range(n):
                if mass[j] > 0.0:
                    last = j
                    acc += mass[j]
                    if acc > target:
                        pick = j
                        break
            if pick < 0:  # rounding left target at the total: the last drawable class
                pick = last
            out[p, s] = pick
            if not replacement:
                mass[pick] = 0.0


@_rows
def router_rows(x, k, normalize, selected, weights):
    """Per row: the top-k experts (as :func:`topk_rows`) and their softmax probability
    over the full row (f64 accumulation), renormalized over the k when ``normalize``."""
    n = x.shape[1]
    for p in prange(x.shape[0]):
        idx = np.empty(k, np.int64)
        if k * 8 < n:
            filled = _topk_heap(x[p], k, idx)
        else:
            order = _order(x[p], True)
            filled = 0
            for j in range(k):
                if x[p, order[j]] != x[p, order[j]]:
                    break
                idx[j] = order[j]
                filled += 1
        m = -np.inf
        for j in range(n):
            v = x[p, j]
            if v > m:
                m = v
        shift = m if (m - m) == 0 else 0.0
        total = 0.0
        for j in range(n):
            total += np.exp(np.float64(x[p, j]) - shift)
        picked = 0.0
        for j in range(k):
            if j < filled:
                pr = np.exp(np.float64(x[p, idx[j]]) - shift) / total
                selected[p, j] = idx[j]
            else:
                pr = 0.0
                selected[p, j] = 0
            weights[p, j] = pr
            picked += pr
        if normalize and picked > 0.0:
            for j in range(k):
                weights[p, j] = weights[p, j] / picked
