"""Variables created in a strategy scope: spec sections 4.1-4.4 of
/work/shared/reference/tf-distribute-semantics.md (plus the values 4.5 says are saved,
through ``strategy.extended.read_var``), and variables in NumPy expressions.

Conventions used below: ``S(N)`` is a MirroredStrategy over N virtual CPU devices; ``rid()`` is
the current replica id; ``comps(s, v)`` lists the per-replica component values of ``v``.
"""

import contextlib
import threading

import numpy as np
import pytest

import mpidist
from replicas import mirrored as S, rid
from mpidist import VariableAggregation as Agg
from mpidist import VariableSynchronization as Sync

NS = [1, 2, 3, 4]
MULTI = [2, 3, 4]
ALL_AGGS = [Agg.NONE, Agg.SUM, Agg.MEAN, Agg.ONLY_FIRST_REPLICA]
KINDS = ["assign", "assign_add", "assign_sub"]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def comps(strategy, v):
    """Component values of a distributed variable, as Python numbers, in replica order."""
    return [c.numpy().item() for c in strategy.experimental_local_results(v)]


def local(strategy, x):
    """Per-replica values of a run result (PerReplica, Mirrored or a plain value)."""
    return [np.asarray(c).tolist() for c in strategy.experimental_local_results(x)]


def make_var(strategy, init=10.0, **kwargs):
    with strategy.scope():
        return mpidist.Variable(init, **kwargs)


def set_components(strategy, v, first, step=1.0):
    """Give replica i's component the value first + i*step (v must have local-only writes:
    a MirroredVariable with aggregation NONE, or a SyncOnReadVariable)."""
    assert v.aggregation is Agg.NONE or isinstance(v, mpidist.SyncOnReadVariable)
    strategy.run(lambda: v.assign(np.float64(first + step * rid()), read_value=False))


def expected_update(kind, start, value):
    return {"assign": value, "assign_add": start + value, "assign_sub": start - value}[kind]


# ---------------------------------------------------------------------------------------------
# 4.1 Creation
# ---------------------------------------------------------------------------------------------
class TestCreation:
    @pytest.mark.parametrize("n", NS)
    def test_auto_synchronization_is_reported_as_on_write(self, n):
        """4.1: synchronization AUTO is treated as ON_WRITE and reported as such."""
        s = S(n)
        v = make_var(s, 1.0, synchronization=Sync.AUTO)
        assert v.synchronization is Sync.ON_WRITE
        assert isinstance(v, mpidist.MirroredVariable)

    def test_default_synchronization_is_on_write(self):
        """4.1: with no synchronization given the variable is ON_WRITE (AUTO)."""
        v = make_var(S(2), 1.0)
        assert v.synchronization is Sync.ON_WRITE
        assert isinstance(v, mpidist.MirroredVariable)

    @pytest.mark.parametrize("n", NS)
    def test_on_write_creates_mirrored_variable(self, n):
        """4.1: ON_WRITE -> MirroredVariable with one component per device."""
        s = S(n)
        v = make_var(s, 1.0, synchronization=Sync.ON_WRITE)
        assert type(v) is mpidist.MirroredVariable
        assert not isinstance(v, mpidist.SyncOnReadVariable)
        assert isinstance(v, mpidist.DistributedValues)
        assert v.synchronization is Sync.ON_WRITE
        assert len(s.experimental_local_results(v)) == n

    @pytest.mark.parametrize("n", NS)
    def test_on_read_creates_sync_on_read_variable(self, n):
        """4.1: ON_READ -> SyncOnReadVariable with one component per device."""
        s = S(n)
        v = make_var(s, 1.0, synchronization=Sync.ON_READ, aggregation=Agg.SUM)
        assert type(v) is mpidist.SyncOnReadVariable
        assert not isinstance(v, mpidist.MirroredVariable)
        assert v.synchronization is Sync.ON_READ
        assert len(s.experimental_local_results(v)) == n

    @pytest.mark.parametrize("n", NS)
    def test_none_synchronization_raises_naming_the_variable(self, n):
        """4.1: synchronization NONE -> ValueError naming the variable."""
        s = S(n)
        with s.scope():
            with pytest.raises(ValueError, match=r"`NONE` variable synchronization mode is not supported"
                                                 r"(.|\n)*for variable: weights_77"):
                mpidist.Variable(1.0, name="weights_77", synchronization=Sync.NONE)

    @pytest.mark.parametrize("bad", ["BOGUS", 7, mpidist.ReduceOp.SUM])
    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    def test_invalid_aggregation_raises(self, bad, sync):
        """4.1: an aggregation outside {NONE, SUM, MEAN, ONLY_FIRST_REPLICA} -> ValueError."""
        s = S(2)
        with s.scope():
            with pytest.raises(ValueError, match="Invalid variable aggregation mode"):
                mpidist.Variable(1.0, synchronization=sync, aggregation=bad)

    @pytest.mark.parametrize("agg", ALL_AGGS)
    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    def test_valid_aggregations_are_accepted_and_reported(self, agg, sync):
        """4.1: every VariableAggregation member is accepted and reported back."""
        v = make_var(S(2), 1.0, synchronization=sync, aggregation=agg)
        assert v.aggregation is agg

    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    @pytest.mark.parametrize("init,dtype", [(1, None), (1, np.int32), (np.int64(3), None)])
    def test_mean_with_non_floating_dtype_raises(self, sync, init, dtype):
        """4.1: aggregation=MEAN with an integer dtype (either sync) -> ValueError."""
        s = S(2)
        with s.scope():
            with pytest.raises(ValueError, match="aggregation=MEAN and a non-floating dtype"):
                mpidist.Variable(init, dtype=dtype, synchronization=sync, aggregation=Agg.MEAN)

    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    def test_mean_with_float32_is_fine(self, sync):
        """4.1: MEAN is allowed for floating dtypes."""
        s = S(2)
        v = make_var(s, 1.5, dtype=np.float32, synchronization=sync, aggregation=Agg.MEAN)
        assert v.dtype == np.float32
        assert comps(s, v) == [1.5, 1.5]

    @pytest.mark.parametrize("sync,trainable,expected", [
        (Sync.AUTO, None, True),
        (Sync.ON_WRITE, None, True),
        (Sync.ON_READ, None, False),
        (Sync.ON_READ, True, True),
        (Sync.ON_WRITE, False, False),
    ])
    def test_trainable_defaults(self, sync, trainable, expected):
        """4.1: trainable defaults to synchronization != ON_READ; an explicit value wins."""
        s = S(2)
        v = make_var(s, 1.0, trainable=trainable, synchronization=sync, aggregation=Agg.SUM)
        assert v.trainable is expected
        assert [c.trainable for c in s.experimental_local_results(v)] == [expected, expected]

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    def test_component_names(self, n, sync):
        """4.1: component 0 is '<name>:0', component i>0 is '<name>/replica_<i>:0'."""
        s = S(n)
        v = make_var(s, 1.0, synchronization=sync, aggregation=Agg.SUM)
        expected = ["Variable:0"] + [f"Variable/replica_{i}:0" for i in range(1, n)]
        assert [c.name for c in s.experimental_local_results(v)] == expected
        w = make_var(s, 1.0, name="w", synchronization=sync, aggregation=Agg.SUM)
        expected_w = ["w:0"] + [f"w/replica_{i}:0" for i in range(1, n)]
        assert [c.name for c in s.experimental_local_results(w)] == expected_w

    @pytest.mark.parametrize("n", NS)
    def test_container_name_and_device_are_the_primarys(self, n):
        """4.1: container name/device = component 0's ('Variable:0', .../device:CPU:0)."""
        s = S(n)
        v = make_var(s, 1.0)
        components = s.experimental_local_results(v)
        assert v.name == "Variable:0" == components[0].name
        assert v.device == components[0].device
        assert v.device.endswith("device:CPU:0")
        for i, c in enumerate(components):
            assert c.device.endswith(f"device:CPU:{i}")
        assert len({c.device for c in components}) == n

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    def test_component_initial_values_are_equal_independent_copies(self, n, sync):
        """4.1: every component starts as a copy of replica 0's initial value."""
        s = S(n)
        init = np.array([1.0, 2.0, 3.0])
        v = make_var(s, init, synchronization=sync, aggregation=Agg.SUM)
        components = s.experimental_local_results(v)
        for c in components:
            np.testing.assert_array_equal(c.numpy(), [1.0, 2.0, 3.0])
            assert c.dtype == np.float64
            assert c.shape == (3,)
        init[0] = 99.0  # the caller's array is copied, not aliased
        for c in components:
            assert c.numpy()[0] == 1.0

    def test_python_float_initial_value_is_float64(self):
        """4.1 / brief: a Python float initial value gives a float64 variable."""
        s = S(2)
        v = make_var(s, 2.5)
        assert v.dtype == np.float64
        assert all(c.dtype == np.float64 for c in s.experimental_local_results(v))

    @pytest.mark.parametrize("n", NS)
    def test_callable_initial_value(self, n):
        """4.1: initial_value may be a zero-argument callable."""
        s = S(n)
        v = make_var(s, lambda: np.full((2,), 4.0))
        assert [c.numpy().tolist() for c in s.experimental_local_results(v)] == [[4.0, 4.0]] * n

    def test_variable_created_in_scope(self):
        """4.1: variable_created_in_scope is True only for this strategy's variables."""
        s, other = S(2), S(2)
        mine = make_var(s, 1.0)
        theirs = make_var(other, 1.0)
        plain = mpidist.Variable(1.0)
        assert s.extended.variable_created_in_scope(mine) is True
        assert s.extended.variable_created_in_scope(theirs) is False
        assert s.extended.variable_created_in_scope(plain) is False
        assert other.extended.variable_created_in_scope(theirs) is True

    def test_variable_created_in_scope_default_strategy(self):
        """4.1: default strategy -> True iff the variable is not distributed."""
        default = mpidist.get_strategy()
        assert not mpidist.has_strategy()
        assert default.extended.variable_created_in_scope(mpidist.Variable(1.0)) is True
        assert default.extended.variable_created_in_scope(make_var(S(2), 1.0)) is False

    def test_plain_variable_outside_any_scope(self):
        """4.1: outside every scope mpidist.Variable is a plain Variable."""
        v = mpidist.Variable(3.0, name="plain")
        assert type(v) is mpidist.Variable
        assert not isinstance(v, mpidist.DistributedValues)
        assert v.name == "plain:0"
        assert v.numpy() == 3.0
        assert v.trainable is True

    def test_one_device_strategy_creates_plain_variable(self):
        """9.8 / 4.1: OneDeviceStrategy creates a plain Variable on its device."""
        s = mpidist.OneDeviceStrategy("/cpu:0")
        with s.scope():
            v = mpidist.Variable(5.0)
        assert type(v) is mpidist.Variable
        assert not isinstance(v, mpidist.DistributedValues)
        assert v.numpy() == 5.0
        assert s.experimental_local_results(v) == (v,)
        assert s.extended.variable_created_in_scope(v) is True

    @pytest.mark.parametrize("n", NS)
    def test_variable_created_in_replica_context_is_one_shared_mirrored_variable(self, n):
        """4.1: Variable(...) inside strategy.run creates one MirroredVariable shared by all
        replicas; its components copy replica 0's initial value."""
        s = S(n)
        seen = []
        lock = threading.Lock()

        def fn():
            v = mpidist.Variable(np.float64(10.0 + rid()), name="made_in_run")
            with lock:
                seen.append(v)
            return v

        result = s.run(fn)
        assert len(seen) == n
        assert all(v is seen[0] for v in seen)
        assert result is seen[0]
        assert isinstance(result, mpidist.MirroredVariable)
        assert comps(s, result) == [10.0] * n
        assert result.name == "made_in_run:0"
        assert s.extended.variable_created_in_scope(result)


# ---------------------------------------------------------------------------------------------
# 4.2 Reading a MirroredVariable
# ---------------------------------------------------------------------------------------------
class TestMirroredReads:
    @pytest.mark.parametrize("n", NS)
    def test_replica_context_reads_the_local_component(self, n):
        """4.2: in replica context read_value()/numpy()/value() give the local component."""
        s = S(n)
        v = make_var(s, 0.0)  # aggregation NONE: local writes only
        set_components(s, v, 1.0)
        assert comps(s, v) == [1.0 + i for i in range(n)]
        assert local(s, s.run(lambda: v.read_value())) == [1.0 + i for i in range(n)]
        assert local(s, s.run(lambda: v.numpy())) == [1.0 + i for i in range(n)]
        assert local(s, s.run(lambda: v.value())) == [1.0 + i for i in range(n)]
        assert local(s, s.run(lambda: float(v))) == [1.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", NS)
    def test_cross_replica_read_in_sync(self, n):
        """4.2: in cross-replica context a synchronized variable reads its value."""
        s = S(n)
        v = make_var(s, 2.5)
        with s.scope():
            assert v.read_value() == 2.5
            assert v.numpy() == 2.5
            assert v.value() == 2.5

    @pytest.mark.parametrize("n", MULTI)
    def test_cross_replica_read_out_of_sync_gives_replica_0(self, n):
        """4.2: out-of-sync components (NONE assign) read as replica 0's value cross-replica."""
        s = S(n)
        v = make_var(s, 0.0)
        set_components(s, v, 1.0)
        assert comps(s, v) == [1.0 + i for i in range(n)]
        with s.scope():
            assert mpidist.in_cross_replica_context()
            assert float(np.asarray(v.read_value())) == 1.0
            assert float(np.asarray(v.value())) == 1.0
            assert v.numpy() == 1.0
            assert float(np.asarray(v)) == 1.0
            assert float(v) == 1.0

    @pytest.mark.parametrize("n", MULTI)
    def test_read_outside_scope_out_of_sync_gives_replica_0(self, n):
        """4.2: with no strategy active the variable reads as replica 0's component."""
        s = S(n)
        v = make_var(s, 0.0)
        set_components(s, v, 1.0)
        assert v.numpy() == 1.0
        assert float(np.asarray(v.read_value())) == 1.0

    @pytest.mark.parametrize("n", MULTI)
    def test_cross_replica_read_on_a_component_device_gives_that_component(self, n):
        """4.2 + 5.4: in an update fn (under component i's device) the container reads as
        component i."""
        s = S(n)
        v = make_var(s, 0.0)
        set_components(s, v, 1.0)
        got = s.extended.update(v, lambda component: v.numpy(), group=False)
        assert [np.asarray(g).item() for g in got] == [1.0 + i for i in range(n)]


# ---------------------------------------------------------------------------------------------
# 4.3 Updating a MirroredVariable
# ---------------------------------------------------------------------------------------------
# The N=2 table, verbatim from the spec (initial 10.0, replica value rid+1).
TABLE_N2 = {
    (Agg.NONE, "assign"): [1, 2], (Agg.NONE, "assign_add"): [11, 12], (Agg.NONE, "assign_sub"): [9, 8],
    (Agg.SUM, "assign"): [3, 3], (Agg.SUM, "assign_add"): [13, 13], (Agg.SUM, "assign_sub"): [7, 7],
    (Agg.MEAN, "assign"): [1.5, 1.5], (Agg.MEAN, "assign_add"): [11.5, 11.5],
    (Agg.MEAN, "assign_sub"): [8.5, 8.5],
    (Agg.ONLY_FIRST_REPLICA, "assign"): [1, 1], (Agg.ONLY_FIRST_REPLICA, "assign_add"): [11, 11],
    (Agg.ONLY_FIRST_REPLICA, "assign_sub"): [9, 9],
}


def general_expected(agg, kind, n):
    """The 4.3 rule at N replicas, replica i contributing i+1, start value 10."""
    contributions = [i + 1.0 for i in range(n)]
    if agg is Agg.NONE:
        return [expected_update(kind, 10.0, c) for c in contributions]
    reduced = {Agg.SUM: sum(contributions), Agg.MEAN: sum(contributions) / n,
               Agg.ONLY_FIRST_REPLICA: contributions[0]}[agg]
    return [expected_update(kind, 10.0, reduced)] * n


class TestMirroredUpdatesReplicaContext:
    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_table_n2(self, agg, kind):
        """4.3 table at N=2: per-replica value rid+1 on a variable initialised to 10."""
        s = S(2)
        v = make_var(s, 10.0, aggregation=agg)
        s.run(lambda: getattr(v, kind)(np.float64(rid() + 1)))
        assert comps(s, v) == TABLE_N2[(agg, kind)]

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_general_n(self, n, agg, kind):
        """4.3 at N=1..4: NONE per-replica, SUM sum, MEAN mean, ONLY_FIRST replica 0's value."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=agg)
        s.run(lambda: getattr(v, kind)(np.float64(rid() + 1)))
        assert comps(s, v) == pytest.approx(general_expected(agg, kind, n))

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("kind,expected", [("assign", 3.0), ("assign_add", 13.0), ("assign_sub", 7.0)])
    @pytest.mark.parametrize("agg", [Agg.NONE, Agg.MEAN, Agg.ONLY_FIRST_REPLICA])
    def test_same_value_on_all_replicas(self, n, agg, kind, expected):
        """4.3: the identical Python float on every replica -> applied once to every copy."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=agg)
        s.run(lambda: getattr(v, kind)(3.0))
        assert comps(s, v) == [expected] * n

    @pytest.mark.parametrize("n", MULTI)
    @pytest.mark.parametrize("kind", KINDS)
    def test_same_value_with_sum_raises_and_changes_nothing(self, n, kind):
        """4.3: SUM of a non-distributed value -> ValueError; every component unchanged."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=Agg.SUM)
        with pytest.raises(ValueError, match=r"A non-DistributedValues value 3\.0 cannot be reduced "
                                             r"with the given reduce op ReduceOp\.SUM"):
            s.run(lambda: getattr(v, kind)(3.0))
        assert comps(s, v) == [10.0] * n

    @pytest.mark.parametrize("kind,expected", [("assign", 3.0), ("assign_add", 13.0), ("assign_sub", 7.0)])
    def test_same_value_with_sum_on_one_replica_is_broadcast(self, kind, expected):
        """4.3 + 5.1: with N == 1 a non-distributed SUM value is simply broadcast."""
        s = S(1)
        v = make_var(s, 10.0, aggregation=Agg.SUM)
        s.run(lambda: getattr(v, kind)(3.0))
        assert comps(s, v) == [expected]

    @pytest.mark.parametrize("n", NS)
    def test_integer_variable_with_sum(self, n):
        """4.3: int Variable(1, SUM), assign_add(rid+1) -> 1 + N(N+1)/2 everywhere ([4,4] at N=2)."""
        s = S(n)
        v = make_var(s, 1, aggregation=Agg.SUM)
        s.run(lambda: v.assign_add(rid() + 1))
        assert comps(s, v) == [1 + n * (n + 1) // 2] * n
        assert all(c.dtype.kind == "i" for c in s.experimental_local_results(v))

    @pytest.mark.parametrize("n", NS)
    def test_integer_variable_with_only_first_replica(self, n):
        """4.3: int variables work with ONLY_FIRST_REPLICA (replica 0's value everywhere)."""
        s = S(n)
        v = make_var(s, 1, aggregation=Agg.ONLY_FIRST_REPLICA)
        s.run(lambda: v.assign_add(rid() + 1))
        assert comps(s, v) == [2] * n
        s.run(lambda: v.assign(rid() + 5))
        assert comps(s, v) == [5] * n
        assert all(c.dtype.kind == "i" for c in s.experimental_local_results(v))

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    @pytest.mark.parametrize("container", ["per_replica", "mirrored"])
    def test_distributed_value_in_replica_context_raises_type_error(self, n, agg, container):
        """4.3: a DistributedValues as the update value in replica context -> TypeError."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=agg)
        if container == "per_replica":
            dv = s.experimental_distribute_values_from_function(
                lambda ctx: np.float64(ctx.replica_id_in_sync_group))
        else:
            dv = mpidist.Mirrored([np.float64(2.0)] * n)
        assert isinstance(dv, mpidist.DistributedValues)
        with pytest.raises(TypeError, match="Cannot use DistributedValues to update variables in "
                                            "replica context"):
            s.run(lambda: v.assign(dv))
        assert comps(s, v) == [10.0] * n

    @pytest.mark.parametrize("n", MULTI)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_return_value_after_run_is_per_replica_of_post_update_values(self, n, agg):
        """4.3: assign* in replica context, returned from run -> PerReplica of new values."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=agg)
        result = s.run(lambda: v.assign_add(np.float64(rid() + 1)))
        assert isinstance(result, mpidist.PerReplica)
        expected = general_expected(agg, "assign_add", n)
        assert local(s, result) == pytest.approx(expected)
        assert comps(s, v) == pytest.approx(expected)

    @pytest.mark.parametrize("n", MULTI)
    def test_failing_update_in_replica_context_leaves_every_component_unchanged(self, n):
        """4.3 / design: an update that fails validation (wrong shape) changes no component."""
        s = S(n)
        v = make_var(s, np.array([1.0, 2.0]), aggregation=Agg.SUM)
        with pytest.raises(ValueError, match="shape"):
            s.run(lambda: v.assign(np.ones(3) * (rid() + 1)))
        assert [c.numpy().tolist() for c in s.experimental_local_results(v)] == [[1.0, 2.0]] * n


class TestMirroredUpdatesCrossReplica:
    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_applies_value_to_every_component(self, n, agg):
        """4.3: cross-replica assign(3.) -> all 3, assign_add(3.) -> 13 (from 10), assign_sub."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=agg)
        with s.scope():
            v.assign_add(3.0)
            assert comps(s, v) == [13.0] * n
            v.assign(10.0)
            v.assign_sub(3.0)
            assert comps(s, v) == [7.0] * n
            v.assign(3.0)
            assert comps(s, v) == [3.0] * n

    @pytest.mark.parametrize("n", MULTI)
    @pytest.mark.parametrize("kind,expected", [("assign", 3.0), ("assign_add", 13.0), ("assign_sub", 7.0)])
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_returns_mirrored_of_updated_values(self, n, agg, kind, expected):
        """4.3: cross-replica assign* returns a Mirrored of the updated values."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=agg)
        with s.scope():
            result = getattr(v, kind)(3.0)
        assert isinstance(result, mpidist.Mirrored)
        assert local(s, result) == [expected] * n
        assert comps(s, v) == [expected] * n

    @pytest.mark.parametrize("n", NS)
    def test_out_of_sync_components_are_each_updated(self, n):
        """4.3: cross-replica assign_add applies to every component (even out of sync)."""
        s = S(n)
        v = make_var(s, 0.0)
        set_components(s, v, 1.0)
        with s.scope():
            v.assign_add(10.0)
        assert comps(s, v) == [11.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", NS)
    def test_mirrored_value_from_broadcast_to(self, n):
        """4.3: assign(broadcast_to(7., v)) -> 7 on every component."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=Agg.SUM)
        with s.scope():
            m = s.extended.broadcast_to(np.array(7.0), v)
            v.assign(m)
        assert comps(s, v) == [7.0] * n

    @pytest.mark.parametrize("n", MULTI)
    def test_mirrored_value_is_applied_componentwise(self, n):
        """4.3: a Mirrored value is applied component by component (component i -> i)."""
        s = S(n)
        v = make_var(s, 10.0)
        m = mpidist.Mirrored([np.float64(7.0 + i) for i in range(n)])
        with s.scope():
            v.assign(m)
        assert comps(s, v) == [7.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", MULTI)
    def test_per_replica_value_is_applied_componentwise(self, n):
        """4.3: a PerReplica value is also applied component-wise."""
        s = S(n)
        v = make_var(s, 10.0, aggregation=Agg.MEAN)
        pr = s.experimental_distribute_values_from_function(
            lambda ctx: np.float64(ctx.replica_id_in_sync_group + 1))
        with s.scope():
            v.assign_add(pr)
        assert comps(s, v) == [11.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", MULTI)
    def test_failing_componentwise_update_changes_nothing(self, n):
        """Design 5 / 4.3: one bad component (float into int) -> TypeError, no component written."""
        s = S(n)
        v = make_var(s, 10)
        pr = mpidist.PerReplica([np.int64(1)] * (n - 1) + [np.float64(1.5)])
        with s.scope():
            with pytest.raises(TypeError, match="dtype"):
                v.assign(pr)
        assert comps(s, v) == [10] * n

    @pytest.mark.parametrize("n", MULTI)
    def test_failing_componentwise_shape_changes_nothing(self, n):
        """Design 5 / 4.3: one wrongly shaped component -> ValueError, no component written."""
        s = S(n)
        v = make_var(s, np.zeros(2))
        pr = mpidist.PerReplica([np.ones(2)] * (n - 1) + [np.ones(3)])
        with s.scope():
            with pytest.raises(ValueError, match="shape"):
                v.assign(pr)
        assert [c.numpy().tolist() for c in s.experimental_local_results(v)] == [[0.0, 0.0]] * n


# ---------------------------------------------------------------------------------------------
# 4.4 SyncOnReadVariable
# ---------------------------------------------------------------------------------------------
def on_read(strategy, agg, init=10.0, **kwargs):
    return make_var(strategy, init, synchronization=Sync.ON_READ, aggregation=agg, **kwargs)


class TestSyncOnReadReplicaContext:
    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_writes_touch_only_the_local_component(self, n, agg, kind):
        """4.4: replica-context assign* change only the replica's own copy (no aggregation)."""
        s = S(n)
        v = on_read(s, agg)
        s.run(lambda: getattr(v, kind)(np.float64(rid() + 1)))
        assert comps(s, v) == [expected_update(kind, 10.0, i + 1.0) for i in range(n)]

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_replica_reads_are_local(self, n, agg):
        """4.4: read_value() in replica context gives the local component ([11, 12])."""
        s = S(n)
        v = on_read(s, agg)
        s.run(lambda: v.assign_add(np.float64(rid() + 1)))
        assert local(s, s.run(lambda: v.read_value())) == [11.0 + i for i in range(n)]
        assert local(s, s.run(lambda: v + 0.0)) == [11.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", MULTI)
    def test_same_value_with_sum_is_written_locally(self, n):
        """4.4: ON_READ SUM in replica context does no reduction, so the same value is fine."""
        s = S(n)
        v = on_read(s, Agg.SUM)
        s.run(lambda: v.assign(3.0))
        assert comps(s, v) == [3.0] * n


def with_components(strategy, agg, start=10.0):
    """ON_READ variable whose component i holds start + 1 + i ([11, 12] at N=2)."""
    v = on_read(strategy, agg, start)
    strategy.run(lambda: v.assign_add(np.float64(rid() + 1), read_value=False))
    return v


class TestSyncOnReadCrossReplica:
    @pytest.mark.parametrize("agg,expected", [(Agg.SUM, 23.0), (Agg.MEAN, 11.5),
                                              (Agg.ONLY_FIRST_REPLICA, 11.0)])
    def test_read_table_n2(self, agg, expected):
        """4.4: components [11, 12] read cross-replica: SUM 23, MEAN 11.5, ONLY_FIRST 11."""
        s = S(2)
        v = with_components(s, agg)
        assert comps(s, v) == [11.0, 12.0]
        with s.scope():
            assert float(np.asarray(v.read_value())) == expected
            assert float(np.asarray(v.value())) == expected
            assert v.numpy() == expected
            assert float(np.asarray(v)) == expected
            assert float(v) == expected
            assert float(v + 0.0) == expected

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("agg", [Agg.SUM, Agg.MEAN, Agg.ONLY_FIRST_REPLICA])
    def test_read_general_n(self, n, agg):
        """4.4 at N=1..4: SUM sums, MEAN averages, ONLY_FIRST reads replica 0."""
        s = S(n)
        v = with_components(s, agg)
        values = [11.0 + i for i in range(n)]
        expected = {Agg.SUM: sum(values), Agg.MEAN: sum(values) / n,
                    Agg.ONLY_FIRST_REPLICA: values[0]}[agg]
        with s.scope():
            assert float(np.asarray(v.read_value())) == pytest.approx(expected)
            assert v.numpy() == pytest.approx(expected)

    @pytest.mark.parametrize("n", NS)
    def test_read_with_aggregation_none_raises(self, n):
        """4.4: a cross-replica read of an ON_READ NONE variable -> ValueError."""
        s = S(n)
        v = with_components(s, Agg.NONE)
        with s.scope():
            for read in (v.read_value, v.value, v.numpy, lambda: np.asarray(v)):
                with pytest.raises(ValueError, match="Could not convert from"):
                    read()

    def test_none_variable_is_creatable_and_untrainable(self):
        """4.4: ON_READ + NONE creation succeeds, trainable False; replica reads/writes work."""
        s = S(2)
        v = on_read(s, Agg.NONE)
        assert v.trainable is False
        s.run(lambda: v.assign(np.float64(rid() + 7)))
        assert local(s, s.run(lambda: v.read_value())) == [7.0, 8.0]

    @pytest.mark.parametrize("n", NS)
    def test_sum_assign_stores_value_over_n(self, n):
        """4.4: SUM assign(6.) -> each component 6/N ([3, 3] at N=2); reads back as 6."""
        s = S(n)
        v = with_components(s, Agg.SUM)
        with s.scope():
            returned = v.assign(6.0)
            assert float(np.asarray(returned)) == pytest.approx(6.0)
            assert v.numpy() == pytest.approx(6.0)
        assert comps(s, v) == pytest.approx([6.0 / n] * n)

    @pytest.mark.parametrize("n", NS)
    def test_sum_assign_casts_value_over_n_to_dtype(self, n):
        """4.4: SUM assign on an int variable stores int(value / N) ([3, 3] for 7 at N=2)."""
        s = S(n)
        v = on_read(s, Agg.SUM, 0)
        with s.scope():
            v.assign(7, read_value=False)
        assert comps(s, v) == [int(7 / n)] * n
        assert all(c.dtype.kind == "i" for c in s.experimental_local_results(v))

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("kind", ["assign_add", "assign_sub"])
    def test_sum_assign_add_sub_raise_and_change_nothing(self, n, kind):
        """4.4: cross-replica assign_add/assign_sub on a SUM SyncOnRead -> ValueError."""
        s = S(n)
        v = with_components(s, Agg.SUM)
        with s.scope():
            with pytest.raises(ValueError, match=rf"does not support `{kind}` in cross-replica "
                                                 rf"context when aggregation is set to(.|\n)*SUM"):
                getattr(v, kind)(1.0)
        assert comps(s, v) == [11.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("agg", [Agg.MEAN, Agg.ONLY_FIRST_REPLICA])
    def test_mean_and_only_first_update_table(self, n, agg):
        """4.4: MEAN / ONLY_FIRST: assign(6.) -> all 6, assign_add(1.) -> 7, assign_sub(1.) -> 6."""
        s = S(n)
        v = with_components(s, agg)
        with s.scope():
            assert float(np.asarray(v.assign(6.0))) == 6.0
            assert comps(s, v) == [6.0] * n
            assert float(np.asarray(v.assign_add(1.0))) == 7.0
            assert comps(s, v) == [7.0] * n
            assert float(np.asarray(v.assign_sub(1.0))) == 6.0
            assert comps(s, v) == [6.0] * n

    @pytest.mark.parametrize("n", NS)
    def test_none_writes_then_raises_when_reading_back(self, n):
        """4.4: NONE: assign* writes every component, then the read-back raises (read_value=True)."""
        s = S(n)
        v = with_components(s, Agg.NONE)
        with s.scope():
            with pytest.raises(ValueError, match="Could not convert from"):
                v.assign(6.0)
            assert comps(s, v) == [6.0] * n
            with pytest.raises(ValueError, match="Could not convert from"):
                v.assign_add(1.0)
            assert comps(s, v) == [7.0] * n
            with pytest.raises(ValueError, match="Could not convert from"):
                v.assign_sub(2.0)
            assert comps(s, v) == [5.0] * n

    @pytest.mark.parametrize("n", NS)
    def test_none_with_read_value_false_succeeds(self, n):
        """4.4: NONE with read_value=False: the writes succeed silently."""
        s = S(n)
        v = with_components(s, Agg.NONE)
        with s.scope():
            v.assign(6.0, read_value=False)
            assert comps(s, v) == [6.0] * n
            v.assign_add(1.0, read_value=False)
            assert comps(s, v) == [7.0] * n
            v.assign_sub(1.0, read_value=False)
            assert comps(s, v) == [6.0] * n

    @pytest.mark.parametrize("n", MULTI)
    @pytest.mark.parametrize("in_scope", [False, True])
    def test_strategy_reduce_on_none_variable(self, n, in_scope):
        """4.4: strategy.reduce works on an ON_READ NONE variable ([7, 8] -> SUM 15, MEAN 7.5)."""
        s = S(n)
        v = on_read(s, Agg.NONE)
        s.run(lambda: v.assign(np.float64(rid() + 7)))
        values = [7.0 + i for i in range(n)]
        assert comps(s, v) == values
        if in_scope:
            with s.scope():
                total = s.reduce(mpidist.ReduceOp.SUM, v, axis=None)
                mean = s.reduce(mpidist.ReduceOp.MEAN, v, axis=None)
        else:
            total = s.reduce(mpidist.ReduceOp.SUM, v, axis=None)
            mean = s.reduce(mpidist.ReduceOp.MEAN, v, axis=None)
        assert float(np.asarray(total)) == sum(values)
        assert float(np.asarray(mean)) == pytest.approx(sum(values) / n)

    def test_strategy_reduce_on_none_variable_spec_numbers(self):
        """4.4: the spec's exact example at N=2: [7, 8] -> 15.0 and 7.5."""
        s = S(2)
        v = on_read(s, Agg.NONE)
        s.run(lambda: v.assign(np.float64(rid() + 7)))
        assert float(np.asarray(s.reduce("SUM", v, axis=None))) == 15.0
        assert float(np.asarray(s.reduce("MEAN", v, axis=None))) == 7.5

    @pytest.mark.parametrize("n", NS)
    def test_experimental_local_results_gives_components(self, n):
        """4.4: experimental_local_results(v) -> the component variables, in replica order."""
        s = S(n)
        v = with_components(s, Agg.NONE)
        components = s.experimental_local_results(v)
        assert isinstance(components, tuple)
        assert len(components) == n
        assert all(isinstance(c, mpidist.Variable) and not isinstance(c, mpidist.DistributedValues)
                   for c in components)
        assert [c.numpy().item() for c in components] == [11.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("agg", ALL_AGGS)
    def test_extended_update_applies_fn_to_every_component(self, n, agg):
        """4.4 / 5.4: strategy.extended.update(sync_on_read_var, fn) runs fn on each component."""
        s = S(n)
        v = with_components(s, agg)
        seen = []

        def fn(component, delta):
            assert mpidist.in_cross_replica_context()
            seen.append(component)
            component.assign_add(delta)

        s.extended.update(v, fn, args=(1.0,))
        assert seen == list(s.experimental_local_results(v))
        assert comps(s, v) == [12.0 + i for i in range(n)]


# ---------------------------------------------------------------------------------------------
# read_var: the values section 4.5 says a checkpoint saves
# ---------------------------------------------------------------------------------------------
class TestReadVar:
    @pytest.mark.parametrize("n", MULTI)
    @pytest.mark.parametrize("in_scope", [False, True])
    def test_mirrored_out_of_sync_reads_replica_0(self, n, in_scope):
        """4.5: read_var(MirroredVariable) out of sync -> replica 0's value ([1, 2] saves 1.0)."""
        s = S(n)
        v = make_var(s, 0.0)
        set_components(s, v, 1.0)
        if in_scope:
            with s.scope():
                got = s.extended.read_var(v)
        else:
            got = s.extended.read_var(v)
        assert float(np.asarray(got)) == 1.0

    @pytest.mark.parametrize("n", MULTI)
    @pytest.mark.parametrize("in_scope", [False, True])
    @pytest.mark.parametrize("agg", [Agg.SUM, Agg.MEAN, Agg.ONLY_FIRST_REPLICA])
    def test_sync_on_read_reads_aggregated(self, n, agg, in_scope):
        """4.5: read_var(SyncOnRead) -> aggregated ([3, 5]: SUM 8, MEAN 4, ONLY_FIRST 3)."""
        s = S(n)
        v = on_read(s, agg, 0.0)
        s.run(lambda: v.assign(np.float64(3 + 2 * rid())))
        values = [3.0 + 2 * i for i in range(n)]
        assert comps(s, v) == values
        expected = {Agg.SUM: sum(values), Agg.MEAN: sum(values) / n,
                    Agg.ONLY_FIRST_REPLICA: 3.0}[agg]
        if in_scope:
            with s.scope():
                got = s.extended.read_var(v)
        else:
            got = s.extended.read_var(v)
        assert float(np.asarray(got)) == pytest.approx(expected)

    def test_sync_on_read_spec_numbers(self):
        """4.5 table at N=2: components [3, 5] -> SUM 8.0, MEAN 4.0, ONLY_FIRST 3.0."""
        s = S(2)
        for agg, expected in [(Agg.SUM, 8.0), (Agg.MEAN, 4.0), (Agg.ONLY_FIRST_REPLICA, 3.0)]:
            v = on_read(s, agg, 0.0)
            s.run(lambda: v.assign(np.float64(3 + 2 * rid())))
            with s.scope():
                assert float(np.asarray(s.extended.read_var(v))) == expected

    def test_sync_on_read_none_raises(self):
        """4.5: read_var of an ON_READ NONE variable raises the NONE ValueError."""
        s = S(2)
        v = on_read(s, Agg.NONE, 0.0)
        with s.scope():
            with pytest.raises(ValueError, match="Could not convert from"):
                s.extended.read_var(v)


# ---------------------------------------------------------------------------------------------
# Variables in NumPy expressions
# ---------------------------------------------------------------------------------------------
def replica_vector_var(strategy, sync):
    """Vector variable whose component i is [1, 2] * (i + 1); local-only writes."""
    agg = Agg.NONE if sync is Sync.ON_WRITE else Agg.SUM
    with strategy.scope():
        v = mpidist.Variable(np.zeros(2), synchronization=sync, aggregation=agg)
    strategy.run(lambda: v.assign(np.array([1.0, 2.0]) * (rid() + 1), read_value=False))
    return v


class TestNumpyExpressions:
    @pytest.mark.parametrize("n", NS)
    @pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
    def test_expressions_in_replica_context_use_the_local_component(self, n, sync):
        """Design 2: np.asarray(v), v*x, x*v, v+1, -v, v.numpy() act on the replica's copy."""
        s = S(n)
        v = replica_vector_var(s, sync)
        x = np.array([10.0, 100.0])
        own = [np.array([1.0, 2.0]) * (i + 1) for i in range(n)]

        def fn():
            results = (np.asarray(v), v * x, x * v, v + 1, -v, v.numpy(), v.read_value())
            for r in results:
                assert isinstance(r, np.ndarray)
                assert r.dtype == np.float64 and r.shape == (2,)
            return results

        got = s.run(fn)
        names = ["asarray", "v*x", "x*v", "v+1", "-v", "numpy", "read_value"]
        expected = [own, [o * x for o in own], [x * o for o in own], [o + 1 for o in own],
                    [-o for o in own], own, own]
        for name, g, e in zip(names, got, expected):
            assert local(s, g) == [a.tolist() for a in e], name

    @pytest.mark.parametrize("n", MULTI)
    def test_mirrored_expressions_cross_replica_use_replica_0(self, n):
        """4.2: in cross-replica context operators read replica 0's copy (out of sync)."""
        s = S(n)
        v = replica_vector_var(s, Sync.ON_WRITE)
        with s.scope():
            np.testing.assert_array_equal(np.asarray(v), [1.0, 2.0])
            np.testing.assert_array_equal(v * 2.0, [2.0, 4.0])
            np.testing.assert_array_equal(3.0 * v, [3.0, 6.0])
            np.testing.assert_array_equal(v + 1, [2.0, 3.0])
            np.testing.assert_array_equal(-v, [-1.0, -2.0])

    @pytest.mark.parametrize("n", MULTI)
    def test_sync_on_read_expressions_cross_replica_use_aggregate(self, n):
        """4.4: cross-replica conversion of a SUM SyncOnRead gives the sum of the copies."""
        s = S(n)
        v = replica_vector_var(s, Sync.ON_READ)
        total = sum(i + 1 for i in range(n))
        with s.scope():
            np.testing.assert_array_equal(np.asarray(v), [total, 2.0 * total])
            np.testing.assert_array_equal(v + 0.0, [total, 2.0 * total])

    @pytest.mark.parametrize("make", ["plain", "mirrored"])
    def test_numpy_returns_a_copy(self, make):
        """v.numpy() is a copy: mutating it or later assigns do not affect each other."""
        if make == "plain":
            v = mpidist.Variable(np.array([1.0, 2.0]))
            ctx = None
        else:
            s = S(2)
            v = make_var(s, np.array([1.0, 2.0]))
            ctx = s
        snapshot = v.numpy()
        snapshot[0] = 99.0
        np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
        if ctx is None:
            v.assign([5.0, 6.0])
        else:
            with ctx.scope():
                v.assign([5.0, 6.0])
        np.testing.assert_array_equal(snapshot, [99.0, 2.0])
        np.testing.assert_array_equal(v.numpy(), [5.0, 6.0])

    def test_numpy_in_replica_context_is_a_copy(self):
        """v.numpy() inside a replica is a copy of that replica's component."""
        s = S(2)
        v = make_var(s, np.array([1.0, 2.0]))

        def fn():
            a = v.numpy()
            a[:] = -1.0
            return v.numpy()

        assert local(s, s.run(fn)) == [[1.0, 2.0], [1.0, 2.0]]
        assert [c.numpy().tolist() for c in s.experimental_local_results(v)] == [[1.0, 2.0]] * 2

    def test_read_value_is_a_snapshot(self):
        """v.read_value() returns the current value, unaffected by later assigns."""
        v = mpidist.Variable(np.array([1.0, 2.0]))
        r = v.read_value()
        np.testing.assert_array_equal(r, [1.0, 2.0])
        v.assign_add([1.0, 1.0])
        np.testing.assert_array_equal(r, [1.0, 2.0])
        np.testing.assert_array_equal(v.read_value(), [2.0, 3.0])

    def test_plain_assign_returns_new_value(self):
        """assign / assign_add / assign_sub on a plain variable return the new value."""
        v = mpidist.Variable(10.0)
        assert float(np.asarray(v.assign(3.0))) == 3.0
        assert float(np.asarray(v.assign_add(2.0))) == 5.0
        assert float(np.asarray(v.assign_sub(1.0))) == 4.0
        assert v.numpy() == 4.0

    @pytest.mark.parametrize("make", ["plain", "mirrored", "sync_on_read"])
    def test_wrong_shape_assign_raises_and_keeps_value(self, make):
        """Assigning a value of another shape -> ValueError; the value is unchanged."""
        s = S(2)
        if make == "plain":
            v = mpidist.Variable(np.array([1.0, 2.0]))
        elif make == "mirrored":
            v = make_var(s, np.array([1.0, 2.0]))
        else:
            v = make_var(s, np.array([1.0, 2.0]), synchronization=Sync.ON_READ,
                         aggregation=Agg.MEAN)
        with s.scope() if make != "plain" else contextlib.nullcontext():
            for bad in ([1.0, 2.0, 3.0], np.ones((2, 1)), 5.0):
                with pytest.raises(ValueError, match="shape"):
                    v.assign(bad)
                with pytest.raises(ValueError, match="shape"):
                    v.assign_add(bad)
        values = [v.numpy().tolist()] if make == "plain" else \
            [c.numpy().tolist() for c in s.experimental_local_results(v)]
        assert all(val == [1.0, 2.0] for val in values)

    @pytest.mark.parametrize("make", ["plain", "mirrored"])
    def test_float_into_int_variable_raises_type_error(self, make):
        """Assigning a float value to an integer variable -> TypeError; value unchanged."""
        s = S(2)
        v = mpidist.Variable(3) if make == "plain" else make_var(s, 3)
        assert v.dtype.kind == "i"
        with s.scope() if make != "plain" else contextlib.nullcontext():
            with pytest.raises(TypeError, match="dtype"):
                v.assign(1.5)
            with pytest.raises(TypeError, match="dtype"):
                v.assign_add(np.float32(1.0))
        values = [v.numpy().item()] if make == "plain" else comps(s, v)
        assert all(val == 3 for val in values)

    def test_float_into_int_variable_in_replica_context_raises(self):
        """A float update to an int variable inside strategy.run -> TypeError, nothing written."""
        s = S(2)
        v = make_var(s, 3)
        with pytest.raises(TypeError, match="dtype"):
            s.run(lambda: v.assign(np.float64(rid() + 0.5)))
        assert comps(s, v) == [3, 3]

    def test_int_into_float_variable_is_fine(self):
        """A Python int assigned to a float variable is converted (no error)."""
        v = mpidist.Variable(1.5)
        v.assign(2)
        assert v.numpy() == 2.0
        assert v.dtype == np.float64



def test_variable_refuses_the_internal_distribute_strategy_argument():
    """``Variable.plain`` takes ``distribute_strategy``; ``Variable(...)`` does not."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'distribute_strategy'"):
        mpidist.Variable(np.ones(2), distribute_strategy=mpidist.get_strategy())
    v = mpidist.Variable.plain(np.ones(2), distribute_strategy=None)
    assert v.distribute_strategy is None and v.numpy().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("bad", [None, "abc"])
def test_sum_sync_on_read_assign_of_a_wrong_value_names_it_and_changes_nothing(bad):
    """Cross-replica ``assign`` of a SUM SyncOnReadVariable divides the value by the replica
    count: a wrong value is refused by the assignment check first (was a bare TypeError from
    ``None / 2``)."""
    s = S(2)
    with s.scope():
        v = mpidist.Variable(np.ones(3), synchronization=Sync.ON_READ, aggregation=Agg.SUM)
    before = v.numpy().copy()
    with pytest.raises(TypeError, match=r"Cannot assign .* to variable .*: pass a numeric array"):
        v.assign(bad)
    np.testing.assert_array_equal(v.numpy(), before)
