"""fucina.dask: compiled functions over Dask arrays block by block (chunking checks), and
model embeddings of Dask bags / DataFrame columns, on the synchronous scheduler and on a
distributed.LocalCluster of 2 worker processes (a worker killed mid-job, a missing model)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from bert_synth import write_model

import fucina
import fucina.dask as fd
import fucina.models.bert as bert

TEXTS = ["the cat sat on the mat.", "hello world!", "a big red dog ran far, far, far", "cats",
         "dogs sat", "the dog", "hello, the big red cat sat on a mat. world!", "a",
         "zebra unknown words", "the big red mat", "far far far far far far far far far far",
         "world", "the cat ran", "hello big dog"]
RNG = np.random.default_rng(14)
X = RNG.standard_normal((10, 6)).astype(np.float32)
W = RNG.standard_normal((6, 4)).astype(np.float32)


def proj_relu(x, w):
    return x.dot(w, "d").relu()


def row_softmax(x):
    return x.softmax("d")


def col_softmax(x):
    return x.softmax("b")


def col_sum(x):
    return x.sum("b")


def blockwise_reference(fn, blocks_x: list[np.ndarray], w: np.ndarray | None) -> np.ndarray:
    """The single-process run with the same block boundaries."""
    c = fucina.compile(fn)
    out = []
    with fucina.ExecContext() as ctx:
        for b in blocks_x:
            args = [fucina.Tensor("b", "d").from_numpy(ctx, b)]
            if w is not None:
                args.append(fucina.Tensor("d", "o").from_numpy(ctx, w))
            out.append(np.array(c(*args).numpy()))
    return np.concatenate(out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bert_dask")
    write_model(d, seed=14)
    return d


@pytest.fixture(scope="module")
def model(model_dir: Path) -> bert.BertModel:
    return bert.load(model_dir)


# -- map_blocks: planning and values (synchronous scheduler) -------------------------------


def test_map_blocks_matches_the_blockwise_single_process_run() -> None:
    x = da.from_array(X, chunks=(4, 6))
    w = da.from_array(W, chunks=(6, 4))
    y = fd.map_blocks(proj_relu, x, w, tags=[("b", "d"), ("d", "o")])
    assert y.shape == (10, 4) and y.chunks == ((4, 4, 2), (4,)) and y.dtype == np.float32
    got = y.compute(scheduler="sync")
    want = blockwise_reference(proj_relu, [X[0:4], X[4:8], X[8:10]], W)
    assert np.array_equal(got, want)
    np.testing.assert_allclose(got, np.maximum(X @ W, 0), rtol=1e-5, atol=1e-6)
    assert fd.output_tags(proj_relu, x, w, tags=[("b", "d"), ("d", "o")]) == ("b", "o")
    t = fd.map_blocks(proj_relu, x, w, tags=[("b", "d"), ("d", "o")], out_tags=("o", "b"))
    assert t.chunks == ((4,), (4, 4, 2))
    assert np.array_equal(t.compute(scheduler="sync"), want.T)


def test_a_softmax_along_an_unsplit_tag_runs_block_by_block() -> None:
    x = da.from_array(X, chunks=(3, 6))
    got = fd.map_blocks(row_softmax, x, tags=("b", "d")).compute(scheduler="sync")
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5)
    assert np.array_equal(got, blockwise_reference(row_softmax, [X[i:i + 3] for i in
                                                                 range(0, 10, 3)], None))


def test_splitting_a_contracted_tag_is_refused_with_the_chunking() -> None:
    x = da.from_array(X, chunks=(5, 3))
    w = da.from_array(W, chunks=(3, 4))
    with pytest.raises(ValueError, match=r"contracts or reduces.*tag 'd'.*splits 'd' into 2 "
                                         r"chunks \(3, 3\)"):
        fd.map_blocks(proj_relu, x, w, tags=[("b", "d"), ("d", "o")])


def test_splitting_a_reduced_tag_is_refused() -> None:
    x = da.from_array(X, chunks=(4, 6))
    with pytest.raises(ValueError, match=r"contracts or reduces.*tag 'b'.*\(4, 4, 2\)"):
        fd.map_blocks(col_sum, x, tags=("b", "d"))
    # one chunk along the reduced tag: fine, and equal to the whole-array sum
    y = fd.map_blocks(col_sum, x.rechunk((10, 3)), tags=("b", "d"))
    assert y.chunks == ((3, 3),)
    np.testing.assert_allclose(y.compute(scheduler="sync"), X.sum(0), rtol=1e-5, atol=1e-6)


def test_mixing_values_along_a_split_tag_is_refused() -> None:
    x = da.from_array(X, chunks=(5, 6))
    with pytest.raises(ValueError, match=r"mixes values along.*tag 'b'.*\(5, 5\)"):
        fd.map_blocks(col_softmax, x, tags=("b", "d"))

    def running(v):
        return v.cumsum("b")

    with pytest.raises(ValueError, match=r"mixes values along.*tag 'b'"):
        fd.map_blocks(running, x, tags=("b", "d"))


def test_map_blocks_argument_errors() -> None:
    x = da.from_array(X, chunks=(5, 6))
    with pytest.raises(ValueError, match=r"array 0 has 2 axes.*name 3"):
        fd.map_blocks(row_softmax, x, tags=("b", "d", "e"))
    with pytest.raises(ValueError, match="distinct"):
        fd.map_blocks(row_softmax, x, tags=("b", "b"))
    with pytest.raises(TypeError, match="argument 0 must be a dask.array.Array, got ndarray"):
        fd.map_blocks(row_softmax, X, tags=("b", "d"))
    with pytest.raises(ValueError, match=r"out_tags \('b', 'x'\) must be a permutation"):
        fd.map_blocks(row_softmax, x, tags=("b", "d"), out_tags=("b", "x"))
    with pytest.raises(ValueError, match="tag 'd' has size 6 in one array and 5 in array 1"):
        fd.map_blocks(proj_relu, x, da.zeros((5, 4), np.float32), tags=[("b", "d"),
                                                                       ("d", "o")])
    with fucina.ExecContext() as ctx:
        w = fucina.Tensor("d", "o").from_numpy(ctx, W)

        def captures_a_tensor(v):
            return v.dot(w, "d")

        with pytest.raises(TypeError, match="must pickle to reach the workers"):
            fd.map_blocks(captures_a_tensor, x, tags=("b", "d"))


# -- embed (synchronous scheduler) ----------------------------------------------------------


def partitions(texts) -> list[list[str]]:
    return [list(p) for p in dask.compute(*texts.to_delayed(), scheduler="sync")]


def per_partition(model: bert.BertModel, parts: list[list[str]], batch_size: int) -> np.ndarray:
    return np.concatenate([model.encode(p, batch_size=batch_size) for p in parts])


def test_embed_a_bag_and_a_dataframe_column(model) -> None:
    bag = db.from_sequence(TEXTS, npartitions=3)
    e = fd.embed(model, bag, batch_size=2)
    assert e.dtype == np.float32 and e.shape[1] == 16 and np.isnan(e.shape[0])
    got = e.compute(scheduler="sync")
    assert got.shape == (len(TEXTS), 16)
    assert np.array_equal(got, per_partition(model, partitions(bag), 2))
    col = dd.from_pandas(pd.DataFrame({"text": TEXTS, "n": range(len(TEXTS))}),
                         npartitions=4)["text"]
    got2 = fd.embed(model, col, batch_size=4).compute(scheduler="sync")
    assert np.array_equal(got2, per_partition(model, partitions(col), 4))
    np.testing.assert_allclose(got2, model.encode(TEXTS), atol=1e-6)


def test_embed_argument_errors(model) -> None:
    df = dd.from_pandas(pd.DataFrame({"text": TEXTS}), npartitions=2)
    with pytest.raises(TypeError, match=r"one column of strings \(df\['text'\]\)"):
        fd.embed(model, df)
    with pytest.raises(TypeError, match="Dask bag or a Dask DataFrame column.*got list"):
        fd.embed(model, TEXTS)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        fd.embed(model, db.from_sequence(TEXTS), batch_size=0)
    with pytest.raises(TypeError, match="needs a model with encode"):
        fd.embed(object(), db.from_sequence(TEXTS))


# -- on a LocalCluster: 2 worker processes x 1 thread ---------------------------------------


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_cluster_map_blocks_is_bit_identical(client) -> None:
    x = da.from_array(X, chunks=(3, 6))
    w = da.from_array(W, chunks=(6, 4))
    y = fd.map_blocks(proj_relu, x, w, tags=[("b", "d"), ("d", "o")])
    got = client.compute(y).result(timeout=300)
    want = blockwise_reference(proj_relu, [X[i:i + 3] for i in range(0, 10, 3)], W)
    assert np.array_equal(got, want)


def test_cluster_embed_is_bit_identical(client, model) -> None:
    bag = db.from_sequence(TEXTS, npartitions=4)
    got = client.compute(fd.embed(model, bag, batch_size=2)).result(timeout=300)
    assert np.array_equal(got, per_partition(model, partitions(bag), 2))
    col = dd.from_pandas(pd.DataFrame({"text": TEXTS}), npartitions=3)["text"]
    got2 = client.compute(fd.embed(model, col)).result(timeout=300)
    assert np.array_equal(got2, per_partition(model, partitions(col), 32))
    # the tasks ran in the worker processes, which opened the model themselves and loaded
    # its kernels from the disk cache this process filled (the same FUCINA_CACHE_DIR)
    pids = client.run(os.getpid)
    assert len(pids) == 2 and os.getpid() not in pids.values()
    loads = client.run(kernel_loads)
    assert sum(d for d, _ in loads.values()) > 0


def kernel_loads() -> tuple[int, int]:
    info = fucina.cache_info()
    return info.disk_hits, info.compiled


def test_cluster_worker_without_the_model_file(client, model_dir, tmp_path) -> None:
    d = tmp_path / "moved_model"
    shutil.copytree(model_dir, d)
    m = bert.load(d)
    bag = db.from_sequence(TEXTS, npartitions=2)
    e = fd.embed(m, bag)
    shutil.move(d, tmp_path / "elsewhere")  # the workers no longer find it at d
    with pytest.raises(FileNotFoundError, match=rf"model file '{d}/config.json' does not exist "
                                                r"on host"):
        client.compute(e).result(timeout=300)


def die_once(part: list[str], marker: str) -> list[str]:
    """Kill this worker process the first time a partition holding TEXTS[5] runs."""
    if TEXTS[5] in part and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os._exit(1)
    return part


def test_cluster_survives_a_worker_killed_mid_job(client, model, tmp_path) -> None:
    marker = tmp_path / "killed"
    bag = db.from_sequence(TEXTS, npartitions=4)
    e = fd.embed(model, bag.map_partitions(die_once, str(marker)), batch_size=2)
    got = client.compute(e).result(timeout=300)
    assert marker.exists() and int(marker.read_text()) != os.getpid()  # a worker did die
    assert got.shape == (len(TEXTS), 16)
    assert np.array_equal(got, per_partition(model, partitions(bag), 2))


def test_cluster_map_blocks_with_a_captured_model(client, model, model_dir) -> None:
    # the closure travels by value, the model it captures by reference to its files; the
    # blocks join the model's context on the worker (its weights are captured tensors)
    def lookup(ids):
        return model.word.gather("vocab", ids, "tok")

    ids = np.array([2, 5, 0, 7, 7, 3, 21, 1, 4], np.int64)
    x = da.from_array(ids, chunks=4)
    y = fd.map_blocks(lookup, x, tags=("tok",))
    assert y.chunks == ((4, 4, 1), (16,))
    table = np.asarray(bert.load(model_dir).word.numpy())
    assert np.array_equal(y.compute(scheduler="sync"), table[ids])
    assert np.array_equal(client.compute(y).result(timeout=300), table[ids])


def test_arrays_sharing_a_tag_line_up_by_name() -> None:
    # x splits "b" as (5, 5), y as (4, 6): blocks are cut at both boundaries
    y_np = RNG.standard_normal((10, 6)).astype(np.float32)

    def add(a, b):
        return a.add(b)

    x = da.from_array(X, chunks=(5, 6))
    y = da.from_array(y_np.T.copy(), chunks=(6, (4, 6)))  # axes ("d", "b"): named, not placed
    z = fd.map_blocks(add, x, y, tags=[("b", "d"), ("d", "b")])
    assert z.chunks == ((4, 1, 5), (6,))
    assert np.array_equal(z.compute(scheduler="sync"), X + y_np)
    # a contraction over the split shared tag is refused with the unified chunking
    w = da.from_array(W, chunks=((2, 4), 4))
    with pytest.raises(ValueError, match=r"tag 'd'.*into 3 chunks \(2, 1, 3\)"):
        fd.map_blocks(proj_relu, da.from_array(X, chunks=(10, (3, 3))), w,
                      tags=[("b", "d"), ("d", "o")])
