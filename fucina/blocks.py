"""Byte-exact numpy layouts of the GGML block-quantized formats.

Every block dtype is a packed (``align=False``) numpy structured dtype whose
field names, order and sizes follow ggml's ``ggml-common.h`` structs, so a
buffer of GGUF tensor bytes can be viewed as an array of blocks without a
copy (``raw_bytes.view(BlockQ8_0)``). Half-precision scale fields (``d``,
``dmin``, ``m``, ``s``) are raw ``uint16`` IEEE binary16 bit patterns; the
quantized payloads are fixed-size subarray fields. All multi-byte fields are
little-endian, as GGUF stores them.

A block-quantized tensor of logical shape ``[..., n]`` stores
``n // BLOCK_SIZES[name]`` blocks along its last axis.
"""

import numpy as np

__all__ = [
    "BLOCK_DTYPES",
    "BLOCK_SIZES",
    "BlockIQ1_M",
    "BlockIQ1_S",
    "BlockIQ2_S",
    "BlockIQ2_XS",
    "BlockIQ2_XXS",
    "BlockIQ3_S",
    "BlockIQ3_XXS",
    "BlockIQ4_NL",
    "BlockIQ4_XS",
    "BlockMXFP4",
    "BlockNVFP4",
    "BlockQ1_0",
    "BlockQ2_0",
    "BlockQ2_K",
    "BlockQ3_K",
    "BlockQ4_0",
    "BlockQ4_1",
    "BlockQ4_K",
    "BlockQ5_0",
    "BlockQ5_1",
    "BlockQ5_K",
    "BlockQ6_K",
    "BlockQ8_0",
    "BlockQ8_1",
    "BlockQ8_K",
    "BlockTQ1_0",
    "BlockTQ2_0",
    "block_byte_size",
    "block_size",
    "iq3s_n_scale",
    "iq4_nl_block_size",
    "k_scale_size",
    "mxfp4_block_size",
    "nvfp4_block_size",
    "nvfp4_subblock_size",
    "q1_0_block_size",
    "q2_0_block_size",
    "q4_0_block_size",
    "q4_1_block_size",
    "q5_0_block_size",
    "q5_1_block_size",
    "q8_0_block_size",
    "q8_1_block_size",
    "qk_k_block_size",
]

# Logical elements per block (ggml's QK* constants).
q1_0_block_size = 128
q2_0_block_size = 128
q4_0_block_size = 32
q4_1_block_size = 32
q5_0_block_size = 32
q5_1_block_size = 32
q8_0_block_size = 32
q8_1_block_size = 32
qk_k_block_size = 256  # super-block size of the K-quants, IQ* (but IQ4_NL) and TQ*
k_scale_size = 12  # bytes of packed 6-bit scales/mins in Q4_K/Q5_K
iq4_nl_block_size = 32
mxfp4_block_size = 32
nvfp4_block_size = 64
nvfp4_subblock_size = 16  # elements sharing one UE4M3 scale byte
iq3s_n_scale = qk_k_block_size // 64  # scale bytes in an IQ3_S block

_QK = qk_k_block_size
_F16 = "<u2"  # ggml_half, kept as raw bits


def _block(fields: list[tuple], nbytes: int) -> np.dtype:
    """Build a packed structured dtype and pin its size against ggml's."""
    dt = np.dtype(fields, align=False)
    if dt.itemsize != nbytes:  # a layout typo must fail at import, not corrupt data
        raise RuntimeError(f"block layout is {dt.itemsize} bytes, ggml says {nbytes}")
    return dt


# --- legacy 32/128-element formats -------------------------------------------

BlockQ1_0 = _block([("d", _F16), ("qs", "u1", (q1_0_block_size // 8,))], 18)
"""Q1_0: f16 scale, 1 sign bit per element (LSB first): ``bit ? d : -d``."""

BlockQ2_0 = _block([("d", _F16), ("qs", "u1", (q2_0_block_size // 4,))], 34)
"""Q2_0: f16 scale, 2-bit codes LSB first, value ``(q - 1) * d`` (ternary)."""

BlockQ4_0 = _block([("d", _F16), ("qs", "u1", (q4_0_block_size // 2,))], 18)
"""Q4_0: f16 scale, nibbles (low nibble: element j, high: j + 16), ``(q - 8) * d``."""

BlockQ4_1 = _block([("d", _F16), ("m", _F16), ("qs", "u1", (q4_1_block_size // 2,))], 20)
"""Q4_1: f16 scale and minimum, nibbles, ``q * d + m``."""

BlockQ5_0 = _block([("d", _F16), ("qh", "u1", (4,)), ("qs", "u1", (q5_0_block_size // 2,))], 22)
"""Q5_0: f16 scale, 32 fifth bits (little-endian u32), nibbles, ``(q - 16) * d``."""

BlockQ5_1 = _block(
    [("d", _F16), ("m", _F16), ("qh", "u1", (4,)), ("qs", "u1", (q5_1_block_size // 2,))],
    24,
)
"""Q5_1: f16 scale and minimum, fifth bits, nibbles, ``q * d + m``."""

BlockQ8_0 = _block([("d", _F16), ("qs", "i1", (q8_0_block_size,))], 34)
"""Q8_0: f16 scale, 32 signed bytes, ``q * d``."""

BlockQ8_1 = _block([("d", _F16), ("s", _F16), ("qs", "i1", (q8_1_block_size,))], 36)
"""Q8_1: Q8_0 plus ``s = d * sum(qs)`` as f16 (activation-side format)."""

# --- K-quants (256-element super-blocks) ---------------------------------------

BlockQ2_K = _block(
    [
        ("scales", "u1", (_QK // 16,)),
        ("qs", "u1", (_QK // 4,)),
        ("d", _F16),
        ("dmin", _F16),
    ],
    84,
)
"""Q2_K: 4-bit scale/min pairs per 16 elements, 2-bit quants, f16 d and dmin."""

BlockQ3_K = _block(
    [
        ("hmask", "u1", (_QK // 8,)),
        ("qs", "u1", (_QK // 4,)),
        ("scales", "u1", (12,)),
        ("d", _F16),
    ],
    110,
)
"""Q3_K: high-bit mask, 2-bit low quants, packed 6-bit scales, f16 d."""

BlockQ4_K = _block(
    [
        ("d", _F16),
        ("dmin", _F16),
        ("scales", "u1", (k_scale_size,)),
        ("qs", "u1", (_QK // 2,)),
    ],
    144,
)
"""Q4_K: f16 d/dmin, packed 6-bit scales and mins per 32 elements, nibbles."""

BlockQ5_K = _block(
    [
        ("d", _F16),
        ("dmin", _F16),
        ("scales", "u1", (k_scale_size,)),
        ("qh", "u1", (_QK // 8,)),
        ("qs", "u1", (_QK // 2,)),
    ],
    176,
)
"""Q5_K: Q4_K plus one high bit per element."""

BlockQ6_K = _block(
    [
        ("ql", "u1", (_QK // 2,)),
        ("qh", "u1", (_QK // 4,)),
        ("scales", "i1", (_QK // 16,)),
        ("d", _F16),
    ],
    210,
)
"""Q6_K: low nibbles, 2 high bits per element, signed 8-bit scales per 16, f16 d."""

BlockQ8_K = _block([("d", "<f4"), ("qs", "i1", (_QK,)), ("bsums", "<i2", (_QK // 16,))], 292)
"""Q8_K: f32 scale, 256 signed bytes, per-16 partial sums (activation-side format)."""

# --- IQ (codebook) formats ------------------------------------------------------

BlockIQ1_S = _block([("d", _F16), ("qs", "u1", (_QK // 8,)), ("qh", "<u2", (_QK // 32,))], 50)
"""IQ1_S: f16 d, low 8 bits of 11-bit grid indices, per-32 high bits/scale/delta sign."""

BlockIQ1_M = _block(
    [("qs", "u1", (_QK // 8,)), ("qh", "u1", (_QK // 16,)), ("scales", "u1", (_QK // 32,))],
    56,
)
"""IQ1_M: grid indices, high bits and delta signs, 3-bit scales (f16 d in their top nibbles)."""

BlockIQ2_XXS = _block([("d", _F16), ("qs", "<u2", (_QK // 8,))], 66)
"""IQ2_XXS: f16 d, per 32 elements two u32 words (4 grid bytes; 4x7 sign bits + 4-bit scale)."""

BlockIQ2_XS = _block([("d", _F16), ("qs", "<u2", (_QK // 8,)), ("scales", "u1", (_QK // 32,))], 74)
"""IQ2_XS: f16 d, u16 (9-bit grid index + 7-bit sign index) per 8 elements, 4-bit scales."""

BlockIQ2_S = _block(
    [
        ("d", _F16),
        ("qs", "u1", (_QK // 4,)),  # 32 grid-index low bytes, then 32 sign bytes
        ("qh", "u1", (_QK // 32,)),
        ("scales", "u1", (_QK // 32,)),
    ],
    82,
)
"""IQ2_S: f16 d, grid-index bytes and explicit sign bytes, 2 high index bits, 4-bit scales."""

BlockIQ3_XXS = _block([("d", _F16), ("qs", "u1", (3 * _QK // 8,))], 98)
"""IQ3_XXS: f16 d, 64 grid-index bytes then 8 u32 scale/sign words."""

BlockIQ3_S = _block(
    [
        ("d", _F16),
        ("qs", "u1", (_QK // 4,)),
        ("qh", "u1", (_QK // 32,)),
        ("signs", "u1", (_QK // 8,)),
        ("scales", "u1", (iq3s_n_scale,)),
    ],
    110,
)
"""IQ3_S: f16 d, 9-bit grid indices (8 + 1 high bit), sign bits, 4-bit odd scales."""

BlockIQ4_NL = _block([("d", _F16), ("qs", "u1", (iq4_nl_block_size // 2,))], 18)
"""IQ4_NL: f16 d, nibbles indexing the 16-entry nonlinear codebook."""

BlockIQ4_XS = _block(
    [
        ("d", _F16),
        ("scales_h", "<u2"),
        ("scales_l", "u1", (_QK // 64,)),
        ("qs", "u1", (_QK // 2,)),
    ],
    136,
)
"""IQ4_XS: f16 d, 6-bit per-32 scales (split high/low), codebook nibbles."""

# --- ternary and FP4 formats ----------------------------------------------------

BlockTQ1_0 = _block(
    [("qs", "u1", ((_QK - 4 * _QK // 64) // 5,)), ("qh", "u1", (_QK // 64,)), ("d", _F16)],
    54,
)
"""TQ1_0: base-3 packed trits (5 per byte in qs, 4 per byte in qh), f16 d."""

BlockTQ2_0 = _block([("qs", "u1", (_QK // 4,)), ("d", _F16)], 66)
"""TQ2_0: 2-bit trit codes (``q - 1``), f16 d."""

BlockMXFP4 = _block([("e", "u1"), ("qs", "u1", (mxfp4_block_size // 2,))], 17)
"""MXFP4: shared E8M0 exponent byte, E2M1 nibbles."""

BlockNVFP4 = _block(
    [
        ("d", "u1", (nvfp4_block_size // nvfp4_subblock_size,)),
        ("qs", "u1", (nvfp4_block_size // 2,)),
    ],
    36,
)
"""NVFP4: one UE4M3 scale byte per 16-element sub-block, E2M1 nibbles."""

BLOCK_DTYPES: dict[str, np.dtype] = {
    "q1_0": BlockQ1_0,
    "q2_0": BlockQ2_0,
    "q4_0": BlockQ4_0,
    "q4_1": BlockQ4_1,
    "q5_0": BlockQ5_0,
    "q5_1": BlockQ5_1,
    "q8_0": BlockQ8_0,
    "q8_1": BlockQ8_1,
    "q2_k": BlockQ2_K,
    "q3_k": BlockQ3_K,
    "q4_k": BlockQ4_K,
    "q5_k": BlockQ5_K,
    "q6_k": BlockQ6_K,
    "q8_k": BlockQ8_K,
    "iq1_s": BlockIQ1_S,
    "iq1_m": BlockIQ1_M,
    "iq2_xxs": BlockIQ2_XXS,
    "iq2_xs": BlockIQ2_XS,
    "iq2_s": BlockIQ2_S,
    "iq3_xxs": BlockIQ3_XXS,
    "iq3_s": BlockIQ3_S,
    "iq4_nl": BlockIQ4_NL,
    "iq4_xs": BlockIQ4_XS,
    "tq1_0": BlockTQ1_0,
    "tq2_0": BlockTQ2_0,
    "mxfp4": BlockMXFP4,
    "nvfp4": BlockNVFP4,
}
"""Block dtype of every block-quantized format, keyed by lowercase dtype name."""

BLOCK_SIZES: dict[str, int] = {
    "q1_0": q1_0_block_size,
    "q2_0": q2_0_block_size,
    "q4_0": q4_0_block_size,
    "q4_1": q4_1_block_size,
    "q5_0": q5_0_block_size,
    "q5_1": q5_1_block_size,
    "q8_0": q8_0_block_size,
    "q8_1": q8_1_block_size,
    "q2_k": qk_k_block_size,
    "q3_k": qk_k_block_size,
    "q4_k": qk_k_block_size,
    "q5_k": qk_k_block_size,
    "q6_k": qk_k_block_size,
    "q8_k": qk_k_block_size,
    "iq1_s": qk_k_block_size,
    "iq1_m": qk_k_block_size,
    "iq2_xxs": qk_k_block_size,
    "iq2_xs": qk_k_block_size,
    "iq2_s": qk_k_block_size,
    "iq3_xxs": qk_k_block_size,
    "iq3_s": qk_k_block_size,
    "iq4_nl": iq4_nl_block_size,
    "iq4_xs": qk_k_block_size,
    "tq1_0": qk_k_block_size,
    "tq2_0": qk_k_block_size,
    "mxfp4": mxfp4_block_size,
    "nvfp4": nvfp4_block_size,
}
"""Logical elements per block, keyed by lowercase dtype name."""


def _block_name(dtype: object) -> str:
    """``dtype`` if it names a block-quantized dtype, else ValueError (the type first:
    an array is no key)."""
    if not isinstance(dtype, str) or dtype not in BLOCK_SIZES:
        raise ValueError(f"{dtype!r} is not a block-quantized dtype name")
    return dtype


def block_size(dtype: str) -> int:
    """Logical elements per block of a block-quantized dtype name."""
    return BLOCK_SIZES[_block_name(dtype)]


def block_byte_size(dtype: str) -> int:
    """Bytes per block of a block-quantized dtype name."""
    return BLOCK_DTYPES[_block_name(dtype)].itemsize
