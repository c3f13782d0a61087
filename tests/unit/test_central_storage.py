"""CentralStorageStrategy and AggregatingVariable (reference section 9.7, ps-design section 5):
devices, one copy of each variable on the parameter device, aggregated replica-context
updates, optimizers (same numbers as MirroredStrategy), input, reductions, checkpoints.

``C(n)`` is a CentralStorageStrategy over n virtual CPU devices; ``rid()`` the replica id.
"""

import copy
import re

import numpy as np
import pytest

import mpidist
from mpidist import VariableAggregation as Agg
from mpidist import VariableSynchronization as Sync
from mpidist.data import Dataset
from mpidist.values.aggregating import AggregatingVariable
from replicas import mirrored, rid

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"
AGGREGATION_ERROR = (
    "You must specify an aggregation method to update a AggregatingVariable in Replica Context. "
    "You can do so by passing an explicit value for argument `aggregation` to "
    "mpidist.Variable(..).e.g. `mpidist.Variable(..., "
    "aggregation=mpidist.VariableAggregation.SUM)``mpidist.VariableAggregation` lists the "
    "possible aggregation methods.This is required because AggregatingVariable should always be "
    "kept in sync."
)


def C(n, **kwargs):
    return mpidist.experimental.CentralStorageStrategy([f"/cpu:{i}" for i in range(n)], **kwargs)


def variable(strategy, init=1.0, **kwargs):
    with strategy.scope():
        return mpidist.Variable(init, **kwargs)


def locals_of(strategy, value):
    return [np.asarray(x).tolist() for x in strategy.experimental_local_results(value)]


# -- devices --------------------------------------------------------------------------------
def test_defaults_without_gpus_are_one_cpu_replica_and_cpu_parameters():
    s = mpidist.experimental.CentralStorageStrategy()
    assert s.num_replicas_in_sync == 1
    assert s.extended.worker_devices == (CPU0,)
    assert s.extended.parameter_devices == (CPU0,)


def test_two_compute_devices_share_one_parameter_device():
    s = C(2)
    assert s.num_replicas_in_sync == 2
    assert s.extended.worker_devices == (CPU0, CPU1)
    assert s.extended.parameter_devices == (CPU0,)
    assert C(2, parameter_device="/cpu:1").extended.parameter_devices == (CPU1,)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"compute_devices": []}, ValueError, "needs at least one compute device"),
    ({"compute_devices": ["/cpu:0", "/cpu:0"]}, ValueError, "got the compute device '/cpu:0' twice"),
    ({"compute_devices": 3}, TypeError, "compute_devices must be a list of device strings"),
    ({"compute_devices": ["/gpu:0"]}, ValueError, "this process sees 0 GPU(s)"),
    ({"parameter_device": 0}, TypeError, "parameter_device must be a device string"),
    ({"parameter_device": "/gpu:3"}, ValueError, "got '/gpu:3' but this process sees 0 GPU(s)"),
])
def test_bad_devices_are_clear_errors(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        mpidist.experimental.CentralStorageStrategy(**kwargs)


def test_deepcopy_gives_an_equal_new_strategy_and_copy_is_refused():
    s = C(2, parameter_device="/cpu:1")
    twin = copy.deepcopy(s)
    assert twin is not s and twin.extended.parameter_devices == (CPU1,)
    assert twin.extended.worker_devices == (CPU0, CPU1)
    with pytest.raises(RuntimeError, match="Must only deepcopy DistributionStrategy."):
        copy.copy(s)


# -- variables ------------------------------------------------------------------------------
def test_with_several_compute_devices_a_variable_is_one_copy_on_the_parameter_device():
    s = C(2, parameter_device="/cpu:1")
    v = variable(s, [1.0, 2.0], name="w")
    assert type(v) is AggregatingVariable and isinstance(v, mpidist.Variable)
    assert not isinstance(v, mpidist.DistributedValues)
    assert type(v.get()) is mpidist.Variable
    assert v.device == v.get().device == CPU1
    assert (v.name, v.shape, v.dtype, v.aggregation) == ("w:0", (2,), np.float64, Agg.NONE)
    assert v.distribute_strategy is s and s.extended.variable_created_in_scope(v)
    assert v.numpy().tolist() == [1.0, 2.0]


def test_on_read_variables_are_aggregating_too():
    s = C(2)
    v = variable(s, 0.0, synchronization=Sync.ON_READ, aggregation=Agg.SUM)
    assert type(v) is AggregatingVariable
    assert v.synchronization is Sync.ON_READ and v.trainable is False
    s.run(lambda: v.assign_add(float(rid()) + 1.0))
    assert v.numpy() == 3.0  # one copy: the read is not summed over replicas again


def test_with_one_compute_device_a_variable_is_plain():
    s = C(1, parameter_device="/cpu:1")
    v = variable(s, 1.0, aggregation=Agg.SUM)
    assert type(v) is mpidist.Variable
    assert v.device == CPU1 and v.distribute_strategy is s
    s.run(lambda: v.assign_add(2.0))
    assert v.numpy() == 3.0


def test_a_variable_created_inside_run_is_created_once():
    s = C(2)
    made = s.run(lambda: mpidist.Variable(float(rid()) + 5.0, aggregation=Agg.SUM))
    assert type(made) is AggregatingVariable
    assert made.numpy() == 5.0  # replica 0's initial value


# -- updates in replica context ---------------------------------------------------------------
def test_aggregation_none_in_replica_context_is_tfs_error_and_leaves_the_value():
    s = C(2)
    v = variable(s, 1.0)
    with pytest.raises(ValueError, match=re.escape(AGGREGATION_ERROR)):
        s.run(lambda: v.assign_add(1.0))
    assert v.numpy() == 1.0


@pytest.mark.parametrize("aggregation, method, want", [
    (Agg.SUM, "assign_add", 4.0),             # 1 + (1 + 2)
    (Agg.MEAN, "assign_add", 2.5),            # 1 + (1 + 2) / 2
    (Agg.ONLY_FIRST_REPLICA, "assign_add", 2.0),  # 1 + 1
    (Agg.SUM, "assign_sub", -2.0),            # 1 - (1 + 2)
    (Agg.MEAN, "assign", 1.5),                # (1 + 2) / 2
    (Agg.ONLY_FIRST_REPLICA, "assign", 1.0),
])
def test_replica_updates_are_aggregated_and_applied_once(aggregation, method, want):
    s = C(2)
    v = variable(s, 1.0, aggregation=aggregation)
    result = s.run(lambda: getattr(v, method)(float(rid()) + 1.0))
    assert v.numpy() == want
    assert locals_of(s, result) == [want, want]  # every replica reads the new value


def test_sum_over_three_replicas():
    s = C(3)
    v = variable(s, 0.0, aggregation=Agg.SUM)
    s.run(lambda: v.assign_add(float(rid()) + 1.0, read_value=False))
    assert v.numpy() == 6.0


def test_summing_one_shared_value_is_tfs_error():
    s = C(2)
    v = variable(s, 1.0, aggregation=Agg.SUM)
    with pytest.raises(ValueError, match=re.escape(
            "A non-DistributedValues value 5.0 cannot be reduced with the given reduce op "
            "ReduceOp.SUM")):
        s.run(lambda: v.assign(5.0))
    assert v.numpy() == 1.0


def test_a_distributed_value_in_replica_context_is_a_type_error():
    s = C(2)
    v = variable(s, 1.0, aggregation=Agg.SUM)
    pr = s.experimental_distribute_values_from_function(lambda ctx: 1.0)
    with pytest.raises(TypeError, match="Cannot use DistributedValues to update variables in "
                                        "replica context"):
        s.run(lambda: v.assign(pr))


def test_a_bad_value_fails_before_anything_is_written():
    s = C(2)
    v = variable(s, [1.0, 2.0], aggregation=Agg.SUM)
    with pytest.raises(ValueError, match=re.escape("shape (3,)")):
        s.run(lambda: v.assign_add(np.ones(3)))
    assert v.numpy().tolist() == [1.0, 2.0]


def test_updating_inside_another_strategys_run_is_refused():
    v = variable(C(2), 1.0, aggregation=Agg.SUM)
    with pytest.raises(RuntimeError, match="Mixing different mpidist.Strategy objects"):
        mirrored(2).run(lambda: v.assign_add(1.0))
    assert v.numpy() == 1.0


def test_replica_reads_are_the_parameter_array_itself():
    s = C(2)
    v = variable(s, np.arange(4.0), aggregation=Agg.SUM)
    storage = v.get().storage
    # Both replicas read the very array the copy lives in (so run returns it unwrapped);
    # np.asarray gives a copy (NumPy 2's __array__ contract: writes must not bypass the variable).
    assert s.run(lambda: v.current_array()) is storage
    copies = s.experimental_local_results(s.run(lambda: np.asarray(v)))
    assert all(c is not storage and np.array_equal(c, storage) for c in copies)
    doubled = s.run(lambda: v * 2.0)
    assert locals_of(s, doubled) == [[0.0, 2.0, 4.0, 6.0]] * 2


# -- updates in cross-replica context -----------------------------------------------------------
def test_cross_replica_updates_apply_once():
    s = C(2)
    v = variable(s, 1.0)  # NONE is fine here
    v.assign_add(3.0)
    with s.scope():
        assert v.assign_sub(1.0) == 3.0
    assert v.numpy() == 3.0


def test_cross_replica_assign_of_a_per_replica_needs_equal_components():
    s = C(2)
    v = variable(s, 0.0)
    same = s.experimental_distribute_values_from_function(lambda ctx: np.float64(7.0))
    v.assign(same)
    assert v.numpy() == 7.0
    differ = s.experimental_distribute_values_from_function(
        lambda ctx: np.float64(ctx.replica_id_in_sync_group))
    with pytest.raises(ValueError, match=re.escape(
            "You cannot update variable 'Variable:0' with a PerReplica whose components differ "
            "(replica 0 and replica 1)")):
        v.assign(differ)
    assert v.numpy() == 7.0


def test_extended_update_runs_fn_once_on_the_plain_copy():
    s = C(2)
    v = variable(s, 1.0)
    seen = []

    def fn(copy_, x):
        seen.append(type(copy_))
        return copy_.assign_add(x)

    with s.scope():
        result = s.extended.update(v, fn, args=(2.0,))
    assert seen == [mpidist.Variable] and v.numpy() == 3.0 and result == 3.0
    s.run(lambda: s.extended.update(v, fn, args=(1.0,)))  # replica context: merge_call, once
    assert v.numpy() == 4.0 and len(seen) == 2


def test_extended_update_refuses_differing_values_and_non_variables():
    s = C(2)
    v = variable(s, 1.0)
    differ = s.experimental_distribute_values_from_function(
        lambda ctx: np.float64(ctx.replica_id_in_sync_group))
    with s.scope():
        with pytest.raises(ValueError, match="whose components differ"):
            s.extended.update(v, lambda c, x: c.assign(x), args=(differ,))
        with pytest.raises(ValueError, match=re.escape("You can not update `var` 3.0. It must "
                                                       "be a Variable.")):
            s.extended.update(3.0, lambda c: c)
    assert v.numpy() == 1.0


def test_scatter_updates_follow_the_same_rules():
    s = C(2)
    rows = mpidist.IndexedSlices
    v = variable(s, np.zeros((3, 2)), aggregation=Agg.SUM)
    m = variable(s, np.zeros((3, 2)), aggregation=Agg.MEAN)
    first = variable(s, np.zeros((3, 2)), aggregation=Agg.ONLY_FIRST_REPLICA)
    none = variable(s, np.zeros((3, 2)))
    v.scatter_add(rows(np.ones((1, 2)), [2]))  # cross-replica: once
    assert v.numpy().tolist() == [[0, 0], [0, 0], [1, 1]]

    def step():
        r = int(rid())
        v.scatter_add(rows(np.full((1, 2), r + 1.0), [r]))
        m.scatter_add(rows(np.full((1, 2), r + 1.0), [0]))
        first.scatter_update(rows(np.full((1, 2), r + 5.0), [1]))

    s.run(step)
    assert v.numpy().tolist() == [[1, 1], [2, 2], [1, 1]]
    assert m.numpy().tolist() == [[1.5, 1.5], [0, 0], [0, 0]]
    assert first.numpy().tolist() == [[0, 0], [5, 5], [0, 0]]
    with pytest.raises(ValueError, match=re.escape(AGGREGATION_ERROR)):
        s.run(lambda: none.scatter_add(rows(np.ones((1, 2)), [0])))
    with pytest.raises(NotImplementedError, match=re.escape(
            "scatter_update of an AggregatingVariable in replica context is only supported with "
            "`ONLY_FIRST_REPLICA` aggregation, got: VariableAggregation.SUM.")):
        s.run(lambda: v.scatter_update(rows(np.ones((1, 2)), [0])))
    assert none.numpy().sum() == 0 and v.numpy().sum() == 8


def test_non_slot_devices_name_the_first_variable_by_name():
    s = C(2)
    b, a = variable(s, 1.0, name="b"), variable(s, 1.0, name="a")
    assert s.extended.non_slot_devices([b, a]) is a


# -- optimizers ---------------------------------------------------------------------------------
def _train(strategy, optimizer_class, steps=3, **opt_kwargs):
    rng = np.random.default_rng(0)
    w0, x, y = rng.normal(size=(4, 3)), rng.normal(size=(8, 4)), rng.normal(size=(8, 3))
    with strategy.scope():
        w = mpidist.Variable(w0, name="w")
        b = mpidist.Variable(np.zeros(3), name="b")
        optimizer = optimizer_class(**opt_kwargs)
    dist = strategy.experimental_distribute_dataset(Dataset.from_tensor_slices((x, y)).batch(8))
    xb, yb = next(iter(dist))

    def step(x, y):
        err = x @ np.asarray(w) + np.asarray(b) - y
        optimizer.apply_gradients([(x.T @ err / 8, w), (err.sum(axis=0) / 8, b)])

    for _ in range(steps):
        strategy.run(step, args=(xb, yb))
    return w, b, optimizer


@pytest.mark.parametrize("optimizer_class, kwargs", [
    (mpidist.optimizers.SGD, {"learning_rate": 0.1, "momentum": 0.9}),
    (mpidist.optimizers.Adam, {"learning_rate": 0.01}),
    (mpidist.optimizers.SGD, {"learning_rate": 0.1, "clipnorm": 0.5}),
])
def test_apply_gradients_gives_mirroreds_numbers_exactly(optimizer_class, kwargs):
    wm, bm, om = _train(mirrored(2), optimizer_class, **kwargs)
    wc, bc, oc = _train(C(2), optimizer_class, **kwargs)
    assert np.array_equal(wc.numpy(), wm.numpy()) and np.array_equal(bc.numpy(), bm.numpy())
    assert not np.array_equal(wc.numpy(), np.random.default_rng(0).normal(size=(4, 3)))
    assert int(oc.iterations.numpy()) == 3
    assert type(oc.iterations) is AggregatingVariable


def test_optimizer_slots_are_central_too():
    w, _, optimizer = _train(C(2), mpidist.optimizers.Adam, learning_rate=0.01)
    for name in ("m", "v"):
        slot = optimizer.get_slot(w, name)
        assert type(slot) is AggregatingVariable and slot.device == CPU0
    assert np.abs(optimizer.get_slot(w, "m").numpy()).sum() > 0


def test_fit_gives_mirroreds_weights_and_metrics():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(64, 4)), rng.integers(0, 3, 64)

    class Linear:
        def __init__(self):
            self.w = mpidist.Variable(np.random.default_rng(2).normal(size=(4, 3)), name="w")

        @property
        def trainable_variables(self):
            return [self.w]

        def loss_and_gradients(self, x, y):
            logits = x @ np.asarray(self.w)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            per_example = -np.log(p[np.arange(len(y)), y])
            p[np.arange(len(y)), y] -= 1.0
            return per_example, [x.T @ p], logits

    results = []
    for strategy in (mirrored(2), C(2)):
        with strategy.scope():
            model, optimizer = Linear(), mpidist.optimizers.SGD(0.1)
            accuracy = mpidist.metrics.SparseCategoricalAccuracy()
        history = mpidist.fit(model, Dataset.from_tensor_slices((x, y)).batch(16), epochs=2,
                              optimizer=optimizer, metrics=[accuracy], verbose=0)
        results.append((model.w.numpy(), history.history))
    (w_m, h_m), (w_c, h_c) = results
    assert np.array_equal(w_c, w_m) and h_c == h_m


# -- metrics ------------------------------------------------------------------------------------
def test_metrics_count_every_replicas_values_once():
    s = C(2)
    with s.scope():
        total = mpidist.metrics.Sum()
        mean = mpidist.metrics.Mean()
    s.run(lambda: (total.update_state(np.array([1.0, 2.0]) * (rid() + 1)),
                   mean.update_state(np.array([1.0, 3.0]) * (rid() + 1))))
    assert float(total.result()) == 9.0  # 3 + 6
    assert float(mean.result()) == 3.0   # (1 + 3 + 2 + 6) / 4
    total.reset_state()
    assert float(total.result()) == 0.0


# -- input --------------------------------------------------------------------------------------
def test_input_is_split_as_mirrored_splits_it():
    s = C(2)
    batches = [locals_of(s, b) for b in s.experimental_distribute_dataset(Dataset.range(6).batch(4))]
    assert batches == [[[0, 1], [2, 3]], [[4], [5]]]


def test_input_options_are_accepted_unlike_tf_2_21():
    s = C(2)
    dist = s.experimental_distribute_dataset(Dataset.range(6).batch(4), mpidist.InputOptions())
    assert [locals_of(s, b) for b in dist] == [[[0, 1], [2, 3]], [[4], [5]]]


def test_datasets_from_function_feed_the_replicas_in_turn():
    s = C(2)
    dist = s.distribute_datasets_from_function(lambda ctx: Dataset.range(8).batch(2))
    assert [locals_of(s, b) for b in dist] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_per_replica_input_mode_is_not_implemented():
    s = C(2)
    options = mpidist.InputOptions(
        experimental_replication_mode=mpidist.InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match=re.escape(
            "InputReplicationMode.PER_REPLICA is only supported in "
            "`distribute_datasets_from_function`.")):
        s.experimental_distribute_dataset(Dataset.range(6).batch(4), options)
    with pytest.raises(NotImplementedError, match=re.escape(
            "InputReplicationMode.PER_REPLICA is only supported in "
            "`distribute_datasets_from_function` of mpidist.MirroredStrategy")):
        s.distribute_datasets_from_function(lambda ctx: Dataset.range(4).batch(2), options)


# -- reductions ---------------------------------------------------------------------------------
def test_reduce_reduce_to_and_batch_reduce_to():
    s = C(2, parameter_device="/cpu:1")
    pr = s.experimental_distribute_values_from_function(
        lambda ctx: np.array([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1))
    assert s.reduce("SUM", pr, axis=None).tolist() == [3.0, 6.0]
    assert s.reduce("MEAN", pr, axis=None).tolist() == [1.5, 3.0]
    assert float(s.reduce("SUM", pr, axis=0)) == 9.0
    v = variable(s, [0.0, 0.0])
    assert s.extended.reduce_to("SUM", pr, v).tolist() == [3.0, 6.0]  # one destination: an array
    got = s.extended.batch_reduce_to("MEAN", [(pr, v), (pr, "/cpu:0")])
    assert [g.tolist() for g in got] == [[1.5, 3.0], [1.5, 3.0]]


def test_gather_concatenates_in_replica_order():
    s = C(3)
    pr = s.experimental_distribute_values_from_function(
        lambda ctx: np.array([ctx.replica_id_in_sync_group] * 2))
    assert s.gather(pr, axis=0).tolist() == [0, 0, 1, 1, 2, 2]


def test_all_reduce_in_replica_context():
    s = C(2)
    out = s.run(lambda: mpidist.get_replica_context().all_reduce("SUM", np.float64(rid()) + 1))
    assert locals_of(s, out) == [3.0, 3.0]


# -- checkpoints --------------------------------------------------------------------------------
def test_checkpoints_save_the_one_copy_and_restore_across_strategies(tmp_path):
    s = C(2)
    v = variable(s, [1.0, 2.0], aggregation=Agg.SUM, name="v")
    s.run(lambda: v.assign_add(np.ones(2), read_value=False))  # [3, 4]
    path = mpidist.train.Checkpoint(v=v).save(str(tmp_path / "central"))

    m = mirrored(2)
    into_mirrored = variable(m, [0.0, 0.0], name="v")
    mpidist.train.Checkpoint(v=into_mirrored).restore(path)
    assert [c.numpy().tolist() for c in into_mirrored.values] == [[3.0, 4.0]] * 2

    into_mirrored.assign([5.0, 6.0])
    back = mpidist.train.Checkpoint(v=into_mirrored).save(str(tmp_path / "mirrored"))
    mpidist.train.Checkpoint(v=v).restore(back)
    assert v.numpy().tolist() == [5.0, 6.0]

    again = variable(C(3), [0.0, 0.0], name="v")
    mpidist.train.Checkpoint(v=again).restore(path)
    assert again.numpy().tolist() == [3.0, 4.0]


def test_optimizer_state_round_trips_through_a_checkpoint(tmp_path):
    w, _, optimizer = _train(C(2), mpidist.optimizers.SGD, learning_rate=0.1, momentum=0.9)
    path = mpidist.train.Checkpoint(w=w, opt=optimizer).save(str(tmp_path / "ckpt"))
    w2, _, optimizer2 = _train(C(2), mpidist.optimizers.SGD, steps=1, learning_rate=0.1,
                               momentum=0.9)
    mpidist.train.Checkpoint(w=w2, opt=optimizer2).restore(path)
    assert np.array_equal(w2.numpy(), w.numpy())
    assert int(optimizer2.iterations.numpy()) == 3
    assert np.array_equal(optimizer2.get_slot(w2, "momentum").numpy(),
                          optimizer.get_slot(w, "momentum").numpy())
