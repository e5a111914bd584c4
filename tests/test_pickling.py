"""Models and compiled functions pickle cheaply: a model as a reference to its files,
a compiled function as its Python function (fucina.models.reopen, Compiled.__reduce__)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
from bert_synth import write_model

import fucina
import fucina.models.bert as bert
from fucina.models.reopen import Reopenable, ReopenSpec, reopen

SENTENCES = ["the cat sat on the mat.", "hello world!", "a big red dog ran far, far, far",
             "dogs sat", "hello, the big red cat sat on a mat. world!"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bert_pickle")
    write_model(d, seed=5)
    return d


def test_a_model_pickles_as_a_reference_and_round_trips_bit_identically(model_dir) -> None:
    m = bert.load(model_dir)
    data = pickle.dumps(m)
    weights = os.path.getsize(model_dir / "model.safetensors")
    assert len(data) < 1000 < weights  # bytes of paths, not the weights
    assert str(model_dir.resolve()).encode() in data
    m2 = pickle.loads(data)
    assert isinstance(m2, bert.BertModel) and m2 is not m
    assert m2.model_dir == model_dir.resolve()
    want = m.encode(SENTENCES, batch_size=2)
    got = m2.encode(SENTENCES, batch_size=2)
    assert got.dtype == np.float32 and got.shape == (len(SENTENCES), 16)
    assert np.array_equal(got, want)
    # cloudpickle (what Dask uses) takes the same path
    assert len(cloudpickle.dumps(m)) < 1000


def test_unpickling_reuses_the_model_this_process_reopened(model_dir) -> None:
    m = bert.load(model_dir)
    a = pickle.loads(pickle.dumps(m))
    b = pickle.loads(pickle.dumps(m))
    assert a is b


def test_a_rewritten_model_file_is_opened_again(tmp_path: Path) -> None:
    write_model(tmp_path, seed=1)
    m = bert.load(tmp_path)
    old = pickle.loads(pickle.dumps(m))
    e_old = old.encode(["the red cat"])
    write_model(tmp_path, seed=2)
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))  # a different stamp for sure
    new = pickle.loads(pickle.dumps(m))
    assert new is not old
    assert np.array_equal(new.encode(["the red cat"]), bert.load(tmp_path).encode(["the red cat"]))
    assert not np.array_equal(new.encode(["the red cat"]), e_old)


def test_a_missing_model_file_names_the_path(tmp_path: Path) -> None:
    d = tmp_path / "m"
    write_model(d, seed=4)
    data = pickle.dumps(bert.load(d))
    os.remove(d / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json.*does not exist on host"):
        pickle.loads(data)
    shutil.rmtree(d)
    with pytest.raises(FileNotFoundError, match=str(d / "config.json")):
        pickle.loads(data)


def test_the_dask_token_follows_the_files(tmp_path: Path) -> None:
    write_model(tmp_path, seed=6)
    m = bert.load(tmp_path)
    t1 = m.__dask_tokenize__()
    assert t1 == bert.load(tmp_path).__dask_tokenize__()
    os.utime(tmp_path / "model.safetensors", ns=(7, 7))
    assert m.__dask_tokenize__() != t1


class _NoSpec(Reopenable):
    pass


class _Pair(Reopenable):
    def __init__(self, path: str, scale: int = 1):
        self.path, self.scale = path, scale

    def reopen_spec(self) -> ReopenSpec:
        return ReopenSpec(args=(self.path,), kwargs=(("scale", self.scale),), files=(self.path,))


def test_the_mixin_protocol(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="_NoSpec mixes in Reopenable and must define"):
        pickle.dumps(_NoSpec())
    p = tmp_path / "w.bin"
    p.write_bytes(b"1234")
    got = pickle.loads(pickle.dumps(_Pair(str(p), scale=3)))
    assert (got.path, got.scale) == (str(p), 3)
    assert reopen(_Pair, ReopenSpec((str(p),), (("scale", 3),), (str(p),))) is got


def double_plus_one(x):
    return x.add(x).add_scalar(1.0)


def test_a_compiled_function_pickles_as_its_function() -> None:
    c = fucina.compile(double_plus_one)
    with fucina.ExecContext() as ctx:
        x = fucina.Tensor("a", "b").from_numpy(ctx, np.arange(6, dtype=np.float32).reshape(2, 3))
        want = c(x).numpy().copy()
        data = pickle.dumps(c)
        assert len(data) < 200 and b"double_plus_one" in data
        c2 = pickle.loads(data)
        assert isinstance(c2, fucina.Compiled) and c2.fn is double_plus_one
        assert c2.cache_size() == 0  # programs are rebuilt where it is unpickled
        got = c2(x).numpy()
        assert np.array_equal(got, want) and got[1, 2] == 11.0
        # the same function unpickled again shares its compiled twin (and its programs)
        assert pickle.loads(data) is c2 and c2.cache_size() == 1


def test_a_compiled_closure_over_a_model_pickles_small(model_dir) -> None:
    m = bert.load(model_dir)
    scale = 2.0

    def scaled(x):
        return x.scale(scale)

    c = fucina.compile(scaled)
    c2 = cloudpickle.loads(cloudpickle.dumps(c))
    with fucina.ExecContext() as ctx:
        x = fucina.Tensor("a").from_numpy(ctx, np.array([1.5, -2.0], np.float32))
        assert np.array_equal(c2(x).numpy(), np.array([3.0, -4.0], np.float32))

    def embed(texts):
        return m.encode(texts)

    data = cloudpickle.dumps(embed)
    assert len(data) < 2000
    assert np.array_equal(cloudpickle.loads(data)(SENTENCES), m.encode(SENTENCES))
