"""The file pipeline's semantics (tf.data's): ``list_files`` (order, shuffling, errors),
``interleave`` / ``flat_map`` order for any cycle and block length, the block path that file
readers take (which must give exactly the element-by-element order), ``SHARD_HINT``, and
FILE / AUTO / DATA / OFF / HINT auto-sharding across simulated workers with uneven files.

The multi-rank runs of the same rules are in tests/mpi/test_file_input_on_ranks.py.
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.core.devices import parse_device
from mpidist.data import Dataset, TensorSpec
from mpidist.data.dataset import FileReader
from mpidist.data.experimental import SHARD_HINT
from mpidist.data.distributed import InputWorkers, distribute_dataset
from mpidist.data.experimental import AutoShardPolicy
from mpidist.errors import InvalidArgumentError, NotFoundError


class BlockReader(FileReader):
    """A test reader: the rows of an .npy file (loaded whole: tests only), in blocks of
    ``block`` rows, so the block path is exercised at every block size."""

    reader = "BlockReader"

    def __init__(self, filenames, block=3):
        super().__init__(filenames)
        self._block = block

    def _file_spec(self, path):
        a = np.load(path, mmap_mode="r")
        return TensorSpec(a.shape[1:], a.dtype)

    def _file_rows(self, path):
        return len(np.load(path, mmap_mode="r"))

    def _file_blocks(self, path, sizes):
        a = np.load(path)
        for start in range(0, len(a), self._block):
            yield a[start:start + self._block]


def write_files(tmp_path, lengths, width=None, start=0):
    """Files f000.npy, f001.npy ... holding consecutive ints (file i's rows follow file
    i-1's), so every row says where it came from."""
    paths, value = [], start
    for i, n in enumerate(lengths):
        rows = np.arange(value, value + n, dtype=np.int64)
        if width:
            rows = np.repeat(rows[:, None], width, axis=1)
        path = tmp_path / f"f{i:03d}.npy"
        np.save(path, rows)
        paths.append(str(path))
        value += n
    return paths


def ints(ds):
    return [int(np.asarray(x).reshape(-1)[0]) for x in ds]


# -- list_files ---------------------------------------------------------------------------------
def test_list_files_sorted_without_shuffle(tmp_path):
    for name in ["b.txt", "a.txt", "c.txt", "a.log"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "dir.txt").mkdir()
    files = [str(f) for f in Dataset.list_files(str(tmp_path / "*.txt"), shuffle=False)]
    assert files == [str(tmp_path / n) for n in ["a.txt", "b.txt", "c.txt"]]
    both = Dataset.list_files([str(tmp_path / "*.log"), str(tmp_path / "b*")], shuffle=False)
    assert [os.path.basename(f) for f in both] == ["a.log", "b.txt"]
    assert both.cardinality() == 2


def test_list_files_shuffles_by_default_reproducibly_with_a_seed(tmp_path):
    for i in range(20):
        (tmp_path / f"{i:02d}.x").write_text("")
    pattern = str(tmp_path / "*.x")
    everything = sorted(str(tmp_path / f"{i:02d}.x") for i in range(20))
    seeded = Dataset.list_files(pattern, seed=7)
    first, second = list(seeded), list(seeded)
    assert sorted(first) == everything and sorted(second) == everything
    assert first != everything  # 1 in 20! of being sorted by chance
    assert first != second  # a new order each pass (reshuffle_each_iteration)
    again = Dataset.list_files(pattern, seed=7)
    assert list(again) == first and list(again) == second


def test_list_files_pattern_matching_nothing_is_tf_error(tmp_path):
    with pytest.raises(InvalidArgumentError, match="No files matched pattern: .*nothing-\\*"):
        Dataset.list_files(str(tmp_path / "nothing-*"))
    (tmp_path / "a.npy").write_text("")
    with pytest.raises(InvalidArgumentError, match="No files matched pattern: .*zzz"):
        Dataset.list_files([str(tmp_path / "*.npy"), str(tmp_path / "zzz")])
    with pytest.raises(TypeError, match="file name"):
        Dataset.list_files(3)


# -- interleave / flat_map ----------------------------------------------------------------------
def test_interleave_tf_documented_order():
    ds = Dataset.range(1, 6).interleave(lambda x: Dataset.from_tensors(x).repeat(6),
                                        cycle_length=2, block_length=4)
    assert ints(ds) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4,
                        5, 5, 5, 5, 5, 5]


def test_interleave_refills_a_slot_when_the_cycle_returns_to_it():
    ds = Dataset.range(1, 4).interleave(lambda x: Dataset.range(10 * x, 10 * x + x),
                                        cycle_length=2, block_length=1)
    assert ints(ds) == [10, 20, 21, 30, 31, 32]


def test_flat_map_concatenates_and_unbatches():
    assert ints(Dataset.range(1, 4).flat_map(lambda x: Dataset.range(x))) == [0, 0, 1, 0, 1, 2]
    rows = np.arange(12).reshape(6, 2)
    flat = Dataset.from_tensor_slices(rows).batch(4).flat_map(Dataset.from_tensor_slices)
    assert np.array_equal(np.stack(list(flat)), rows)


def test_interleave_tuple_elements_are_positional_arguments():
    ds = Dataset.from_tensor_slices((np.array([1, 2]), np.array([10, 20])))
    out = ds.interleave(lambda a, b: Dataset.from_tensors(a + b), cycle_length=2)
    assert ints(out) == [11, 22]


def test_interleave_mistakes_are_named():
    with pytest.raises(TypeError, match="map_func must be a callable"):
        Dataset.range(3).interleave(5)
    with pytest.raises(TypeError, match="must return an mpidist.data.Dataset.*element 0"):
        list(Dataset.range(3).interleave(lambda x: x * 2))
    with pytest.raises(InvalidArgumentError, match="cycle_length"):
        Dataset.range(3).interleave(Dataset.range, cycle_length=0)
    with pytest.raises(InvalidArgumentError, match="block_length"):
        Dataset.range(3).interleave(Dataset.range, block_length=-2)
    mixed = Dataset.range(2).interleave(
        lambda x: Dataset.from_tensors(np.zeros(2, np.float32) if x == 0 else np.zeros(2, int)))
    with pytest.raises(InvalidArgumentError, match="element 1.*same structure, dtypes"):
        list(mixed)


def test_interleave_default_cycle_length_is_the_cpu_count():
    k = len(os.sched_getaffinity(0))
    ds = Dataset.range(k + 1).interleave(lambda x: Dataset.from_tensors(x).repeat(2))
    assert ints(ds)[:2 * k] == list(range(k)) * 2


def test_interleave_cardinality_is_unknown_and_spec_is_the_inner_one():
    ds = Dataset.range(3).interleave(lambda x: Dataset.from_tensor_slices(np.zeros((2, 5))))
    assert ds.cardinality() == mpidist.data.UNKNOWN_CARDINALITY
    assert ds.element_spec == TensorSpec((5,), np.float64)


def reference_rows(lengths, cycle, block):
    """The interleave order, from the element-by-element path over in-memory datasets."""
    data = [np.arange(sum(lengths[:i]), sum(lengths[:i + 1])) for i in range(len(lengths))]
    ds = Dataset.range(len(lengths)).interleave(lambda i: Dataset.from_tensor_slices(data[int(i)]),
                                                cycle_length=cycle, block_length=block)
    return ints(ds)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=7), cycle=st.integers(1, 4),
       block=st.integers(1, 6), reader_block=st.integers(1, 8), batch=st.integers(1, 9))
def test_block_path_gives_the_element_order(tmp_path_factory, lengths, cycle, block,
                                            reader_block, batch):
    """Readers hand interleave and batch whole blocks (several rounds of the cycle stacked at
    once): the rows and batches must be exactly those of the element-by-element order."""
    tmp = tmp_path_factory.mktemp("files")
    paths = write_files(tmp, lengths, width=2)
    files = Dataset.from_tensor_slices(np.array(paths))
    ds = files.interleave(lambda f: BlockReader(f, reader_block), cycle_length=cycle,
                          block_length=block)
    want = reference_rows(lengths, cycle, block)
    assert ints(ds) == want
    batches = [b[:, 0].tolist() for b in ds.batch(batch)]
    assert batches == [want[i:i + batch] for i in range(0, len(want), batch)]
    assert [b.tolist() for b in ds.skip(3).take(7).map(lambda r: r[0]).batch(2)] == \
        [want[3:10][i:i + 2] for i in range(0, len(want[3:10]), 2)]
    assert ints(ds.shard(3, 1)) == want[1::3]


# -- FileReader ---------------------------------------------------------------------------------
def test_file_reader_reads_files_in_order_and_checks_them(tmp_path):
    paths = write_files(tmp_path, [4, 0, 3], width=3)
    reader = BlockReader(paths, block=2)
    assert ints(reader) == list(range(7))
    assert reader.cardinality() == 7 and reader.element_spec == TensorSpec((3,), np.int64)
    assert [b.shape for b in reader.batch(5)] == [(5, 3), (2, 3)]
    odd = tmp_path / "odd.npy"
    np.save(odd, np.zeros((2, 4), np.int64))
    with pytest.raises(InvalidArgumentError, match=f"BlockReader: {odd} holds .*but {paths[0]}"):
        list(BlockReader([paths[0], str(odd)]))
    with pytest.raises(NotFoundError, match="missing.npy: No such file"):
        list(BlockReader([paths[0], str(tmp_path / "missing.npy")]))
    names = BlockReader(Dataset.list_files(str(tmp_path / "f*.npy"), shuffle=False))
    assert ints(names) == list(range(7))


# -- SHARD_HINT -----------------------------------------------------------------------------------
def test_shard_hint_is_one_shard_outside_distribution():
    ds = Dataset.range(6).shard(SHARD_HINT, SHARD_HINT)
    assert ints(ds) == list(range(6))
    assert ds.cardinality() == mpidist.data.UNKNOWN_CARDINALITY
    with pytest.raises(InvalidArgumentError, match="Index must be between"):
        Dataset.range(6).shard(3, SHARD_HINT)


# -- auto-sharding across simulated workers ------------------------------------------------------
def worker_rows(dataset, num_workers, worker_index, replicas=1):
    workers = InputWorkers(devices=tuple(parse_device(f"/cpu:{i}")
                                         for i in range(replicas)),
                           num_workers=num_workers, worker_index=worker_index,
                           num_replicas_in_sync=num_workers * replicas)
    dist = distribute_dataset(dataset, workers)
    rows = []
    for step in dist:
        parts = step.values if replicas > 1 else (step,)
        for part in parts:
            rows.extend(np.asarray(part)[:, 0].tolist())
    return rows


def with_policy(ds, policy):
    options = mpidist.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return ds.with_options(options)


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("policy", [AutoShardPolicy.AUTO, AutoShardPolicy.FILE])
@pytest.mark.parametrize("lengths", [[5, 0, 9, 2, 7], [3, 3, 3, 3], [1, 20, 1, 4, 11, 2, 8]])
def test_file_sharding_reads_each_workers_files_exactly_once(tmp_path, workers, policy, lengths):
    paths = write_files(tmp_path, lengths, width=2)
    files = Dataset.list_files(str(tmp_path / "*.npy"), shuffle=False)
    ds = with_policy(files.interleave(BlockReader, cycle_length=2).batch(4), policy)
    seen = []
    for w in range(workers):
        rows = worker_rows(ds, workers, w, replicas=2)
        mine = set().union(*(set(np.load(p)[:, 0].tolist()) for p in paths[w::workers]))
        assert set(rows) == mine  # worker w reads sorted files w, w + W, ... and only those
        seen.extend(rows)
    assert sorted(seen) == list(range(sum(lengths)))


@pytest.mark.parametrize("workers", [2, 4])
def test_shuffled_files_are_split_the_same_way_on_every_worker_each_epoch(tmp_path, workers):
    lengths = [3, 1, 4, 1, 5, 9, 2, 6]
    write_files(tmp_path, lengths, width=1)
    files = Dataset.list_files(str(tmp_path / "*.npy"), seed=11)
    ds = files.interleave(BlockReader, cycle_length=3).shuffle(8, seed=3).batch(3)
    for _ in range(2):  # two epochs, each a new order, each exactly once
        seen = [r for w in range(workers) for r in worker_rows(ds, workers, w)]
        assert sorted(seen) == list(range(sum(lengths)))


def test_too_few_files_file_is_tf_error_and_auto_falls_back_to_data(tmp_path):
    write_files(tmp_path, [4, 4, 4], width=1)
    files = Dataset.list_files(str(tmp_path / "*.npy"), shuffle=False)
    pipeline = files.interleave(BlockReader, cycle_length=1).batch(4)
    with pytest.raises(InvalidArgumentError,
                       match="Could not apply FILE based sharding: the dataset only has 3 "
                             "file\\(s\\), which is not enough for the required 4 shards/workers"):
        worker_rows(with_policy(pipeline, AutoShardPolicy.FILE), 4, 0)
    # AUTO: DATA instead, the legacy split: worker w keeps global sub-batch w of each batch
    got = [worker_rows(pipeline, 4, w) for w in range(4)]
    assert got == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]


def test_data_and_off_read_every_file_on_every_worker(tmp_path):
    write_files(tmp_path, [4, 4], width=1)
    pipeline = Dataset.list_files(str(tmp_path / "*.npy"), shuffle=False).interleave(
        BlockReader, cycle_length=1).batch(4)
    data = [worker_rows(with_policy(pipeline, AutoShardPolicy.DATA), 2, w) for w in range(2)]
    assert data == [[0, 1, 4, 5], [2, 3, 6, 7]]
    off = [worker_rows(with_policy(pipeline, AutoShardPolicy.OFF), 2, w) for w in range(2)]
    assert off == [list(range(8)), list(range(8))]


def test_auto_without_files_is_data(tmp_path):
    ds = Dataset.range(8).map(lambda x: np.array([x])).batch(4)
    assert [worker_rows(ds, 2, w) for w in range(2)] == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_hint_policy_fills_the_placeholders_and_others_refuse_them():
    ds = Dataset.range(10).map(lambda x: np.array([x])).shard(SHARD_HINT, SHARD_HINT).batch(2)
    hinted = with_policy(ds, AutoShardPolicy.HINT)
    assert [worker_rows(hinted, 2, w) for w in range(2)] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert worker_rows(ds, 1, 0) == list(range(10))
    with pytest.raises(InvalidArgumentError, match="SHARD_HINT.*AutoShardPolicy.HINT"):
        worker_rows(ds, 2, 0)


@pytest.mark.parametrize("batch", [1, 7, 64, 100])
def test_batches_of_file_rows_are_cut_inside_one_block_except_at_file_ends(tmp_path, batch):
    """Readers size their blocks in whole batches, the first block of a file completing the
    batch in progress: every batch but those spanning two files is a view of one block (one
    copy from the file, as the raw library makes)."""
    lengths = [200, 77, 0, 301, 5]
    write_files(tmp_path, lengths, width=2048)  # 16 KiB rows: 64 rows fill a default block
    files = Dataset.list_files(str(tmp_path / "*.npy"), shuffle=False)
    for pipeline in (mpidist.data.NpyDataset(sorted(str(p) for p in tmp_path.glob("*.npy"))),
                     files.interleave(mpidist.data.NpyDataset, cycle_length=1)):
        batches = list(pipeline.batch(batch))
        assert np.concatenate(batches)[:, 0].tolist() == list(range(sum(lengths)))
        joined = sum(b.base is None for b in batches)  # concatenated from pieces
        assert joined <= len([n for n in lengths if n]) - 1


def test_a_rewritten_file_is_read_with_its_new_spec(tmp_path):
    """Specs of files are remembered across readers (an interleave opens a new reader per file
    each epoch) only while the file is unchanged."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((5, 2), np.float32))
    assert mpidist.data.NpyDataset(str(path)).element_spec == TensorSpec((2,), np.float32)
    np.save(path, np.ones((5, 2), np.int32))  # same size in bytes, same inode
    again = mpidist.data.NpyDataset(str(path))
    assert again.element_spec == TensorSpec((2,), np.int32)
    assert np.stack(list(again)).dtype == np.int32
