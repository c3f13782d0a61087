"""mpidist.metrics under MultiWorkerMirroredStrategy across real MPI ranks: the results equal
NumPy on the whole global data, whatever the ranks x local replicas split.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py. Every rank builds
the same global data from one seed; values are multiples of 1/4, so every sum is exact.
"""

import itertools

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist import metrics
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.data import Dataset

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

LOCAL = [1, 2]
N = 41
CLASSES = 4


def mwms(local=1):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    return mpidist.MultiWorkerMirroredStrategy(resolver)


def rid():
    return int(mpidist.get_replica_context().replica_id_in_sync_group)


def _spy(name, original, calls):
    def spy(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    return spy


def data(seed):
    rng = np.random.default_rng(seed)
    return {"values": rng.integers(-40, 40, size=N) / 4.0,
            "weights": rng.integers(0, 6, size=N) / 2.0,
            "labels": rng.integers(0, CLASSES, size=N),
            "scores": rng.integers(0, 12, size=(N, CLASSES)) / 4.0}


def ref_mean(values, weights=None):
    w = np.ones_like(values) if weights is None else weights
    return 0.0 if w.sum() == 0 else (values * w).sum() / w.sum()


def splits(replicas):
    """Unequal slices of range(N), one per global replica; the last of 3+ is empty."""
    sizes = [i + 1 for i in range(replicas)]
    if replicas >= 3:
        sizes[-1] = 0
    cuts = np.cumsum([0] + sizes, dtype=np.int64)
    cuts = (cuts * N) // cuts[-1]
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(cuts)]


def make_metrics(s):
    with s.scope():  # collective: every rank creates the same metrics in the same order
        return (metrics.Mean(), metrics.Sum(), metrics.SparseCategoricalAccuracy(),
                metrics.Accuracy())


def check(ms, d, weighted):
    mean, total, sca, acc = ms
    w = d["weights"] if weighted else None
    assert mean.result() == ref_mean(d["values"], w)
    assert total.result() == (d["values"] if w is None else d["values"] * w).sum()
    matches = (d["labels"] == d["scores"].argmax(-1)).astype(np.float64)
    assert sca.result() == ref_mean(matches, w)
    assert acc.result() == ref_mean(matches, w)


def step(ms, weighted):
    mean, total, sca, acc = ms

    def fn(labels, scores, values, weights):
        w = weights if weighted else None
        mean.update_state(values, sample_weight=w)
        total.update_state(values, sample_weight=w)
        sca.update_state(labels, scores, sample_weight=w)
        acc.update_state(labels, np.argmax(scores, axis=-1), sample_weight=w)

    return fn


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("weighted", [False, True])
def test_unequal_per_replica_batches_match_numpy(local, weighted):
    s, d = mwms(local), data(seed=local)
    ms = make_metrics(s)
    parts = splits(s.num_replicas_in_sync)
    feed = [s.experimental_distribute_values_from_function(
        lambda ctx, a=d[k]: a[parts[ctx.replica_id_in_sync_group]])
        for k in ("labels", "scores", "values", "weights")]
    s.run(step(ms, weighted), args=feed)
    check(ms, d, weighted)
    with s.scope():
        check(ms, d, weighted)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("weighted", [False, True])
def test_distributed_dataset_matches_numpy(local, weighted):
    s, d = mwms(local), data(seed=10 + local)
    ms = make_metrics(s)
    ds = Dataset.from_tensor_slices((d["labels"], d["scores"], d["values"], d["weights"])).batch(7)
    for _ in range(2):
        for batch in s.experimental_distribute_dataset(ds):
            s.run(step(ms, weighted), args=batch)
        check(ms, d, weighted)
        for m in ms:
            m.reset_state()
            assert m.result() == 0.0


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_replica_updates_are_local_until_result(local, monkeypatch):
    s = mwms(local)
    with s.scope():
        m = metrics.Mean()
    ops = s.extended._cross_device_ops
    calls = []
    for name in ("reduce", "batch_reduce", "broadcast", "_gather"):
        monkeypatch.setattr(ops, name, _spy(name, getattr(ops, name), calls))
    s.run(lambda: m.update_state(np.full(rid() + 1, float(rid()))))
    assert calls == []
    mine = [rank * local + i for i in range(local)]
    assert [c.numpy().item() for c in m.total.values] == [float(r * (r + 1)) for r in mine]
    assert [c.numpy().item() for c in m.count.values] == [float(r + 1) for r in mine]
    everyone = range(size * local)
    assert m.result() == sum(r * (r + 1) for r in everyone) / sum(r + 1 for r in everyone)
    assert calls == ["batch_reduce"]
    calls.clear()
    m.reset_state()  # no communication either
    assert calls == [] and [c.numpy().item() for c in m.total.values] == [0.0] * local


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_result_in_replica_context_is_global(local):
    s = mwms(local)
    with s.scope():
        m = metrics.Sum()

    def fn():
        m.update_state([float(rid())])
        return m.result()

    got = s.experimental_local_results(s.run(fn))
    total = float(sum(range(size * local)))
    assert list(got) == [total] * local


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_cross_replica_update_counts_each_workers_own_value(local):
    s = mwms(local)
    with s.scope():
        m = metrics.Mean()
        m.update_state([float(rank + 1)] * 2)
        assert m.result() == sum(range(1, size + 1)) / size
    m.update_state([0.0], sample_weight=float(size))  # outside the scope (default mode)
    assert m.result() == sum(range(1, size + 1)) * 2 / (2 * size + size * size)


@pytest.mark.mpi
def test_default_strategy_metric_is_local_to_the_rank():
    m = metrics.Mean()
    m.update_state([float(rank)])
    assert m.result() == float(rank)  # plain variables: no collective, this rank's data only
