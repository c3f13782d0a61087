"""``Dataset.save`` / ``Dataset.load`` (tf.data's): round trips with and without
``shard_func``, ``reader_func``, the saved element spec and cardinality, FILE auto-sharding of a
loaded dataset by shard, and the mistakes (not a saved dataset, unsupported options, a bad
shard_func). The file format itself is tested in test_saved_format.py."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.core.devices import parse_device
from mpidist.data import Dataset, TensorSpec
from mpidist.data.distributed import InputWorkers, distribute_dataset
from mpidist.errors import InvalidArgumentError, NotFoundError


def flat(ds):
    return [int(np.asarray(e[0] if isinstance(e, tuple) else e)) for e in ds]


def in_order(path):
    """A loaded dataset read shard after shard (reader_func), so the order is known."""
    return Dataset.load(path, reader_func=lambda shards: shards.flat_map(lambda s: s))


def test_round_trip_keeps_elements_structure_and_spec(tmp_path):
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    labels = np.array(list("abcdefghij"))
    ds = Dataset.from_tensor_slices({"x": x, "label": labels, "id": np.arange(10)})
    ds.save(str(tmp_path / "d"))
    loaded = Dataset.load(str(tmp_path / "d"))
    assert loaded.cardinality() == 10
    assert loaded.element_spec["x"] == TensorSpec((3,), np.float32)
    got = sorted(loaded, key=lambda e: int(e["id"]))
    for i, e in enumerate(got):
        assert np.array_equal(e["x"], x[i]) and str(e["label"]) == labels[i]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 60), shards=st.integers(1, 5), batch=st.integers(1, 7))
def test_shard_func_decides_the_files_and_reading_them_in_order_gives_each_shard(
        tmp_path_factory, n, shards, batch):
    path = str(tmp_path_factory.mktemp("saved") / "d")
    ds = Dataset.from_tensor_slices((np.arange(n), np.arange(n) * 10))
    ds.save(path, shard_func=lambda i, ten: i % shards)  # tuple elements: positional
    want = [i for s in range(shards) for i in range(n) if i % shards == s]
    assert flat(in_order(path)) == want
    got = [b[0].tolist() for b in in_order(path).batch(batch)]
    assert got == [want[i:i + batch] for i in range(0, len(want), batch)]
    assert sorted(flat(Dataset.load(path))) == list(range(n))  # default reader_func


def test_default_reader_interleaves_the_shards(tmp_path):
    Dataset.range(12).save(str(tmp_path / "d"), shard_func=lambda i: i // 4)
    k = min(3, len(os.sched_getaffinity(0)))  # TF's default cycle: the CPU cores
    loaded = list(Dataset.load(str(tmp_path / "d")))
    shards = [list(range(s * 4, s * 4 + 4)) for s in range(3)]
    want = Dataset.from_tensor_slices(np.arange(3)).interleave(
        lambda s: Dataset.from_tensor_slices(np.array(shards[int(s)])), cycle_length=k)
    assert [int(e) for e in loaded] == [int(e) for e in want]


def test_save_replaces_a_saved_dataset_and_refuses_other_directories(tmp_path):
    path = tmp_path / "d"
    Dataset.range(5).save(str(path))
    Dataset.range(3).save(str(path))
    assert sorted(flat(Dataset.load(str(path)))) == [0, 1, 2]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidArgumentError):
        Dataset.range(3).save(str(other))
    assert (other / "notes.txt").read_text() == "keep me"


def test_load_mistakes_are_named(tmp_path):
    with pytest.raises(NotFoundError):
        Dataset.load(str(tmp_path / "nothing"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(InvalidArgumentError, match="not a saved dataset.*Dataset.save"):
        Dataset.load(str(tmp_path / "plain"))
    Dataset.range(4).save(str(tmp_path / "d"))
    with pytest.raises(InvalidArgumentError, match="element_spec"):
        Dataset.load(str(tmp_path / "d"), element_spec=TensorSpec((2,), np.float32))
    assert flat(Dataset.load(str(tmp_path / "d"), element_spec=TensorSpec((), np.int64),
                             reader_func=lambda d: d.flat_map(lambda s: s))) != []
    with pytest.raises(InvalidArgumentError, match="compression"):
        Dataset.load(str(tmp_path / "d"), compression="GZIP")
    with pytest.raises(TypeError, match="reader_func must return"):
        Dataset.load(str(tmp_path / "d"), reader_func=lambda d: 3)


def test_save_mistakes_are_named_and_leave_nothing(tmp_path):
    with pytest.raises(InvalidArgumentError, match="compression"):
        Dataset.range(3).save(str(tmp_path / "a"), compression="GZIP")
    with pytest.raises(TypeError, match="shard_func"):
        Dataset.range(3).save(str(tmp_path / "b"), shard_func=3)
    with pytest.raises(InvalidArgumentError, match="element 1"):
        Dataset.range(3).save(str(tmp_path / "c"), shard_func=lambda i: -1 if i == 1 else 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("workers", [2, 3])
def test_file_sharding_gives_each_worker_its_own_shards(tmp_path, workers):
    path = str(tmp_path / "d")
    Dataset.from_tensor_slices(np.arange(40)[:, None]).save(path, shard_func=lambda r: r[0] % 7)
    loaded = Dataset.load(path).batch(4)
    seen = []
    for w in range(workers):
        dist = distribute_dataset(loaded, InputWorkers(devices=(parse_device("/cpu:0"),),
                                                       num_workers=workers, worker_index=w,
                                                       num_replicas_in_sync=workers))
        rows = [int(r) for step in dist for r in np.asarray(step)[:, 0]]
        assert {r % 7 for r in rows} == set(range(7)[w::workers])  # shard files w, w + W, ...
        seen.extend(rows)
    assert sorted(seen) == list(range(40))


def test_saving_a_file_reader_writes_its_blocks_with_the_same_rows_as_element_by_element(
        tmp_path):
    rows = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    np.save(tmp_path / "rows.npy", rows)
    reader = mpidist.data.NpyDataset(str(tmp_path / "rows.npy"), block_rows=64)
    reader.save(str(tmp_path / "blocks"))  # blocks, round-robin by strided slices
    Dataset.from_tensor_slices(rows).save(str(tmp_path / "elements"))  # element by element
    for name in ("blocks", "elements"):
        got = np.stack(list(in_order(str(tmp_path / name))))
        want = np.concatenate([rows[s::8] for s in range(8)])  # shard s: rows s, s + 8, ...
        assert np.array_equal(got, want), name
