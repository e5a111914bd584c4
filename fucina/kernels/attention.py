"""Flash-style attention kernels: streaming softmax forward, blockwise recomputing backward.

Scores are never materialized as a [q, k] matrix. The forward cuts each kv
head's query columns into tiles of ``BQ`` and runs one task per run of up to
:data:`TASK_TILES` tiles; a task walks the keys in blocks of ``BK``, copying
each block once for all its tiles, and keeps per tile a running row max, a
running denominator and an output accumulator (the online softmax), and saves
the per-row logsumexp. The backward (flash-attention-2) runs one task per query
head and walks key blocks, recomputing each block of probabilities from the
saved logsumexp. Working memory is a few ``BQ x BK`` and ``B x D`` tiles per
task and tile.

The products pass literal strides and sizes (``0``, ``1``, ``BQ``...): Numba then
compiles a specialization of the micro-kernel per call-site pattern, with those
strides as constants. Passing them as int64 values (one specialization) cut the first
forward + backward compile from 53 to 39 s but made the kernels 2-10% slower (Intel
AVX-512, one thread), so the literals stay.

Block products run on the register-blocked micro-kernel of
``fucina.kernels.microkernel`` (:func:`~fucina.kernels.microkernel.gemm`: 6 x NR6
tiles, 4 x 16 at the edges; on the 4 x 16 tile alone the forward and backward ran
1.04-1.23x slower, Intel AVX-512 guest, one and two threads, same bits). Scores are kept
transposed (keys by rows, queries along the contiguous axis) so that no tile
is ever transposed and the softmax statistics are elementwise. Tiles are
zero-padded to whole output tiles; masked and padded scores are -inf before
the softmax, so they contribute exactly 0.

Every operand is a flat float32 buffer plus an element offset of 0 and one
stride per axis; the feature axis is unit-stride (the caller copies
otherwise). Callers validate every size, stride and index first
(:func:`check_operands`): the kernels trust them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..errors import IndexOutOfBounds, InvalidShape, ShapeMismatch
from .microkernel import NR, gemm
from .vecmath import exp_f32, log_f32

#: Query rows per forward task and per backward inner block.
BQ = 64
#: Keys per block.
BK = 64

_FM = {"nsz", "arcp", "contract", "afn", "reassoc"}
_F = np.float32
_NEG = np.float32(-np.inf)
_U = np.uint64  # unsigned flat indices: no negative-index wraparound select
_jit = njit(fastmath=_FM, error_model="numpy", cache=True, nogil=True)
_pjit = njit(parallel=True, fastmath=_FM, error_model="numpy", cache=True, nogil=True)


@_jit
def _load_block(k, kb, k_ss, v, vb, v_ss, nk, D, Kb, Vb):
    """Rows ``r < nk`` of a key and a value block (row ``r`` at ``kb + r * k_ss``, ``vb +
    r * v_ss``) into the contiguous tiles ``Kb``/``Vb``; their rows past ``nk`` zeroed."""
    for r in range(nk):
        ks = kb + r * k_ss
        vs = vb + r * v_ss
        for d in range(D):
            Kb[r, d] = k[_U(ks + d)]
        for d in range(D):
            Vb[r, d] = v[_U(vs + d)]
    for r in range(nk, Kb.shape[0]):
        for d in range(D):
            Kb[r, d] = 0.0
            Vb[r, d] = 0.0


@_jit
def _key_range(p, KV, causal, window):
    """[lo, hi) of the keys absolute query position ``p`` attends."""
    if not causal:
        return 0, KV
    hi = min(KV, p + 1)
    lo = 0
    if window > 0:
        lo = max(0, p - window + 1)
    return lo, hi


@_pjit
def attention_forward(q, q_ss, q_sh, k, k_ss, k_sh, v, v_ss, v_sh, bias, b_ss, b_sk,
                      has_bias, heads, task_kh, task_c0, task_c1, task_k0, task_k1, part,
                      out, scale, S, H, KV, D, off, causal, window):
    """Output [S, H, D] then logsumexp [H, S] into the flat ``out``.

    Query row ``i`` sits at absolute position ``i + off``; with ``causal`` it
    attends keys ``[max(0, p - window + 1) if window else 0, p]``. ``bias``
    ([S, KV], strides ``b_ss``/``b_sk``) is added to the scaled scores.

    The query heads reading one kv head form that kv head's columns (column
    ``c`` is head ``heads[c // S]``, row ``c % S``); task ``t`` takes columns
    ``[task_c0[t], task_c1[t])`` of kv head ``task_kh[t]``, in tiles of ``BQ``
    columns. Each key block is loaded once per task for all the task's tiles
    and all the heads of a group (a decode step over a GQA cache reads each
    cached key once; a prompt's key block is copied once per task, not once
    per tile). Scores are computed transposed (``S^T = K Q^T``: keys by rows,
    columns along the contiguous axis), so the running max, the rescale and
    the denominators are elementwise over the columns, and ``P V`` reads
    ``P^T`` as its broadcast operand: no tile is ever transposed. Products
    cover the used columns only (rounded up to the micro-kernel's tile). A
    tile's values do not depend on the task it is in: its key blocks, products
    and softmax steps are the same in the same order.

    Task ``t`` reads keys ``[task_k0[t], task_k1[t])``. When a task holds only
    part of its columns' keys (``part`` is not empty: a long cache split across
    tasks), it leaves its unnormalized output, running max and denominator in
    ``part[t]`` for :func:`combine_parts` instead of writing ``out``.
    """
    Dv = (D + NR - 1) // NR * NR
    lse_base = S * H * D
    split = part.shape[0] > 0
    for t in prange(task_kh.shape[0]):
        kh = task_kh[t]
        c0 = task_c0[t]
        ncol = task_c1[t] - c0
        nt = (ncol + BQ - 1) // BQ  # tiles of this task
        k0 = task_k0[t]
        k1 = task_k1[t]
        QT = np.zeros((nt, D, BQ), np.float32)
        Qr = np.empty((BQ, D), np.float32)
        Kb = np.zeros((BK, D), np.float32)
        Vb = np.zeros((BK, Dv), np.float32)
        St = np.empty((BK, BQ), np.float32)
        acc = np.zeros((nt, BQ, Dv), np.float32)
        m = np.full((nt, BQ), _NEG, np.float32)
        mn = np.empty(BQ, np.float32)
        el = np.zeros((nt, BQ), np.float32)
        row = np.zeros((nt, BQ), np.int64)
        head = np.zeros((nt, BQ), np.int64)
        lo_r = np.zeros((nt, BQ), np.int32)
        hi_r = np.zeros((nt, BQ), np.int32)  # padding columns attend nothing
        # per tile: columns, key blocks [first, end), keys every column attends
        t_nq = np.zeros(nt, np.int64)
        t_j0 = np.zeros(nt, np.int64)
        t_jhi = np.zeros(nt, np.int64)
        t_all_lo = np.zeros(nt, np.int64)
        t_all_hi = np.zeros(nt, np.int64)
        first = KV
        last = 0
        for u in range(nt):
            nq = min(BQ, ncol - u * BQ)
            t_nq[u] = nq
            jlo = KV
            jhi = 0
            all_lo = 0
            all_hi = KV
            for i in range(nq):
                c = c0 + u * BQ + i
                h = heads[c // S]
                r = c % S
                head[u, i] = h
                row[u, i] = r
                b = r * q_ss + h * q_sh
                for d in range(D):
                    Qr[i, d] = q[_U(b + d)] * scale
                lo, hi = _key_range(r + off, KV, causal, window)
                lo = max(lo, k0)
                hi = min(hi, k1)
                lo_r[u, i] = lo
                hi_r[u, i] = hi
                jlo = min(jlo, lo)
                jhi = max(jhi, hi)
                all_lo = max(all_lo, lo)
                all_hi = min(all_hi, hi)
            # Transposed from the gathered rows: the gather loop stays short, so the
            # core keeps more rows' loads in flight (each row of q is a head stride
            # away, on its own page). Writing QT straight from q, one strided store
            # per element, cost 4.7 of 28 ms of a causal 512-token, 32-head forward
            # (one thread, Intel AVX-512); gathering first, 2.3.
            for d in range(D):
                for i in range(nq):
                    QT[u, d, i] = Qr[i, d]
            t_j0[u] = (jlo // BK) * BK
            t_jhi[u] = jhi
            t_all_lo[u] = all_lo
            t_all_hi[u] = all_hi
            first = min(first, t_j0[u])
            last = max(last, jhi)
        j0 = first
        while j0 < last:
            nk = min(BK, KV - j0)
            kb = j0 * k_ss + kh * k_sh
            vb = j0 * v_ss + kh * v_sh
            copied = False
            for u in range(nt):
                if j0 < t_j0[u] or j0 >= t_jhi[u]:
                    continue  # no column of this tile sees this key block
                nq = t_nq[u]
                nn = (nq + NR - 1) // NR * NR  # score columns computed
                nm = (nq + 3) // 4 * 4  # output rows computed
                # With one column tile (decode steps) each key is read once: the
                # products read K and V in place. With more, K and V blocks are copied
                # into contiguous tiles (once per task): their rows are a head stride
                # apart and would collide in the same cache sets on every re-read.
                direct = nn == NR and nk == BK and Dv == D and nt == 1
                if direct:
                    gemm(k, kb, k_ss, 1, QT, u * D * BQ, BQ, St, 0, BQ, BK, nn, D,
                             False)
                else:
                    if not copied:
                        _load_block(k, kb, k_ss, v, vb, v_ss, nk, D, Kb, Vb)
                        copied = True
                    gemm(Kb, 0, D, 1, QT, u * D * BQ, BQ, St, 0, BQ, BK, nn, D, False)
                # A block every real column attends in full needs no mask.
                if (has_bias or nq < nn or nk < BK or j0 < t_all_lo[u]
                        or j0 + nk > t_all_hi[u]):
                    for j in range(BK):
                        ja = j0 + j
                        if j >= nk:
                            for i in range(nn):
                                St[j, i] = _NEG
                            continue
                        if has_bias:
                            bb = ja * b_sk
                            for i in range(nq):
                                St[j, i] += bias[_U(bb + row[u, i] * b_ss)]
                        for i in range(nn):
                            ok = (ja >= lo_r[u, i]) & (ja < hi_r[u, i])
                            St[j, i] = St[j, i] if ok else _NEG
                for i in range(nn):
                    mn[i] = m[u, i]
                for j in range(BK):
                    for i in range(nn):
                        s = St[j, i]
                        mn[i] = s if s > mn[i] else mn[i]
                for i in range(nn):
                    # A column that attended nothing yet keeps max -inf; shifting it by
                    # 0 keeps its exps exactly 0 instead of NaN.
                    x = mn[i]
                    x = x if x != _NEG else _F(0.0)
                    a = exp_f32(m[u, i] - x)
                    el[u, i] *= a
                    m[u, i] = mn[i]
                    mn[i] = x
                    if a != 1.0:
                        for d in range(Dv):
                            acc[u, i, d] *= a
                for j in range(BK):
                    for i in range(nn):
                        p = exp_f32(St[j, i] - mn[i])
                        el[u, i] += p
                        St[j, i] = p
                if direct:
                    gemm(St, 0, 1, BQ, v, vb, v_ss, acc, u * BQ * Dv, Dv, nm, Dv, nk,
                             True)
                else:
                    gemm(St, 0, 1, BQ, Vb, 0, Dv, acc, u * BQ * Dv, Dv, nm, Dv, nk,
                             True)
            j0 += BK
        for u in range(nt):
            for i in range(t_nq[u]):
                if split:
                    ci = u * BQ + i
                    for d in range(D):
                        part[t, ci, d] = acc[u, i, d]
                    part[t, ci, D] = m[u, i]
                    part[t, ci, D + 1] = el[u, i]
                    continue
                h = head[u, i]
                r = row[u, i]
                b = (r * H + h) * D
                inv = _F(1.0) / el[u, i]
                for d in range(D):
                    out[_U(b + d)] = acc[u, i, d] * inv
                out[_U(lse_base + h * S + r)] = m[u, i] + log_f32(el[u, i])


#: Most column tiles one forward task holds: it copies each key block once for all of
#: them (a causal 512-token prompt, 32 heads: the copies were 6.4 of 38 ms, one thread,
#: Intel AVX-512 guest).
TASK_TILES = 8
#: Tiles are grouped into tasks only while at least this many tasks remain.
MIN_TASKS = 16


def tiles_per_task(counts: np.ndarray, S: int) -> int:
    """How many column tiles of one kv head each forward task takes (1: one each), from
    the query heads per kv head (``counts``) and the query length.

    Decided from the shapes alone; a tile's values do not depend on its task.
    """
    tiles = int(sum(-(-int(n) * S // BQ) for n in counts))
    return max(1, min(TASK_TILES, tiles // MIN_TASKS))


def forward_tasks(kvmap: np.ndarray, counts: np.ndarray, S: int, group: int = 1
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Query heads grouped by kv head, and the (kv head, column range) of every task.

    Returns ``heads`` (query heads ordered by kv head) and per task its kv head
    and its columns ``[c0, c1)`` in the group's column space (each group starts
    at ``S`` times its first head's place in ``heads``): ``group`` tiles of
    ``BQ`` columns, fewer at the end of a kv head's columns.
    """
    heads = np.argsort(kvmap, kind="stable").astype(np.int64)
    t_kh, t_c0, t_c1 = [], [], []
    first = 0
    width = BQ * group
    for kh in range(len(counts)):
        n = int(counts[kh]) * S
        start = first * S
        for c in range(0, n, width):
            t_kh.append(kh)
            t_c0.append(start + c)
            t_c1.append(start + min(c + width, n))
        first += int(counts[kh])
    return (heads, np.array(t_kh, np.int64), np.array(t_c0, np.int64),
            np.array(t_c1, np.int64))


#: Below this many tasks a long key range is split across tasks (flash decoding).
SPLIT_TASKS = 8
#: Fewest keys a split task handles.
SPLIT_MIN_KEYS = 8 * BK


def key_splits(tasks: int, kv: int) -> int:
    """How many key chunks each task's range is cut into (1: none).

    Decided from the shapes alone (never the thread count), so results do not
    depend on the machine: few tasks over many keys (a decode step over a long
    cache) become at least ``SPLIT_TASKS`` tasks of at least ``SPLIT_MIN_KEYS``
    keys each.
    """
    if tasks >= SPLIT_TASKS:
        return 1
    want = -(-SPLIT_TASKS // tasks)
    return max(1, min(want, kv // SPLIT_MIN_KEYS))


@_pjit
def combine_parts(part, splits, heads, task_c0, task_c1, out, S, H, D):
    """Merge the key chunks of each (split) task: rescale by the chunks' maxima, sum,
    normalize; write the output rows and the logsumexp."""
    lse_base = S * H * D
    n = task_c0.shape[0]
    for t in prange(n):
        c0 = task_c0[t]
        for i in range(task_c1[t] - c0):
            c = c0 + i
            h = heads[c // S]
            r = c % S
            mx = _NEG
            for s in range(splits):
                mx = max(mx, part[t * splits + s, i, D])
            shift = mx if mx != _NEG else _F(0.0)
            total = _F(0.0)
            b = (r * H + h) * D
            for d in range(D):
                out[_U(b + d)] = 0.0
            for s in range(splits):
                u = t * splits + s
                w = exp_f32(part[u, i, D] - shift)
                total += w * part[u, i, D + 1]
                for d in range(D):
                    out[_U(b + d)] += w * part[u, i, d]
            inv = _F(1.0) / total
            for d in range(D):
                out[_U(b + d)] *= inv
            out[_U(lse_base + h * S + r)] = mx + log_f32(total)


@_pjit
def attention_backward(q, q_ss, q_sh, k, k_ss, k_sh, v, v_ss, v_sh, o, go, go_ss, go_sh,
                       kvmap, dq, dk, dv, slot, dk_ss, dk_sh, scale, S, H, KV, D, off, causal,
                       window):
    """Gradients of the forward above (no bias) from its output ``o`` (with logsumexp).

    One task per query head: its query rows and output gradient are laid out
    once as row tiles and transposed tiles; then each key block recomputes the
    transposed probabilities ``P^T = exp(K Q^T scale - lse)`` and accumulates
    ``dV += P^T dO``, ``dS^T = P^T (V dO^T - delta)``, ``dK += dS^T Q scale``,
    ``dQ += dS K scale``. ``dq`` is [S, H, D]; the key/value gradients of query
    head ``h`` go to ``dk``/``dv`` at ``key * dk_ss + slot[h] * dk_sh``: its kv
    head's rows when each kv head serves one query head, else a per-head
    partial the caller sums (:func:`sum_partials`).
    """
    Dv = (D + NR - 1) // NR * NR
    nqb = (S + BQ - 1) // BQ
    Sp = nqb * BQ
    lse_base = S * H * D
    for h in prange(H):
        kh = kvmap[h]
        QT = np.zeros((nqb, D, BQ), np.float32)
        Qb = np.zeros((nqb, BQ, Dv), np.float32)
        GT = np.zeros((nqb, D, BQ), np.float32)
        Gb = np.zeros((nqb, BQ, Dv), np.float32)
        dQl = np.zeros((nqb, BQ, Dv), np.float32)
        delta = np.zeros(Sp, np.float32)
        lse = np.zeros(Sp, np.float32)
        for i in range(S):
            ib = i // BQ
            r = i - ib * BQ
            qb = i * q_ss + h * q_sh
            gb = i * go_ss + h * go_sh
            ob = (i * H + h) * D
            dl = _F(0.0)
            for d in range(D):
                x = q[_U(qb + d)] * scale
                Qb[ib, r, d] = x
                y = go[_U(gb + d)]
                Gb[ib, r, d] = y
                dl += o[_U(ob + d)] * y
            delta[i] = dl
            lse[i] = o[_U(lse_base + h * S + i)]
        # The transposed tiles from the gathered rows (as in the forward: one strided
        # store per element while reading q and the output gradient left their rows'
        # loads one at a time; ~9 of 70 ms of a causal 512-token, 32-head backward, one
        # thread, Intel AVX-512 guest).
        for ib in range(nqb):
            for d in range(D):
                for r in range(BQ):
                    QT[ib, d, r] = Qb[ib, r, d]
                    GT[ib, d, r] = Gb[ib, r, d]
        Kb = np.zeros((BK, Dv), np.float32)
        Vb = np.zeros((BK, Dv), np.float32)
        dKj = np.empty((BK, Dv), np.float32)
        dVj = np.empty((BK, Dv), np.float32)
        St = np.empty((BK, BQ), np.float32)
        dPt = np.empty((BK, BQ), np.float32)
        for j0 in range(0, KV, BK):
            nk = min(BK, KV - j0)
            _load_block(k, j0 * k_ss + kh * k_sh, k_ss, v, j0 * v_ss + kh * v_sh, v_ss, nk, D,
                        Kb, Vb)
            dKj[:] = 0.0
            dVj[:] = 0.0
            # Query blocks holding a row that can see a key of this block.
            ib_lo = 0
            ib_hi = nqb
            if causal:
                ib_lo = max(0, j0 - off) // BQ
                if window > 0:
                    ib_hi = min(nqb, (min(S, j0 + nk - 1 - off + window) + BQ - 1) // BQ)
            for ib in range(ib_lo, ib_hi):
                i0 = ib * BQ
                nq = min(BQ, S - i0)
                qt = ib * D * BQ
                rows = ib * BQ * Dv
                gemm(Kb, 0, Dv, 1, QT, qt, BQ, St, 0, BQ, BK, BQ, D, False)
                for j in range(BK):
                    lo = 0
                    hi = nq
                    if j >= nk:
                        hi = 0
                    elif causal:  # query p = i + off sees key j0 + j when j0 + j <= p
                        lo = max(0, j0 + j - off - i0)
                        if window > 0:
                            hi = min(nq, j0 + j - off + window - i0)
                    for i in range(BQ):
                        p = exp_f32(St[j, i] - lse[i0 + i])
                        St[j, i] = p if (i >= lo) & (i < hi) else _F(0.0)
                gemm(St, 0, BQ, 1, Gb, rows, Dv, dVj, 0, Dv, BK, Dv, BQ, True)
                gemm(Vb, 0, Dv, 1, GT, qt, BQ, dPt, 0, BQ, BK, BQ, D, False)
                for j in range(BK):
                    for i in range(BQ):
                        dPt[j, i] = St[j, i] * (dPt[j, i] - delta[i0 + i])
                gemm(dPt, 0, BQ, 1, Qb, rows, Dv, dKj, 0, Dv, BK, Dv, BQ, True)
                gemm(dPt, 0, 1, BQ, Kb, 0, Dv, dQl, rows, Dv, BQ, Dv, BK, True)
            for r in range(nk):
                b = (j0 + r) * dk_ss + slot[h] * dk_sh
                for d in range(D):
                    dk[_U(b + d)] = dKj[r, d]
                    dv[_U(b + d)] = dVj[r, d]
        for i in range(S):
            ib = i // BQ
            r = i - ib * BQ
            b = (i * H + h) * D
            for d in range(D):
                dq[_U(b + d)] = dQl[ib, r, d] * scale


@_pjit
def sum_partials(part, kvmap, out, H, KV, KH, D):
    """out[key, kh, :] = sum over heads h with kvmap[h] == kh of part[h, key, :]."""
    for kh in prange(KH):
        for j in range(KV):
            b = (j * KH + kh) * D
            for d in range(D):
                out[_U(b + d)] = 0.0
            for h in range(H):
                if kvmap[h] == kh:
                    pb = (h * KV + j) * D
                    for d in range(D):
                        out[_U(b + d)] += part[_U(pb + d)]


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
            out: np.ndarray | None = None, group: int | None = None) -> np.ndarray:
    """Flat float32 result: the output [S, H, D], then the logsumexp [H, S].

    ``group`` overrides :func:`tiles_per_task` (the tests compare groupings: the
    values are the same bits whatever the grouping).
    """
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
    counts = np.bincount(kvmap, minlength=k.shape[1])  # query heads per kv head
    if group is None:
        group = tiles_per_task(counts, S)
    if group < 1:
        raise InvalidShape(f"attention task group {group} is below 1")
    heads, t_kh, t_c0, t_c1 = forward_tasks(kvmap, counts, S, group)
    splits = key_splits(len(t_kh), KV)
    if splits == 1:
        t_k0 = np.zeros(len(t_kh), np.int64)
        t_k1 = np.full(len(t_kh), KV, np.int64)
        part = np.zeros((0, 0, 0), np.float32)
        u_kh, u_c0, u_c1 = t_kh, t_c0, t_c1
    else:  # every task repeated once per key chunk (chunks of whole blocks)
        step = -(-KV // splits // BK) * BK
        edges = np.minimum(np.arange(splits + 1, dtype=np.int64) * step, KV)
        u_kh, u_c0, u_c1 = (np.repeat(a, splits) for a in (t_kh, t_c0, t_c1))
        t_k0 = np.tile(edges[:-1], len(t_kh))
        t_k1 = np.tile(edges[1:], len(t_kh))
        part = np.empty((len(u_kh), BQ * group, D + 2), np.float32)
    attention_forward(qf, q_ss, q_sh, kf, k_ss, k_sh, vf, v_ss, v_sh, bf, b_ss, b_sk,
                      bias is not None, heads, u_kh, u_c0, u_c1, t_k0, t_k1, part, out,
                      np.float32(scale), S, H, KV, D, off, bool(causal), int(window))
    if splits > 1:
        combine_parts(part, splits, heads, t_c0, t_c1, out, S, H, D)
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
