"""Block layouts, scalar casts and block dequantization.

Oracles: numpy itself, brute-force searches over decode tables, torch's
bfloat16/float8 casts (when torch is installed) and the ``gguf`` package's
``quants.dequantize``/``quantize`` (when installed).
"""

import warnings

import numpy as np
import pytest

from fucina import blocks
from fucina.kernels import cast, quant
from fucina.kernels.cast import (
    STORAGE_NP,
    bf16_to_f32,
    cast_array,
    f8e4m3_to_f32,
    f8e5m2_to_f32,
    f32_to_bf16,
    f32_to_f8e4m3,
    f32_to_f8e5m2,
)
from fucina.kernels.quant import DEQUANTIZE_FORMATS, dequantize, quantize_q8_0

# (elements per block, bytes per block), the storage geometry table of the reference.
GEOMETRY = {
    "q1_0": (128, 18),
    "q2_0": (128, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q8_0": (32, 34),
    "q8_1": (32, 36),
    "q2_k": (256, 84),
    "q3_k": (256, 110),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
    "q8_k": (256, 292),
    "iq1_s": (256, 50),
    "iq1_m": (256, 56),
    "iq2_xxs": (256, 66),
    "iq2_xs": (256, 74),
    "iq2_s": (256, 82),
    "iq3_xxs": (256, 98),
    "iq3_s": (256, 110),
    "iq4_nl": (32, 18),
    "iq4_xs": (256, 136),
    "tq1_0": (256, 54),
    "tq2_0": (256, 66),
    "mxfp4": (32, 17),
    "nvfp4": (64, 36),
}

HALF_FIELDS = {"d", "dmin", "m", "s"}


def _struct_name(fmt: str) -> str:
    return "Block" + fmt.upper()


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def bits_f32(u) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(np.float32)


# --- block layouts -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(GEOMETRY))
def test_block_geometry(fmt):
    elems, nbytes = GEOMETRY[fmt]
    dt = blocks.BLOCK_DTYPES[fmt]
    assert dt.itemsize == nbytes
    assert blocks.BLOCK_SIZES[fmt] == elems
    assert getattr(blocks, _struct_name(fmt)) is dt
    assert blocks.block_size(fmt) == elems
    assert blocks.block_byte_size(fmt) == nbytes
    assert not dt.isalignedstruct


def test_block_registry_is_complete():
    assert set(blocks.BLOCK_DTYPES) == set(GEOMETRY) == set(blocks.BLOCK_SIZES)
    with pytest.raises(ValueError):
        blocks.block_size("f32")


def test_block_fields_follow_ggml():
    q8 = blocks.BlockQ8_0
    assert q8.names == ("d", "qs")
    assert q8["d"] == np.dtype("<u2") and q8["qs"].shape == (32,)
    assert q8["qs"].base == np.dtype("i1")
    assert blocks.BlockQ4_K.names == ("d", "dmin", "scales", "qs")
    assert blocks.BlockQ4_K.fields["qs"][1] == 16
    assert blocks.BlockQ6_K.names == ("ql", "qh", "scales", "d")
    assert blocks.BlockQ6_K.fields["d"][1] == 208
    assert blocks.BlockQ8_K["d"] == np.dtype("<f4")
    assert blocks.BlockNVFP4.names == ("d", "qs") and blocks.BlockNVFP4["d"].shape == (4,)
    assert blocks.BlockMXFP4.names == ("e", "qs")
    assert blocks.BlockIQ4_XS.names == ("d", "scales_h", "scales_l", "qs")
    assert blocks.BlockTQ1_0.names == ("qs", "qh", "d")


def test_block_constants():
    assert blocks.q1_0_block_size == blocks.q2_0_block_size == 128
    assert blocks.q4_0_block_size == blocks.q4_1_block_size == 32
    assert blocks.q5_0_block_size == blocks.q5_1_block_size == 32
    assert blocks.q8_0_block_size == blocks.q8_1_block_size == 32
    assert blocks.qk_k_block_size == 256
    assert blocks.k_scale_size == 12
    assert blocks.iq4_nl_block_size == blocks.mxfp4_block_size == 32
    assert blocks.nvfp4_block_size == 64
    assert blocks.nvfp4_subblock_size == 16
    assert blocks.iq3s_n_scale == 4


def test_block_sizes_match_gguf():
    gguf = pytest.importorskip("gguf")
    for fmt, (elems, nbytes) in GEOMETRY.items():
        qtype = getattr(gguf.GGMLQuantizationType, fmt.upper(), None)
        if qtype is None or fmt == "q8_1":  # gguf-py lists Q8_1 with f32 d/s (40 B)
            continue
        assert gguf.GGML_QUANT_SIZES[qtype] == (elems, nbytes), fmt


# --- bf16 ------------------------------------------------------------------------------


def test_bf16_decode_is_the_top_half():
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = bf16_to_f32(codes)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), codes.astype(np.uint32) << 16)


def test_bf16_round_to_nearest_even():
    cases = {
        1.0: 0x3F80,
        1.0 + 2.0**-8: 0x3F80,  # tie, even stays
        1.0 + 3 * 2.0**-8: 0x3F82,  # tie, odd rounds up
        1.0 + 2.0**-8 + 2.0**-20: 0x3F81,  # just past the tie
        -(1.0 + 2.0**-8): 0xBF80,
        -0.0: 0x8000,
        np.inf: 0x7F80,
        -np.inf: 0xFF80,
        3.4028234663852886e38: 0x7F80,  # f32 max rounds up to inf
    }
    got = f32_to_bf16(np.array(list(cases), dtype=np.float32))
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, np.array(list(cases.values()), dtype=np.uint16))


def test_bf16_nan_is_quieted_never_inf():
    nans = np.array([0x7F800001, 0xFF800001, 0x7F810000, 0x7FC00000, 0x7FFFFFFF], np.uint32)
    got = f32_to_bf16(bits_f32(nans))
    np.testing.assert_array_equal(got, np.array([0x7FC0, 0xFFC0, 0x7FC1, 0x7FC0, 0x7FFF]))
    assert np.isnan(bf16_to_f32(got)).all()


def test_bf16_random_against_nearest_search():
    rng = np.random.default_rng(1)
    u = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    u = u[(u & 0x7F800000) != 0x7F800000]  # finite only
    got = f32_to_bf16(bits_f32(u)).astype(np.uint32)
    x = bits_f32(u).astype(np.float64)
    lo = u >> 16
    hi = lo + 1
    vlo = bits_f32(lo << 16).astype(np.float64)
    with np.errstate(over="ignore"):
        vhi = bits_f32(hi << 16).astype(np.float64)
    # Past the largest finite bf16 the next rung is 2**128 (IEEE rounds to inf there).
    vhi = np.where(np.isinf(vhi), np.copysign(2.0**128, x), vhi)
    dlo, dhi = np.abs(x - vlo), np.abs(vhi - x)
    want = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    np.testing.assert_array_equal(got, want)


def test_bf16_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    u = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    u = u[(u & 0x7FFFFFFF) <= 0x7F800000]  # torch canonicalizes NaNs differently
    x = bits_f32(u)
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy()
    np.testing.assert_array_equal(f32_to_bf16(x), want.view(np.uint16))
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    codes = codes[(codes & 0x7FFF) <= 0x7F80]
    back = torch.from_numpy(codes.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(bf16_to_f32(codes), back)


# --- OCP FP8 -----------------------------------------------------------------------------


def _f8_reference_encode(
    x: np.ndarray, table: np.ndarray, overflow_code: int, overflow_value: float
) -> np.ndarray:
    """Brute force: nearest finite code, ties to the even code, virtual overflow rung."""
    finite = np.arange(overflow_code)  # non-negative finite codes, increasing in value
    vals = np.append(table[finite].astype(np.float64), overflow_value)
    a = np.abs(x.astype(np.float64))
    dist = np.abs(a[:, None] - vals[None, :])
    best = dist.min(axis=1, keepdims=True)
    cand = dist == best
    # among equally near codes prefer the even one (at most two candidates)
    even = cand & (np.arange(vals.size) % 2 == 0)
    code = np.where(even.any(axis=1), even.argmax(axis=1), cand.argmax(axis=1))
    code = np.where(a > overflow_value, overflow_code, code).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def test_f8_e4m3_decode_table():
    codes = np.arange(256, dtype=np.uint8)
    v = f8e4m3_to_f32(codes)
    assert v.dtype == np.float32
    assert v[0x38] == 1.0 and v[0x7E] == 448.0 and v[0x01] == 2.0**-9
    assert v[0x80] == 0.0 and np.signbit(v[0x80])
    nan = np.isnan(v)
    assert set(np.flatnonzero(nan)) == {0x7F, 0xFF}
    assert not np.signbit(v[0x7F]) and np.signbit(v[0xFF])
    assert np.isfinite(v[~nan]).all()


def test_f8_e5m2_decode_table():
    codes = np.arange(256, dtype=np.uint8)
    v = f8e5m2_to_f32(codes)
    assert v[0x3C] == 1.0 and v[0x7B] == 57344.0 and v[0x01] == 2.0**-16
    assert v[0x7C] == np.inf and v[0xFC] == -np.inf
    assert set(np.flatnonzero(np.isnan(v))) == {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}


@pytest.mark.parametrize(
    ("decode", "encode", "nan_codes"),
    [
        (f8e4m3_to_f32, f32_to_f8e4m3, {0x7F, 0xFF}),
        (f8e5m2_to_f32, f32_to_f8e5m2, {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}),
    ],
)
def test_f8_round_trip_all_codes(decode, encode, nan_codes):
    codes = np.arange(256, dtype=np.uint8)
    back = encode(decode(codes))
    keep = np.array([c not in nan_codes for c in range(256)])
    np.testing.assert_array_equal(back[keep], codes[keep])
    # NaN codes come back as the canonical NaN with their sign
    np.testing.assert_array_equal(back[~keep] & 0x7F, 0x7F)
    np.testing.assert_array_equal(back[~keep] >> 7, codes[~keep] >> 7)


def test_f8_every_f16_value_matches_brute_force():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[~np.isnan(h)]
    x = h.astype(np.float32)
    e4 = _f8_reference_encode(x, f8e4m3_to_f32(np.arange(256)), 0x7F, 480.0)
    np.testing.assert_array_equal(f32_to_f8e4m3(x), e4)
    e5 = _f8_reference_encode(x, f8e5m2_to_f32(np.arange(256)), 0x7C, 65536.0)
    np.testing.assert_array_equal(f32_to_f8e5m2(x), e5)


def test_f8_overflow_and_nan_rules():
    x = np.array(
        [
            448,
            464,
            np.nextafter(np.float32(464), np.float32(1e9)),
            480,
            1e30,
            np.inf,
            -np.inf,
            np.nan,
            -np.nan,
            -0.0,
            -1e-30,
        ],
        dtype=np.float32,
    )
    # E4M3FN: no infinities, overflow saturates to the NaN code (sign kept)
    np.testing.assert_array_equal(
        f32_to_f8e4m3(x), [0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0x7F, 0xFF, 0x7F, 0xFF, 0x80, 0x80]
    )
    y = np.array(
        [57344, 61439.996, 61440, 65536, 1e30, np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32
    )
    np.testing.assert_array_equal(
        f32_to_f8e5m2(y), [0x7B, 0x7B, 0x7C, 0x7C, 0x7C, 0x7C, 0xFC, 0x7F, 0xFF]
    )


def test_f8_against_torch():
    torch = pytest.importorskip("torch")
    codes = np.arange(256, dtype=np.uint8)
    for fmt, decode, encode in [
        (torch.float8_e4m3fn, f8e4m3_to_f32, f32_to_f8e4m3),
        (torch.float8_e5m2, f8e5m2_to_f32, f32_to_f8e5m2),
    ]:
        want = torch.from_numpy(codes.copy()).view(fmt).float().numpy()
        got = decode(codes)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
        rng = np.random.default_rng(3)
        x = rng.standard_normal(200_000) * np.exp2(rng.integers(-24, 17, 200_000))
        x = x.astype(np.float32)
        if fmt == torch.float8_e4m3fn:
            # torch 2.13 saturates E4M3FN overflow to +-448; the reference pins
            # the NaN code instead (test_f8_overflow_and_nan_rules), so compare
            # only where no overflow happens.
            x = x[np.abs(x) <= 464]
        want = torch.from_numpy(x.copy()).to(fmt).view(torch.uint8).numpy()
        np.testing.assert_array_equal(encode(x), want)


# --- cast_array ----------------------------------------------------------------------------

ALL = sorted(STORAGE_NP)
INTS = ["u8", "u16", "i8", "i16", "i32", "i64"]


def _special_values(dtype: str) -> np.ndarray:
    """Storage values of ``dtype`` covering zeros, extremes, inf and NaN."""
    if dtype == "bool":
        return np.array([False, True])
    if dtype in INTS:
        info = np.iinfo(STORAGE_NP[dtype])
        return np.array([0, 1, info.max, info.min, info.max // 3, 7], dtype=STORAGE_NP[dtype])
    f = np.array(
        [
            0.0,
            -0.0,
            1.5,
            -2.5,
            1e30,
            -1e30,
            1e-30,
            np.inf,
            -np.inf,
            np.nan,
            65519.0,
            3e9,
            -3e9,
            1e20,
        ],
        dtype=np.float64,
    )
    with np.errstate(all="ignore"):
        return cast_array(f, "f64", dtype)


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_cast_shapes_and_no_warnings(src, dst):
    a = _special_values(src)
    if a.size % 2 == 0:
        a = a.reshape(2, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = cast_array(a, src, dst)
        zero_d = cast_array(a.reshape(-1)[:1].reshape(()), src, dst)
    assert out.dtype == STORAGE_NP[dst] and out.shape == a.shape
    assert out.flags.c_contiguous and not np.shares_memory(out, a)
    assert zero_d.shape == () and zero_d.dtype == STORAGE_NP[dst]


def test_cast_rejects_wrong_storage():
    with pytest.raises(ValueError):
        cast_array(np.zeros(3, np.float32), "f64", "f32")
    with pytest.raises(ValueError):
        cast_array(np.zeros(3, np.float32), "f32", "f128")


def test_cast_integer_wraps():
    np.testing.assert_array_equal(
        cast_array(np.array([300, -1, 255], np.int32), "i32", "u8"), [44, 255, 255]
    )
    np.testing.assert_array_equal(cast_array(np.array([-1], np.int8), "i8", "u16"), [65535])
    np.testing.assert_array_equal(
        cast_array(np.array([2**31, 2**32 + 5], np.int64), "i64", "i32"), [-(2**31), 5]
    )
    np.testing.assert_array_equal(cast_array(np.array([200], np.uint8), "u8", "i8"), [-56])
    np.testing.assert_array_equal(
        cast_array(np.array([40000], np.uint16), "u16", "i16"), [40000 - 65536]
    )


def test_cast_float_to_int_truncates_saturates_nan_zero():
    x = np.array(
        [np.nan, np.inf, -np.inf, 1e30, -1e30, 2.9, -2.9, -0.5, 127.9, 128, -129], dtype=np.float32
    )
    np.testing.assert_array_equal(
        cast_array(x, "f32", "i8"), [0, 127, -128, 127, -128, 2, -2, 0, 127, 127, -128]
    )
    np.testing.assert_array_equal(
        cast_array(x, "f32", "u8"), [0, 255, 0, 255, 0, 2, 0, 0, 127, 128, 0]
    )
    big = np.array([2.0**63, -(2.0**63), 2.0**63 - 1024, np.nan, -np.inf])
    np.testing.assert_array_equal(
        cast_array(big, "f64", "i64"), [2**63 - 1, -(2**63), 2**63 - 1024, 0, -(2**63)]
    )
    np.testing.assert_array_equal(cast_array(np.array([4e9, -1.0]), "f64", "i32"), [2**31 - 1, -1])
    # bf16 / f8 / f16 sources go through their value bridges
    np.testing.assert_array_equal(
        cast_array(np.array([0x4040, 0xC0A0, 0x7FC0], np.uint16), "bf16", "i16"), [3, -5, 0]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([0x7E, 0xFE, 0x7F], np.uint8), "f8_e4m3", "i16"), [448, -448, 0]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([0x7C, 0x3C], np.uint8), "f8_e5m2", "u8"), [255, 1]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([65504, -7.75], np.float16), "f16", "i8"), [127, -7]
    )


def test_cast_to_bool():
    f = np.array([0.0, -0.0, np.nan, np.inf, 1e-38, -3.0], dtype=np.float32)
    want = [False, False, True, True, True, True]
    np.testing.assert_array_equal(cast_array(f, "f32", "bool"), want)
    np.testing.assert_array_equal(cast_array(f.astype(np.float64), "f64", "bool"), want)
    np.testing.assert_array_equal(cast_array(f32_to_bf16(f), "bf16", "bool"), want)
    np.testing.assert_array_equal(
        cast_array(np.array([0, 0x80, 0x7F, 0x01], np.uint8), "f8_e4m3", "bool"),
        [False, False, True, True],
    )
    np.testing.assert_array_equal(
        cast_array(np.array([0x80, 0x7C, 0x7E], np.uint8), "f8_e5m2", "bool"), [False, True, True]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([0, -1, 256], np.int64), "i64", "bool"), [False, True, True]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([0.0, -0.0, 2.0], np.float16), "f16", "bool"), [False, False, True]
    )


def test_cast_from_bool():
    b = np.array([False, True])
    ones = {
        "u8": 1,
        "u16": 1,
        "i8": 1,
        "i16": 1,
        "i32": 1,
        "i64": 1,
        "f16": 1.0,
        "f32": 1.0,
        "f64": 1.0,
        "bf16": 0x3F80,
        "f8_e4m3": 0x38,
        "f8_e5m2": 0x3C,
        "bool": True,
    }
    for dst, one in ones.items():
        out = cast_array(b, "bool", dst)
        np.testing.assert_array_equal(out, np.array([0, one], dtype=STORAGE_NP[dst]))


def test_cast_int_to_float_rounds_to_nearest():
    i = np.array([2**53 + 1, 2**24 + 1, -(2**63)], dtype=np.int64)
    np.testing.assert_array_equal(cast_array(i, "i64", "f64"), [2.0**53, 2.0**24 + 1, -(2.0**63)])
    np.testing.assert_array_equal(cast_array(i, "i64", "f32"), [2.0**53, 2.0**24, -(2.0**63)])
    np.testing.assert_array_equal(
        cast_array(np.array([65535, 2049], np.uint16), "u16", "f16"), [np.inf, 2048]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([-3, 1000], np.int16), "i16", "bf16"), [0xC040, 0x447A]
    )
    np.testing.assert_array_equal(
        cast_array(np.array([3, 500], np.int32), "i32", "f8_e4m3"), [0x44, 0x7F]
    )


def test_cast_float_routing():
    # f64 -> f16 goes through f32: the f32 rounding lands on an f16 tie, which
    # then rounds to even (a direct f64 -> f16 rounding would give 1 + 2**-10).
    x = np.array([1.0 + 2.0**-11 + 2.0**-40])
    assert cast_array(x, "f64", "f16")[0] == np.float16(1.0)
    # f16 -> bf16 through f32
    h = np.array([1.0 + 2.0**-8 + 2.0**-10, 65504.0, -np.inf], dtype=np.float16)
    np.testing.assert_array_equal(cast_array(h, "f16", "bf16"), [0x3F81, 0x4780, 0xFF80])
    # f64 -> f32 / bf16 overflow to inf, NaN stays NaN
    big = np.array([1e300, -1e300, np.nan])
    out = cast_array(big, "f64", "f32")
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])
    np.testing.assert_array_equal(cast_array(big[:2], "f64", "bf16"), [0x7F80, 0xFF80])
    # f8 -> f64 and back are exact on every finite code
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[np.isfinite(f8e5m2_to_f32(codes))]
    np.testing.assert_array_equal(
        cast_array(cast_array(codes, "f8_e5m2", "f64"), "f64", "f8_e5m2"), codes
    )
    # f8 -> f8 bridges through f32
    np.testing.assert_array_equal(
        cast_array(np.array([0x7B, 0x3C], np.uint8), "f8_e5m2", "f8_e4m3"), [0x7F, 0x38]
    )


def test_cast_against_torch():
    torch = pytest.importorskip("torch")
    tdt = {
        "bool": torch.bool,
        "u8": torch.uint8,
        "i8": torch.int8,
        "i16": torch.int16,
        "i32": torch.int32,
        "i64": torch.int64,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "f32": torch.float32,
        "f64": torch.float64,
    }
    rng = np.random.default_rng(4)
    # In-range values only: torch's float -> int on overflow or NaN is undefined.
    base = np.concatenate(
        [
            rng.integers(-100, 100, 64).astype(np.float64),
            np.clip(rng.standard_normal(64) * 40, -100, 100),
            [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, 99.9, -99.9],
        ]
    )

    def to_torch(a, name):
        if name == "bf16":
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())

    def from_torch(t, name):
        if name == "bf16":
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()

    for src in tdt:
        vals = np.abs(base) if src in ("u8", "bool") else base
        a = cast_array(vals, "f64", src)
        for dst in tdt:
            if dst == "u8" and src in ("f16", "bf16", "f32", "f64"):
                continue  # torch wraps negative floats into u8; the reference saturates
            got = cast_array(a, src, dst)
            want = from_torch(to_torch(a, src).to(tdt[dst]), dst)
            np.testing.assert_array_equal(got, want, err_msg=f"{src}->{dst}")


# --- dequantize ------------------------------------------------------------------------------


def _random_blocks(fmt: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random block bytes whose half / f32 scales are finite (ggml assumes so)."""
    dt = blocks.BLOCK_DTYPES[fmt]
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    b = (
        np.frombuffer(rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).tobytes(), dtype=dt)
        .reshape(shape)
        .copy()
    )

    def finite_halves(size_shape):
        v = rng.standard_normal(size_shape) * np.exp2(rng.integers(-26, 12, size_shape))
        return v.astype(np.float16).view(np.uint16)  # includes subnormals and zeros

    for name in dt.names:
        if name in HALF_FIELDS and dt[name] == np.dtype("<u2"):
            b[name] = finite_halves(shape)
    if fmt == "q8_k":
        b["d"] = (rng.standard_normal(shape) * 1e-3).astype(np.float32)
    if fmt == "iq1_m":  # the f16 scale lives in the top nibble of each scale word
        words = np.ascontiguousarray(b["scales"]).view("<u2")
        d = finite_halves(shape)[..., None]
        nib = (d >> np.array([0, 4, 8, 12], dtype=np.uint16)) & np.uint16(0xF)
        b["scales"] = ((words & np.uint16(0x0FFF)) | (nib << np.uint16(12))).view(np.uint8)
    return b


def _gguf_formats():
    try:
        import gguf
        import gguf.quants
    except ImportError:
        return []
    out = []
    for fmt in sorted(GEOMETRY):
        qtype = getattr(gguf.GGMLQuantizationType, fmt.upper(), None)
        if qtype is not None and qtype in gguf.quants._type_traits:
            out.append(fmt)
    return out


GGUF_FORMATS = _gguf_formats()


@pytest.mark.parametrize("fmt", GGUF_FORMATS or ["q8_0"])
def test_dequantize_matches_gguf(fmt):
    gguf = pytest.importorskip("gguf")
    quants = pytest.importorskip("gguf.quants")

    assert fmt in DEQUANTIZE_FORMATS
    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    b = _random_blocks(fmt, (2, 3, 5), seed=sum(fmt.encode()))
    raw = b.view(np.uint8).reshape(6, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gguf may warn on huge MXFP4 scales
        want = quants.dequantize(raw, qtype).reshape(2, 3, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = dequantize(b, fmt)
    assert got.dtype == np.float32 and got.shape == (2, 3, 5 * blocks.BLOCK_SIZES[fmt])
    # bit-identical, signed zeros and infinities included
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # raw bytes are accepted too, and a non-contiguous block view decodes the same
    np.testing.assert_array_equal(dequantize(b.view(np.uint8), fmt), got)
    np.testing.assert_array_equal(
        dequantize(b[:, ::2], fmt), got.reshape(2, 3, 5, -1)[:, ::2].reshape(2, 2, -1)
    )


def test_every_gguf_format_is_supported():
    pytest.importorskip("gguf")
    assert set(GGUF_FORMATS) <= DEQUANTIZE_FORMATS
    assert len(GGUF_FORMATS) >= 23


def _half_bits(v):
    return np.float16(v).view(np.uint16)


def test_dequantize_q1_0_q2_0_by_hand():
    b = np.zeros(1, blocks.BlockQ1_0)
    b["d"] = _half_bits(0.5)
    b["qs"][0, 0] = 0b0000_0101  # elements 0 and 2 positive
    b["qs"][0, 15] = 0x80  # element 127 positive
    want = np.full(128, -0.5, np.float32)
    want[[0, 2, 127]] = 0.5
    np.testing.assert_array_equal(dequantize(b, "q1_0"), want)

    b = np.zeros(1, blocks.BlockQ2_0)
    b["d"] = _half_bits(2.0)
    b["qs"][0, 0] = 0b11_10_01_00  # codes 0,1,2,3 -> -1, 0, 1, 2
    b["qs"][0, 1:] = 0b01_01_01_01
    want = np.zeros(128, np.float32)
    want[:4] = [-2.0, 0.0, 2.0, 4.0]
    np.testing.assert_array_equal(dequantize(b, "q2_0"), want)


def test_dequantize_q8_1_q8_k_by_hand():
    rng = np.random.default_rng(5)
    b = np.zeros(2, blocks.BlockQ8_1)
    b["d"] = _half_bits(0.25)
    b["s"] = _half_bits(123.0)  # ignored by decoding
    b["qs"] = rng.integers(-128, 128, (2, 32))
    want = (b["qs"].astype(np.float32) * np.float32(0.25)).reshape(-1)
    np.testing.assert_array_equal(dequantize(b, "q8_1"), want)
    k = np.zeros(1, blocks.BlockQ8_K)
    k["d"] = np.float32(0.1)
    k["qs"] = rng.integers(-128, 128, (1, 256))
    want = (np.float32(0.1) * k["qs"].astype(np.float32)).reshape(-1)
    np.testing.assert_array_equal(dequantize(k, "q8_k"), want)


def test_dequantize_errors():
    with pytest.raises(ValueError, match="no decoder for f32"):
        dequantize(np.zeros(3, np.uint8), "f32")
    with pytest.raises(ValueError):
        dequantize(np.zeros((2, 33), np.uint8), "q8_0")  # not whole blocks
    with pytest.raises(ValueError):
        dequantize(np.zeros(2, blocks.BlockQ4_0), "q4_1")


def test_quantize_q8_0_matches_gguf():
    gguf = pytest.importorskip("gguf")
    quants = pytest.importorskip("gguf.quants")

    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4, 96)) * np.exp2(rng.integers(-10, 10, (3, 4, 1)))
    x = x.astype(np.float32)
    x[0, 0, :32] = 0.0  # an all-zero block
    x[0, 1, :32] = np.linspace(-127, 127, 32)  # exact halves -> round away from zero
    x[0, 1, 5] = 0.5
    got = quantize_q8_0(x)
    assert got.dtype == blocks.BlockQ8_0 and got.shape == (3, 4, 3)
    want = quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(got.view(np.uint8).reshape(want.shape), want)
    np.testing.assert_array_equal(
        dequantize(got, "q8_0"), quants.dequantize(want, gguf.GGMLQuantizationType.Q8_0)
    )


def test_quantize_q8_0_rejects_bad_input():
    with pytest.raises(ValueError):
        quantize_q8_0(np.zeros(31, np.float32))
    with pytest.raises(ValueError):
        quantize_q8_0(np.array([np.nan] * 32, np.float32))


def test_modules_export_what_they_document():
    for mod in (blocks, cast, quant):
        for name in mod.__all__:
            assert hasattr(mod, name), (mod.__name__, name)
