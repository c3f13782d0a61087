"""The lean path of ``strategy.run`` + ``ReplicaContext.all_reduce`` with one replica per rank:
the same numbers, dtypes, result types and labels as the merge_call path, a new result array
(the input untouched, earlier results never overwritten), and no merge_call on the way.

The reference is an in-process MirroredStrategy holding every replica of the job, which takes
the merge_call path. Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.comm.communicator import world_communicator
from mpidist.core.user_calls import current_calls
from mpidist.strategies.replica_context import ReplicaContext

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

DTYPES = ["float32", "float64", "int32", "int64", "float16", "int8", "complex64"]


@pytest.fixture(scope="module")
def strategy():
    return mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=["/cpu:0"]))


def value_of(replica, shape=(5,), dtype="float64"):
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return (base * (replica + 1) + replica).astype(dtype)


def reference(fn, args_of):
    """``fn(*args_of(replica))`` on every replica of the job, all in this process (the merge_call
    path): this rank's replica's result."""
    ref = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(size)])
    per_replica = ref.experimental_distribute_values_from_function(
        lambda ctx: args_of(ctx.replica_id_in_sync_group))
    results = ref.run(lambda args: fn(*args), args=(per_replica,))
    return ref.experimental_local_results(results)[rank]


def assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
        return
    if isinstance(want, (int, float)):
        assert got == want
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def all_reduce(op):
    return lambda value: mpidist.get_replica_context().all_reduce(op, value)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("shape", [(5,), (), (2, 3)], ids=["1d", "0d", "2d"])
def test_one_array_as_the_merge_path_gives_it(strategy, dtype, op, shape):
    x = value_of(rank, shape, dtype)
    before = x.copy()
    got = strategy.run(all_reduce(op), args=(x,))
    want = reference(all_reduce(op), lambda r: (value_of(r, shape, dtype),))
    assert_same(got, want)
    if size > 1:
        assert got is not x and not np.shares_memory(got, x)
    np.testing.assert_array_equal(x, before)  # the input untouched


@pytest.mark.mpi
def test_integer_mean_divides_once_into_float64(strategy):
    x = np.full(4, rank + 1, np.int64)
    got = strategy.run(all_reduce("MEAN"), args=(x,))
    if size == 1:  # one replica in all: its value is the mean, returned as it is
        assert got is x
        return
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.full(4, (size + 1) / 2))


@pytest.mark.mpi
def test_non_contiguous_array(strategy):
    x = value_of(rank, (4, 6))[:, ::2]
    got = strategy.run(all_reduce("SUM"), args=(x,))
    want = reference(all_reduce("SUM"), lambda r: (value_of(r, (4, 6))[:, ::2],))
    assert_same(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("container", [list, tuple])
@pytest.mark.parametrize("dtypes", [
    ("float32",) * 3, ("int64",) * 2, ("float32", "float64"), ("float64", "float32", "float32"),
    ("float16", "float16"), ("int8", "int8"), ("float32", "complex64", "float32")],
    ids=["float32x3", "int64x2", "mixed", "fit-like", "float16x2", "int8x2", "with-complex"])
def test_flat_list_or_tuple(strategy, op, container, dtypes):
    def values(r):
        return container(value_of(r, (i + 2,), d) for i, d in enumerate(dtypes))

    mine = values(rank)
    before = [v.copy() for v in mine]
    got = strategy.run(all_reduce(op), args=(mine,))
    want = reference(all_reduce(op), lambda r: (values(r),))
    assert_same(got, want)
    for v, b in zip(mine, before):
        np.testing.assert_array_equal(v, b)


@pytest.mark.mpi
def test_nested_values_are_rebuilt(strategy):
    def values(r):
        return {"w": value_of(r, (3,)), "b": [value_of(r, (2,), "float32"), 1.5]}

    got = strategy.run(all_reduce("SUM"), args=(values(rank),))
    want = reference(all_reduce("SUM"), lambda r: (values(r),))
    assert_same(got, want)


@pytest.mark.mpi
def test_results_are_not_overwritten_by_later_calls(strategy):
    """Results live in recycled buffers only once dropped: a kept result stays as it was."""
    first = strategy.run(all_reduce("SUM"), args=(np.ones(8, np.float32),))
    pair = strategy.run(all_reduce("SUM"), args=([np.ones(8, np.float32)] * 2,))
    for _ in range(3):
        strategy.run(all_reduce("SUM"), args=(np.full(8, 7.0, np.float32),))
        strategy.run(all_reduce("SUM"), args=([np.full(8, 7.0, np.float32)] * 2,))
    np.testing.assert_array_equal(first, np.full(8, size, np.float32))
    for p in pair:
        np.testing.assert_array_equal(p, np.full(8, size, np.float32))


@pytest.mark.mpi
@pytest.mark.parametrize("value, expected", [
    (np.ones(3), [("all_reduce", 1)]),
    ([np.ones(3, np.float32), np.ones(2, np.float32)], [("all_reduce_packs", 2)]),
    ([np.ones(2), np.ones(3, np.float32), np.ones(2, np.float32)],
     [("all_reduce", 3), ("all_reduce_packs", 3)]),
], ids=["array", "list", "mixed-list"])
def test_straight_to_the_communicator_with_the_label(strategy, monkeypatch, value, expected):
    """One collective, labelled with the user's call, and no merge_call round-trip."""
    if size == 1:
        pytest.skip("one replica in all issues no collective (all_reduce is the identity, "
                    "tested in tests/unit/test_lean_run.py); this runs again at 2 and 4 ranks")
    communicator = world_communicator()
    seen, depth = [], [0]
    for name in ("all_reduce", "all_reduce_packs"):
        original = getattr(communicator, name)

        def record(*args, _name=name, _original=original, **kwargs):
            if not depth[0]:  # (one pack is sent by all_reduce_packs calling all_reduce)
                seen.append((_name, current_calls()))
            depth[0] += 1
            try:
                return _original(*args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(communicator, name, record)

    def no_merge_call(*args, **kwargs):
        raise AssertionError("the one-replica path took a merge_call")

    monkeypatch.setattr(ReplicaContext, "merge_call", no_merge_call)
    strategy.run(all_reduce("MEAN"), args=(value,))
    assert [name for name, _ in seen] == [name for name, _ in expected]
    for (_, calls), (_, count) in zip(seen, expected):
        assert calls[-1] == ("ReplicaContext.all_reduce",
                             (("reduce_op", "MEAN"), ("num_values", count)))


@pytest.mark.mpi
def test_bad_values_get_the_same_errors(strategy):
    with pytest.raises(TypeError, match="ReplicaContext.all_reduce cannot reduce a value of "
                                        "dtype bool"):
        strategy.run(all_reduce("SUM"), args=(np.ones(3, bool),))
    with pytest.raises(TypeError, match="ReplicaContext.all_reduce cannot reduce"):
        strategy.run(all_reduce("SUM"), args=([np.ones(3), np.array(["a"])],))
    with pytest.raises(ValueError, match="'MAX' is not a valid ReduceOp"):
        strategy.run(all_reduce("max"), args=(np.ones(3),))
    # Still in step: a correct all-reduce after the refused ones.
    got = strategy.run(all_reduce("SUM"), args=(np.ones(3),))
    np.testing.assert_array_equal(got, np.full(3, float(size)))
