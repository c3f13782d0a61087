"""Mistakes that only exist across ranks: ranks that disagree on a call that would give them
different answers, or a collective call made on some ranks only. Each must be the same clear
error on every rank, naming the user's public call and what differs, never a hang and never a
silently different answer; afterwards the ranks are still in step (a correct collective works)
and nothing was half-applied.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py. With one rank there
is nobody to disagree with: each case then checks that the call simply works.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.errors import InvalidArgumentError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
ODD = rank % 2 == 1  # ranks 1, 3 disagree with ranks 0, 2


@pytest.fixture(scope="module", params=[1, 2], ids=["1-replica", "2-replicas"])
def strategy(request):
    devices = [f"/cpu:{i}" for i in range(request.param)]
    return mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=devices))


def ones(strategy, n=3, dtype=np.float64):
    return strategy.run(lambda: np.ones(n, dtype=dtype))


def still_in_step(strategy):
    """A correct collective after the error: every replica of every rank contributes ones."""
    total = strategy.reduce("SUM", ones(strategy), axis=None)
    np.testing.assert_array_equal(total, np.full(3, float(strategy.num_replicas_in_sync)))


def disagree(strategy, call, *message_parts):
    """``call()`` on every rank (it behaves differently on odd ranks): with one rank it must
    work; with several, every rank raises InvalidArgumentError containing ``message_parts``."""
    if size == 1:
        call()
        return None
    with pytest.raises(InvalidArgumentError) as info:
        call()
    text = str(info.value)
    for part in message_parts:
        assert part in text, f"{part!r} missing from: {text}"
    assert "Ranks issued different collectives" in text
    assert f"seen on rank {rank}" in text
    still_in_step(strategy)
    return text


# -- arguments that change the answer -----------------------------------------------------------
def test_reduce_with_different_reduce_ops(strategy):
    op = "MEAN" if ODD else "SUM"
    text = disagree(strategy, lambda: strategy.reduce(op, ones(strategy), axis=None),
                    "Strategy.reduce", "reduce_op", "SUM", "MEAN", "collective call")
    if text:
        assert "Strategy.reduce's argument reduce_op" in text


def test_reduce_with_different_axes(strategy):
    axis = 0 if ODD else None
    disagree(strategy, lambda: strategy.reduce("SUM", ones(strategy), axis=axis),
             "Strategy.reduce", "axis")


def test_reduce_of_different_shapes(strategy):
    n = 4 if ODD else 3
    disagree(strategy, lambda: strategy.reduce("SUM", ones(strategy, n), axis=None),
             "Strategy.reduce", "shape", "[3]", "[4]")


def test_reduce_of_different_dtypes(strategy):
    dtype = np.float32 if ODD else np.float64
    disagree(strategy, lambda: strategy.reduce("SUM", ones(strategy, 3, dtype), axis=None),
             "Strategy.reduce", "dtype", "float32", "float64")


def test_replica_all_reduce_with_different_ops(strategy):
    op = "MEAN" if ODD else "SUM"

    def step():
        return mpidist.get_replica_context().all_reduce(op, np.ones(3))

    disagree(strategy, lambda: strategy.run(step), "ReplicaContext.all_reduce", "reduce_op")


def test_replica_all_reduce_of_different_structures(strategy):
    count = 3 if ODD else 2

    def step():
        return mpidist.get_replica_context().all_reduce("SUM", [np.ones(2)] * count)

    disagree(strategy, lambda: strategy.run(step), "ReplicaContext.all_reduce", "num_values")


def test_replica_all_gather_with_different_axes(strategy):
    axis = 1 if ODD else 0

    def step():
        return mpidist.get_replica_context().all_gather(np.ones((2, 2)), axis=axis)

    disagree(strategy, lambda: strategy.run(step), "ReplicaContext.all_gather", "axis")


def test_gather_with_different_axes(strategy):
    axis = 1 if ODD else 0
    values = strategy.run(lambda: np.ones((2, 2)))
    disagree(strategy, lambda: strategy.gather(values, axis=axis), "Strategy.gather", "axis")


def test_reduce_to_with_different_ops(strategy):
    op = "MEAN" if ODD else "SUM"
    values = ones(strategy)
    disagree(strategy, lambda: strategy.extended.reduce_to(op, values, "/cpu:0"),
             "reduce_to", "reduce_op")


def test_batch_reduce_to_of_different_lengths(strategy):
    values = ones(strategy)
    pairs = [(values, "/cpu:0")] * (3 if ODD else 2)
    disagree(strategy, lambda: strategy.extended.batch_reduce_to("SUM", pairs),
             "batch_reduce_to")


def test_apply_gradients_with_different_learning_rates_updates_nothing(strategy):
    with strategy.scope():
        var = mpidist.Variable(np.zeros(3), name="w")
        optimizer = mpidist.optimizers.SGD(learning_rate=0.5 if ODD else 0.1)

    def step():
        optimizer.apply_gradients([(np.ones(3), var)])

    disagree(strategy, lambda: strategy.run(step), "apply_gradients", "learning_rate")
    if size > 1:  # refused before any copy moved
        np.testing.assert_array_equal(var.numpy(), np.zeros(3))
        assert int(optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("first_step_done", [False, True])
def test_apply_mean_gradients_with_different_learning_rates_updates_nothing(strategy,
                                                                           first_step_done):
    """fit's update (the totals ride with the gradients once the slots exist): a rank with
    another learning rate is refused on every rank before anything changes."""
    with strategy.scope():
        var = mpidist.Variable(np.zeros(3), name="w")
        optimizer = mpidist.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    totals = np.array([1.0, 2.0])
    if first_step_done:  # the slots and the fused plan exist: the one-collective path
        strategy.run(lambda: optimizer.apply_mean_gradients([(np.ones(3), var)], totals))
    before = var.numpy().copy()
    optimizer.learning_rate = 0.5 if ODD else 0.1

    def step():
        optimizer.apply_mean_gradients([(np.ones(3), var)], totals)

    disagree(strategy, lambda: strategy.run(step), "apply_mean_gradients", "learning_rate")
    if size > 1:
        np.testing.assert_array_equal(var.numpy(), before)
        assert int(optimizer.iterations.numpy()) == int(first_step_done)


def test_apply_mean_gradients_against_apply_gradients(strategy):
    with strategy.scope():
        var = mpidist.Variable(np.zeros(3), name="w")
        optimizer = mpidist.optimizers.SGD(0.1)

    def step():
        if ODD:
            optimizer.apply_gradients([(np.ones(3), var)])
        else:
            optimizer.apply_mean_gradients([(np.ones(3), var)], np.array([1.0, 2.0]))

    disagree(strategy, lambda: strategy.run(step), "apply_mean_gradients", "apply_gradients")


def test_variables_created_with_different_shapes(strategy):
    shape = (4,) if ODD else (3,)

    def create():
        with strategy.scope():
            return mpidist.Variable(np.zeros(shape), name="v")

    disagree(strategy, create, "Variable creation", "shape")


# -- a collective call made on some ranks only --------------------------------------------------
def test_metric_result_on_the_chief_only(strategy):
    with strategy.scope():
        metric = mpidist.metrics.Mean()
    strategy.run(lambda: metric.update_state(np.ones(2)))

    def call():
        if rank == 0:
            return metric.result()
        return strategy.reduce("SUM", ones(strategy), axis=None)

    disagree(strategy, call, "Mean.result", "Strategy.reduce", "if rank == 0")
    expected = 1.0
    assert float(metric.result()) == expected  # the metric's state survived the error


def test_reduce_against_replica_all_reduce(strategy):
    def step():
        return mpidist.get_replica_context().all_reduce("SUM", np.ones(3))

    def call():
        if ODD:
            return strategy.run(step)
        return strategy.reduce("SUM", ones(strategy), axis=None)

    disagree(strategy, call, "Strategy.reduce", "ReplicaContext.all_reduce")


def test_fit_against_a_reduce(strategy):
    with strategy.scope():
        var = mpidist.Variable(np.zeros(2), name="w")
        optimizer = mpidist.optimizers.SGD(0.1)

    class Model:
        trainable_variables = [var]

        def loss_and_gradients(self, x, y):
            return np.zeros(len(x)), [np.ones(2)]

    dataset = mpidist.data.Dataset.from_tensor_slices((np.ones((8, 2)), np.ones(8))).batch(8)

    def call():
        if ODD:
            return strategy.reduce("SUM", ones(strategy), axis=None)
        return mpidist.fit(Model(), dataset, epochs=1, optimizer=optimizer, verbose=0)

    disagree(strategy, call, "fit", "Strategy.reduce")


def test_fit_without_strategy_trains_across_the_ranks(strategy):
    """docs/training.md builds the model in strategy.scope() and calls fit(model, ...) without
    strategy=: every rank must then see its share of each global batch (under the default
    strategy each rank would read every row alone)."""
    with strategy.scope():
        var = mpidist.Variable(np.zeros(2), name="w")
        optimizer = mpidist.optimizers.SGD(0.1)
    seen = []

    class Model:
        trainable_variables = [var]

        def loss_and_gradients(self, x, y):
            seen.append(len(x))
            return (x.sum(axis=1) - y) ** 2, [np.full(2, float(len(x)))]

    rows = 8 * strategy.num_replicas_in_sync
    dataset = mpidist.data.Dataset.from_tensor_slices((np.ones((rows, 2)), np.ones(rows)))
    mpidist.fit(Model(), dataset.batch(rows), epochs=1, optimizer=optimizer, verbose=0)
    assert comm.allreduce(sum(seen)) == rows  # the global batch, shared out once
    assert len(seen) == len(strategy.extended.worker_devices)  # one call per local replica
    # The gradient of the summed loss is len(x) per replica: summed over the replicas and
    # divided by the global count it is 1, so one SGD step moves each weight by -0.1.
    np.testing.assert_allclose(var.numpy(), np.full(2, -0.1))
