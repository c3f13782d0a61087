"""Input that differs from rank to rank, under MultiWorkerMirroredStrategy on real MPI ranks.

The case that used to hang: each rank builds its own in-memory dataset (its own shard file,
say) of a different length under the default auto-shard policy. The per-step end-of-data
agreement was skipped (DATA over an in-memory source was assumed to give every rank the same
steps), so the short rank left the loop and the others waited in their next collective.
Now the ranks compare their step counts once, when the distributed dataset is made; where they
differ, every rank runs the per-step agreement and stops at the same step, the short ranks
getting empty batches, and rank 0 warns that DATA sharding of different datasets uses only
part of each rank's data.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.data import UNKNOWN_CARDINALITY, Dataset
from mpidist.data.experimental import AutoShardPolicy
from mpidist.errors import InvalidArgumentError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()


def mwms(local=1):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    return mpidist.MultiWorkerMirroredStrategy(resolver)


def with_policy(dataset, policy):
    options = mpidist.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def rows_of(worker, global_batch):
    """Worker w's own data: 1 + w full global batches and a partial one of w rows, so worker w
    has 1 + w + (w > 0) batches; row i of worker w is [i, i, i] + 1000 w (float32)."""
    n = global_batch * (1 + worker) + worker
    return np.repeat(np.arange(n, dtype=np.float32)[:, None], 3, axis=1) + 1000 * worker


def own_share(batch, W, R, w):
    """The AUTO/DATA split, written out: N = W R sub-batches of ceil(B / N) rows; local replica
    r of worker w takes sub-batch r W + w."""
    per = -(-len(batch) // (W * R))
    return [batch[(r * W + w) * per:(r * W + w + 1) * per] for r in range(R)]


def run_steps(strategy, dist):
    """Per step: this rank's replicas' batches, and the job's sum of the step (a collective
    on every step: the loop that hung)."""
    steps = []
    for batch in dist:
        total = strategy.reduce(mpidist.ReduceOp.SUM,
                                strategy.run(lambda x: x.sum(), args=(batch,)), axis=None)
        steps.append(([np.asarray(b) for b in strategy.experimental_local_results(batch)],
                      float(total)))
    return steps


def distribute_recording_warnings(strategy, dataset):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = strategy.experimental_distribute_dataset(dataset)
    return dist, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.mpi
@pytest.mark.parametrize("local", [1, 2])
def test_datasets_of_different_lengths_stop_together(local):
    s = mwms(local)
    G = 2 * size * local
    dist, warned = distribute_recording_warnings(
        s, Dataset.from_tensor_slices(rows_of(rank, G)).batch(G))

    counts = [len(rows_of(w, G)) for w in range(size)]
    lengths = [-(-c // G) for c in counts]
    longest = max(lengths)
    if size > 1:
        assert dist.cardinality() == longest  # the job's number of steps, the same everywhere
    else:
        assert dist.cardinality() == lengths[0]
    if rank == 0 and size > 1:
        assert len(warned) == 1, warned
        message = warned[0]
        for w in range(size):
            assert f"rank {w}: {lengths[w]} step(s) from {counts[w]} source element(s)" in message
        assert "AutoShardPolicy.OFF" in message and "stops at the same step" in message
    else:
        assert warned == []

    steps = run_steps(s, dist)
    assert comm.allgather(len(steps)) == [longest] * size  # no rank left early, none hung
    mine = rows_of(rank, G)
    for k, (parts, total) in enumerate(steps):
        batch = mine[k * G:(k + 1) * G]
        want = own_share(batch, size, local, rank) if k < lengths[rank] \
            else [np.empty((0, 3), np.float32)] * local
        assert len(parts) == local
        for got, expected in zip(parts, want):
            assert got.dtype == np.float32 and got.shape == expected.shape, (k, got.shape)
            np.testing.assert_array_equal(got, expected)
        job_total = sum(float(sum(p.sum() for p in own_share(rows_of(w, G)[k * G:(k + 1) * G],
                                                              size, local, w)))
                        for w in range(size))
        assert total == pytest.approx(job_total, rel=1e-6)
    # A second pass runs the same steps (the agreement is per iterator, not used up).
    assert len(run_steps(s, dist)) == longest


@pytest.mark.mpi
def test_the_same_dataset_everywhere_needs_no_agreement_per_step():
    """Equal step counts are proven once: iterating issues no collective, so a rank that stops
    early does not block the others (they would otherwise meet it in a per-step all-reduce)."""
    s = mwms(1)
    G = 2 * size
    data = np.arange(5 * G, dtype=np.float64)
    dist, warned = distribute_recording_warnings(s, Dataset.from_tensor_slices(data).batch(G))
    assert warned == [] and dist.cardinality() == 5
    it = iter(dist)
    taken = 1 if rank == 0 else 5
    got = [np.asarray(next(it)).tolist() for _ in range(taken)]
    per = G // size
    assert got == [data[k * G + rank * per:k * G + (rank + 1) * per].tolist() for k in range(taken)]
    # The next collective is the same one on every rank: the job is still in step.
    total = s.reduce(mpidist.ReduceOp.SUM, s.run(lambda: np.float64(rank + 1)), axis=None)
    assert float(total) == size * (size + 1) / 2


@pytest.mark.mpi
def test_same_number_of_steps_from_different_data_warns_and_runs():
    """Ranks whose datasets differ in size but not in batches: no per-step agreement is needed,
    and rank 0 still warns that DATA sharding uses only part of each rank's data."""
    s = mwms(1)
    G = 4 * size
    n = 2 * G - 1 - rank  # two batches on every rank (G >= 4 > rank + 1 at these sizes)
    data = np.arange(n, dtype=np.float64)
    dist, warned = distribute_recording_warnings(s, Dataset.from_tensor_slices(data).batch(G))
    assert dist.cardinality() == 2
    if rank == 0 and size > 1:
        assert len(warned) == 1
        for w in range(size):
            assert f"rank {w}: 2 step(s) from {2 * G - 1 - w} source element(s)" in warned[0]
    else:
        assert warned == []
    steps = run_steps(s, dist)
    assert comm.allgather(len(steps)) == [2] * size


SAME_LENGTH_PIPELINES = {
    # how each rank builds 16 rows: (pipeline, whether the ranks build the same sequence)
    "shuffle(seed=rank)": (lambda x: Dataset.from_tensor_slices(x).shuffle(16, seed=rank), False),
    "range.shuffle(seed=rank)": (lambda x: Dataset.range(16).shuffle(16, seed=rank), False),
    "each rank's own slice": (lambda x: Dataset.from_tensor_slices(
        np.concatenate([x[rank::size], x[:16 - len(x[rank::size])] + 100])), False),
    "a permutation per rank": (lambda x: Dataset.from_tensor_slices(
        np.random.default_rng(rank).permutation(x)), False),
    "shuffle(seed=7)": (lambda x: Dataset.from_tensor_slices(x).shuffle(16, seed=7), True),
    "shuffle()": (lambda x: Dataset.from_tensor_slices(x).shuffle(16), True),
    "map then shuffle(seed=7)": (lambda x: Dataset.from_tensor_slices(x).map(lambda v: v * 2)
                                 .shuffle(16, seed=7), True),
}


@pytest.mark.mpi
@pytest.mark.parametrize("how", SAME_LENGTH_PIPELINES)
def test_ranks_building_different_sequences_of_the_same_length_are_warned(how):
    """DATA sharding keeps each rank's share of every global batch of its own pipeline: ranks
    whose pipelines give the same number of rows in another order or with other content (a
    shuffle seeded with the rank, each rank's own slice of the data) would read some rows twice
    and others never. Rank 0 warns, naming the cause; ranks building the same sequence do not
    warn, and nothing changes in what each rank reads (TF's answer)."""
    s = mwms(1)
    build, same = SAME_LENGTH_PIPELINES[how]
    dist, warned = distribute_recording_warnings(s, build(np.arange(16.0)).batch(4 * size))
    if rank == 0 and size > 1 and not same:
        assert len(warned) == 1, warned
        assert "and give their elements in a different order or with different content (a " \
            "shuffle seeded differently on each worker, e.g. seed=rank, or each worker's own " \
            "slice of the data" in warned[0], warned[0]
    else:
        assert warned == [], warned
    seen = sorted(v for step in run_steps(s, dist) for rows in step[0] for v in rows.tolist())
    everyone = sorted(v for part in comm.allgather(seen) for v in part)
    if same:  # every row once, on one rank
        expected = [2.0 * v for v in range(16)] if how.startswith("map") else list(range(16))
        assert everyone == [float(v) for v in expected]


@pytest.mark.mpi
@pytest.mark.parametrize("local", [1, 2])
def test_generator_and_list_sources_of_different_lengths(local):
    """Rank r reads r + 1 global batches from a source whose length no rank can prove (a
    generator dataset) or from a list: every rank runs as many steps as the longest."""
    s = mwms(local)
    G = 2 * size * local
    batches = [np.full((G, 2), 10 * rank + k, dtype=np.float32) for k in range(rank + 1)]
    generated = Dataset.from_generator(lambda: iter(batches))
    for source in (generated, batches):
        dist, warned = distribute_recording_warnings(s, source)
        if source is batches and size > 1:
            assert dist.cardinality() == size  # every rank proved its list's length
        elif source is generated and size > 1:
            assert dist.cardinality() == UNKNOWN_CARDINALITY
        steps = run_steps(s, dist)
        assert comm.allgather(len(steps)) == [size] * size
        for k, (parts, total) in enumerate(steps):
            for got in parts:
                if k <= rank:
                    assert got.shape == (G // (size * local), 2)
                    assert (got == 10 * rank + k).all()
                else:
                    assert got.shape == (0, 2) and got.dtype == np.float32
            share = G // (size * local) * 2 * local
            assert total == sum(share * (10 * w + k) for w in range(size) if k <= w)


@pytest.mark.mpi
def test_ranks_that_disagree_on_the_policy_get_an_error_on_every_rank():
    s = mwms(1)
    if size == 1:
        pytest.skip("a disagreement needs two ranks; this test runs again at 2 and 4 ranks")
    policy = AutoShardPolicy.OFF if rank == 0 else AutoShardPolicy.DATA
    with pytest.raises(InvalidArgumentError) as info:
        s.experimental_distribute_dataset(with_policy(Dataset.range(4 * size).batch(size), policy))
    message = str(info.value)
    assert "experimental_distribute_dataset's argument auto_shard_policy" in message
    assert "auto_shard_policy=OFF" in message and "auto_shard_policy=DATA" in message
    # The refusal left the ranks in step.
    total = s.reduce(mpidist.ReduceOp.SUM, s.run(lambda: np.float64(1)), axis=None)
    assert float(total) == size


@pytest.mark.mpi
def test_end_of_data_agreement_is_labelled_in_a_mismatch():
    """FILE sharding agrees the end of data every step. A rank that calls another collective
    instead of next(iterator) gets an error that names DistributedIterator.get_next."""
    s = mwms(1)
    if size == 1:
        pytest.skip("a mismatch needs two ranks; this test runs again at 2 and 4 ranks")
    dist = s.experimental_distribute_dataset(
        with_policy(Dataset.range(4 * size).batch(2 * size), AutoShardPolicy.FILE))
    it = iter(dist)
    with pytest.raises(InvalidArgumentError) as info:
        if rank == 0:
            s.reduce(mpidist.ReduceOp.SUM, s.run(lambda: np.float64(1)), axis=None)
        else:
            next(it)
    message = str(info.value)
    assert "DistributedIterator.get_next" in message and "Strategy.reduce" in message
    total = s.reduce(mpidist.ReduceOp.SUM, s.run(lambda: np.float64(2)), axis=None)
    assert float(total) == 2 * size


@pytest.mark.mpi
def test_a_bare_array_is_refused_on_every_rank_before_any_collective():
    s = mwms(1)
    with pytest.raises(TypeError, match=r"numpy\.ndarray of shape \(512, 3\).*"
                                        r"Dataset\.from_tensor_slices\(x\)\.batch\(GLOBAL_BATCH\)"):
        s.experimental_distribute_dataset(np.ones((512, 3)))
    with pytest.raises(TypeError, match="dataset_fn returned a tuple of 2 item"):
        s.distribute_datasets_from_function(lambda ctx: (np.ones((4, 3)), np.ones(4)))
    total = s.reduce(mpidist.ReduceOp.SUM, s.run(lambda: np.float64(3)), axis=None)
    assert float(total) == 3 * size
