"""Encoders: byte parity with gguf-py and with ggml's C reference quantizer.

gguf-py encodes q4_0/q4_1/q5_0/q5_1/q8_0/tq1_0/tq2_0/mxfp4/bf16; for those the
bytes must be identical. The K-quants, q8_k and q8_1 are checked against
digests of ggml's own ``quantize_row_*_ref`` output (ggml-quants.c built with
``gcc -O2``, no FMA contraction) over nine fixed input vectors, and against
the properties the reference algorithm guarantees (round-trip error bounds,
code ranges, q8_k's partial sums), decoding with gguf-py's dequantizer.
"""

from __future__ import annotations

import hashlib

import gguf
import numpy as np
import pytest

import fucina
import fucina.gguf as G
from fucina.errors import EncoderUnavailable, InvalidShape, NonFiniteValue


def _lcg(n: int, seed: int) -> np.ndarray:
    """Deterministic uniforms in [0, 1) from a 64-bit LCG (no RNG-version drift)."""
    out = np.empty(n, np.uint64)
    s = np.uint64(seed)
    a, c = np.uint64(6364136223846793005), np.uint64(1442695040888963407)
    with np.errstate(over="ignore"):
        for i in range(n):
            s = s * a + c
            out[i] = s
    return (out >> np.uint64(40)).astype(np.float64) / 2.0**24


def _vectors(n: int = 256 * 16) -> dict[str, np.ndarray]:
    u, v, i = _lcg(n, 1), _lcg(n, 2), np.arange(n)
    return {
        "ramp": np.linspace(-3, 5, n).astype(np.float32),
        "alternating": np.where(i % 2 == 0, 0.75, -0.75).astype(np.float32),
        "near_zero": ((u - 0.5) * 1e-6).astype(np.float32),
        "wide_range": ((u - 0.5) * np.exp(v * 20 - 10)).astype(np.float32),
        "all_equal": np.full(n, 0.3, np.float32),
        "denormals": ((u - 0.5) * 1e-38).astype(np.float32),
        "random": ((u - 0.5) * 4 + (v - 0.5)).astype(np.float32),
        "zeros": np.zeros(n, np.float32),
        "positive": (u + 1).astype(np.float32),
    }


VECTORS = _vectors()

# sha256[:16] of ggml's quantize_row_<fmt>_ref output for each vector.
GGML_DIGESTS = {
    ("q4_k", "ramp"): "c103b505f776a757", ("q4_k", "alternating"): "9dbc3275229f4472",
    ("q4_k", "near_zero"): "4fa984a40f73fab0", ("q4_k", "wide_range"): "f6382f02515e187d",
    ("q4_k", "all_equal"): "e98480bc152db1c8", ("q4_k", "denormals"): "cfc335996cfae29f",
    ("q4_k", "random"): "777d36868f2882f5", ("q4_k", "zeros"): "cfc335996cfae29f",
    ("q4_k", "positive"): "7805cf7410b6d221",
    ("q5_k", "ramp"): "f10e2e04582321f6", ("q5_k", "alternating"): "ad63bcebad250e4a",
    ("q5_k", "near_zero"): "f061ae8be29405d3", ("q5_k", "wide_range"): "612ef7725a27ece2",
    ("q5_k", "all_equal"): "f5790d4bb503fc9b", ("q5_k", "denormals"): "9b44eb0c6245877e",
    ("q5_k", "random"): "81b97402f333ed2e", ("q5_k", "zeros"): "9b44eb0c6245877e",
    ("q5_k", "positive"): "63a798db5c588d63",
    ("q6_k", "ramp"): "82f6c950d4546339", ("q6_k", "alternating"): "5f9adc032f06bce4",
    ("q6_k", "near_zero"): "316a5bf033b0143e", ("q6_k", "wide_range"): "d310fd1500c35bf7",
    ("q6_k", "all_equal"): "daaa58ec7f208356", ("q6_k", "denormals"): "9b00b8930d66b11e",
    ("q6_k", "random"): "22ed4692603fbcf3", ("q6_k", "zeros"): "9b00b8930d66b11e",
    ("q6_k", "positive"): "e1df153faaec7971",
    # q8_k on denormals overflows ggml's 1/max to inf (undefined rounding): not pinned.
    ("q8_k", "ramp"): "19f103ee527d63b9", ("q8_k", "alternating"): "7f59bc634a36eef8",
    ("q8_k", "near_zero"): "033f386ace0feb41", ("q8_k", "wide_range"): "371d001bd0a89495",
    ("q8_k", "all_equal"): "9e70e052dc7e4eb7", ("q8_k", "random"): "d8d0de35c4f03a5c",
    ("q8_k", "zeros"): "6f7021b3448ac0c8", ("q8_k", "positive"): "e528f117b8bda5e4",
    ("q8_1", "ramp"): "dda786e8631ab7e0", ("q8_1", "alternating"): "cddcf27d15e4eb10",
    ("q8_1", "near_zero"): "fb710e5cf781848f", ("q8_1", "wide_range"): "849816e12b84043c",
    ("q8_1", "all_equal"): "434da4ac6257132f", ("q8_1", "denormals"): "606f558e014930f9",
    ("q8_1", "random"): "f8264f0008d0b1e3", ("q8_1", "zeros"): "606f558e014930f9",
    ("q8_1", "positive"): "eb5917498d1854f4",
}


@pytest.mark.parametrize("key", sorted(GGML_DIGESTS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_matches_ggml_reference_bytes(key: tuple[str, str]) -> None:
    fmt, vec = key
    blocks = G.encode_f32(fmt, VECTORS[vec])
    assert hashlib.sha256(blocks.tobytes()).hexdigest()[:16] == GGML_DIGESTS[key]


GGUF_PY_FORMATS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "tq1_0", "tq2_0", "mxfp4"]


@pytest.mark.parametrize("fmt", GGUF_PY_FORMATS)
@pytest.mark.parametrize("vec", sorted(VECTORS))
def test_byte_identical_to_gguf_py(fmt: str, vec: str) -> None:
    x = VECTORS[vec].reshape(4, -1)
    with np.errstate(all="ignore"):  # gguf-py's own 1/d overflows on denormal blocks
        want = gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, fmt.upper()))
    got = G.encode_f32(fmt, x)
    assert got.shape == (4, x.shape[1] // fucina.BLOCK_SIZES[fmt])
    np.testing.assert_array_equal(got.view(np.uint8).reshape(4, -1), want)


def test_scalar_formats_match_gguf_py() -> None:
    x = np.concatenate([VECTORS["random"], VECTORS["wide_range"] * 1e6,
                        np.array([np.inf, -np.inf, np.nan, 3.0e38], np.float32)])
    with np.errstate(all="ignore"):
        want_bf16 = gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16).view(np.uint16)
        want_f16 = gguf.quants.quantize(x, gguf.GGMLQuantizationType.F16)
    np.testing.assert_array_equal(G.encode_f32("bf16", x), want_bf16)
    np.testing.assert_array_equal(G.encode_f32("f16", x).view(np.uint16), want_f16.view(np.uint16))
    np.testing.assert_array_equal(G.encode_f32("f32", x), x)


KQUANT_RMS_BOUND = {"q4_k": 0.12, "q5_k": 0.06, "q6_k": 0.03}


@pytest.mark.parametrize("fmt", sorted(KQUANT_RMS_BOUND))
def test_kquant_round_trip_through_gguf_py_decoder(fmt: str) -> None:
    x = (np.sin(np.arange(256 * 32) * 0.37) * 2 + (_lcg(256 * 32, 5) - 0.5)).astype(np.float32)
    blocks = G.encode_f32(fmt, x)
    back = gguf.quants.dequantize(blocks.view(np.uint8), getattr(gguf.GGMLQuantizationType,
                                                                 fmt.upper()))
    # our decoder reads the same bytes the same way
    np.testing.assert_array_equal(G.decode_f32(fmt, blocks), back)
    rms = np.sqrt(np.mean((back - x) ** 2)) / np.sqrt(np.mean(x**2))
    assert rms < KQUANT_RMS_BOUND[fmt], rms
    # more bits never hurt: each format beats the coarser one on the same data
    assert np.abs(back - x).max() < 0.5


def test_kquant_scale_fields_obey_the_reference_ranges() -> None:
    x = VECTORS["random"]
    q4 = G.encode_f32("q4_k", x)
    d = q4["d"].view(np.float16).astype(np.float32)
    assert (d >= 0).all() and (q4["dmin"].view(np.float16) >= 0).all()
    q6 = G.encode_f32("q6_k", x)
    # the largest-magnitude sub-block scale is quantized to -128 (ggml's iscale = -128/max)
    assert (np.abs(q6["scales"].astype(int)).max(axis=1) >= 127).all()


def test_q8_k_partial_sums_and_error() -> None:
    x = VECTORS["random"]
    b = G.encode_f32("q8_k", x)
    np.testing.assert_array_equal(
        b["bsums"], b["qs"].astype(np.int32).reshape(-1, 16, 16).sum(axis=2))
    back = G.decode_f32("q8_k", b)
    assert (np.abs(back - x).reshape(-1, 256) <= np.abs(b["d"])[:, None] * 0.5001).all()


def test_q8_1_sum_field() -> None:
    x = VECTORS["random"]
    b = G.encode_f32("q8_1", x)
    d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)  # unrounded, as ggml
    s = b["qs"].astype(np.int32).sum(axis=1).astype(np.float32) * d
    np.testing.assert_array_equal(b["s"], s.astype(np.float16).view(np.uint16))


def test_q2_0_is_ternary_round_to_absmax() -> None:
    x = VECTORS["random"][:1024]
    b = G.encode_f32("q2_0", x)
    codes = (b["qs"][..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    assert set(np.unique(codes)) <= {0, 1, 2}
    d = b["d"].view(np.float16).astype(np.float32)
    np.testing.assert_allclose(d, np.abs(x.reshape(-1, 128)).max(axis=1), rtol=1e-3)
    back = G.decode_f32("q2_0", b)
    assert (np.abs(back - x).reshape(-1, 128) <= d[:, None] * 0.5 + 1e-3).all()


def test_tq2_0_hand_values() -> None:
    # the reference's example: 0.5 everywhere encodes as d = 0.5, trit +1 (code 2)
    b = G.encode_f32("tq2_0", np.full(256, 0.5, np.float32))
    assert b["d"][0] == np.float16(0.5).view(np.uint16)
    assert (b["qs"] == 0b10101010).all()


def test_encoder_errors() -> None:
    with pytest.raises(NonFiniteValue, match="q4_k"):
        G.encode_f32("q4_k", np.full(256, np.nan, np.float32))
    with pytest.raises(InvalidShape, match="multiple of 32"):
        G.encode_f32("q8_0", np.zeros(33, np.float32))
    with pytest.raises(EncoderUnavailable, match="q3_k"):
        G.encode_f32("q3_k", np.zeros(256, np.float32))
    with pytest.raises(EncoderUnavailable, match="iq2_xs"):
        G.encode_f32(fucina.iq2_xs, np.zeros(256, np.float32))


def test_encoded_blocks_build_a_tensor(ctx: fucina.ExecContext) -> None:
    # the reference's Q8_0 example: two rows, dequantize back within 0.01
    src = (np.arange(64) % 7 * 0.25).astype(np.float32)
    W = fucina.Tensor("out", "in", dtype="q8_0")
    w = W.from_blocks(ctx, (2, 32), G.encode_f32("q8_0", src.reshape(2, 32)))
    np.testing.assert_allclose(w.to("f32").numpy().reshape(-1), src, atol=0.01)
