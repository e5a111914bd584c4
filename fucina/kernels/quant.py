"""Decoding (and the Q8_0 encoding) of the GGML block-quantized formats.

:func:`dequantize` turns an array of blocks (:mod:`fucina.blocks` dtypes,
blocks along the last axis) into float32 values. Every decoder evaluates the
same f32 expression, in the same association order, as ggml's
``dequantize_row_*`` reference and the ``gguf`` package, so results are
bit-identical to ``gguf.quants.dequantize`` (0 ulp, signed zeros included).

The IQ2_*/IQ3_*/IQ1_* codebook grids are ggml data tables that cannot be
derived from a formula; they are read from the ``gguf`` package when it is
installed (lazily, on first use). Without ``gguf`` those seven formats are
absent from :data:`DEQUANTIZE_FORMATS`.
"""

import importlib.util
from collections.abc import Callable
from functools import cache

import numpy as np

from fucina.blocks import BLOCK_DTYPES, BLOCK_SIZES, BlockQ8_0, q8_0_block_size

__all__ = ["DEQUANTIZE_FORMATS", "dequantize", "quantize_q8_0"]

_F32 = np.float32

# 16-entry nonlinear IQ4 codebook and the E2M1 (FP4) codebook stored doubled
# (the shared scale decoders below halve to compensate), as ggml defines them.
_KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=_F32
)
_KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=_F32)

_IQ1_DELTA = _F32(0.125)


def _ksigns() -> np.ndarray:
    """ggml's ``ksigns_iq2xs``: 7 stored sign bits plus an 8th making the parity even."""
    i = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(i[:, None], axis=1).sum(axis=1) & 1
    return i | (parity.astype(np.uint8) << np.uint8(7))


_KSIGNS = _ksigns()
_BIT = np.arange(8, dtype=np.uint8)


def _e8m0_half_table() -> np.ndarray:
    """ggml's ``ggml_e8m0_to_fp32_half``: 2**(e - 128) for every E8M0 byte."""
    e = np.arange(256, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(_F32)


def _ue4m3_half_table() -> np.ndarray:
    """ggml's ``ggml_ue4m3_to_fp32``: unsigned E4M3 scale, halved; 0x00/0x7f decode to 0.

    Like ggml, the top (sign) bit is ignored rather than rejected.
    """
    x = np.arange(256)
    exp = (x >> 3) & 0xF
    man = x & 0x7
    raw = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * np.exp2(exp - 7.0))
    return np.where((x == 0) | (x == 0x7F), 0.0, raw * 0.5).astype(_F32)  # all exact


_E8M0_HALF = _e8m0_half_table()
_UE4M3_HALF = _ue4m3_half_table()

_GRID_CLASSES = {
    "iq2_xxs": "IQ2_XXS",
    "iq2_xs": "IQ2_XS",
    "iq2_s": "IQ2_S",
    "iq3_xxs": "IQ3_XXS",
    "iq3_s": "IQ3_S",
    "iq1_s": "IQ1_S",
    "iq1_m": "IQ1_S",  # IQ1_M shares the IQ1_S grid
}
_HAVE_GGUF = importlib.util.find_spec("gguf") is not None


@cache
def _grid(fmt: str) -> np.ndarray:
    """The (entries, width) float32 codebook grid of an IQ format, from ``gguf``."""
    try:
        import gguf.quants
    except ImportError:  # pragma: no cover - guarded by DEQUANTIZE_FORMATS
        raise ValueError(f"dequantize: no decoder for {fmt}") from None
    cls = getattr(gguf.quants, _GRID_CLASSES[fmt])
    cls.init_grid()
    grid = np.array(cls.grid, dtype=_F32).reshape(cls.grid_shape)
    grid.flags.writeable = False
    return grid


# --- field helpers --------------------------------------------------------------


def _half(bits: np.ndarray) -> np.ndarray:
    """f16 bit field -> f32 column of shape (n, 1)."""
    return np.ascontiguousarray(bits).view(np.float16).astype(_F32).reshape(-1, 1)


def _u32(raw: np.ndarray) -> np.ndarray:
    """(..., 4k) bytes -> (..., k) little-endian uint32 words."""
    return np.ascontiguousarray(raw).view("<u4")


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, m) bytes -> (n, 2m): low nibbles of all bytes, then high nibbles."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)


def _crumbs(qs: np.ndarray, groups: int) -> np.ndarray:
    """2-bit fields in ggml's plane order: (n, groups*32) bytes -> (n, groups, 4, 32)."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return (qs.reshape(-1, groups, 1, 32) >> shifts) & np.uint8(3)


def _sign_bits(sign_bytes: np.ndarray) -> np.ndarray:
    """(..., k) sign bytes -> (..., k, 8) float32 factors: bit j set means -1."""
    bits = (sign_bytes[..., None] >> _BIT) & np.uint8(1)
    return np.where(bits == 0, _F32(1), _F32(-1))


# --- legacy formats -------------------------------------------------------------


def _deq_q1_0(b: np.ndarray) -> np.ndarray:
    d = _half(b["d"])
    bits = np.unpackbits(b["qs"], axis=-1, bitorder="little")
    return np.where(bits == 1, d, -d)


def _deq_q2_0(b: np.ndarray) -> np.ndarray:
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)
    q = ((b["qs"][..., None] >> shifts) & np.uint8(3)).reshape(len(b), -1)  # byte-major
    return (q.astype(np.int8) - np.int8(1)).astype(_F32) * _half(b["d"])


def _deq_q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b["qs"]).astype(np.int8) - np.int8(8)
    return _half(b["d"]) * q.astype(_F32)


def _deq_q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b["qs"]).astype(_F32)
    return _half(b["d"]) * q + _half(b["m"])


def _q5_high(b: np.ndarray) -> np.ndarray:
    qh = _u32(b["qh"]).reshape(-1, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def _deq_q5_0(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b["qs"]) | (_q5_high(b) << np.uint8(4))).astype(np.int8) - np.int8(16)
    return _half(b["d"]) * q.astype(_F32)


def _deq_q5_1(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b["qs"]) | (_q5_high(b) << np.uint8(4))).astype(_F32)
    return _half(b["d"]) * q + _half(b["m"])


def _deq_q8_0(b: np.ndarray) -> np.ndarray:
    return b["qs"].astype(_F32) * _half(b["d"])


def _deq_q8_k(b: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(b["d"]).astype(_F32).reshape(-1, 1)
    return d * b["qs"].astype(_F32)


# --- K-quants -------------------------------------------------------------------


def _deq_q2_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc = b["scales"]
    dl = (_half(b["d"]) * (sc & np.uint8(0xF)).astype(_F32)).reshape(n, 16, 1)
    ml = (_half(b["dmin"]) * (sc >> np.uint8(4)).astype(_F32)).reshape(n, 16, 1)
    q = _crumbs(b["qs"], 2).reshape(n, 16, 16).astype(_F32)
    return (dl * q - ml).reshape(n, -1)


def _deq_q3_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc = b["scales"]
    # 16 6-bit scales: low nibbles from bytes 0..7 (low then high nibble halves),
    # 2 high bits from bytes 8..11, byte (j % 4) shifted by 2 * (j // 4).
    low = np.concatenate([sc[:, :8] & np.uint8(0xF), sc[:, :8] >> np.uint8(4)], axis=-1)
    hshift = (2 * (np.arange(16) // 4)).astype(np.uint8)
    high = (sc[:, 8 + np.arange(16) % 4] >> hshift) & np.uint8(3)
    scales = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    dl = (_half(b["d"]) * scales.astype(_F32)).reshape(n, 16, 1)
    ql = _crumbs(b["qs"], 2).reshape(n, 256).astype(np.int8)
    hbit = ((b["hmask"][:, None, :] >> _BIT[:, None]) & np.uint8(1)).reshape(n, 256)
    # A clear high bit means "subtract 4" (ggml's inverted mask).
    q = (ql - ((hbit ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)).astype(_F32)
    return (dl * q.reshape(n, 16, 16)).reshape(n, -1)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 8 6-bit scales and mins of Q4_K/Q5_K (ggml ``get_scale_min_k4``)."""
    a, m, c = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scales = np.concatenate([a & np.uint8(63), (c & np.uint8(0xF)) | ((a >> 6) << 4)], axis=-1)
    mins = np.concatenate([m & np.uint8(63), (c >> np.uint8(4)) | ((m >> 6) << 4)], axis=-1)
    return scales, mins


def _k4_low_bits(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K nibbles -> (n, 8, 32): per 64-chunk the low nibbles, then the high."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0xF)).reshape(-1, 8, 32)


def _deq_q4_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc, mn = _scale_min_k4(b["scales"])
    d = (_half(b["d"]) * sc.astype(_F32)).reshape(n, 8, 1)
    dm = (_half(b["dmin"]) * mn.astype(_F32)).reshape(n, 8, 1)
    q = _k4_low_bits(b["qs"]).astype(_F32)
    return (d * q - dm).reshape(n, -1)


def _deq_q5_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc, mn = _scale_min_k4(b["scales"])
    d = (_half(b["d"]) * sc.astype(_F32)).reshape(n, 8, 1)
    dm = (_half(b["dmin"]) * mn.astype(_F32)).reshape(n, 8, 1)
    hbit = (b["qh"][:, None, :] >> _BIT[:, None]) & np.uint8(1)  # sub-block j: bit j
    q = (_k4_low_bits(b["qs"]) | (hbit << np.uint8(4))).astype(_F32)
    return (d * q - dm).reshape(n, -1)


def _deq_q6_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    ql = b["ql"].reshape(n, 2, 2, 32)  # [half][first/second 32 bytes][l]
    low = np.concatenate([ql & np.uint8(0xF), ql >> np.uint8(4)], axis=2)  # planes 0..3
    high = _crumbs(b["qh"], 2)
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    d = (_half(b["d"]) * b["scales"].astype(_F32)).reshape(n, 16, 1)
    return (d * q.reshape(n, 16, 16).astype(_F32)).reshape(n, -1)


# --- codebook formats -------------------------------------------------------------


def _deq_iq4_nl(b: np.ndarray) -> np.ndarray:
    return _half(b["d"]) * _KVALUES_IQ4NL[_nibbles(b["qs"])]


def _deq_iq4_xs(b: np.ndarray) -> np.ndarray:
    n = len(b)
    ib = np.arange(8)
    sl = b["scales_l"]
    low = (sl[:, ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & np.uint8(0xF)
    sh = np.ascontiguousarray(b["scales_h"]).reshape(n, 1)
    high = ((sh >> (2 * ib).astype(np.uint16)) & np.uint16(3)).astype(np.uint8)
    ls = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    dl = (_half(b["d"]) * ls.astype(_F32)).reshape(n, 8, 1)
    q = _nibbles(b["qs"].reshape(n, 8, 16))
    return (dl * _KVALUES_IQ4NL[q]).reshape(n, -1)


def _deq_iq2_xxs(b: np.ndarray) -> np.ndarray:
    n = len(b)
    raw = np.ascontiguousarray(b["qs"]).view(np.uint8).reshape(n, 8, 8)
    idx = raw[:, :, :4]  # 4 grid indices per 32 elements
    aux = _u32(raw[:, :, 4:]).reshape(n, 8)  # 4 x 7 sign-index bits, 4-bit scale
    db = _half(b["d"]) * (_F32(0.5) + (aux >> np.uint32(28)).astype(_F32)) * _F32(0.25)
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)
    signs = _sign_bits(_KSIGNS[sidx])
    grid = _grid("iq2_xxs")[idx]
    return (db.reshape(n, 8, 1, 1) * grid * signs).reshape(n, -1)


def _deq_iq2_xs(b: np.ndarray) -> np.ndarray:
    n = len(b)
    qs = b["qs"]
    sc = _nibbles(b["scales"][:, :, None]).reshape(n, 16)  # per 16 elements
    db = _half(b["d"]) * (_F32(0.5) + sc.astype(_F32)) * _F32(0.25)
    signs = _sign_bits(_KSIGNS[qs >> np.uint16(9)])
    grid = _grid("iq2_xs")[qs & np.uint16(511)]
    return (
        db.reshape(n, 16, 1, 1) * grid.reshape(n, 16, 2, 8) * signs.reshape(n, 16, 2, 8)
    ).reshape(n, -1)


def _deq_iq2_s(b: np.ndarray) -> np.ndarray:
    n = len(b)
    qs = b["qs"]
    sc = _nibbles(b["scales"][:, :, None]).reshape(n, 16)
    db = _half(b["d"]) * (_F32(0.5) + sc.astype(_F32)) * _F32(0.25)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)
    hi = ((b["qh"][:, :, None] >> shifts) & np.uint8(3)).reshape(n, 32).astype(np.uint16)
    idx = qs[:, :32].astype(np.uint16) | (hi << np.uint16(8))
    signs = _sign_bits(qs[:, 32:])
    grid = _grid("iq2_s")[idx]
    return (
        db.reshape(n, 16, 1, 1) * grid.reshape(n, 16, 2, 8) * signs.reshape(n, 16, 2, 8)
    ).reshape(n, -1)


def _deq_iq3_xxs(b: np.ndarray) -> np.ndarray:
    n = len(b)
    qs = b["qs"]
    aux = _u32(qs[:, 64:]).reshape(n, 8)
    db = _half(b["d"]) * (_F32(0.5) + (aux >> np.uint32(28)).astype(_F32)) * _F32(0.5)
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)
    signs = _sign_bits(_KSIGNS[sidx])  # (n, 8, 4, 8)
    grid = _grid("iq3_xxs")[qs[:, :64]].reshape(n, 8, 4, 8)  # two 4-wide entries per 8
    return (db.reshape(n, 8, 1, 1) * grid * signs).reshape(n, -1)


def _deq_iq3_s(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc = _nibbles(b["scales"][:, :, None]).reshape(n, 8)  # per 32 elements
    db = _half(b["d"]) * (1 + 2 * sc).astype(_F32)
    hi = ((b["qh"][:, :, None] >> _BIT) & np.uint8(1)).reshape(n, 64).astype(np.uint16)
    idx = b["qs"].astype(np.uint16) | (hi << np.uint16(8))
    grid = _grid("iq3_s")[idx].reshape(n, 8, 4, 8)
    signs = _sign_bits(b["signs"]).reshape(n, 8, 4, 8)
    return (db.reshape(n, 8, 1, 1) * grid * signs).reshape(n, -1)


def _deq_iq1_s(b: np.ndarray) -> np.ndarray:
    n = len(b)
    qh = np.ascontiguousarray(b["qh"])  # (n, 8) uint16
    dl = _half(b["d"]) * (2 * ((qh >> np.uint16(12)) & np.uint16(7)) + 1).astype(_F32)
    delta = np.where((qh & np.uint16(0x8000)) == 0, _IQ1_DELTA, -_IQ1_DELTA)
    hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & np.uint16(7)
    idx = b["qs"].astype(np.uint16) | (hi.reshape(n, 32) << np.uint16(8))
    grid = _grid("iq1_s")[idx].reshape(n, 8, 4, 8)
    return (dl.reshape(n, 8, 1, 1) * (grid + delta.reshape(n, 8, 1, 1))).reshape(n, -1)


def _deq_iq1_m(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc = _u32(b["scales"]).view("<u2").reshape(n, 4)
    # The f16 block scale is spread over the top nibbles of the four scale words.
    top = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    dbits = top[:, 0] | top[:, 1] | top[:, 2] | top[:, 3]
    d = _half(dbits)
    sub = (sc[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & np.uint16(7)
    dl = d * (2 * sub.reshape(n, 16) + 1).astype(_F32)  # per 16 elements
    qh = b["qh"][:, :, None] >> np.array([0, 4], dtype=np.uint8)  # (n, 16, 2) nibbles
    idx = b["qs"].astype(np.uint16) | (
        (qh & np.uint8(7)).astype(np.uint16).reshape(n, 32) << np.uint16(8)
    )
    delta = np.where((qh & np.uint8(8)) == 0, _IQ1_DELTA, -_IQ1_DELTA).reshape(n, 16, 2, 1)
    grid = _grid("iq1_m")[idx].reshape(n, 16, 2, 8)
    return (dl.reshape(n, 16, 1, 1) * (grid + delta)).reshape(n, -1)


# --- ternary and FP4 ---------------------------------------------------------------


def _deq_tq1_0(b: np.ndarray) -> np.ndarray:
    n = len(b)
    qs, qh = b["qs"], b["qh"]
    pow3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)
    # A trit is read by multiplying by 3**k (wrapping in uint8), then taking the
    # top "digit" of the byte: (q * 3) >> 8.
    p0 = (qs[:, None, :32] * pow3[None, :, None]).reshape(n, 160)
    p1 = (qs[:, None, 32:] * pow3[None, :, None]).reshape(n, 80)
    p2 = (qh[:, None, :] * pow3[None, :4, None]).reshape(n, 16)
    q = np.concatenate([p0, p1, p2], axis=-1)
    t = ((q.astype(np.uint16) * np.uint16(3)) >> np.uint16(8)).astype(np.int8) - np.int8(1)
    return _half(b["d"]) * t.astype(_F32)


def _deq_tq2_0(b: np.ndarray) -> np.ndarray:
    q = _crumbs(b["qs"], 2).reshape(len(b), 256).astype(np.int8) - np.int8(1)
    return _half(b["d"]) * q.astype(_F32)


def _deq_mxfp4(b: np.ndarray) -> np.ndarray:
    d = _E8M0_HALF[b["e"]].reshape(-1, 1)
    return d * _KVALUES_FP4[_nibbles(b["qs"])]


def _deq_nvfp4(b: np.ndarray) -> np.ndarray:
    n = len(b)
    d = _UE4M3_HALF[b["d"]].reshape(n, 4, 1)
    q = _nibbles(b["qs"].reshape(n, 4, 8))  # per 16-element sub-block: lows, then highs
    return (d * _KVALUES_FP4[q]).reshape(n, -1)


_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q1_0": _deq_q1_0,
    "q2_0": _deq_q2_0,
    "q4_0": _deq_q4_0,
    "q4_1": _deq_q4_1,
    "q5_0": _deq_q5_0,
    "q5_1": _deq_q5_1,
    "q8_0": _deq_q8_0,
    "q8_1": _deq_q8_0,  # same values: the extra `s` field only serves dot products
    "q2_k": _deq_q2_k,
    "q3_k": _deq_q3_k,
    "q4_k": _deq_q4_k,
    "q5_k": _deq_q5_k,
    "q6_k": _deq_q6_k,
    "q8_k": _deq_q8_k,
    "iq4_nl": _deq_iq4_nl,
    "iq4_xs": _deq_iq4_xs,
    "iq2_xxs": _deq_iq2_xxs,
    "iq2_xs": _deq_iq2_xs,
    "iq2_s": _deq_iq2_s,
    "iq3_xxs": _deq_iq3_xxs,
    "iq3_s": _deq_iq3_s,
    "iq1_s": _deq_iq1_s,
    "iq1_m": _deq_iq1_m,
    "tq1_0": _deq_tq1_0,
    "tq2_0": _deq_tq2_0,
    "mxfp4": _deq_mxfp4,
    "nvfp4": _deq_nvfp4,
}

DEQUANTIZE_FORMATS: frozenset[str] = frozenset(
    name for name in _DECODERS if _HAVE_GGUF or name not in _GRID_CLASSES
)
"""Block formats :func:`dequantize` can decode (the IQ grid formats need ``gguf``)."""


def _as_blocks(blocks: np.ndarray, dtype: str) -> np.ndarray:
    """View ``blocks`` as the format's structured dtype (raw uint8 bytes accepted)."""
    want = BLOCK_DTYPES[dtype]
    arr = np.asarray(blocks)
    if arr.dtype == want:
        return arr
    if arr.dtype == np.uint8:  # raw GGUF bytes: (..., n_blocks * itemsize)
        if arr.ndim == 0 or arr.shape[-1] % want.itemsize:
            raise ValueError(
                f"dequantize: {dtype} rows must be a multiple of {want.itemsize} bytes"
            )
        return np.ascontiguousarray(arr).view(want)
    if arr.dtype.itemsize == want.itemsize and arr.dtype.kind == "V":
        return np.ascontiguousarray(arr).view(want)  # same bytes, other field names
    raise ValueError(f"dequantize: expected {dtype} blocks ({want}), got {arr.dtype}")


def dequantize(blocks: np.ndarray, dtype: str) -> np.ndarray:
    """Decode block-quantized data to float32.

    ``blocks`` is an array of ``fucina.blocks.BLOCK_DTYPES[dtype]`` structs of
    any shape ``(..., n_blocks)`` (or raw ``uint8`` bytes ``(..., n_bytes)``);
    the result has shape ``(..., n_blocks * BLOCK_SIZES[dtype])``.
    Raises ``ValueError`` for a format without a decoder (see
    :data:`DEQUANTIZE_FORMATS`).
    """
    if dtype not in DEQUANTIZE_FORMATS:
        raise ValueError(f"dequantize: no decoder for {dtype}")
    arr = _as_blocks(blocks, dtype)
    if arr.ndim == 0:
        raise ValueError("dequantize: blocks must have at least one axis")
    out_shape = arr.shape[:-1] + (arr.shape[-1] * BLOCK_SIZES[dtype],)
    flat = arr.reshape(-1)
    if flat.size == 0:
        return np.zeros(out_shape, dtype=_F32)
    with np.errstate(all="ignore"):  # huge E8M0 scales overflow to inf, as in ggml
        values = _DECODERS[dtype](flat)
    return np.ascontiguousarray(values, dtype=_F32).reshape(out_shape)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: nearest integer, halfway cases away from zero (exact)."""
    a = np.abs(v)
    r = np.floor(a)
    r = r + (a - r >= _F32(0.5)).astype(_F32)  # a - r is exact for |a| < 2**24
    return np.copysign(r, v)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Encode float32 values as Q8_0 blocks (ggml ``quantize_row_q8_0_ref``).

    ``x`` has shape ``(..., n)`` with ``n`` a multiple of 32 and finite values;
    returns ``BlockQ8_0`` structs of shape ``(..., n // 32)``, byte-identical to
    ``gguf.quants.quantize(x, GGMLQuantizationType.Q8_0)``.
    """
    xs = np.asarray(x, dtype=_F32)
    if xs.ndim == 0 or xs.shape[-1] % q8_0_block_size or xs.shape[-1] == 0:
        raise ValueError(
            f"quantize_q8_0: last axis must be a nonzero multiple of {q8_0_block_size}"
        )
    if not np.isfinite(xs).all():
        raise ValueError("quantize_q8_0: input must be finite")
    rows = xs.reshape(-1, q8_0_block_size)
    with np.errstate(all="ignore"):  # 1/d for zero blocks is masked; f16 may overflow
        d = np.abs(rows).max(axis=1, keepdims=True) / _F32(127)
        inv = np.where(d == 0, _F32(0), _F32(1) / d)
        q = _round_half_away(rows * inv)
        out = np.empty(rows.shape[0], dtype=BlockQ8_0)
        out["d"] = d.reshape(-1).astype(np.float16).view(np.uint16)
        out["qs"] = q.astype(np.int8)
    return out.reshape(xs.shape[:-1] + (xs.shape[-1] // q8_0_block_size,))
