"""ClusterCoordinator on an in-process cluster (spec §9.5, ps-design.md §3): the singleton, what
may be scheduled, RemoteValues and fetch, join/done, atomic updates from concurrent workers,
TF's first-error rule with cancellation, per-worker datasets and iterators, and training with
SGD, momentum and Adam on the parameter servers giving OneDeviceStrategy's weights.

Closures that must run on two workers at once meet at a barrier (module-level functions, so a
worker imports them by name and shares the barrier); one closure in flight per worker makes
the dispatch deterministic there.
"""

import threading
import time

import numpy as np
import pytest

import mpidist
from mpidist.errors import CancelledError, InvalidArgumentError, OutOfRangeError
from mpidist.experimental.partitioners import FixedShardsPartitioner
from mpidist.experimental.coordinator import (
    ClusterCoordinator,
    PerWorkerValues,
    RemoteValue,
    RemoteValueStatus,
    num_workers,
    worker_index,
)
from ps_cluster import ps_job, ps_settings, wait_until

pytestmark = pytest.mark.timeout(60)

Dataset = mpidist.data.Dataset
CANCELLED = "The corresponding function is cancelled. Please reschedule the function."

BARRIER = threading.Barrier(2, timeout=10)


@pytest.fixture
def two_at_once(monkeypatch):
    """Closures that call ``meet()`` run in pairs on the two workers of the job."""
    monkeypatch.setattr(f"{__name__}.BARRIER", threading.Barrier(2, timeout=10))
    ps_settings(monkeypatch, MPIDIST_PS_INFLIGHT_PER_WORKER="1")


def meet():
    BARRIER.wait()


@mpidist.function
def sum_of_next_batch(iterator):
    batch = next(iterator)
    meet()
    return int(np.sum(batch)), worker_index()


@mpidist.function
def next_batch_sum(iterator):
    return int(np.sum(next(iterator))), worker_index()


@mpidist.function
def next_element(iterator):
    element = next(iterator)
    meet()
    return int(element), worker_index(), num_workers()


@mpidist.function
def add_one(value):
    return value + 1


# -- the coordinator object -----------------------------------------------------------------------
def test_one_coordinator_per_strategy():
    with ps_job() as (strategy, coordinator):
        assert ClusterCoordinator(strategy) is coordinator
        assert ClusterCoordinator(strategy) is ClusterCoordinator(strategy)
        assert coordinator.strategy is strategy


@pytest.mark.parametrize("make", [
    lambda: mpidist.MirroredStrategy(["/cpu:0"]),
    lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    lambda: None,
], ids=["mirrored", "one-device", "none"])
def test_only_a_parameter_server_strategy_has_a_coordinator(make):
    with pytest.raises(ValueError) as info:
        ClusterCoordinator(make())
    assert str(info.value) == (
        "Only `mpidist.experimental.ParameterServerStrategy` is supported to work with "
        "`mpidist.experimental.coordinator.ClusterCoordinator` currently.")


def test_schedule_accepts_only_mpidist_functions():
    with ps_job() as (_, coordinator):
        def plain():
            return 1

        for fn in (plain, lambda: 1, print):
            with pytest.raises(TypeError) as info:
                coordinator.schedule(fn)
            assert str(info.value).startswith(
                "`mpidist.experimental.coordinator.ClusterCoordinator.schedule` only accepts a "
                "function decorated with `@mpidist.function`, got ")
            assert "replace @tf.function with @mpidist.function" in str(info.value)
        assert coordinator.done()
        assert coordinator.schedule(add_one, args=(1,)).fetch() == 2  # nothing was queued


def test_a_remote_value_argument_is_refused():
    with ps_job() as (_, coordinator):
        remote = coordinator.schedule(add_one, args=(1,))
        for args, kwargs in (((remote,), None), (([1, {"x": remote}],), None),
                             ((), {"value": remote})):
            with pytest.raises(ValueError) as info:
                coordinator.schedule(add_one, args=args, kwargs=kwargs)
            assert str(info.value).startswith(
                "`mpidist.experimental.coordinator.RemoteValue` used as an input to scheduled "
                "function is not yet supported.")
        assert coordinator.schedule(add_one, args=(remote.fetch(),)).fetch() == 3


def test_per_worker_values_take_only_remote_values():
    with pytest.raises(AssertionError) as info:
        PerWorkerValues([RemoteValue(), 1])
    assert str(info.value) == "`PerWorkerValues` should only take `RemoteValue`s."


# -- scheduling, fetching, join and done ------------------------------------------------------------
def test_five_increments_of_a_variable_on_a_parameter_server():
    """w = Variable(3.); 5 x schedule(step: w.assign_add(1.); return w.read_value()) -> w = 8
    and the fetched values are {4, 5, 6, 7, 8} in some order."""
    with ps_job() as (strategy, coordinator):
        with strategy.scope():
            w = mpidist.Variable(3.0, name="w")

        @mpidist.function
        def step():
            w.assign_add(1.0)
            return w.read_value()

        results = [coordinator.schedule(step) for _ in range(5)]
        coordinator.join()
        assert coordinator.done()
        assert all(r.status is RemoteValueStatus.READY for r in results)
        assert float(w.numpy()) == 8.0
        assert sorted(float(r.fetch()) for r in results) == [4.0, 5.0, 6.0, 7.0, 8.0]
        assert isinstance(results[0].fetch(), np.ndarray)
        assert results[0].get() is results[0].fetch()


def test_fetch_maps_a_structure_and_keeps_other_leaves():
    with ps_job() as (_, coordinator):
        remote = coordinator.schedule(add_one, args=(4.0,))
        assert coordinator.fetch({"a": 1, "b": remote}) == {"a": 1, "b": 5.0}
        assert coordinator.fetch([remote, (remote, "x")]) == [5.0, (5.0, "x")]
        assert coordinator.fetch(7) == 7


def test_done_is_false_while_a_function_runs_and_join_waits_for_it():
    with ps_job() as (_, coordinator):
        @mpidist.function
        def slow(seconds):
            time.sleep(seconds)
            return seconds

        remote = coordinator.schedule(slow, args=(0.2,))
        assert remote.status is RemoteValueStatus.NOT_READY
        assert not coordinator.done()
        coordinator.join()
        assert coordinator.done()
        assert remote.status is RemoteValueStatus.READY and remote.fetch() == 0.2
        coordinator.join()  # nothing pending: returns at once


def test_concurrent_posted_updates_from_two_workers_lose_none():
    """100 closures x 10 posted assign_adds, spread over 2 workers: all 1000 applied."""
    with ps_job(num_ps=2, num_workers=2) as (strategy, coordinator):
        with strategy.scope():
            counter = mpidist.Variable(0.0, name="counter")
            rows = mpidist.Variable(np.zeros(4), name="rows")

        @mpidist.function
        def add_many(times):
            for _ in range(times):
                counter.assign_add(1.0, read_value=False)
                rows.assign_add(np.arange(4.0), read_value=False)
            return worker_index()

        results = [coordinator.schedule(add_many, args=(10,)) for _ in range(100)]
        coordinator.join()
        assert float(counter.numpy()) == 1000.0
        np.testing.assert_array_equal(rows.numpy(), np.arange(4.0) * 1000)
        assert {r.fetch() for r in results} == {0, 1}


# -- TF's first-error rule ----------------------------------------------------------------------
def test_first_error_is_raised_once_and_queued_functions_are_cancelled(monkeypatch):
    """3 good (slow) + 1 failing + 96 more: the error surfaces once (from a schedule or from
    join); the 96 queued behind the in-flight ones are cancelled and never run; the good ones
    keep their results; scheduling works again afterwards."""
    ps_settings(monkeypatch, MPIDIST_PS_INFLIGHT_PER_WORKER="1")
    with ps_job(num_workers=4) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")

        @mpidist.function
        def good(i, seconds):
            time.sleep(seconds)
            runs.assign_add(1.0, read_value=False)
            return i

        @mpidist.function
        def bad():
            time.sleep(0.05)
            raise InvalidArgumentError("step 4 failed")

        first = [coordinator.schedule(good, args=(i, 0.2)) for i in range(3)]
        failing = coordinator.schedule(bad)  # the four run at once, one per worker
        more, raised = [], []
        for i in range(96):
            try:
                more.append(coordinator.schedule(good, args=(i, 0.0)))
            except InvalidArgumentError as error:
                raised.append(error)
        try:
            coordinator.join()
        except InvalidArgumentError as error:
            raised.append(error)
        assert [str(e) for e in raised] == ["step 4 failed"]
        coordinator.join()  # raised once, then cleared
        assert coordinator.done()

        assert [r.fetch() for r in first] == [0, 1, 2]
        with pytest.raises(InvalidArgumentError) as info:
            failing.fetch()
        assert str(info.value) == "step 4 failed"
        assert "Traceback on /job:worker/replica:0/task:" in info.value.__notes__[-1]
        assert len(more) in (95, 96)  # a schedule() that raises returns no RemoteValue
        for remote in more:
            assert remote.status is RemoteValueStatus.READY
            with pytest.raises(CancelledError) as info:
                remote.fetch()
            assert str(info.value) == CANCELLED
        assert float(runs.numpy()) == 3.0  # the cancelled ones never ran

        again = coordinator.schedule(good, args=(7, 0.0))
        assert again.fetch() == 7 and float(runs.numpy()) == 4.0


@pytest.mark.parametrize("call", ["schedule", "done", "join"])
def test_the_next_call_after_a_failure_raises_it(call):
    with ps_job(num_workers=1) as (_, coordinator):
        @mpidist.function
        def bad(message):
            raise KeyError(message)

        failing = coordinator.schedule(bad, args=("missing",))
        wait_until(lambda: failing.status is RemoteValueStatus.READY, what="the failure")
        with pytest.raises(KeyError) as info:
            getattr(coordinator, call)(*((add_one, (1,)) if call == "schedule" else ()))
        assert info.value.args == ("missing",)
        assert coordinator.done()
        assert coordinator.schedule(add_one, args=(1,)).fetch() == 2


# -- per-worker datasets (spec §9.5, ps-design.md §3.5) -------------------------------------------
def test_each_worker_iterates_its_own_copy(two_at_once):
    """range(100).batch(4), 4 closures on 2 workers summing next(it) -> {6, 6, 22, 22}."""
    with ps_job(num_workers=2) as (_, coordinator):
        per_worker = coordinator.create_per_worker_dataset(
            lambda: Dataset.range(100).batch(4))
        iterator = iter(per_worker)
        results = [coordinator.schedule(sum_of_next_batch, args=(iterator,)) for _ in range(4)]
        coordinator.join()
        got = sorted(r.fetch() for r in results)
        assert got == [(6, 0), (6, 1), (22, 0), (22, 1)]
        assert len(per_worker) == len(iterator) == 2


@pytest.mark.parametrize("batches,closures", [(1, 2), (2, 3), (3, 7)])
def test_a_used_up_per_worker_iterator_raises_out_of_range_at_join(batches, closures):
    """TF: next() past the end of a worker's dataset fails the closure with OutOfRangeError,
    which join() raises (a bare StopIteration would name nothing); the closures before it ran."""
    with ps_job(num_workers=1) as (_, coordinator):
        iterator = iter(coordinator.create_per_worker_dataset(
            lambda: Dataset.range(4 * batches).batch(4)))
        results = [coordinator.schedule(next_batch_sum, args=(iterator,))
                   for _ in range(closures)]
        with pytest.raises(OutOfRangeError, match=r"End of sequence: the scheduled function "
                                                  r"'next_batch_sum' .* worker 0's .*repeat"):
            coordinator.join()
        assert [r.fetch() for r in results[:batches]] == \
            [(16 * b + 6, 0) for b in range(batches)]


def test_worker_index_inside_dataset_fn(two_at_once):
    with ps_job(num_workers=2) as (_, coordinator):
        def dataset_fn():
            return Dataset.from_tensor_slices(np.full(4, 10 * worker_index() + num_workers()))

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        got = coordinator.fetch([coordinator.schedule(next_element, args=(iterator,))
                                 for _ in range(4)])
        assert sorted(got) == [(2, 0, 2), (2, 0, 2), (12, 1, 2), (12, 1, 2)]


@pytest.mark.parametrize("source", ["dataset", "distribute_datasets_from_function"])
def test_per_worker_dataset_from_a_dataset_or_a_distributed_dataset(two_at_once, source):
    with ps_job(num_workers=2) as (strategy, coordinator):
        if source == "dataset":
            dataset = Dataset.range(20).map(lambda x: x * 2).batch(4)
        else:
            def dataset_fn(context):
                assert context.num_input_pipelines == 1 and context.input_pipeline_id == 0
                return Dataset.range(20).map(lambda x: x * 2).batch(4)

            dataset = strategy.distribute_datasets_from_function(dataset_fn)
            with pytest.raises(TypeError, match="pass it to coordinator.create_per_worker_"):
                iter(dataset)
        iterator = iter(coordinator.create_per_worker_dataset(dataset))
        got = coordinator.fetch([coordinator.schedule(sum_of_next_batch, args=(iterator,))
                                 for _ in range(4)])
        assert sorted(got) == [(12, 0), (12, 1), (44, 0), (44, 1)]


def test_next_on_the_chief_is_not_supported():
    with ps_job() as (_, coordinator):
        iterator = iter(coordinator.create_per_worker_dataset(lambda: Dataset.range(3)))
        for call in (lambda: next(iterator), iterator.get_next):
            with pytest.raises(NotImplementedError) as info:
                call()
            assert str(info.value) == \
                "Iterating over an `AsyncDistributedIterator` is not supported right now."


def test_creating_a_variable_in_dataset_fn_is_an_error():
    with ps_job(num_workers=2) as (_, coordinator):
        def dataset_fn():
            mpidist.Variable(1.0, name="inside")
            return Dataset.range(3)

        per_worker = coordinator.create_per_worker_dataset(dataset_fn)
        for remote in per_worker.values:  # both workers ran it: one error, raised once below
            with pytest.raises(ValueError) as info:
                remote.fetch()
            assert str(info.value) == "Creating variables in `dataset_fn` is not allowed."
        with pytest.raises(ValueError) as info:
            coordinator.join()
        assert str(info.value) == "Creating variables in `dataset_fn` is not allowed."
        assert coordinator.done()


# -- training on the parameter servers ------------------------------------------------------------
FEATURES = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
TARGETS = (FEATURES @ np.array([1.5, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
STEPS = 12


def linear_gradients(w, b, x, y):
    """Mean squared error of ``x @ w + b`` and its gradients (w, b)."""
    error = x @ w + b - y
    grads = [x.T @ error * np.float32(2 / len(y)), np.float32(2) * error.mean()]
    return grads, float((error ** 2).mean())


OPTIMIZERS = {
    "sgd": lambda: mpidist.optimizers.SGD(0.1),
    "momentum": lambda: mpidist.optimizers.SGD(0.05, momentum=0.9),
    "nesterov": lambda: mpidist.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: mpidist.optimizers.Adam(0.05),
}


def train_on_one_device(make_optimizer):
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        w = mpidist.Variable(np.zeros(3, np.float32), name="w")
        b = mpidist.Variable(np.float32(0.0), name="b")
        optimizer = make_optimizer()
    batches = iter(Dataset.from_tensor_slices((FEATURES, TARGETS)).batch(16).repeat())
    losses = []

    def replica_fn(x, y):
        grads, loss = linear_gradients(np.asarray(w.read_value()), np.asarray(b.read_value()),
                                       x, y)
        optimizer.apply_gradients(zip(grads, [w, b]))
        return loss

    for _ in range(STEPS):
        losses.append(strategy.run(replica_fn, args=next(batches)))
    return w.numpy(), b.numpy(), int(optimizer.iterations.numpy()), losses


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_on_one_worker_gives_one_device_weights(name, sharded):
    """One worker runs the scheduled steps in order: the updates the parameter servers apply
    (fused SGD / momentum / Adam, per shard when w is a ShardedVariable) give the same weights
    as OneDeviceStrategy."""
    partitioner = FixedShardsPartitioner(2) if sharded else None
    with ps_job(num_ps=2, num_workers=1, partitioner=partitioner) as (strategy, coordinator):
        with strategy.scope():
            w = mpidist.Variable(np.zeros(3, np.float32), name="w")
            b = mpidist.Variable(np.float32(0.0), name="b")
            optimizer = OPTIMIZERS[name]()
            optimizer.build([w, b])
            mean_loss = mpidist.metrics.Mean("loss")
            seen = mpidist.metrics.Sum("seen")
        if sharded:  # w: rows 0-1 on ps 0, row 2 on ps 1; b on ps 0
            assert [s.shape for s in w.variables] == [(2,), (1,)]
            assert b.device == w.variables[0].device != w.variables[1].device
        else:
            assert w.device != b.device  # one variable on each server

        def dataset_fn():
            return Dataset.from_tensor_slices((FEATURES, TARGETS)).batch(16).repeat()

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        @mpidist.function
        def train_step(iterator):
            def replica_fn(x, y):
                grads, loss = linear_gradients(np.asarray(w.read_value()),
                                               np.asarray(b.read_value()), x, y)
                optimizer.apply_gradients(zip(grads, [w, b]))
                mean_loss.update_state(loss)
                seen.update_state(float(len(y)))
                return loss

            return strategy.run(replica_fn, args=next(iterator))

        losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(STEPS)]
        coordinator.join()
        w_ps, b_ps = np.asarray(w), b.numpy()
        steps = int(optimizer.iterations.numpy())
        ps_losses = [float(r.fetch()) for r in losses]
        mean, total = float(mean_loss.result()), float(seen.result())

    w_one, b_one, steps_one, one_losses = train_on_one_device(OPTIMIZERS[name])
    np.testing.assert_allclose(w_ps, w_one, rtol=1e-6)
    np.testing.assert_allclose(b_ps, b_one, rtol=1e-6)
    assert steps == steps_one == STEPS
    np.testing.assert_allclose(ps_losses, one_losses, rtol=1e-6)
    assert abs(w_ps - np.zeros(3)).max() > 0.1  # it did train
    np.testing.assert_allclose(mean, np.mean(one_losses), rtol=1e-6)
    assert total == 16.0 * STEPS


def test_adam_without_build_on_the_chief_is_an_error_naming_the_fix():
    with ps_job(num_workers=1) as (strategy, coordinator):
        with strategy.scope():
            w = mpidist.Variable(np.ones(3), name="w")
            optimizer = mpidist.optimizers.Adam(0.1)

        @mpidist.function
        def step():
            strategy.run(lambda: optimizer.apply_gradients([(np.ones(3), w)]))

        coordinator.schedule(step)
        with pytest.raises(RuntimeError) as info:
            coordinator.join()
        assert str(info.value) == (
            "Optimizer 'Adam' has no slot variables (m, v) for ['w']. Under "
            "ParameterServerStrategy slots live on the parameter servers and are created on the "
            "coordinator: call optimizer.build(variables) inside `with strategy.scope():` before "
            "scheduling the step.")
        np.testing.assert_array_equal(w.numpy(), np.ones(3))  # nothing was applied
        assert int(optimizer.iterations.numpy()) == 0
