"""Flash-style attention kernels: streaming softmax forward, blockwise recomputing backward.

Scores are never materialized as a [q, k] matrix. The forward runs one task
per (query head, block of ``BQ`` query rows); each task walks the keys in
blocks of ``BK``, keeping a running row max, a running denominator and an
output accumulator (the online softmax), and saves the per-row logsumexp.
The backward (flash-attention-2) runs one task per query head and walks key
blocks, recomputing each block of probabilities from the saved logsumexp.
Working memory is a few ``BQ x BK`` and ``B x D`` tiles per task.

Small matrix products run on tiles copied into task-local row-major buffers
(``_mm_nt``: 2 x 4 output tiles, a dot product over a contiguous axis that
LLVM vectorizes), so a strided or transposed operand never reaches the inner
loop. Tiles are zero-padded to whole output tiles; masked and padded scores
are -inf before the softmax, so they contribute exactly 0.

Every operand is a flat float32 buffer plus an element offset of 0 and one
stride per axis; the feature axis is unit-stride (the caller copies
otherwise). Callers validate every size, stride and index first
(:func:`check_operands`): the kernels trust them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..errors import IndexOutOfBounds, InvalidShape, ShapeMismatch
from .vecmath import exp_f32, log_f32

#: Query rows per forward task and per backward inner block.
BQ = 64
#: Keys per block.
BK = 64

_FM = {"nsz", "arcp", "contract", "afn", "reassoc"}
_F = np.float32
_NEG = np.float32(-np.inf)
_opts = {"fastmath": _FM, "error_model": "numpy", "cache": True, "nogil": True}


def pad4(n: int) -> int:
    """``n`` rounded up to a multiple of 4 (the output tile width)."""
    return (n + 3) & ~3


@njit(**_opts)
def _mm_nt(A, B, C, M, N, K, acc):  # noqa: ANN001, ANN202 - Numba kernel
    """C[m, n] (+)= sum_k A[m, k] * B[n, k]; M even, N a multiple of 4."""
    for m in range(0, M, 2):
        for n in range(0, N, 4):
            c00 = _F(0.0)
            c01 = _F(0.0)
            c02 = _F(0.0)
            c03 = _F(0.0)
            c10 = _F(0.0)
            c11 = _F(0.0)
            c12 = _F(0.0)
            c13 = _F(0.0)
            for k in range(K):
                x0 = A[m, k]
                x1 = A[m + 1, k]
                y0 = B[n, k]
                y1 = B[n + 1, k]
                y2 = B[n + 2, k]
                y3 = B[n + 3, k]
                c00 += x0 * y0
                c01 += x0 * y1
                c02 += x0 * y2
                c03 += x0 * y3
                c10 += x1 * y0
                c11 += x1 * y1
                c12 += x1 * y2
                c13 += x1 * y3
            if acc:
                C[m, n] += c00
                C[m, n + 1] += c01
                C[m, n + 2] += c02
                C[m, n + 3] += c03
                C[m + 1, n] += c10
                C[m + 1, n + 1] += c11
                C[m + 1, n + 2] += c12
                C[m + 1, n + 3] += c13
            else:
                C[m, n] = c00
                C[m, n + 1] = c01
                C[m, n + 2] = c02
                C[m, n + 3] = c03
                C[m + 1, n] = c10
                C[m + 1, n + 1] = c11
                C[m + 1, n + 2] = c12
                C[m + 1, n + 3] = c13


@njit(**_opts)
def _load_rows(src, base, stride, n, D, dst):  # noqa: ANN001, ANN202
    """dst[r, :D] = src[base + r * stride + 0..D) for r < n; rows n.. stay as they are."""
    for r in range(n):
        b = base + r * stride
        for d in range(D):
            dst[r, d] = src[b + d]


@njit(**_opts)
def _load_rows_t(src, base, stride, n, D, dst):  # noqa: ANN001, ANN202
    """dst[d, r] = src[base + r * stride + d] (a transposed tile)."""
    for r in range(n):
        b = base + r * stride
        for d in range(D):
            dst[d, r] = src[b + d]


@njit(**_opts)
def _key_range(p, KV, causal, window):  # noqa: ANN001, ANN202
    """[lo, hi) of the keys absolute query position ``p`` attends."""
    if not causal:
        return 0, KV
    hi = min(KV, p + 1)
    lo = 0
    if window > 0:
        lo = max(0, p - window + 1)
    return lo, hi


@njit(parallel=True, **_opts)
def attention_forward(q, q_ss, q_sh, k, k_ss, k_sh, v, v_ss, v_sh, bias, b_ss, b_sk,
                      has_bias, kvmap, out, scale, S, H, KV, D, off, causal,
                      window):  # noqa: ANN001, ANN201
    """Output [S, H, D] then logsumexp [H, S] into the flat ``out``.

    Query row ``i`` sits at absolute position ``i + off``; with ``causal`` it
    attends keys ``[max(0, p - window + 1) if window else 0, p]``. ``bias``
    ([S, KV], strides ``b_ss``/``b_sk``) is added to the scaled scores.
    """
    Dp = (D + 3) & ~3
    nqb = (S + BQ - 1) // BQ
    lse_base = S * H * D
    for t in prange(H * nqb):
        h = t // nqb
        i0 = (t - h * nqb) * BQ
        nq = min(BQ, S - i0)
        kh = kvmap[h]
        Qs = np.zeros((BQ, Dp), np.float32)
        Kb = np.zeros((BK, Dp), np.float32)
        Vt = np.zeros((Dp, BK), np.float32)
        Sb = np.empty((BQ, BK), np.float32)
        acc = np.zeros((BQ, Dp), np.float32)
        m = np.full(BQ, _NEG, np.float32)
        el = np.zeros(BQ, np.float32)
        lo_r = np.zeros(BQ, np.int64)
        hi_r = np.zeros(BQ, np.int64)
        for i in range(nq):
            b = (i0 + i) * q_ss + h * q_sh
            for d in range(D):
                Qs[i, d] = q[b + d] * scale
            lo_r[i], hi_r[i] = _key_range(i0 + i + off, KV, causal, window)
        jlo = KV
        jhi = 0
        for i in range(nq):
            jlo = min(jlo, lo_r[i])
            jhi = max(jhi, hi_r[i])
        j0 = (jlo // BK) * BK
        while j0 < jhi:
            nk = min(BK, KV - j0)
            _load_rows(k, j0 * k_ss + kh * k_sh, k_ss, nk, D, Kb)
            _load_rows_t(v, j0 * v_ss + kh * v_sh, v_ss, nk, D, Vt)
            if nk < BK:  # stale rows of the previous block must not leak
                for r in range(nk, BK):
                    for d in range(D):
                        Kb[r, d] = 0.0
                        Vt[d, r] = 0.0
            _mm_nt(Qs, Kb, Sb, BQ, BK, Dp, False)
            for i in range(nq):
                lo = lo_r[i] - j0
                hi = hi_r[i] - j0
                mx = _NEG
                if has_bias:
                    bb = (i0 + i) * b_ss + j0 * b_sk
                    for j in range(BK):
                        s = Sb[i, j] + bias[bb + min(j, nk - 1) * b_sk]
                        s = s if (j >= lo and j < hi) else _NEG
                        Sb[i, j] = s
                        mx = max(mx, s)
                else:
                    for j in range(BK):
                        s = Sb[i, j] if (j >= lo and j < hi) else _NEG
                        Sb[i, j] = s
                        mx = max(mx, s)
                mo = m[i]
                mn = max(mo, mx)
                if mn == _NEG:  # nothing attended yet: keep the row empty
                    for j in range(BK):
                        Sb[i, j] = 0.0
                    continue
                a = exp_f32(mo - mn)
                tot = _F(0.0)
                for j in range(BK):
                    p = exp_f32(Sb[i, j] - mn)
                    Sb[i, j] = p
                    tot += p
                el[i] = el[i] * a + tot
                m[i] = mn
                if a != 1.0:
                    for d in range(Dp):
                        acc[i, d] *= a
            for i in range(nq, BQ):
                for j in range(BK):
                    Sb[i, j] = 0.0
            _mm_nt(Sb, Vt, acc, BQ, Dp, BK, True)
            j0 += BK
        for i in range(nq):
            b = ((i0 + i) * H + h) * D
            inv = _F(1.0) / el[i]
            for d in range(D):
                out[b + d] = acc[i, d] * inv
            out[lse_base + h * S + i0 + i] = m[i] + log_f32(el[i])


@njit(parallel=True, **_opts)
def attention_backward(q, q_ss, q_sh, k, k_ss, k_sh, v, v_ss, v_sh, o, go, go_ss, go_sh,
                       kvmap, dq, dk, dv, slot, dk_ss, dk_sh, scale, S, H, KV, D, off, causal,
                       window):  # noqa: ANN001, ANN201
    """Gradients of the forward above (no bias) from its output ``o`` (with logsumexp).

    ``dq`` is [S, H, D] and zeroed by the caller; the key/value gradients of
    query head ``h`` go to ``dk``/``dv`` at ``key * dk_ss + slot[h] * dk_sh``:
    its kv head's rows when each kv head serves one query head, else a
    per-head partial the caller sums (:func:`sum_partials`).
    """
    Dp = (D + 3) & ~3
    lse_base = S * H * D
    for h in prange(H):
        kh = kvmap[h]
        delta = np.zeros(S, np.float32)
        for i in range(S):
            ob = (i * H + h) * D
            gb = i * go_ss + h * go_sh
            s = _F(0.0)
            for d in range(D):
                s += o[ob + d] * go[gb + d]
            delta[i] = s
        Kj = np.zeros((BK, Dp), np.float32)
        Vj = np.zeros((BK, Dp), np.float32)
        Kt = np.zeros((Dp, BK), np.float32)
        dKj = np.zeros((BK, Dp), np.float32)
        dVj = np.zeros((BK, Dp), np.float32)
        Qi = np.zeros((BQ, Dp), np.float32)
        Qt = np.zeros((Dp, BQ), np.float32)
        Gi = np.zeros((BQ, Dp), np.float32)
        Gt = np.zeros((Dp, BQ), np.float32)
        P = np.zeros((BQ, BK), np.float32)
        Pt = np.zeros((BK, BQ), np.float32)
        dP = np.zeros((BQ, BK), np.float32)
        dSt = np.zeros((BK, BQ), np.float32)
        dQi = np.zeros((BQ, Dp), np.float32)
        for j0 in range(0, KV, BK):
            nk = min(BK, KV - j0)
            for r in range(BK):
                for d in range(Dp):
                    Kj[r, d] = 0.0
                    Vj[r, d] = 0.0
                    Kt[d, r] = 0.0
                    dKj[r, d] = 0.0
                    dVj[r, d] = 0.0
            _load_rows(k, j0 * k_ss + kh * k_sh, k_ss, nk, D, Kj)
            _load_rows_t(k, j0 * k_ss + kh * k_sh, k_ss, nk, D, Kt)
            _load_rows(v, j0 * v_ss + kh * v_sh, v_ss, nk, D, Vj)
            # Query rows that can see a key of this block.
            ilo = 0
            ihi = S
            if causal:
                ilo = max(0, j0 - off)
                if window > 0:
                    ihi = min(S, j0 + nk - 1 - off + window)
            i0 = ilo
            while i0 < ihi:
                nq = min(BQ, ihi - i0)
                for r in range(BQ):
                    for d in range(Dp):
                        Qi[r, d] = 0.0
                        Qt[d, r] = 0.0
                        Gi[r, d] = 0.0
                        Gt[d, r] = 0.0
                for r in range(nq):
                    qb = (i0 + r) * q_ss + h * q_sh
                    gb = (i0 + r) * go_ss + h * go_sh
                    for d in range(D):
                        x = q[qb + d] * scale
                        Qi[r, d] = x
                        Qt[d, r] = x
                        y = go[gb + d]
                        Gi[r, d] = y
                        Gt[d, r] = y
                _mm_nt(Qi, Kj, P, BQ, BK, Dp, False)
                for r in range(BQ):
                    if r < nq:
                        lse = o[lse_base + h * S + i0 + r]
                        lo, hi = _key_range(i0 + r + off, KV, causal, window)
                        lo -= j0
                        hi = min(hi - j0, nk)
                    else:
                        lse = _F(0.0)
                        lo = 0
                        hi = 0
                    for j in range(BK):
                        p = exp_f32(P[r, j] - lse)
                        P[r, j] = p if (j >= lo and j < hi) else _F(0.0)
                for r in range(BQ):
                    for j in range(BK):
                        Pt[j, r] = P[r, j]
                _mm_nt(Pt, Gt, dVj, BK, Dp, BQ, True)
                _mm_nt(Gi, Vj, dP, BQ, BK, Dp, False)
                for r in range(BQ):
                    dl = delta[i0 + r] if r < nq else _F(0.0)
                    for j in range(BK):
                        ds = P[r, j] * (dP[r, j] - dl)
                        dP[r, j] = ds
                        dSt[j, r] = ds
                _mm_nt(dSt, Qt, dKj, BK, Dp, BQ, True)
                _mm_nt(dP, Kt, dQi, BQ, Dp, BK, False)
                for r in range(nq):
                    b = ((i0 + r) * H + h) * D
                    for d in range(D):
                        dq[b + d] += dQi[r, d] * scale
                i0 += BQ
            for r in range(nk):
                b = (j0 + r) * dk_ss + slot[h] * dk_sh
                for d in range(D):
                    dk[b + d] = dKj[r, d]
                    dv[b + d] = dVj[r, d]


@njit(parallel=True, **_opts)
def sum_partials(part, kvmap, out, H, KV, KH, D):  # noqa: ANN001, ANN201
    """out[key, kh, :] = sum over heads h with kvmap[h] == kh of part[h, key, :]."""
    for kh in prange(KH):
        for j in range(KV):
            b = (j * KH + kh) * D
            for d in range(D):
                out[b + d] = 0.0
            for h in range(H):
                if kvmap[h] == kh:
                    pb = (h * KV + j) * D
                    for d in range(D):
                        out[b + d] += part[pb + d]


# -- drivers: numpy views in, flat results out ------------------------------------


def _flat(a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """A flat float32 buffer starting at ``a``'s first element and ``a``'s element strides.

    The feature (last) axis must be unit-stride and no stride negative;
    anything else is copied once.
    """
    if a.dtype != np.float32 or (a.shape[-1] > 1 and a.strides[-1] != 4) \
            or any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a, dtype=np.float32)
    item = a.itemsize
    strides = tuple(s // item if n > 1 else 0 for s, n in zip(a.strides, a.shape))
    extent = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    flat = np.lib.stride_tricks.as_strided(a, shape=(extent,), strides=(item,))
    return flat, strides


def check_operands(q_shape: tuple[int, ...], k_shape: tuple[int, ...],
                   v_shape: tuple[int, ...], kvmap: np.ndarray, causal: bool,
                   window: int, bias_shape: tuple[int, ...] | None) -> None:
    """Every size and index the kernels read, checked before any kernel runs."""
    if len(q_shape) != 3 or len(k_shape) != 3:
        raise ShapeMismatch(f"attention operands must be rank 3: q {tuple(q_shape)}, "
                            f"k {tuple(k_shape)}")
    S, H, D = q_shape
    KV, KH, Dk = k_shape
    if tuple(v_shape) != (KV, KH, Dk) or Dk != D:
        raise ShapeMismatch(f"attention operands: q {tuple(q_shape)}, k {tuple(k_shape)}, "
                            f"v {tuple(v_shape)} ([seq, head, d] and two equal "
                            f"[seq, kv_head, d] with the same d)")
    if kvmap.shape != (H,):
        raise ShapeMismatch(
            f"kv_head_for_head has {kvmap.size} entries for {H} query heads")
    bad = (kvmap < 0) | (kvmap >= KH)
    if bad.any():
        at = int(np.argmax(bad))
        raise IndexOutOfBounds(f"kv_head_for_head[{at}] = {int(kvmap[at])} is out of range "
                               f"for kv_head of size {KH}")
    if causal and S > KV:
        raise InvalidShape(f"causal attention needs q seq {S} <= kv seq {KV} (the queries "
                           f"are the last positions of the keys)")
    if window < 0:
        raise InvalidShape(f"window {window} is negative")
    if bias_shape is not None and tuple(bias_shape) != (S, KV):
        raise ShapeMismatch(f"bias shape {tuple(bias_shape)} is not [q seq, kv seq] = "
                            f"{(S, KV)}")


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, kvmap: np.ndarray, scale: float,
            causal: bool, window: int, bias: np.ndarray | None = None,
            out: np.ndarray | None = None) -> np.ndarray:
    """Flat float32 result: the output [S, H, D], then the logsumexp [H, S]."""
    S, H, D = q.shape
    KV = k.shape[0]
    kvmap = np.ascontiguousarray(kvmap, dtype=np.int64)
    check_operands(q.shape, k.shape, v.shape, kvmap, causal, window,
                   None if bias is None else bias.shape)
    qf, (q_ss, q_sh, _) = _flat(q)
    kf, (k_ss, k_sh, _) = _flat(k)
    vf, (v_ss, v_sh, _) = _flat(v)
    if bias is not None:
        bf, (b_ss, b_sk) = _flat2(bias)
    else:
        bf, b_ss, b_sk = np.zeros(1, np.float32), 0, 0
    n = S * H * D + H * S
    if out is None:
        out = np.empty(n, np.float32)
    off = KV - S if causal else 0
    attention_forward(qf, q_ss, q_sh, kf, k_ss, k_sh, vf, v_ss, v_sh, bf, b_ss, b_sk,
                      bias is not None, kvmap, out, np.float32(scale), S, H, KV, D, off,
                      bool(causal), int(window))
    return out


def _flat2(a: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """A [S, KV] bias as a flat buffer and its two element strides (any layout)."""
    if a.dtype != np.float32 or any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a, dtype=np.float32)
    item = a.itemsize
    strides = tuple(s // item if n > 1 else 0 for s, n in zip(a.strides, a.shape))
    extent = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    flat = np.lib.stride_tricks.as_strided(a, shape=(extent,), strides=(item,))
    return flat, (strides[0], strides[1])


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, go: np.ndarray,
             kvmap: np.ndarray, scale: float, causal: bool, window: int,
             out: np.ndarray | None = None) -> np.ndarray:
    """Flat float32 gradients dq [S, H, D], dk [KV, KH, D], dv [KV, KH, D], in that order.

    ``o`` is the forward's flat result (output and logsumexp), ``go`` the
    output gradient [S, H, D].
    """
    S, H, D = q.shape
    KV, KH, _ = k.shape
    kvmap = np.ascontiguousarray(kvmap, dtype=np.int64)
    check_operands(q.shape, k.shape, v.shape, kvmap, causal, window, None)
    if o.shape != (S * H * D + H * S,) or o.dtype != np.float32:
        raise ShapeMismatch(f"saved attention result has shape {o.shape}")
    if tuple(go.shape) != (S, H, D):
        raise ShapeMismatch(f"output gradient shape {go.shape} is not {(S, H, D)}")
    o = np.ascontiguousarray(o)
    qf, (q_ss, q_sh, _) = _flat(q)
    kf, (k_ss, k_sh, _) = _flat(k)
    vf, (v_ss, v_sh, _) = _flat(v)
    gf, (g_ss, g_sh, _) = _flat(go)
    nq, nk = S * H * D, KV * KH * D
    if out is None:
        out = np.empty(nq + 2 * nk, np.float32)
    dq, dk, dv = out[:nq], out[nq:nq + nk], out[nq + nk:]
    dq[:] = 0.0
    users = np.bincount(kvmap, minlength=KH)
    off = KV - S if causal else 0
    args = (np.float32(scale), S, H, KV, D, off, bool(causal), int(window))
    if users.max() <= 1:
        if users.min() == 0:  # a kv head no query head reads gets a zero gradient
            dk[:] = 0.0
            dv[:] = 0.0
        attention_backward(qf, q_ss, q_sh, kf, k_ss, k_sh, vf, v_ss, v_sh, o, gf, g_ss, g_sh,
                           kvmap, dq, dk, dv, kvmap, KH * D, D, *args)
    else:  # grouped heads: per-head partials, summed per kv head
        pk = np.empty(H * KV * D, np.float32)
        pv = np.empty(H * KV * D, np.float32)
        slot = np.arange(H, dtype=np.int64)
        attention_backward(qf, q_ss, q_sh, kf, k_ss, k_sh, vf, v_ss, v_sh, o, gf, g_ss, g_sh,
                           kvmap, dq, pk, pv, slot, D, KV * D, *args)
        sum_partials(pk, kvmap, dk, H, KV, KH, D)
        sum_partials(pv, kvmap, dv, H, KV, KH, D)
    return out
