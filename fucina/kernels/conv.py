"""Convolution, pooling and patch kernels over channel-last f32 arrays.

Layouts (all row-major f32): images ``[B, H, W, C]``, conv weights
``[Cout, kH, kW, Cin/groups]``, patches ``[B, oH*oW, kH*kW, C]`` (window taps
ordered ``(ky, kx)``, the channel fastest: the im2col layout). A window is the
tuple ``(kh, kw, sh, sw, ph, pw, dh, dw)``: kernel, stride, zero padding and
dilation per spatial axis.

Routes for ``conv2d`` (groups == 1):

- 3x3, stride 1, dilation 1, padding <= 1: Winograd F(4x4, 3x3) (36 transform
  planes, 4x fewer multiplies than im2col) on maps of at least 8x8, F(2x2, 3x3)
  (16 planes, 2.25x fewer) below. The planes turn the 3x3 window into one GEMM
  per plane over the tiles. For moderate channel counts the whole conv is one
  parallel Numba region: each task takes a block of tiles through the input
  transform, one small single-threaded BLAS call per plane and the output
  transform in its own cache; deeper channels take chunks of tiles through a
  parallel transform, numpy's batched BLAS GEMM and a parallel transform back.
- otherwise: im2col of a tile of output pixels into a cache-sized buffer, then
  one BLAS GEMM per tile writing straight into the output rows.

Grouped convs (depthwise included) run a direct Numba kernel. Every driver
checks its arrays against the window before a kernel runs: kernels index
only inside buffers whose sizes were verified here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from ..dtypes import DType
from ..errors import ShapeMismatch
from ..runtime.storage import POOL
from . import blas_threads
from .microkernel import LANES, MR6, NR6, gemm6
from .reference import kernel

# fastmath without nnan/ninf: NaN and inf inputs keep their IEEE meaning.
_FM = {"nsz", "arcp", "contract", "afn", "reassoc"}
_par = njit(parallel=True, cache=True, nogil=True, fastmath=_FM)
_inline = njit(inline="always", cache=True, nogil=True, fastmath=_FM)

Window = tuple[int, int, int, int, int, int, int, int]

#: Bytes of im2col buffer per GEMM tile: L3-sized, few BLAS calls per conv.
TILE_BYTES = 1 << 23
#: The fused Winograd kernel multiplies blocks of tiles with one BLAS call per plane
#: from inside its parallel tasks (numba's np.dot: scipy's BLAS). It keeps each call
#: below this many multiply-adds, where OpenBLAS runs a GEMM on the calling thread
#: (65536 x GEMM_MULTITHREAD_THRESHOLD 4): BLAS threads inside the tasks would
#: contend. A BLAS that threads smaller calls is slower here, never wrong.
#: Channel counts that leave fewer than FUSED_MIN_ROWS tiles per block use the
#: chunked route (big batched GEMMs between two parallel regions).
FUSED_GEMM_MACS = 1 << 18
FUSED_MIN_ROWS = 16
#: Parallel tasks of the fused kernel (each owns its plane buffers); a few per
#: core, so a stalled thread's share is picked up by the others.
FUSED_TASKS = 8
#: Bytes of Winograd transform planes (input + product) per chunk of tiles: large, so
#: a conv makes few BLAS calls and parallel regions (both stall on a busy machine).
WINO_CHUNK_BYTES = 1 << 26


def out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    """Output length of a window sweep (torch's floor formula); may be <= 0."""
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def out_hw(h: int, w: int, win: Window) -> tuple[int, int]:
    """Output (height, width) of ``win`` over an ``h x w`` image."""
    kh, kw, sh, sw, ph, pw, dh, dw = win
    return out_size(h, kh, sh, ph, dh), out_size(w, kw, sw, pw, dw)


def _scratch(count: int) -> np.ndarray:
    """A pooled f32 work buffer (fresh large buffers pay a page fault per page)."""
    return POOL.take(np.dtype(np.float32), count)


#: A result buffer: pooled too, so a compiled program's result (pooled storage,
#: back to the pool when released) is reused by the next call.
_result = _scratch


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _expect(a: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ShapeMismatch(f"{what}: array shape {tuple(a.shape)}, expected {tuple(shape)}")


# -- im2col / col2im -------------------------------------------------------------------


@_par
def _im2col(x, H, W, C, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, p0, p1, col):
    """col[p - p0, (ky*kw + kx)*cg + c] = x[b, iy, ix, c0 + c] (0 outside the image)."""
    K = kh * kw * cg
    ohw = oH * oW
    for p in prange(p0, p1):
        b = p // ohw
        r = p - b * ohw
        oy = r // oW
        ox = r - oy * oW
        row = (p - p0) * K
        for ky in range(kh):
            iy = oy * sh - ph + ky * dh
            for kx in range(kw):
                ix = ox * sw - pw + kx * dw
                o = row + (ky * kw + kx) * cg
                dst = col[o:o + cg]
                if iy >= 0 and iy < H and ix >= 0 and ix < W:
                    s = ((b * H + iy) * W + ix) * C + c0
                    src = x[s:s + cg]
                    for c in range(cg):
                        dst[c] = src[c]
                else:
                    for c in range(cg):
                        dst[c] = 0.0


@_par
def _col2im(col, B, H, W, C, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, dx):
    """dx[b, iy, ix, c0 + c] = sum of the patch entries that read it (gather form).

    ``col`` is ``[B*oH*oW, kh*kw*cg]``. Each input pixel sums its taps in
    (ky, kx) order, so the result does not depend on the thread count.
    """
    K = kh * kw * cg
    for bi in prange(B * H):
        b = bi // H
        iy = bi - b * H
        for ix in range(W):
            o = ((b * H + iy) * W + ix) * C + c0
            d = dx[o:o + cg]
            for c in range(cg):
                d[c] = 0.0
            for ky in range(kh):
                ty = iy + ph - ky * dh
                if ty < 0 or ty % sh != 0:
                    continue
                oy = ty // sh
                if oy >= oH:
                    continue
                for kx in range(kw):
                    tx = ix + pw - kx * dw
                    if tx < 0 or tx % sw != 0:
                        continue
                    ox = tx // sw
                    if ox >= oW:
                        continue
                    s = ((b * oH + oy) * oW + ox) * K + (ky * kw + kx) * cg
                    src = col[s:s + cg]
                    for c in range(cg):
                        d[c] += src[c]


def unfold(x: np.ndarray, win: Window) -> np.ndarray:
    """Patches ``[B, oH*oW, kh*kw, C]`` of a ``[B, H, W, C]`` image (pad taps read 0)."""
    x = _f32(x)
    B, H, W, C = x.shape
    kh, kw, sh, sw, ph, pw, dh, dw = win
    oH, oW = out_hw(H, W, win)
    _check_out(oH, oW, win, H, W)
    col = _result(B * oH * oW * kh * kw * C)
    _im2col(x.reshape(-1), H, W, C, 0, C, kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, 0,
            B * oH * oW, col)
    return col.reshape(B, oH * oW, kh * kw, C)


def fold(cols: np.ndarray, hw: tuple[int, int], win: Window) -> np.ndarray:
    """The adjoint of :func:`unfold`: scatter-add patches into ``[B, H, W, C]``."""
    cols = _f32(cols)
    B, L, KK, C = cols.shape
    H, W = hw
    kh, kw, sh, sw, ph, pw, dh, dw = win
    oH, oW = out_hw(H, W, win)
    _check_out(oH, oW, win, H, W)
    _expect(cols, (B, oH * oW, kh * kw, C), "fold patches")
    dx = _result(B * H * W * C)
    _col2im(cols.reshape(-1), B, H, W, C, 0, C, kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, dx)
    return dx.reshape(B, H, W, C)


def _check_out(oH: int, oW: int, win: Window, H: int, W: int) -> None:
    if oH < 1 or oW < 1:
        raise ShapeMismatch(f"window {win} leaves no output over a {H}x{W} image")


# -- conv2d: im2col + GEMM ------------------------------------------------------------------


def _epilogue(o: np.ndarray, bias: np.ndarray | None, relu: bool) -> None:
    if bias is not None:
        np.add(o, bias, out=o)
    if relu:
        np.maximum(o, np.float32(0), out=o)


def _tile_rows(k: int, p: int) -> int:
    return max(1, min(p, TILE_BYTES // (4 * k)))


def _conv_gemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, win: Window,
               relu: bool, out: np.ndarray) -> None:
    """groups == 1: per tile of output pixels, im2col then one GEMM into ``out``."""
    B, H, W, C = x.shape
    Co = w.shape[0]
    kh, kw, sh, sw, ph, pw, dh, dw = win
    oH, oW = out.shape[1], out.shape[2]
    K = kh * kw * C
    P = B * oH * oW
    wt = w.reshape(Co, K).T  # [K, Co]: BLAS reads the transpose without a copy
    o2 = out.reshape(P, Co)
    if kh == kw == 1 and sh == sw == 1 and ph == pw == 0:
        blas_threads.matmul(x.reshape(P, C), wt, o2)  # a 1x1 conv is one plain GEMM
        _epilogue(o2, bias, relu)
        return
    tile = _tile_rows(K, P)
    col = _scratch(tile * K)
    xf = x.reshape(-1)
    for p0 in range(0, P, tile):
        p1 = min(P, p0 + tile)
        _im2col(xf, H, W, C, 0, C, kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, p0, p1, col)
        o = o2[p0:p1]
        blas_threads.matmul(col[:(p1 - p0) * K].reshape(p1 - p0, K), wt, o)
        _epilogue(o, bias, relu)
    POOL.give(col)


# -- conv2d: Winograd F(m x m, 3x3) --------------------------------------------------------------
#
# Y = A^T [(G g G^T) . (B^T d B)] A per tile: d is an n x n input tile (n = m + 2),
# Y its m x m outputs. The elementwise product over the n*n planes is, across
# tiles and channels, one GEMM per plane: [tiles, Cin] x [Cin, Cout].

_BT2 = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
_G2 = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64)
_AT2 = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
_BT4 = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
_G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
_AT4 = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], np.float64)
#: output tile size -> (B^T, G, A^T)
WINOGRAD = {2: (_BT2, _G2, _AT2), 4: (_BT4, _G4, _AT4)}
#: tiles per scratch block inside the transform kernels
_BLOCK = 8


@_inline
def _tile_in(x, H, W, C, b, y0, x0, n, bt, tmp, V, TC, q):
    """V[plane*TC + q + c] = (B^T d B)[plane, c] for the n x n tile d at (y0, x0) of
    image b; returns the sum of the entries written (the non-finite probe).

    Separable: rows first into ``tmp``, then columns; every step is a vector op
    over the contiguous channels. Pad taps read 0.
    """
    for j in range(n):  # tmp[i, j] = sum_k bt[i, k] d[k, j]
        ix = x0 + j
        for i in range(n):
            o = (i * n + j) * C
            dst = tmp[o:o + C]
            for c in range(C):
                dst[c] = 0.0
            if ix < 0 or ix >= W:
                continue
            for k in range(n):
                cf = np.float32(bt[i, k])
                iy = y0 + k
                if cf == 0 or iy < 0 or iy >= H:
                    continue
                s = ((b * H + iy) * W + ix) * C
                src = x[s:s + C]
                for c in range(C):
                    dst[c] += cf * src[c]
    acc = np.float32(0.0)
    for i in range(n):  # V[i, j] = sum_l tmp[i, l] bt[j, l]
        for j in range(n):
            o = (i * n + j) * TC + q
            dst = V[o:o + C]
            for c in range(C):
                dst[c] = 0.0
            for k in range(n):
                cf = np.float32(bt[j, k])
                if cf == 0:
                    continue
                s = (i * n + k) * C
                src = tmp[s:s + C]
                for c in range(C):
                    dst[c] += cf * src[c]
            for c in range(C):
                acc += dst[c]
    return acc


@_inline
def _tile_out(M, TC, q, bias, has_bias, relu, oH, oW, Co, b, ty, tx, m, n, at, tmp, out):
    """The m x m outputs of tile (ty, tx) of image b = A^T M A (+ bias, relu), read from
    its n*n product planes at ``M[plane*TC + q:...]``; outputs past the map are skipped."""
    for i in range(m):  # tmp[i, j] = sum_k at[i, k] M[k, j]
        for j in range(n):
            o = (i * n + j) * Co
            dst = tmp[o:o + Co]
            for c in range(Co):
                dst[c] = 0.0
            for k in range(n):
                cf = np.float32(at[i, k])
                if cf == 0:
                    continue
                s = (k * n + j) * TC + q
                src = M[s:s + Co]
                for c in range(Co):
                    dst[c] += cf * src[c]
    for i in range(m):  # y[i, j] = sum_l tmp[i, l] at[j, l]
        y = m * ty + i
        if y >= oH:
            continue
        for j in range(m):
            xo = m * tx + j
            if xo >= oW:
                continue
            o = ((b * oH + y) * oW + xo) * Co
            dst = out[o:o + Co]
            for c in range(Co):
                dst[c] = bias[c] if has_bias else np.float32(0.0)
            for k in range(n):
                cf = np.float32(at[j, k])
                if cf == 0:
                    continue
                s = (i * n + k) * Co
                src = tmp[s:s + Co]
                for c in range(Co):
                    dst[c] += cf * src[c]
            if relu:
                for c in range(Co):
                    if dst[c] < 0:
                        dst[c] = 0.0


@_par
def _wino_in(x, H, W, C, ph, pw, tH, tW, t0, t1, m, bt, V):
    """Input transform of tiles [t0, t1) into planes ``V[n*n, t1 - t0, C]``.

    Returns the sum of every entry: non-finite exactly when an input of these
    tiles is (B^T . B is invertible), which sends the caller to the im2col
    route so NaN and inf reach only the outputs whose window reads them.
    """
    n = bt.shape[0]
    T = t1 - t0
    tpi = tH * tW
    total = np.float32(0.0)
    for blk in prange((T + _BLOCK - 1) // _BLOCK):
        tmp = np.empty(n * n * C, np.float32)
        acc = np.float32(0.0)
        for t in range(t0 + blk * _BLOCK, min(t1, t0 + (blk + 1) * _BLOCK)):
            b = t // tpi
            r = t - b * tpi
            ty = r // tW
            tx = r - ty * tW
            acc += _tile_in(x, H, W, C, b, m * ty - ph, m * tx - pw, n, bt, tmp, V, T * C,
                            (t - t0) * C)
        total += acc
    return total


@_par
def _wino_out(M, bias, has_bias, relu, oH, oW, Co, tH, tW, t0, t1, m, at, out):
    """Output transform of tiles [t0, t1) from the product planes ``M[n*n, t1 - t0, Co]``."""
    n = at.shape[1]
    T = t1 - t0
    tpi = tH * tW
    for blk in prange((T + _BLOCK - 1) // _BLOCK):
        tmp = np.empty(m * n * Co, np.float32)
        for t in range(t0 + blk * _BLOCK, min(t1, t0 + (blk + 1) * _BLOCK)):
            b = t // tpi
            r = t - b * tpi
            ty = r // tW
            tx = r - ty * tW
            _tile_out(M, T * Co, (t - t0) * Co, bias, has_bias, relu, oH, oW, Co, b, ty, tx,
                      m, n, at, tmp, out)


@_par
def _wino_fused(x, u, bias, has_bias, relu, H, W, C, Co, ph, pw, oH, oW, tH, tW, NT, m,
                bt, at, rows, tiled, VS, MS, out):
    """The whole Winograd conv in one parallel region: each task takes blocks of
    ``rows`` tiles through input transform, one small GEMM per plane (the
    micro-kernel, or single-threaded BLAS, inside the task) and output transform,
    all in its own cache.
    ``VS``/``MS`` hold each task's planes: ``[tasks, n*n, rows, C or Co]``.

    ``tiled``: the planes' GEMMs run on the micro-kernel (``rows`` a multiple of 6,
    ``Co`` of NR6) instead of BLAS.

    Returns the non-finite probe of :func:`_wino_in` over every tile.
    """
    n = bt.shape[0]
    nn = n * n
    uf = u.reshape(-1)
    tpi = tH * tW
    nblk = (NT + rows - 1) // rows
    nsuper = VS.shape[0]
    total = np.float32(0.0)
    for sup in prange(nsuper):
        V = VS[sup]
        M = MS[sup]
        Vf = V.reshape(-1)
        Mf = M.reshape(-1)
        tin = np.empty(n * n * C, np.float32)
        tout = np.empty(m * n * Co, np.float32)
        acc = np.float32(0.0)
        for blk in range(sup * nblk // nsuper, (sup + 1) * nblk // nsuper):
            t0 = blk * rows
            k = min(NT, t0 + rows) - t0
            for t in range(t0, t0 + k):
                b = t // tpi
                r = t - b * tpi
                ty = r // tW
                tx = r - ty * tW
                acc += _tile_in(x, H, W, C, b, m * ty - ph, m * tx - pw, n, bt, tin, Vf,
                                rows * C, (t - t0) * C)
            if tiled:  # whole 6-row tiles: rows k..k6 of V are stale, of M unread
                k6 = (k + MR6 - 1) // MR6 * MR6
                for p in range(nn):
                    gemm6(Vf, p * rows * C, C, 1, uf, p * C * Co, Co, Mf, p * rows * Co, Co,
                          k6, Co, C, False)
            else:
                for p in range(nn):
                    np.dot(V[p, :k], u[p], M[p, :k])
            for t in range(t0, t0 + k):
                b = t // tpi
                r = t - b * tpi
                ty = r // tW
                tx = r - ty * tW
                _tile_out(Mf, rows * Co, (t - t0) * Co, bias, has_bias, relu, oH, oW, Co, b,
                          ty, tx, m, n, at, tout, out)
        total += acc
    return total


def winograd_eligible(w_shape: tuple[int, ...], win: Window, groups: int,
                      hw_out: tuple[int, int] | None = None) -> bool:
    """Whether a conv takes a Winograd route (the reference's gate)."""
    kh, kw, sh, sw, ph, pw, dh, dw = win
    co, wkh, wkw, cg = w_shape
    ok = (kh, kw, wkh, wkw, sh, sw, dh, dw) == (3, 3, 3, 3, 1, 1, 1, 1) and groups == 1 \
        and ph <= 1 and pw <= 1 and cg >= 4
    if ok and hw_out is not None:
        ok = hw_out[0] >= 2 and hw_out[1] >= 2
    return ok


def winograd_tile(hw_out: tuple[int, int]) -> int:
    """Output tile size: F(4x4, 3x3) on maps of at least 8x8, F(2x2, 3x3) below."""
    return 4 if min(hw_out) >= 8 else 2


def winograd_weights(w: np.ndarray, m: int) -> np.ndarray:
    """U = G g G^T per (in, out) channel pair: planes ``[n*n, Cin, Cout]`` (f64 math)."""
    w = np.asarray(w)
    co, kh, kw, ci = w.shape
    _expect(w, (co, 3, 3, ci), "winograd weights")
    g = WINOGRAD[m][1]
    n = g.shape[0]
    taps = np.ascontiguousarray(w.transpose(1, 2, 3, 0), dtype=np.float64)  # [ky, kx, ci, co]
    rows = (g @ taps.reshape(3, -1)).reshape(n, 3, ci * co)  # G along ky
    u = np.matmul(g, rows)  # G along kx: [n, n, ci*co]
    return u.reshape(n * n, ci, co).astype(np.float32)


def _conv_winograd(x: np.ndarray, u: np.ndarray, m: int, bias: np.ndarray | None,
                   win: Window, relu: bool, out: np.ndarray) -> bool:
    """The F(m x m, 3x3) route; False (``out`` unusable) on a non-finite input."""
    B, H, W, C = x.shape
    Co = u.shape[2]
    bt, _, at = WINOGRAD[m]
    n = m + 2
    _expect(u, (n * n, C, Co), "winograd planes")
    ph, pw = win[4], win[5]
    oH, oW = out.shape[1], out.shape[2]
    tH, tW = -(-oH // m), -(-oW // m)
    NT = B * tH * tW
    xf = x.reshape(-1)
    of = out.reshape(-1)
    rows = (FUSED_GEMM_MACS - 1) // (C * Co)
    # The planes' GEMMs on the micro-kernel where it has 16-lane tiles. Conv 3x3
    # [8,56,56,64] -> 64, two threads, Zen 5 with OpenBLAS pinned to its AVX2 kernels:
    # 3.4-3.6 ms against 5.9 with BLAS (torch 4.0); with OpenBLAS's own AVX-512 kernels
    # the two ran alike, so unlike the blocked 2-D GEMM this does not look at the pin.
    tiled = LANES == 16 and Co % NR6 == 0 and u.flags.c_contiguous
    if tiled:
        rows = rows // MR6 * MR6
    if rows >= FUSED_MIN_ROWS:
        rows = min(rows, -(-NT // MR6) * MR6 if tiled else NT)
        tasks = min(-(-NT // rows), FUSED_TASKS)
        vs = _scratch(tasks * n * n * rows * C)
        ms = _scratch(tasks * n * n * rows * Co)
        total = _wino_fused(xf, u, bias if bias is not None else u[0, 0], bias is not None,
                            relu, H, W, C, Co, ph, pw, oH, oW, tH, tW, NT, m, bt, at, rows,
                            tiled, vs.reshape(tasks, n * n, rows, C),
                            ms.reshape(tasks, n * n, rows, Co), of)
        POOL.give(vs)
        POOL.give(ms)
        return math.isfinite(total)
    chunk = max(_BLOCK, min(NT, WINO_CHUNK_BYTES // (4 * n * n * (C + Co))))
    V = _scratch(n * n * chunk * C)
    M = _scratch(n * n * chunk * Co)
    bvec = bias if bias is not None else V[:1]
    finite = True
    for t0 in range(0, NT, chunk):
        t1 = min(NT, t0 + chunk)
        k = t1 - t0
        if not math.isfinite(_wino_in(xf, H, W, C, ph, pw, tH, tW, t0, t1, m, bt, V)):
            finite = False
            break
        blas_threads.matmul(V[:n * n * k * C].reshape(n * n, k, C), u,
                            M[:n * n * k * Co].reshape(n * n, k, Co))
        _wino_out(M, bvec, bias is not None, relu, oH, oW, Co, tH, tW, t0, t1, m, at, of)
    POOL.give(V)
    POOL.give(M)
    return finite


# -- conv2d: grouped (direct) ------------------------------------------------------------------


@_par
def _conv_direct(x, wt, bias, has_bias, relu, B, H, W, C, Co, G, cg, cog,
                 kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, out):
    """Grouped conv, one output pixel at a time; ``wt`` is ``[kh, kw, cg, Co]``."""
    for row in prange(B * oH):
        b = row // oH
        oy = row - b * oH
        for ox in range(oW):
            o = ((b * oH + oy) * oW + ox) * Co
            acc = out[o:o + Co]
            for c in range(Co):
                acc[c] = bias[c] if has_bias else np.float32(0.0)
            for ky in range(kh):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= H:
                    continue
                for kx in range(kw):
                    ix = ox * sw - pw + kx * dw
                    if ix < 0 or ix >= W:
                        continue
                    s = ((b * H + iy) * W + ix) * C
                    xs = x[s:s + C]
                    wk = (ky * kw + kx) * cg * Co
                    if cg == 1 and cog == 1:  # depthwise: one vector op over channels
                        ws = wt[wk:wk + Co]
                        for c in range(Co):
                            acc[c] += xs[c] * ws[c]
                    else:
                        for g in range(G):
                            ag = acc[g * cog:(g + 1) * cog]
                            for ci in range(cg):
                                xv = xs[g * cg + ci]
                                w0 = wk + ci * Co + g * cog
                                ws = wt[w0:w0 + cog]
                                for co in range(cog):
                                    ag[co] += xv * ws[co]
            if relu:
                for c in range(Co):
                    if acc[c] < 0:
                        acc[c] = 0.0


@_par
def _conv_direct_dx(g, wt, B, H, W, C, Co, G, cg, cog, kh, kw, sh, sw, ph, pw, dh, dw,
                    oH, oW, dx):
    """Input gradient of the grouped conv, gathered per input pixel (race-free)."""
    for row in prange(B * H):
        b = row // H
        iy = row - b * H
        for ix in range(W):
            o = ((b * H + iy) * W + ix) * C
            d = dx[o:o + C]
            for c in range(C):
                d[c] = 0.0
            for ky in range(kh):
                ty = iy + ph - ky * dh
                if ty < 0 or ty % sh != 0:
                    continue
                oy = ty // sh
                if oy >= oH:
                    continue
                for kx in range(kw):
                    tx = ix + pw - kx * dw
                    if tx < 0 or tx % sw != 0:
                        continue
                    ox = tx // sw
                    if ox >= oW:
                        continue
                    s = ((b * oH + oy) * oW + ox) * Co
                    gs = g[s:s + Co]
                    wk = (ky * kw + kx) * cg * Co
                    if cg == 1 and cog == 1:
                        ws = wt[wk:wk + Co]
                        for c in range(C):
                            d[c] += gs[c] * ws[c]
                    else:
                        for gr in range(G):
                            gg = gs[gr * cog:(gr + 1) * cog]
                            for ci in range(cg):
                                w0 = wk + ci * Co + gr * cog
                                ws = wt[w0:w0 + cog]
                                acc = np.float32(0.0)
                                for co in range(cog):
                                    acc += gg[co] * ws[co]
                                d[gr * cg + ci] += acc


@_par
def _conv_direct_dw(x, g, B, H, W, C, Co, G, cg, cog, kh, kw, sh, sw, ph, pw, dh, dw,
                    oH, oW, nchunk, part):
    """Weight gradient of the grouped conv: chunk k of the output pixels sums into
    ``part[k]`` (``[kh, kw, cg, Co]``); the caller adds the chunks in order."""
    P = B * oH * oW
    KW = kh * kw * cg * Co
    ohw = oH * oW
    for k in prange(nchunk):
        acc = part[k * KW:(k + 1) * KW]
        for i in range(KW):
            acc[i] = 0.0
        p0 = k * P // nchunk
        p1 = (k + 1) * P // nchunk
        for p in range(p0, p1):
            b = p // ohw
            r = p - b * ohw
            oy = r // oW
            ox = r - oy * oW
            gs = g[p * Co:(p + 1) * Co]
            for ky in range(kh):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= H:
                    continue
                for kx in range(kw):
                    ix = ox * sw - pw + kx * dw
                    if ix < 0 or ix >= W:
                        continue
                    s = ((b * H + iy) * W + ix) * C
                    xs = x[s:s + C]
                    wk = (ky * kw + kx) * cg * Co
                    if cg == 1 and cog == 1:
                        a = acc[wk:wk + Co]
                        for c in range(Co):
                            a[c] += xs[c] * gs[c]
                    else:
                        for gr in range(G):
                            gg = gs[gr * cog:(gr + 1) * cog]
                            for ci in range(cg):
                                xv = xs[gr * cg + ci]
                                w0 = wk + ci * Co + gr * cog
                                a = acc[w0:w0 + cog]
                                for co in range(cog):
                                    a[co] += xv * gg[co]


def _direct_args(x_shape: tuple[int, ...], w_shape: tuple[int, ...], groups: int
                 ) -> tuple[int, int, int, int, int, int, int, int]:
    B, H, W, C = x_shape
    Co, kh, kw, cg = w_shape
    return B, H, W, C, Co, groups, cg, Co // groups


# -- conv2d drivers ------------------------------------------------------------------------------


def check_conv(x_shape: tuple[int, ...], w_shape: tuple[int, ...], win: Window,
               groups: int) -> tuple[int, int]:
    """Validate a conv's operand sizes; returns the output (height, width)."""
    B, H, W, C = x_shape
    Co, kh, kw, cg = w_shape
    if groups < 1 or C % groups or Co % groups:
        raise ShapeMismatch(f"groups={groups} must divide input channels {C} and output "
                            f"channels {Co}")
    if cg * groups != C:
        raise ShapeMismatch(f"weight has {cg} input channels per group; input has {C} "
                            f"channels in {groups} group(s)")
    if (kh, kw) != (win[0], win[1]):
        raise ShapeMismatch(f"weight window {kh}x{kw} differs from the window {win[:2]}")
    oH, oW = out_hw(H, W, win)
    _check_out(oH, oW, win, H, W)
    return oH, oW


def conv2d_forward(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, win: Window,
                   groups: int, relu: bool = False, planes: dict[int, np.ndarray] | None = None
                   ) -> np.ndarray:
    """``[B, oH, oW, Cout]`` = conv of ``x`` with ``w`` (+ bias, relu).

    ``planes`` are prepared Winograd weights (tile size -> :func:`winograd_weights`
    of ``w``): used on the Winograd routes instead of transforming ``w`` again.
    """
    x = _f32(x)
    w = _f32(w)
    oH, oW = check_conv(x.shape, w.shape, win, groups)
    B, Co = x.shape[0], w.shape[0]
    if bias is not None:
        bias = _f32(bias)
        _expect(bias, (Co,), "conv bias")
    out = _result(B * oH * oW * Co).reshape(B, oH, oW, Co)
    if groups > 1:
        B_, H, W, C, Co, G, cg, cog = _direct_args(x.shape, w.shape, groups)
        wt = np.ascontiguousarray(w.transpose(1, 2, 3, 0)).reshape(-1)
        kh, kw, sh, sw, ph, pw, dh, dw = win
        _conv_direct(x.reshape(-1), wt, bias if bias is not None else wt[:1],
                     bias is not None, relu, B, H, W, C, Co, G, cg, cog,
                     kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, out.reshape(-1))
        return out
    if winograd_eligible(w.shape, win, groups, (oH, oW)):
        m = winograd_tile((oH, oW))
        u = planes[m] if planes is not None else winograd_weights(w, m)
        if np.isfinite(u).all() and _conv_winograd(x, u, m, bias, win, relu, out):
            return out
    _conv_gemm(x, w, bias, win, relu, out)
    return out


def conv2d_grad_input(g: np.ndarray, w: np.ndarray, in_shape: tuple[int, ...], win: Window,
                      groups: int) -> np.ndarray:
    """dL/dx of a conv (``g`` is dL/dout)."""
    g = _f32(g)
    w = _f32(w)
    oH, oW = check_conv(in_shape, w.shape, win, groups)
    B, H, W, C = in_shape
    Co, kh, kw, cg = w.shape
    _expect(g, (B, oH, oW, Co), "conv output gradient")
    sh, sw, ph, pw, dh, dw = win[2:]
    if groups > 1:
        dx = _result(B * H * W * C)
        wt = np.ascontiguousarray(w.transpose(1, 2, 3, 0)).reshape(-1)
        _conv_direct_dx(g.reshape(-1), wt, *_direct_args(in_shape, w.shape, groups),
                        kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, dx)
        return dx.reshape(in_shape)
    fph, fpw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    if sh == sw == 1 and fph >= 0 and fpw >= 0:
        # Stride 1: the input gradient is a conv of g with the flipped, transposed
        # weight (the forward routes, Winograd included, serve it).
        wf = np.ascontiguousarray(w[:, ::-1, ::-1, :].transpose(3, 1, 2, 0))
        dx = conv2d_forward(g, wf, None, (kh, kw, 1, 1, fph, fpw, dh, dw), 1)
        if dx.shape == tuple(in_shape):
            return dx
    # General stride: per chunk of images, dcol = g @ W then col2im.
    K = kh * kw * C
    wm = w.reshape(Co, K)
    dx = _result(B * H * W * C)
    per = max(1, min(B, 2 * TILE_BYTES // max(1, 4 * oH * oW * K)))
    for b0 in range(0, B, per):
        b1 = min(B, b0 + per)
        dcol = blas_threads.matmul(g[b0:b1].reshape(-1, Co), wm)
        _col2im(dcol.reshape(-1), b1 - b0, H, W, C, 0, C, kh, kw, sh, sw, ph, pw, dh, dw,
                oH, oW, dx[b0 * H * W * C:b1 * H * W * C])
    return dx.reshape(in_shape)


def conv2d_grad_weight(x: np.ndarray, g: np.ndarray, w_shape: tuple[int, ...], win: Window,
                       groups: int) -> np.ndarray:
    """dL/dweight of a conv, ``[Cout, kh, kw, Cin/groups]``."""
    x = _f32(x)
    g = _f32(g)
    oH, oW = check_conv(x.shape, w_shape, win, groups)
    B, H, W, C = x.shape
    Co, kh, kw, cg = w_shape
    _expect(g, (B, oH, oW, Co), "conv output gradient")
    sh, sw, ph, pw, dh, dw = win[2:]
    P = B * oH * oW
    if groups > 1:
        nchunk = min(P, 32)
        KW = kh * kw * cg * Co
        part = np.empty(nchunk * KW, np.float32)
        _conv_direct_dw(x.reshape(-1), g.reshape(-1), *_direct_args(x.shape, w_shape, groups),
                        kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, nchunk, part)
        total = part.reshape(nchunk, KW).sum(axis=0, dtype=np.float32)
        return np.ascontiguousarray(total.reshape(kh, kw, cg, Co).transpose(3, 0, 1, 2))
    K = kh * kw * C
    g2 = g.reshape(P, Co)
    if kh == kw == 1 and sh == sw == 1 and ph == pw == 0:
        return blas_threads.matmul(g2.T, x.reshape(P, C)).reshape(w_shape)
    tile = _tile_rows(K, P)
    col = _scratch(tile * K)
    acc = np.zeros((Co, K), np.float32)
    part = np.empty((Co, K), np.float32)
    xf = x.reshape(-1)
    for p0 in range(0, P, tile):
        p1 = min(P, p0 + tile)
        _im2col(xf, H, W, C, 0, C, kh, kw, sh, sw, ph, pw, dh, dw, oH, oW, p0, p1, col)
        blas_threads.matmul(g2[p0:p1].T, col[:(p1 - p0) * K].reshape(p1 - p0, K), part)
        acc += part
    POOL.give(col)
    return acc.reshape(w_shape)


# -- pooling ---------------------------------------------------------------------------------------


@_par
def _pool(x, B, H, W, C, kh, kw, sh, sw, ph, pw, oH, oW, is_max, out):
    """max (NaN propagates, pad taps skipped) or mean over the valid taps."""
    for row in prange(B * oH):
        b = row // oH
        oy = row - b * oH
        y0 = oy * sh - ph
        ylo = max(y0, 0)
        yhi = min(y0 + kh, H)
        for ox in range(oW):
            x0 = ox * sw - pw
            xlo = max(x0, 0)
            xhi = min(x0 + kw, W)
            o = ((b * oH + oy) * oW + ox) * C
            acc = out[o:o + C]
            init = -np.inf if is_max else 0.0
            for c in range(C):
                acc[c] = init
            for iy in range(ylo, yhi):
                for ix in range(xlo, xhi):
                    s = ((b * H + iy) * W + ix) * C
                    xs = x[s:s + C]
                    if is_max:
                        for c in range(C):
                            v = xs[c]
                            if v > acc[c] or v != v:
                                acc[c] = v
                    else:
                        for c in range(C):
                            acc[c] += xs[c]
            if not is_max:
                n = np.float32((yhi - ylo) * (xhi - xlo))
                for c in range(C):
                    acc[c] = acc[c] / n


@_par
def _max_pool_dx(x, g, B, H, W, C, kh, kw, sh, sw, ph, pw, oH, oW, dx):
    """Route each output's gradient to its window's max (torch's pick: the first
    strict maximum in (ky, kx) order, or the last NaN). One image per task."""
    for b in prange(B):
        base = b * H * W * C
        for i in range(H * W * C):
            dx[base + i] = 0.0
        for oy in range(oH):
            y0 = oy * sh - ph
            ylo = max(y0, 0)
            yhi = min(y0 + kh, H)
            for ox in range(oW):
                x0 = ox * sw - pw
                xlo = max(x0, 0)
                xhi = min(x0 + kw, W)
                go = ((b * oH + oy) * oW + ox) * C
                for c in range(C):
                    best = -np.inf
                    at = ((b * H + ylo) * W + xlo) * C + c
                    for iy in range(ylo, yhi):
                        for ix in range(xlo, xhi):
                            s = ((b * H + iy) * W + ix) * C + c
                            v = x[s]
                            if v > best or v != v:
                                best = v
                                at = s
                    dx[at] += g[go + c]


@_par
def _avg_pool_dx(g, B, H, W, C, kh, kw, sh, sw, ph, pw, oH, oW, dx):
    """dx[pixel] = sum over the windows that read it of g / (valid taps), gathered."""
    for row in prange(B * H):
        b = row // H
        iy = row - b * H
        for ix in range(W):
            o = ((b * H + iy) * W + ix) * C
            d = dx[o:o + C]
            for c in range(C):
                d[c] = 0.0
            for ky in range(kh):
                ty = iy + ph - ky
                if ty < 0 or ty % sh != 0:
                    continue
                oy = ty // sh
                if oy >= oH:
                    continue
                y0 = oy * sh - ph
                ny = min(y0 + kh, H) - max(y0, 0)
                for kx in range(kw):
                    tx = ix + pw - kx
                    if tx < 0 or tx % sw != 0:
                        continue
                    ox = tx // sw
                    if ox >= oW:
                        continue
                    x0 = ox * sw - pw
                    n = np.float32(ny * (min(x0 + kw, W) - max(x0, 0)))
                    s = ((b * oH + oy) * oW + ox) * C
                    gs = g[s:s + C]
                    for c in range(C):
                        d[c] += gs[c] / n


def check_pool(x_shape: tuple[int, ...], win: Window) -> tuple[int, int]:
    """Validate a pooling window; returns the output (height, width)."""
    B, H, W, C = x_shape
    oH, oW = out_hw(H, W, win)
    _check_out(oH, oW, win, H, W)
    return oH, oW


def pool2d(x: np.ndarray, fn: str, win: Window) -> np.ndarray:
    """max or avg pooling (valid taps only) of ``[B, H, W, C]``."""
    x = _f32(x)
    B, H, W, C = x.shape
    oH, oW = check_pool(x.shape, win)
    kh, kw, sh, sw, ph, pw = win[:6]
    out = _result(B * oH * oW * C)
    _pool(x.reshape(-1), B, H, W, C, kh, kw, sh, sw, ph, pw, oH, oW, fn == "max", out)
    return out.reshape(B, oH, oW, C)


def pool2d_grad(x: np.ndarray, g: np.ndarray, fn: str, win: Window) -> np.ndarray:
    """dL/dx of :func:`pool2d` given dL/dout ``g``."""
    x = _f32(x)
    g = _f32(g)
    B, H, W, C = x.shape
    oH, oW = check_pool(x.shape, win)
    _expect(g, (B, oH, oW, C), "pool output gradient")
    kh, kw, sh, sw, ph, pw = win[:6]
    dx = _result(B * H * W * C)
    if fn == "max":
        _max_pool_dx(x.reshape(-1), g.reshape(-1), B, H, W, C, kh, kw, sh, sw, ph, pw, oH, oW,
                     dx)
    else:
        _avg_pool_dx(g.reshape(-1), B, H, W, C, kh, kw, sh, sw, ph, pw, oH, oW, dx)
    return dx.reshape(B, H, W, C)


# -- the primitives' reference kernels ------------------------------------------------------------


@kernel("conv2d")
def _k_conv2d(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    prepared = attrs.get("prepared")
    planes = prepared.planes if prepared is not None else None
    bias = ins[2] if len(ins) > 2 else None
    return conv2d_forward(ins[0], ins[1], bias, attrs["window"], attrs["groups"],
                          attrs.get("relu", False), planes)


@kernel("conv2d_grad_input")
def _k_conv2d_dx(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return conv2d_grad_input(ins[0], ins[1], tuple(attrs["in_shape"]), attrs["window"],
                             attrs["groups"])


@kernel("conv2d_grad_weight")
def _k_conv2d_dw(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return conv2d_grad_weight(ins[0], ins[1], tuple(attrs["w_shape"]), attrs["window"],
                              attrs["groups"])


@kernel("unfold")
def _k_unfold(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return unfold(ins[0], attrs["window"])


@kernel("fold")
def _k_fold(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return fold(ins[0], tuple(attrs["hw"]), attrs["window"])


@kernel("pool2d")
def _k_pool2d(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return pool2d(ins[0], attrs["fn"], attrs["window"])


@kernel("pool2d_grad")
def _k_pool2d_grad(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    return pool2d_grad(ins[0], ins[1], attrs["fn"], attrs["window"])


class PreparedConvWeights:
    """Winograd weight planes built once from a conv2d weight (``fucina.PreparedConvWeights``).

    ``PreparedConvWeights.empty`` is the inert value for a weight that can
    never take the Winograd route; every conv route ignores it.
    """

    __slots__ = ("planes", "weight_shape", "_released")
    empty: PreparedConvWeights

    def __init__(self, planes: dict[int, np.ndarray] | None,
                 weight_shape: tuple[int, ...] | None):
        if planes is not None:
            for u in planes.values():
                u.flags.writeable = False
        self.planes = planes
        self.weight_shape = weight_shape
        self._released = False

    @property
    def is_empty(self) -> bool:
        """True for the inert value (no planes)."""
        return self.planes is None and not self._released

    def deinit(self) -> None:
        """Release the planes (a no-op on ``empty``)."""
        if self.planes is not None:
            self.planes = None
            self._released = True

    def __repr__(self) -> str:
        if self._released:
            return "PreparedConvWeights(<deinit'ed>)"
        if self.planes is None:
            return "PreparedConvWeights.empty"
        return f"PreparedConvWeights(winograd F(2x2)/F(4x4), weight {self.weight_shape})"

    @classmethod
    def build(cls, w: np.ndarray) -> PreparedConvWeights:
        """The planes of every Winograd tile size for weight ``w``."""
        return cls({m: winograd_weights(w, m) for m in WINOGRAD}, tuple(w.shape))


PreparedConvWeights.empty = PreparedConvWeights(None, None)
