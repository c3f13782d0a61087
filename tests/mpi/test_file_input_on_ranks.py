"""Training data from files across real MPI ranks: TF's auto-shard rules for file pipelines
(AUTO finds the reader and shards by FILE; FILE with fewer files than workers is TF's error
and AUTO falls back to DATA), exactly-once coverage per epoch with uneven files, reshuffling
with the seed the ranks agree on, ``distribute_datasets_from_function`` pipelines that read
their own files, and a training loop that outlives the worker whose files run out first.

Size-agnostic: run under mpiexec -n 1, 2 and 4 (and 4 on two simulated nodes) by
tests/test_mpi_launch.py. Rank 0 writes the files into a directory every rank sees.
"""

import os
import tempfile
from collections import Counter

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.data import Dataset, NpyDataset
from mpidist.data.experimental import AutoShardPolicy
from mpidist.errors import InvalidArgumentError

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def mwms(local=1):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    return mpidist.MultiWorkerMirroredStrategy(resolver)


@pytest.fixture(scope="module")
def shared_dir():
    base = os.environ.get("MPIDIST_TEST_RESULTS_DIR") or tempfile.gettempdir()
    path = comm.bcast(tempfile.mkdtemp(prefix="files-", dir=base) if rank == 0 else None)
    return path


def write_files(directory, lengths, name):
    """Files ``name``-000.npy ... of consecutive ids (rows [id, id]); rank 0 writes, all wait.
    Returns the sorted paths and every file's ids."""
    paths, ids, start = [], [], 0
    for i, n in enumerate(lengths):
        path = os.path.join(directory, f"{name}-{i:03d}.npy")
        rows = np.repeat(np.arange(start, start + n, dtype=np.int64)[:, None], 2, axis=1)
        if rank == 0:
            np.save(path, rows)
        paths.append(path)
        ids.append(list(range(start, start + n)))
        start += n
    comm.Barrier()
    return paths, ids


def uneven(count):
    return [(7 * i) % 11 + 1 for i in range(count)]


def with_policy(dataset, policy):
    options = mpidist.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def rows_seen(strategy, distributed):
    """This rank's ids, per step, over its local replicas (empty sub-batches included)."""
    steps = []
    for step in distributed:
        ids = []
        for batch in strategy.experimental_local_results(step):
            ids.extend(np.asarray(batch)[:, 0].tolist())
        steps.append(ids)
    return steps


def everyone(steps):
    gathered = comm.allgather(steps)
    assert len({len(s) for s in gathered}) == 1, (
        f"ranks ran different numbers of steps: {[len(s) for s in gathered]}")
    return gathered


@pytest.mark.parametrize("local", [1, 2])
def test_auto_reads_each_workers_own_files_exactly_once(shared_dir, local):
    paths, ids = write_files(shared_dir, uneven(2 * size + 1), f"auto{local}")
    strategy = mwms(local)
    files = Dataset.list_files(os.path.join(shared_dir, f"auto{local}-*.npy"), shuffle=False)
    ds = files.interleave(NpyDataset, cycle_length=2).batch(5)
    steps = rows_seen(strategy, strategy.experimental_distribute_dataset(ds))
    mine = [i for step in steps for i in step]
    assert sorted(mine) == sorted(i for f in ids[rank::size] for i in f)  # sorted files w::W
    counts = Counter(i for s in everyone(steps) for step in s for i in step)
    total = sum(len(f) for f in ids)
    assert sorted(counts) == list(range(total)) and set(counts.values()) == {1}


def test_unseeded_shuffles_reshuffle_each_epoch_and_stay_exactly_once(shared_dir):
    _, ids = write_files(shared_dir, uneven(3 * size), "shuf")
    total = sum(len(f) for f in ids)
    strategy = mwms()
    files = Dataset.list_files(os.path.join(shared_dir, "shuf-*.npy"))  # shuffled, no seed
    ds = files.interleave(NpyDataset, cycle_length=3).shuffle(16).batch(4)
    dist = strategy.experimental_distribute_dataset(ds)
    epochs = []
    for _ in range(2):
        steps = everyone(rows_seen(strategy, dist))
        order = [i for s in steps for step in s for i in step]
        assert sorted(order) == list(range(total))
        epochs.append(order)
    assert epochs[0] != epochs[1]


def test_fewer_files_than_workers(shared_dir):
    write_files(shared_dir, [6], "one")
    strategy = mwms()
    ds = Dataset.list_files(os.path.join(shared_dir, "one-*.npy")).interleave(NpyDataset).batch(3)
    if size > 1:
        with pytest.raises(InvalidArgumentError, match="Could not apply FILE based sharding: "
                           f"the dataset only has 1 file\\(s\\).*required {size} shards"):
            strategy.experimental_distribute_dataset(with_policy(ds, AutoShardPolicy.FILE))
    counts = Counter(i for s in everyone(rows_seen(strategy, strategy.experimental_distribute_dataset(ds)))
                     for step in s for i in step)
    assert sorted(counts) == list(range(6)) and set(counts.values()) == {1}  # AUTO: by DATA


def test_datasets_from_function_read_their_own_files(shared_dir):
    _, ids = write_files(shared_dir, uneven(size + 2), "fn")
    total = sum(len(f) for f in ids)
    strategy = mwms(2)

    def dataset_fn(ctx):
        files = Dataset.list_files(os.path.join(shared_dir, "fn-*.npy"), shuffle=False)
        return files.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).interleave(
            NpyDataset, cycle_length=1).batch(ctx.get_per_replica_batch_size(4 * size))

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    counts = Counter(i for s in everyone(rows_seen(strategy, dist)) for step in s for i in step)
    assert sorted(counts) == list(range(total)) and set(counts.values()) == {1}


def test_training_outlives_the_worker_whose_files_end_first(shared_dir):
    """Rank 0's files hold many more rows than the others': every rank runs the same steps,
    each step's all-reduce sums the rows of the whole job, and nothing hangs."""
    lengths = [40] + [3] * (2 * size - 1)
    _, ids = write_files(shared_dir, lengths, "long")
    strategy = mwms()
    files = Dataset.list_files(os.path.join(shared_dir, "long-*.npy"), shuffle=False)
    dist = strategy.experimental_distribute_dataset(
        files.interleave(NpyDataset, cycle_length=2).batch(4 * size))

    def step(batch):
        ctx = mpidist.get_replica_context()
        return ctx.all_reduce("SUM", np.array([float(len(batch)), float(batch[:, 0].sum())]))

    totals = np.zeros(2)
    for batch in dist:
        totals += np.asarray(strategy.experimental_local_results(strategy.run(step, args=(batch,)))[0])
    everything = [i for f in ids for i in f]
    assert totals.tolist() == [float(len(everything)), float(sum(everything))]


def test_a_saved_dataset_is_split_by_shard_file(shared_dir):
    path = os.path.join(shared_dir, "saved")
    total = 10 * size + 3
    if rank == 0:
        rows = np.repeat(np.arange(total, dtype=np.int64)[:, None], 2, axis=1)
        Dataset.from_tensor_slices(rows).save(path, shard_func=lambda r: r[0] % (2 * size + 1))
    comm.Barrier()
    strategy = mwms()
    loaded = Dataset.load(path)
    assert loaded.cardinality() == total
    steps = rows_seen(strategy, strategy.experimental_distribute_dataset(loaded.batch(4)))
    mine = {i % (2 * size + 1) for step in steps for i in step}
    assert mine <= set(range(2 * size + 1)[rank::size])  # this worker's shard files only
    counts = Counter(i for s in everyone(steps) for step in s for i in step)
    assert sorted(counts) == list(range(total)) and set(counts.values()) == {1}
