"""FILE auto-sharding splits one list of files among the workers: worker w reads names w, w+W,
... of its own list. The workers compare their lists (a digest, in the one all-reduce that makes
a distributed dataset) and any difference is an error on every rank, naming each worker's list,
instead of rows silently lost or read twice: a rank whose glob missed the newest file, the
Horovod habit of globbing each rank's own files, the same files listed in another order.

Size-agnostic: run under mpiexec -n 1, 2, 4 and on two simulated nodes by tests/test_mpi_launch.py.
"""

import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.data import Dataset, NpyDataset, TextLineDataset
from mpidist.data.experimental import AutoShardPolicy
from mpidist.errors import InvalidArgumentError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
FILES = 2 * max(size, 2) + 1  # more files than workers, not a multiple of them
ROWS = 3  # rows per file; file k holds k * 10 + [0, 1, 2]


@pytest.fixture(scope="module")
def data_dir():
    """One directory every rank sees (the simulated nodes share this machine's /tmp)."""
    made = tempfile.TemporaryDirectory(prefix="mpidist-file-lists-") if rank == 0 else None
    path = Path(comm.bcast(made.name if made else None, root=0))
    if rank == 0:
        for k in range(FILES):
            np.save(path / f"part-{k:02d}.npy", np.arange(ROWS, dtype=np.float64) + 10 * k)
            (path / f"part-{k:02d}.txt").write_text("".join(f"{10 * k + i}\n" for i in range(ROWS)))
    comm.Barrier()
    yield path
    comm.Barrier()
    if made:
        made.cleanup()


def mwms():
    return mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=["/cpu:0"]))


def with_policy(dataset, policy):
    options = mpidist.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def total_of(strategy, dataset):
    """The job's sum of every row the distributed dataset gives (each row once)."""
    total = 0.0
    for batch in strategy.experimental_distribute_dataset(dataset):
        per_replica = strategy.run(lambda x: np.asarray(x, dtype=np.float64).sum(), args=(batch,))
        total += float(strategy.reduce(mpidist.ReduceOp.SUM, per_replica, axis=None))
    return total


def listed_total(directory):
    """The job's sum over ``list_files(directory/part-*.npy)`` read by NpyDataset (shuffled,
    the default), auto-sharded."""
    files = Dataset.list_files(str(directory / "part-*.npy"))
    return total_of(mwms(), files.interleave(lambda f: NpyDataset(f)).batch(2 * size))


def all_rows_sum(files):
    return float(sum(10 * k * ROWS + ROWS * (ROWS - 1) / 2 for k in files))


def npy_files(directory, ks):
    return [str(directory / f"part-{k:02d}.npy") for k in ks]


def refused_on_every_rank(strategy, dataset, *expected):
    with pytest.raises(InvalidArgumentError, match="the workers list different files") as info:
        strategy.experimental_distribute_dataset(dataset)
    message = str(info.value)
    for part in ("worker 0:", f"worker {size - 1}:", "AutoShardPolicy.OFF", *expected):
        assert part in message, message
    # every rank raised at the same point: the ranks are still in step
    total = strategy.reduce(mpidist.ReduceOp.SUM, strategy.run(lambda: np.float64(1)), axis=None)
    assert float(total) == size
    return message


def needs_two_ranks():
    if size == 1:
        pytest.skip("a disagreement needs two ranks; this test runs again at 2 and 4 ranks")


@pytest.mark.mpi
def test_the_same_files_everywhere_are_each_read_once(data_dir):
    """list_files shuffles by default: the workers still split the same sorted list."""
    assert listed_total(data_dir) == all_rows_sum(range(FILES))


@pytest.mark.mpi
def test_each_rank_globbing_its_own_files_is_an_error(data_dir):
    """Horovod's habit under the default AUTO policy: rank r lists part-r*, FILE sharding
    would read every W-th of those."""
    needs_two_ranks()
    s = mwms()
    mine = [k for k in range(FILES) if k % size == rank]
    ds = Dataset.from_tensor_slices(npy_files(data_dir, mine)).interleave(NpyDataset).batch(size)
    message = refused_on_every_rank(s, ds, "AUTO auto-sharding")
    assert f"{len([k for k in range(FILES) if k % size == 0])} file(s)" in message


@pytest.mark.mpi
def test_a_rank_missing_the_newest_file_is_an_error(data_dir):
    needs_two_ranks()
    s = mwms()
    ks = range(FILES - 1) if rank == size - 1 else range(FILES)
    names = [str(data_dir / f"part-{k:02d}.txt") for k in ks]
    ds = with_policy(TextLineDataset(names).batch(size), AutoShardPolicy.FILE)
    message = refused_on_every_rank(s, ds, "FILE auto-sharding", f"{FILES} file(s)",
                                    f"{FILES - 1} file(s)")
    assert f"part-{FILES - 1:02d}.txt" in message


@pytest.mark.mpi
def test_a_rank_with_fewer_files_than_workers_does_not_fall_back_alone(data_dir):
    """AUTO shards by DATA where there are fewer files than workers: a rank that found only
    one file must not take DATA while the others take FILE."""
    needs_two_ranks()
    s = mwms()
    ks = [0] if rank == 0 else range(FILES)
    ds = Dataset.from_tensor_slices(npy_files(data_dir, ks)).interleave(NpyDataset).batch(size)
    refused_on_every_rank(s, ds, "AUTO auto-sharding", "worker 0: 1 file(s)")


@pytest.mark.mpi
def test_generated_lists_are_refused_exactly_when_they_differ(data_dir):
    """Cases drawn from one seed on every rank: each rank's list is the full list, with one
    rank (drawn) dropping a file, listing them in another order, or adding a duplicate. The
    split is refused exactly when some rank's list differs from rank 0's, and otherwise reads
    every row once."""
    s = mwms()
    for case in range(8):
        rng = np.random.default_rng(case)
        lists = [list(range(FILES)) for _ in range(size)]
        odd, change = int(rng.integers(size)), int(rng.integers(4))
        if change == 0:
            lists[odd].pop(int(rng.integers(FILES)))
        elif change == 1:
            lists[odd] = [int(k) for k in rng.permutation(FILES)]
        elif change == 2:
            lists[odd].append(int(rng.integers(FILES)))
        differs = any(lst != lists[0] for lst in lists)
        ds = with_policy(Dataset.from_tensor_slices(npy_files(data_dir, lists[rank]))
                         .interleave(NpyDataset).batch(size), AutoShardPolicy.FILE)
        if differs:
            refused_on_every_rank(s, ds, "FILE auto-sharding")
        else:
            assert total_of(s, ds) == all_rows_sum(lists[0]), (case, lists)


@pytest.mark.mpi
def test_each_node_s_own_copy_of_the_same_files_is_one_list(data_dir):
    """The same files under another directory on each rank (node-local copies): the names
    compare without their directories, and every row is read once."""
    own = data_dir / f"copy-{rank}"
    own.mkdir()
    for k in range(FILES):
        (own / f"part-{k:02d}.npy").write_bytes((data_dir / f"part-{k:02d}.npy").read_bytes())
    assert listed_total(own) == all_rows_sum(range(FILES))


@pytest.mark.mpi
def test_own_files_with_sharding_off_read_every_rank_s_own(data_dir):
    """The fix the error names: OFF, each rank reading all of its own files."""
    s = mwms()
    mine = [k for k in range(FILES) if k % size == rank]
    ds = with_policy(Dataset.from_tensor_slices(npy_files(data_dir, mine))
                     .interleave(NpyDataset).batch(1), AutoShardPolicy.OFF)
    seen = [float(v) for b in s.experimental_distribute_dataset(ds) for v in np.ravel(b)]
    assert sorted(seen) == sorted(10.0 * k + i for k in mine for i in range(ROWS))
