"""Distributed input under MultiWorkerMirroredStrategy across real MPI ranks (spec section 7):
how each global batch is split over the replicas of every worker for each auto-shard policy,
that every example is seen exactly once, that the end of data is agreed across workers, and
``distribute_datasets_from_function``.

Each rank records what its replicas received; the records are all-gathered and every rank
checks the union against the spec's rule, computed here for this world size.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

from collections import Counter

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.core import nest
from mpidist.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, TensorSpec
from mpidist.data.experimental import AutoShardPolicy
from mpidist.data.spec import PerReplicaSpec
from mpidist.errors import InvalidArgumentError, OutOfRangeError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

LOCAL = [1, 2, 3, 4]
AUTO, DATA, FILE, OFF = (AutoShardPolicy.AUTO, AutoShardPolicy.DATA, AutoShardPolicy.FILE,
                         AutoShardPolicy.OFF)


def mwms(local=1):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    return mpidist.MultiWorkerMirroredStrategy(resolver)


def reference(local):
    """The in-process MirroredStrategy with every replica of the job."""
    return mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(size * local)])


def with_policy(dataset, policy):
    options = mpidist.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def cases(n_replicas):
    """(dataset size, global batch) pairs: divisible, not divisible, global batch not a multiple
    of the replica count, smaller than it, and larger than the whole dataset. Every size is at
    least 4, so FILE sharding has a source element per worker at every world size tested."""
    n = n_replicas
    return [(6 * n, 2 * n), (6 * n + 1, 2 * n), (13, 2 * n + 1), (7, 3), (11, 1), (5, 8)]


# -- what the ranks saw -----------------------------------------------------------------------
def local_steps(strategy, iterable):
    """This rank's steps: per step, each local replica's batch (NumPy arrays, nests kept)."""
    return [[nest.map_structure(np.asarray, v) for v in strategy.experimental_local_results(step)]
            for step in iterable]


def id_lists(steps):
    return [[np.asarray(batch).tolist() for batch in step] for step in steps]


def gathered(steps):
    """Every rank's steps; all ranks must have run the same number of steps."""
    everyone = comm.allgather(steps)
    assert len({len(s) for s in everyone}) == 1, (
        f"ranks stopped after different numbers of steps: {[len(s) for s in everyone]}")
    return everyone


def seen(everyone):
    """How often each example turned up on any replica of any rank."""
    counts = Counter()
    for steps in everyone:
        for step in steps:
            for batch in step:
                counts.update(np.asarray(batch).ravel().tolist())
    return counts


# -- the spec's rules, for the expected values ------------------------------------------------
def global_batches(ids, batch, drop):
    out = [list(ids[i:i + batch]) for i in range(0, len(ids), batch)]
    return [b for b in out if len(b) == batch] if drop else out


def legacy_split(batches, W, R, w):
    """AUTO / DATA: each batch of B in N = W*R sub-batches of ceil(B/N); local replica r of
    worker w gets global sub-batch k = r*W + w."""
    n = W * R
    steps = []
    for b in batches:
        per = -(-len(b) // n)
        steps.append([b[k * per:(k + 1) * per] for k in (r * W + w for r in range(R))])
    return steps


def balanced_split(stream, batch, W, R, w):
    """OFF / FILE: the worker's stream of elements cut into sub-batches cycling through
    [floor+1]*extra + [floor]*(N-extra), rotated left by w*R; R sub-batches per step."""
    n = W * R
    floor, extra = divmod(batch, n)
    sizes = [floor + 1] * extra + [floor] * (n - extra)
    shift = (w * R) % n
    sizes = sizes[shift:] + sizes[:shift]
    steps, pos, i = [], 0, 0
    while pos < len(stream):
        step = []
        for _ in range(R):
            k = sizes[i % n]
            i += 1
            step.append(list(stream[pos:pos + k]))
            pos += k
        steps.append(step)
    return steps


def worker_stream(policy, n, batch, drop, W, w):
    """The elements worker w reads (before the split into sub-batches)."""
    ids = list(range(w, n, W)) if policy is FILE and W > 1 else list(range(n))
    return [i for b in global_batches(ids, batch, drop) for i in b]


def expected_steps(policy, n, batch, drop, W, R):
    """Per worker, its replicas' ids per step, padded with empty batches to the common end."""
    if policy in (AUTO, DATA):
        per_worker = [legacy_split(global_batches(list(range(n)), batch, drop), W, R, w)
                      for w in range(W)]
    else:
        per_worker = [balanced_split(worker_stream(policy, n, batch, drop, W, w), batch, W, R, w)
                      for w in range(W)]
    end = max(len(s) for s in per_worker)
    return [s + [[[]] * R] * (end - len(s)) for s in per_worker]


def expected_examples(policy, n, batch, drop, W):
    """Which examples a full epoch over all replicas of all workers gives, with multiplicity."""
    if policy in (AUTO, DATA):
        return Counter(i for b in global_batches(list(range(n)), batch, drop) for i in b)
    workers = range(W) if policy is FILE else [0] * W
    return Counter(i for w in workers for i in worker_stream(policy, n, batch, drop, W, w))


# -- experimental_distribute_dataset: every example exactly once --------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("policy", [AUTO, DATA, FILE], ids=lambda p: p.name)
@pytest.mark.parametrize("drop", [False, True], ids=["partial", "drop_remainder"])
def test_every_example_exactly_once(local, policy, drop):
    s = mwms(local)
    for n, batch in cases(size * local):
        ds = with_policy(Dataset.range(n).batch(batch, drop_remainder=drop), policy)
        everyone = gathered(id_lists(local_steps(s, s.experimental_distribute_dataset(ds))))
        want = expected_examples(policy, n, batch, drop, size)
        assert seen(everyone) == want, (n, batch)
        assert all(c == 1 for c in want.values())
        if not drop or policy is not FILE:
            full = (n // batch) * batch if drop else n
            assert sorted(want) == list(range(full))
        if policy in (AUTO, DATA):
            assert len(everyone[0]) == ds.cardinality(), (n, batch)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("drop", [False, True], ids=["partial", "drop_remainder"])
def test_off_gives_every_worker_every_example(local, drop):
    s = mwms(local)
    for n, batch in cases(size * local):
        ds = with_policy(Dataset.range(n).batch(batch, drop_remainder=drop), OFF)
        steps = id_lists(local_steps(s, s.experimental_distribute_dataset(ds)))
        everyone = gathered(steps)
        full = (n // batch) * batch if drop else n
        for w, worker in enumerate(everyone):
            assert seen([worker]) == Counter(range(full)), (n, batch, w)
        assert seen(everyone) == Counter({i: size for i in range(full)})


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("policy", [DATA, FILE], ids=lambda p: p.name)
def test_repeat_gives_every_example_twice(local, policy):
    s = mwms(local)
    n, batch = 4 * size * local + 3, 2 * size * local + 1
    for ds in (Dataset.range(n).repeat(2).batch(batch),
               Dataset.range(n).shuffle(n).repeat(2).batch(batch)):
        dist = s.experimental_distribute_dataset(with_policy(ds, policy))
        everyone = gathered(id_lists(local_steps(s, dist)))
        assert seen(everyone) == Counter({i: 2 for i in range(n)})


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("policy", [DATA, FILE], ids=lambda p: p.name)
@pytest.mark.parametrize("seed", [None, 7], ids=["unseeded", "seeded"])
def test_shuffled_input_is_split_without_loss_or_duplication(local, policy, seed):
    s = mwms(local)
    W, R = size, local
    n, batch = 6 * W * R + 5, 2 * W * R + 1

    def build():
        return with_policy(Dataset.range(n).shuffle(n, seed=seed).batch(batch), policy)

    dist = s.experimental_distribute_dataset(build())
    epoch0 = gathered(id_lists(local_steps(s, dist)))
    epoch1 = gathered(id_lists(local_steps(s, dist)))
    rebuilt = gathered(id_lists(local_steps(s, s.experimental_distribute_dataset(build()))))
    for everyone in (epoch0, epoch1, rebuilt):
        assert seen(everyone) == Counter(range(n))
    assert epoch0 != epoch1  # a new order each epoch (reshuffle_each_iteration)
    streams = [[i for step in worker for b in step for i in b] for worker in epoch0]
    assert any(st != sorted(st) for st in streams)  # shuffled at all
    if seed is not None:
        assert rebuilt == epoch0  # the same order from a separately built pipeline
        if policy is DATA:
            # Every worker read the very order of a local pass over the same pipeline.
            local_pass = [b.tolist() for b in Dataset.range(n).shuffle(n, seed=seed).batch(batch)]
            assert epoch0 == [legacy_split(local_pass, W, R, w) for w in range(W)]


# -- the exact split -----------------------------------------------------------------------------
@pytest.mark.mpi
def test_spec_example_range_14_batch_8():
    """Spec 7.1 (MWMS, range(14).batch(8), AUTO -> DATA), written out per world size."""
    s = mwms(1)
    want = {
        1: [[[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13]]],
        2: [[[0, 1, 2, 3], [8, 9, 10]], [[4, 5, 6, 7], [11, 12, 13]]],
        4: [[[0, 1], [8, 9]], [[2, 3], [10, 11]], [[4, 5], [12, 13]], [[6, 7], []]],
    }
    dist = s.experimental_distribute_dataset(Dataset.range(14).batch(8))
    got = gathered([ids for (ids,) in id_lists(local_steps(s, dist))])
    if size in want:
        assert got == want[size]
    assert got == [[b[0] for b in worker] for worker in expected_steps(DATA, 14, 8, False, size, 1)]


SPLIT_CASES = [(14, 8, False), (13, 6, False), (10, 4, False), (9, 3, False), (5, 3, False),
               (9, 4, True)]


def split_cases(n_replicas):
    n = n_replicas
    return SPLIT_CASES + [(6 * n + 1, 2 * n + 1, False), (4 * n + 3, 2 * n, True)]


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_data_split_of_dict_elements(local):
    """AUTO -> DATA, dict elements (int64 ids, float32 rows of 3): every replica's sub-batch on
    every rank is the one the legacy rule gives, empty ones included, with the element's
    structure, dtypes and trailing shapes."""
    s = mwms(local)
    for n, batch, drop in split_cases(size * local):
        ids = np.arange(n)
        rows = (np.arange(n * 3) % 1000).astype(np.float32).reshape(n, 3)
        ds = Dataset.from_tensor_slices({"id": ids, "x": rows}).batch(batch, drop_remainder=drop)
        steps = local_steps(s, s.experimental_distribute_dataset(ds))
        for step in steps:
            assert len(step) == local
            for item in step:
                assert isinstance(item, dict) and set(item) == {"id", "x"}, item
                assert item["id"].dtype == np.int64 and item["id"].ndim == 1
                assert item["x"].dtype == np.float32 and item["x"].shape == (len(item["id"]), 3)
                np.testing.assert_array_equal(item["x"], rows[item["id"]])
        everyone = gathered([[item["id"].tolist() for item in step] for step in steps])
        assert everyone == expected_steps(DATA, n, batch, drop, size, local), (n, batch, drop)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("policy", [OFF, FILE], ids=lambda p: p.name)
def test_balanced_split(local, policy):
    """OFF / FILE, float32 rows of 3 (row i = 3i, 3i+1, 3i+2): every replica's sub-batch on
    every rank is the one the balanced rule gives, empty ones (0, 3) float32."""
    s = mwms(local)
    for n, batch, drop in split_cases(size * local):
        if policy is FILE and n < size:
            continue
        rows = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        ds = Dataset.from_tensor_slices(rows).batch(batch, drop_remainder=drop)
        steps = local_steps(s, s.experimental_distribute_dataset(with_policy(ds, policy)))
        for step in steps:
            assert len(step) == local
            for b in step:
                assert b.dtype == np.float32 and b.ndim == 2 and b.shape[1] == 3, b
                np.testing.assert_array_equal(b, rows[(b[:, 0] // 3).astype(int)])
        everyone = gathered([[(b[:, 0] // 3).astype(int).tolist() for b in step]
                             for step in steps])
        want = expected_steps(policy, n, batch, drop, size, local)
        assert everyone == want, (n, batch, drop)


# -- end of data agreed across workers -----------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_uneven_end_gives_empty_batches_and_a_common_stop(local):
    """FILE sharding of 2W+1 rows in batches of 2: worker 0 reads 3 rows, the others 2, so the
    workers run out at different steps; the short ones get empty float32 (0, 3) batches until
    no worker has data, then every rank stops at the same step."""
    s = mwms(local)
    n = 2 * size + 1
    rows = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    ds = with_policy(Dataset.from_tensor_slices(rows).batch(2), FILE)
    dist = s.experimental_distribute_dataset(ds)

    it = iter(dist)
    first = []
    while True:
        try:
            step = it.get_next()
        except OutOfRangeError:
            break
        first.append([np.asarray(b) for b in s.experimental_local_results(step)])
    for _ in range(3):  # the end is sticky and needs no other rank
        with pytest.raises(OutOfRangeError, match="End of sequence"):
            it.get_next()
        assert not it.get_next_as_optional().has_value()
    with pytest.raises(StopIteration):
        next(it)

    it = iter(dist)  # a second pass, through get_next_as_optional
    second = []
    while True:
        optional = it.get_next_as_optional()
        if not optional.has_value():
            break
        second.append([np.asarray(b) for b in s.experimental_local_results(optional.get_value())])

    for steps in (first, second):
        for step in steps:
            assert len(step) == local
            for b in step:
                assert b.dtype == np.float32 and b.ndim == 2 and b.shape[1] == 3
    assert id_lists([[b[:, 0] // 3 for b in step] for step in first]) == \
        id_lists([[b[:, 0] // 3 for b in step] for step in second])
    everyone = gathered([[(b[:, 0] // 3).astype(int).tolist() for b in step] for step in first])
    assert seen(everyone) == Counter(range(n))
    want = expected_steps(FILE, n, 2, False, size, local)
    assert everyone == want
    if size > 1:
        # The workers' shares really differ: some rank had an empty batch while another had data.
        assert len({sum(len(b) > 0 for step in worker for b in step) for worker in want}) > 1
        assert any(len(b) == 0 for worker in everyone for step in worker for b in step)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("extra", [1, 0], ids=["r+1_batches", "r_batches"])
def test_from_function_pipelines_of_different_lengths(local, extra):
    """Rank r's pipeline has r + extra batches of 2 float32 rows of 3: every rank runs as many
    steps as the longest needs, padded with (0, 3) float32 batches (rank 0 may have none)."""
    s = mwms(local)

    def rows_of(worker):
        k = 2 * (worker + extra)
        return np.arange(k * 3, dtype=np.float32).reshape(k, 3) + 1000 * worker

    def dataset_fn(ctx):
        return Dataset.from_tensor_slices(rows_of(ctx.input_pipeline_id)).batch(2)

    dist = s.distribute_datasets_from_function(dataset_fn)
    steps = local_steps(s, dist)
    gathered([[len(b) for b in step] for step in steps])  # the same number of steps everywhere
    assert len(steps) == -(-(size - 1 + extra) // local)
    mine = rows_of(rank)
    for k, step in enumerate(steps):
        assert len(step) == local
        for i, b in enumerate(step):
            j = k * local + i
            want = mine[2 * j:2 * j + 2] if j < rank + extra else np.empty((0, 3), np.float32)
            assert b.dtype == np.float32 and b.shape == want.shape, (k, i, b.shape)
            np.testing.assert_array_equal(b, want)


# -- distribute_datasets_from_function -----------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_from_function_input_context_and_split(local):
    s = mwms(local)
    N = size * local
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        per = ctx.get_per_replica_batch_size(4 * N)
        return Dataset.range(14 * N + 3).batch(per).shard(ctx.num_input_pipelines,
                                                         ctx.input_pipeline_id)

    dist = s.distribute_datasets_from_function(dataset_fn)
    assert len(contexts) == 1
    ctx = contexts[0]
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == \
        (size, rank, N)
    assert ctx.get_per_replica_batch_size(4 * N) == 4
    if N > 1:
        with pytest.raises(ValueError, match=f"`global_batch_size` {4 * N + 1} is not divisible "
                                             f"by `num_replicas_in_sync` {N} "):
            ctx.get_per_replica_batch_size(4 * N + 1)

    everyone = gathered(id_lists(local_steps(s, dist)))
    assert seen(everyone) == Counter(range(14 * N + 3))
    # Worker w's pipeline holds per-replica batches w, w+W, ...; its replicas take them in turn.
    batches = global_batches(list(range(14 * N + 3)), 4, False)
    for w, worker in enumerate(everyone):
        mine = batches[w::size]
        flat = [b for step in worker for b in step]
        assert flat[:len(mine)] == mine and all(b == [] for b in flat[len(mine):])
    # An unseeded shuffle before shard(): the workers agree its order, so shard() still splits
    # one permutation and every example comes exactly once.
    n = 7 * N + 3
    shuffled = gathered(id_lists(local_steps(s, s.distribute_datasets_from_function(
        lambda c: Dataset.range(n).shuffle(n).shard(c.num_input_pipelines, c.input_pipeline_id)
        .batch(c.get_per_replica_batch_size(2 * N))))))
    assert seen(shuffled) == Counter(range(n))
    if (size, local) == (2, 1):  # spec 7.3: range(14).batch(4).shard(W, id), 2 workers
        small = gathered(id_lists(local_steps(s, s.distribute_datasets_from_function(
            lambda c: Dataset.range(14).batch(4).shard(c.num_input_pipelines,
                                                       c.input_pipeline_id)))))
        assert small == [[[[0, 1, 2, 3]], [[8, 9, 10, 11]]], [[[4, 5, 6, 7]], [[12, 13]]]]


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_per_replica_mode_is_refused(local):
    s = mwms(local)
    options = mpidist.InputOptions(
        experimental_replication_mode=mpidist.InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match="only supported in "
                                                  "`distribute_datasets_from_function` of"):
        s.distribute_datasets_from_function(lambda ctx: Dataset.range(4).batch(2), options)
    with pytest.raises(NotImplementedError, match="only supported in "
                                                  "`distribute_datasets_from_function`"):
        s.experimental_distribute_dataset(Dataset.range(4).batch(2), options)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_training_loop_sums_match_the_data(local):
    """distributed dataset -> strategy.run(x.sum()) -> strategy.reduce(SUM) per step: the global
    batch's sum (as the in-process MirroredStrategy with every replica computes it), and over
    an epoch the sum of all data, for each input path."""
    s, ref = mwms(local), reference(local)
    N = size * local
    data = np.random.default_rng(0).random((5 * N + 3, 4))
    batch = 2 * N

    def step_sums(strategy, dist):
        return [float(strategy.reduce(mpidist.ReduceOp.SUM,
                                      strategy.run(lambda x: x.sum(), args=(b,)), axis=None))
                for b in dist]

    ds = Dataset.from_tensor_slices(data).batch(batch)
    got = step_sums(s, s.experimental_distribute_dataset(ds))
    want = step_sums(ref, ref.experimental_distribute_dataset(ds))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got, [data[i:i + batch].sum() for i in range(0, len(data), batch)],
                               rtol=1e-12)

    # MEAN along the batch axis divides by the global batch's true size, on every step.
    means = [s.reduce(mpidist.ReduceOp.MEAN, b, axis=0)
             for b in s.experimental_distribute_dataset(ds)]
    assert len(means) == len(got)
    for k, m in enumerate(means):
        np.testing.assert_allclose(m, data[k * batch:(k + 1) * batch].mean(axis=0), rtol=1e-12)

    for policy, times in ((FILE, 1), (OFF, size)):
        total = sum(step_sums(s, s.experimental_distribute_dataset(with_policy(ds, policy))))
        np.testing.assert_allclose(total, times * data.sum(), rtol=1e-12)

    def dataset_fn(ctx):
        return (Dataset.from_tensor_slices(data)
                .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
                .batch(ctx.get_per_replica_batch_size(batch)))

    total = sum(step_sums(s, s.distribute_datasets_from_function(dataset_fn)))
    np.testing.assert_allclose(total, data.sum(), rtol=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_plain_list_of_global_batches(local):
    """A Python list of global batches is split as a DATA-sharded dataset would be."""
    s = mwms(local)
    N = size * local
    n, batch = 5 * N + 3, 2 * N + 1
    ids = np.arange(n)
    arrays = [ids[i:i + batch] for i in range(0, n, batch)]
    pairs = [(a, a.astype(np.float32) / 2) for a in arrays]
    want = expected_steps(DATA, n, batch, False, size, local)

    dist = s.experimental_distribute_dataset(arrays)
    assert dist.cardinality() == len(arrays)
    assert gathered(id_lists(local_steps(s, dist))) == want

    steps = local_steps(s, s.experimental_distribute_dataset(pairs))
    for step in steps:
        for a, half in step:
            assert a.dtype == ids.dtype and half.dtype == np.float32
            np.testing.assert_array_equal(half, a / 2)
    assert gathered([[a.tolist() for a, _ in step] for step in steps]) == want


# -- element_spec, cardinality, errors -----------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_element_spec_and_cardinality(local):
    s = mwms(local)
    N = size * local

    def spec(shape, dtype=np.int64):
        one = TensorSpec(shape, dtype)
        return one if local == 1 else PerReplicaSpec(*[one] * local)

    exact = Dataset.range(10 * N + 3).batch(4 * N, drop_remainder=True)
    partial = Dataset.range(10 * N + 3).batch(4 * N)
    d = s.experimental_distribute_dataset(exact)
    assert d.element_spec == spec((4,)) and iter(d).element_spec == d.element_spec
    assert d.cardinality() == exact.cardinality() == (10 * N + 3) // (4 * N)
    d = s.experimental_distribute_dataset(partial)
    assert d.element_spec == spec((None,))
    assert d.cardinality() == partial.cardinality() == -(-(10 * N + 3) // (4 * N))
    assert s.experimental_distribute_dataset(with_policy(partial, AUTO)).cardinality() == \
        partial.cardinality()
    for policy in (FILE, OFF):
        card = s.experimental_distribute_dataset(with_policy(partial, policy)).cardinality()
        assert card == (UNKNOWN_CARDINALITY if size > 1 else partial.cardinality())
    with pytest.raises(TypeError):
        len(d)

    def dataset_fn(ctx):
        return Dataset.from_tensor_slices(np.zeros((6, 3), np.float32)).batch(2)

    d = s.distribute_datasets_from_function(dataset_fn)
    assert d.element_spec == spec((None, 3), np.float32)
    assert d.cardinality() == (UNKNOWN_CARDINALITY if size > 1 else -(-3 // local))

    # An infinite dataset: cardinality says so, and the ranks can stop after any step together.
    infinite = s.experimental_distribute_dataset(Dataset.range(3).repeat().batch(4))
    assert infinite.cardinality() == INFINITE_CARDINALITY
    it = iter(infinite)
    got = [[np.asarray(b).tolist() for b in s.experimental_local_results(next(it))]
           for _ in range(3)]
    stream = [i % 3 for i in range(12)]
    want = legacy_split(global_batches(stream, 4, False), size, local, rank)
    assert got == want
    if (size, local) == (1, 2):  # spec 7.1: range(3).repeat().batch(4), N = 2
        assert got[:2] == [[[0, 1], [2, 0]], [[1, 2], [0, 1]]]


@pytest.mark.mpi
def test_input_errors_are_raised_on_every_rank():
    s = mwms(1)
    few = with_policy(Dataset.range(size - 1).batch(1), FILE)
    if size == 1:
        assert local_steps(s, s.experimental_distribute_dataset(few)) == []  # FILE: a no-op
    else:
        with pytest.raises(InvalidArgumentError,
                           match=f"Could not apply FILE based sharding: the dataset only has "
                                 f"{size - 1} file\\(s\\), which is not enough for the required "
                                 f"{size} shards/workers"):
            s.experimental_distribute_dataset(few)
    with pytest.raises(ValueError, match="no batch to split"):
        s.experimental_distribute_dataset(Dataset.range(4))
    for policy in (AUTO, OFF):  # an empty dataset: no step on any rank, and no hang
        assert gathered(local_steps(s, s.experimental_distribute_dataset(
            with_policy(Dataset.range(0).batch(4), policy)))) == [[]] * size
    # The job is still in step after the refusals.
    everyone = gathered(id_lists(local_steps(
        s, s.experimental_distribute_dataset(Dataset.range(2 * size).batch(2 * size)))))
    assert seen(everyone) == Counter(range(2 * size))


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("policy", [OFF, FILE], ids=lambda p: p.name)
def test_balanced_split_keeps_the_element_structure(local, policy):
    """Dict elements under OFF / FILE: a worker whose first slots are empty still gets dicts of
    empty batches with the right dtypes and trailing shapes (not a bare leaf)."""
    s = mwms(local)
    n = 4 * size * local
    data = {"id": np.arange(n), "x": np.arange(n * 3, dtype=np.float32).reshape(n, 3)}
    ds = with_policy(Dataset.from_tensor_slices(data).batch(local), policy)
    steps = local_steps(s, s.experimental_distribute_dataset(ds))
    assert steps
    for step in steps:
        for item in step:
            assert set(item) == {"id", "x"}
            assert item["id"].dtype == np.int64 and item["x"].dtype == np.float32
            assert item["x"].shape == (len(item["id"]), 3)
            np.testing.assert_array_equal(item["x"], data["x"][item["id"]])
    everyone = gathered([[item["id"].tolist() for item in step] for step in steps])
    assert everyone == expected_steps(policy, n, local, False, size, local)
