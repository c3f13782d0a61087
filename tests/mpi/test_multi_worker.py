"""MultiWorkerMirroredStrategy across real MPI ranks: the same numbers as a MirroredStrategy
with the same total replicas, computed in-process on every rank as the reference.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.core import nest
from mpidist.cluster_resolver import MPIClusterResolver, TFConfigClusterResolver
from mpidist.experimental import CommunicationOptions
from mpidist.ops import collective_all_reduce

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

LOCAL = [1, 2]


def mwms(local=1, **options):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    opts = CommunicationOptions(**options) if options else None
    return mpidist.MultiWorkerMirroredStrategy(resolver, opts)


def reference(local):
    """The in-process MirroredStrategy with every replica of the job."""
    return mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(size * local)])


def rid():
    return int(mpidist.get_replica_context().replica_id_in_sync_group)


def value_of(replica, shape=(3,), dtype=np.float64):
    return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * (replica + 1)
            + replica / 4).astype(dtype)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_roles_and_replica_ids(local):
    s = mwms(local)
    assert s.num_replicas_in_sync == size * local
    assert s.extended.worker_devices == tuple(
        f"/job:worker/replica:0/task:{rank}/device:CPU:{i}" for i in range(local))
    assert s.extended.should_checkpoint is (rank == 0)
    assert s.extended.should_save_summary is (rank == 0)
    assert s.extended.experimental_should_init is True
    assert s.extended.experimental_between_graph is True
    ids = s.experimental_local_results(s.run(rid))
    assert list(ids) == [rank * local + i for i in range(local)]
    everyone = comm.allgather(list(ids))
    assert sorted(sum(everyone, [])) == list(range(size * local))


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
def test_reduce_matches_mirrored(local, op, dtype):
    s, ref = mwms(local), reference(local)
    got = s.reduce(op, s.run(lambda: value_of(rid(), (2, 3), dtype)), axis=None)
    want = ref.reduce(op, ref.run(lambda: value_of(rid(), (2, 3), dtype)), axis=None)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == np.float16 else 1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("axis", [0, 1, (0, 1)])
def test_reduce_along_axis_with_unequal_batches(local, axis):
    """MEAN along an axis divides by the true global count though ranks hold different sizes."""
    s, ref = mwms(local), reference(local)

    def step():
        r = rid()
        return np.arange((r + 1) * 2, dtype=np.float64).reshape(r + 1, 2) + r

    axis_arg = axis
    for op in ("SUM", "MEAN"):
        if axis == 1:
            continue  # rows differ per replica: only axis 0 / both are defined
        got = s.reduce(op, s.run(step), axis=axis_arg)
        want = ref.reduce(op, ref.run(step), axis=axis_arg)
        np.testing.assert_allclose(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_replica_context_collectives(local):
    s, ref = mwms(local), reference(local)

    def step():
        ctx = mpidist.get_replica_context()
        r = rid()
        nested = {"a": value_of(r), "b": (np.int64(r + 1), value_of(r, (2, 2), np.float32))}
        return (ctx.all_reduce("SUM", nested), ctx.all_reduce("MEAN", value_of(r)),
                ctx.all_gather(np.arange(r + 1, dtype=np.float64), axis=0))

    got_all = s.experimental_local_results(s.run(step))
    want_all = ref.experimental_local_results(ref.run(step))
    assert len(got_all) == local
    for got, want in zip(got_all, want_all[rank * local:]):
        flat_got, flat_want = nest.flatten(got), nest.flatten(want)
        assert len(flat_got) == len(flat_want) == 5
        for g, w in zip(flat_got, flat_want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w))


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_gather_with_unequal_leading_dims(local):
    s = mwms(local)
    values = s.run(lambda: np.full((rid() % 3 + 1, 2), float(rid())))
    got = s.gather(values, axis=0)
    want = np.concatenate([np.full((r % 3 + 1, 2), float(r)) for r in range(size * local)])
    np.testing.assert_array_equal(got, want)
    got1 = s.gather(s.run(lambda: np.full((2, rid() + 1), rid())), axis=1)
    want1 = np.concatenate([np.full((2, r + 1), r) for r in range(size * local)], axis=1)
    np.testing.assert_array_equal(got1, want1)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("bytes_per_pack", [0, 1, 4000])
def test_batch_reduce_packs_match_mirrored(local, bytes_per_pack):
    s, ref = mwms(local, bytes_per_pack=bytes_per_pack), reference(local)
    shapes = [(10,), (3, 7), (1000,), (5,), (2, 2, 2)]
    dtypes = [np.float32, np.float64, np.float32, np.int64, np.float32]

    def step():
        return tuple(value_of(rid(), sh, dt) for sh, dt in zip(shapes, dtypes))

    for op in ("SUM", "MEAN"):
        pr_s, pr_r = s.run(step), ref.run(step)
        got = s.extended.batch_reduce_to(op, [(v, "/cpu:0") for v in pr_s])
        want = ref.extended.batch_reduce_to(op, [(v, "/cpu:0") for v in pr_r])
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


@pytest.mark.mpi
def test_plain_value_is_each_workers_own():
    """TF: a host value reduced with SUM is summed across workers; MEAN averages them."""
    s = mwms(1)
    assert float(s.reduce("SUM", np.float64(1.0), axis=None)) == size
    assert float(s.reduce("MEAN", np.float64(rank + 1.0), axis=None)) == (size + 1) / 2


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_variables_start_from_the_chiefs_value(local):
    s = mwms(local)
    with s.scope():
        v = mpidist.Variable(np.random.default_rng(rank).random(4))
    chief = np.random.default_rng(0).random(4)
    for component in s.experimental_local_results(v):
        np.testing.assert_array_equal(np.asarray(component), chief)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("aggregation", ["SUM", "MEAN", "ONLY_FIRST_REPLICA"])
def test_mirrored_variable_updates_match_mirrored(local, aggregation):
    results = []
    for strategy in (mwms(local), reference(local)):
        with strategy.scope():
            v = mpidist.Variable(np.full(3, 10.0), aggregation=mpidist.VariableAggregation[aggregation])
        strategy.run(lambda: v.assign_add(value_of(rid())))
        results.append([np.asarray(c) for c in strategy.experimental_local_results(v)])
    for got in results[0]:
        np.testing.assert_allclose(got, results[1][0])


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("aggregation", ["SUM", "MEAN"])
def test_sync_on_read_aggregates_across_workers(local, aggregation):
    s = mwms(local)
    with s.scope():
        v = mpidist.Variable(0.0, synchronization=mpidist.VariableSynchronization.ON_READ,
                             aggregation=mpidist.VariableAggregation[aggregation])
    s.run(lambda: v.assign(float(rid() + 1)))
    n = size * local
    expected = n * (n + 1) / 2 if aggregation == "SUM" else (n + 1) / 2
    assert float(np.asarray(v.read_value())) == expected


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_merge_call_reduces_across_workers(local):
    s = mwms(local)

    def merge_fn(strategy, value):
        return strategy.reduce("SUM", value, axis=None)

    def step():
        return mpidist.get_replica_context().merge_call(merge_fn, args=(np.float64(rid() + 1),))

    n = size * local
    for out in s.experimental_local_results(s.run(step)):
        assert float(out) == n * (n + 1) / 2


@pytest.mark.mpi
def test_large_all_reduce_takes_the_shared_memory_path_and_is_exact():
    s = mwms(1)
    comm_obj = s.extended.communicator
    n = (comm_obj.shm_min_bytes or 0) // 4 + 12345
    for dtype in (np.float32, np.int32, np.float64):
        got = s.reduce("SUM", s.run(lambda: np.full(n, rid() + 1, dtype=dtype)), axis=None)
        assert got.dtype == dtype and got.shape == (n,)
        assert np.all(got == size * (size + 1) // 2)


@pytest.mark.mpi
def test_per_call_options_merge_and_validation():
    s = mwms(1, bytes_per_pack=1, timeout_seconds=30)
    pr = s.run(lambda: np.ones(3))
    out = s.extended.reduce_to("SUM", pr, "/cpu:0", options=CommunicationOptions(timeout_seconds=5))
    np.testing.assert_array_equal(out, np.full(3, float(size)))
    with pytest.raises(ValueError, match="communication_options must be an instance"):
        mpidist.MultiWorkerMirroredStrategy(communication_options={"timeout_seconds": 1})
    with pytest.raises(ValueError, match="cluster_resolver must be an instance"):
        mpidist.MultiWorkerMirroredStrategy(cluster_resolver="worker")


@pytest.mark.mpi
def test_mpi_cluster_resolver_describes_the_world():
    resolver = MPIClusterResolver()
    spec = resolver.cluster_spec()
    assert spec.num_tasks("worker") == size
    assert resolver.task_type == "worker" and resolver.task_id == rank
    assert 0 <= resolver.local_rank < resolver.local_size <= size
    assert resolver.local_devices() == ["/cpu:0"]  # no GPU in this test job
    assert resolver.num_accelerators() == {}


@pytest.mark.mpi
def test_tf_config_resolver_is_checked_against_the_rank(monkeypatch):
    cluster = {"worker": [f"localhost:{2000 + r}" for r in range(size)]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                 "task": {"type": "worker", "index": rank}}))
    s = mpidist.MultiWorkerMirroredStrategy(TFConfigClusterResolver())
    assert s.num_replicas_in_sync == size
    assert s.extended.should_checkpoint is (rank == 0)
    if size > 1:
        wrong = {"cluster": cluster, "task": {"type": "worker", "index": (rank + 1) % size}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(wrong))
        with pytest.raises(ValueError, match=f"it is MPI rank {rank} of {size}"):
            mpidist.MultiWorkerMirroredStrategy(TFConfigClusterResolver())


@pytest.mark.mpi
def test_no_launch_variable_contradicts_the_world():
    from mpidist.comm.mpi import launcher_world_size

    announced = launcher_world_size()
    assert announced is None or announced[1] == size, (announced, os.environ.get("PMI_SIZE"))


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("bytes_per_pack", [0, 64])
def test_one_dtype_batch_takes_the_packed_path_and_results_stay_valid(dtype, bytes_per_pack,
                                                                     monkeypatch):
    """One replica per rank and one dtype: the batch is packed by one concatenate into a
    recycled buffer; results of an earlier call must survive a later one."""
    s, ref = mwms(1, bytes_per_pack=bytes_per_pack), reference(1)
    shapes = [(7,), (3, 4), (50,), (), (4, 3)]

    def step():
        vals = [value_of(rid(), sh, dtype) if sh else np.array(rid() + 2, dtype) for sh in shapes]
        vals[4] = vals[4].T.copy().T  # a non-contiguous (transposed) replica value
        return tuple(vals)

    taken = []
    packed = collective_all_reduce.CollectiveAllReduce._batch_reduce_host_arrays

    def spy(self, *args):
        taken.append(True)
        return packed(self, *args)

    monkeypatch.setattr(collective_all_reduce.CollectiveAllReduce, "_batch_reduce_host_arrays", spy)
    first = s.extended.batch_reduce_to("SUM", [(v, "/cpu:0") for v in s.run(step)])
    assert taken == [True] or size == 1  # one rank: TF's local shortcut, no collective
    kept = [np.array(x, copy=True) for x in first]
    for op in ("SUM", "MEAN"):
        got = s.extended.batch_reduce_to(op, [(v, "/cpu:0") for v in s.run(step)])
        want = ref.extended.batch_reduce_to(op, [(v, "/cpu:0") for v in ref.run(step)])
        for g, w in zip(got, want):
            assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == np.asarray(w).dtype
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    for x, k in zip(first, kept):
        np.testing.assert_array_equal(x, k)


@pytest.mark.mpi
def test_blas_threads_are_shared_out_among_the_ranks_of_a_node():
    from threadpoolctl import threadpool_info

    from mpidist.backend.threads import threads_per_rank

    mwms(1)
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    expected = threads_per_rank(local, "auto")
    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas, "NumPy's BLAS was not found by threadpoolctl"
    if expected is not None:
        assert all(n == expected for n in blas), (blas, expected)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_sync_on_read_only_first_replica_reads_the_chiefs_copy(local):
    s = mwms(local)
    with s.scope():
        v = mpidist.Variable(0.0, synchronization=mpidist.VariableSynchronization.ON_READ,
                             aggregation=mpidist.VariableAggregation.ONLY_FIRST_REPLICA)
    s.run(lambda: v.assign(float(rid() + 1), read_value=False))
    with s.scope():
        assert float(v.read_value()) == 1.0  # global replica 0 lives on the chief
        assert float(np.asarray(s.extended.read_var(v))) == 1.0
    assert [float(c.numpy()) for c in v.values] == [rank * local + i + 1.0 for i in range(local)]
