"""Distribution context: spec section 1 (tf-distribute-semantics.md, 1.1-1.5).

Where the current strategy and replica context come from, what each location reports, how
scopes nest and fail, ``experimental_set_strategy``, and the ReplicaContext API. TF's
"tf.distribute" reads "mpidist" in mpidist's messages.
"""

import copy
import re

import numpy as np
import pytest

import mpidist
from replicas import mirrored

REPLICAS = [1, 2, 3, 4]


def default_strategy():
    """The default strategy, as seen at top level with no scope entered."""
    assert not mpidist.has_strategy()
    return mpidist.get_strategy()


def snapshot():
    """(get_strategy, has_strategy, get_replica_context, in_cross_replica_context), checking
    1.1's invariant: exactly one of "has a replica context" / "in cross-replica context"."""
    snap = (mpidist.get_strategy(), mpidist.has_strategy(), mpidist.get_replica_context(),
            mpidist.in_cross_replica_context())
    assert (snap[2] is not None) != snap[3], f"invariant of 1.1 broken: {snap}"
    return snap


def is_int32_scalar(x):
    """An int32 scalar (np.int32 or 0-d int32 array): mpidist's 'int32 scalar Tensor'."""
    return (not isinstance(x, int)) and np.ndim(x) == 0 and np.asarray(x).dtype == np.int32


def first_local(strategy, value):
    return strategy.experimental_local_results(value)[0]


# ------------------------------------------------------------------------------------------
# 1.2 Values in each location
# ------------------------------------------------------------------------------------------


class TestLocationTable:
    """1.2: the four context functions in each location of the table."""

    def test_top_level_no_scope(self):
        """Top level: default strategy, has_strategy False, _DefaultReplicaContext (id 0 of 1)."""
        strategy, has, ctx, cross = snapshot()
        assert strategy is mpidist.get_strategy()  # the same singleton each time
        assert strategy.num_replicas_in_sync == 1
        assert has is False
        assert cross is False
        assert isinstance(ctx, mpidist.ReplicaContext)
        assert ctx.strategy is strategy
        assert ctx.num_replicas_in_sync == 1
        assert ctx.replica_id_in_sync_group == 0
        assert type(ctx.replica_id_in_sync_group) is int

    @pytest.mark.parametrize("n", REPLICAS)
    def test_inside_strategy_scope(self, n):
        """`with S.scope():` -> S, True, None, True."""
        s = mirrored(n)
        with s.scope():
            assert snapshot() == (s, True, None, True)
        strategy, has, ctx, cross = snapshot()
        assert has is False and cross is False and ctx is not None
        assert strategy is not s

    def test_inside_one_device_scope(self):
        """`with S.scope():` for OneDeviceStrategy -> S, True, None, True."""
        s = mpidist.OneDeviceStrategy("/cpu:0")
        with s.scope():
            assert snapshot() == (s, True, None, True)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_inside_run(self, n):
        """Inside `S.run(fn)`: S, True, a (non-default) ReplicaContext of S, False."""
        s = mirrored(n)
        top_ctx = mpidist.get_replica_context()
        seen = []

        def fn():
            seen.append(snapshot())

        s.run(fn)
        assert len(seen) == n
        ids = []
        for strategy, has, ctx, cross in seen:
            assert strategy is s
            assert has is True
            assert cross is False
            assert isinstance(ctx, mpidist.ReplicaContext)
            assert ctx is not top_ctx
            assert ctx.strategy is s
            ids.append(int(ctx.replica_id_in_sync_group))
        assert sorted(ids) == list(range(n))
        # Back at top level afterwards.
        assert snapshot()[1:] == (False, top_ctx, False)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_inside_merge_fn(self, n):
        """Inside merge_fn of merge_call: S, True, None, True; merge_fn runs once, gets S."""
        s = mirrored(n)
        seen = []

        def merge_fn(strategy):
            seen.append((strategy, snapshot()))
            return 5

        def fn():
            return mpidist.get_replica_context().merge_call(merge_fn)

        result = s.run(fn)
        assert len(seen) == 1
        assert seen[0] == (s, (s, True, None, True))
        assert result == 5

    @pytest.mark.parametrize("n", REPLICAS)
    def test_back_in_replica_context_after_merge_call(self, n):
        """After merge_call returns, the replica is back in its own replica context."""
        s = mirrored(n)
        seen = []

        def fn():
            ctx = mpidist.get_replica_context()
            ctx.merge_call(lambda strategy: None)
            seen.append(snapshot() == (s, True, ctx, False))

        s.run(fn)
        assert seen == [True] * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_inside_extended_update_fn(self, n):
        """Inside fn of S.extended.update (cross-replica call): S, True, None, True, once per
        component."""
        s = mirrored(n)
        seen = []
        with s.scope():
            v = mpidist.Variable(1.0)

            def update_fn(component):
                seen.append(snapshot())
                return component

            s.extended.update(v, update_fn)
        assert seen == [(s, True, None, True)] * n

    def test_inside_default_scope(self):
        """`with default.scope():` -> default, False, _DefaultReplicaContext, False."""
        default = default_strategy()
        top_ctx = mpidist.get_replica_context()
        with default.scope():
            strategy, has, ctx, cross = snapshot()
            assert strategy is default
            assert has is False
            assert cross is False
            assert ctx is top_ctx
            assert ctx.replica_id_in_sync_group == 0
            assert type(ctx.replica_id_in_sync_group) is int

    def test_inside_default_run(self):
        """Inside `default.run(fn)`: default, False, a plain ReplicaContext whose id is an
        int32 scalar 0 (not the Python int of _DefaultReplicaContext), False."""
        default = default_strategy()
        top_ctx = mpidist.get_replica_context()
        seen = []

        def fn(x):
            seen.append(snapshot())
            return x + 1

        assert default.run(fn, args=(41,)) == 42
        assert len(seen) == 1
        strategy, has, ctx, cross = seen[0]
        assert strategy is default
        assert has is False
        assert cross is False
        assert ctx is not None and ctx is not top_ctx
        assert ctx.num_replicas_in_sync == 1
        rid = ctx.replica_id_in_sync_group
        assert is_int32_scalar(rid)
        assert int(rid) == 0

    def test_inside_default_merge_fn(self):
        """2.7 (default replica context): merge_fn(default, ...) runs directly, in
        cross-replica mode of the default strategy."""
        default = default_strategy()
        seen = []

        def merge_fn(strategy, a, b=None):
            seen.append((strategy, a, b, snapshot()))
            return a + b

        assert mpidist.get_replica_context().merge_call(merge_fn, args=(2,), kwargs={"b": 3}) == 5
        assert len(seen) == 1
        strategy, a, b, (cur, has, ctx, cross) = seen[0]
        assert (strategy, a, b) == (default, 2, 3)
        assert cur is default and has is False and ctx is None and cross is True
        # and back to the default replica mode
        assert snapshot()[1:] == (False, mpidist.get_replica_context(), False)
        assert mpidist.get_replica_context() is not None


# ------------------------------------------------------------------------------------------
# 1.2 Default strategy singleton, copying strategies
# ------------------------------------------------------------------------------------------


class TestDefaultStrategySingleton:
    """1.2: the default strategy is a singleton with one replica."""

    def test_num_replicas_is_one(self):
        assert default_strategy().num_replicas_in_sync == 1

    def test_constructing_another_raises(self):
        default = default_strategy()
        with pytest.raises(RuntimeError,
                           match="Should only create a single instance of _DefaultDistributionStrategy"):
            type(default)()
        assert mpidist.get_strategy() is default

    def test_deepcopy_raises(self):
        default = default_strategy()
        with pytest.raises(RuntimeError,
                           match="Should only create a single instance of _DefaultDistributionStrategy"):
            copy.deepcopy(default)


class TestCopyStrategy:
    """1.2: copy.copy(strategy) -> RuntimeError "Must only deepcopy DistributionStrategy."."""

    @pytest.mark.parametrize("make", [
        lambda: mirrored(1), lambda: mirrored(2), lambda: mirrored(4),
        lambda: mpidist.OneDeviceStrategy("/cpu:0"), lambda: mpidist.get_strategy(),
    ], ids=["mirrored1", "mirrored2", "mirrored4", "one_device", "default"])
    def test_shallow_copy_raises(self, make):
        strategy = make()
        with pytest.raises(RuntimeError, match=re.escape("Must only deepcopy DistributionStrategy.")):
            copy.copy(strategy)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_deepcopy_of_mirrored_gives_new_equivalent_strategy(self, n):
        s = mirrored(n)
        s2 = copy.deepcopy(s)
        assert s2 is not s
        assert type(s2) is type(s)
        assert s2.num_replicas_in_sync == n


# ------------------------------------------------------------------------------------------
# 1.3 Entering scopes
# ------------------------------------------------------------------------------------------


class TestScopeEntering:
    """1.3: `with S.scope() as x`, same-strategy re-entry, and the nesting errors."""

    @pytest.mark.parametrize("make", [lambda: mirrored(1), lambda: mirrored(3),
                                      lambda: mpidist.OneDeviceStrategy("/cpu:0")],
                             ids=["mirrored1", "mirrored3", "one_device"])
    def test_scope_as_gives_strategy(self, make):
        s = make()
        with s.scope() as x:
            assert x is s

    @pytest.mark.parametrize("n", REPLICAS)
    def test_reentering_same_strategy_is_noop(self, n):
        """Re-entering S's scope while S is current is allowed; exits unwind like a counter."""
        s = mirrored(n)
        with s.scope():
            with s.scope() as inner:
                assert inner is s
                with s.scope():
                    assert snapshot() == (s, True, None, True)
                assert snapshot() == (s, True, None, True)
            assert snapshot() == (s, True, None, True)
        assert snapshot()[1] is False

    def test_reentering_same_scope_object(self):
        """The same scope object may be entered again while it is current."""
        s = mirrored(2)
        scope = s.scope()
        with scope:
            with scope:
                assert snapshot() == (s, True, None, True)
            assert snapshot() == (s, True, None, True)
        assert snapshot()[1] is False

    @pytest.mark.parametrize("make2", [lambda: mirrored(2),
                                       lambda: mpidist.OneDeviceStrategy("/cpu:0")],
                             ids=["mirrored", "one_device"])
    def test_different_strategy_scope_raises(self, make2):
        """Entering S2.scope() inside S.scope(): RuntimeError "Mixing different ... <S> is not <S2>"."""
        s, s2 = mirrored(2), make2()
        with s.scope():
            with pytest.raises(RuntimeError, match=re.escape(
                    f"Mixing different mpidist.Strategy objects: {s!r} is not {s2!r}")):
                with s2.scope():
                    pass
            # the failed enter leaves S current
            assert snapshot() == (s, True, None, True)
        assert snapshot()[1] is False

    def test_default_scope_inside_strategy_scope_raises(self):
        """Entering the default strategy's scope inside S: "Must not nest ... scopes"."""
        default = default_strategy()
        s = mirrored(2)
        with s.scope():
            with pytest.raises(RuntimeError, match=re.escape("Must not nest mpidist.Strategy scopes")):
                with default.scope():
                    pass
            assert snapshot() == (s, True, None, True)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_default_scope_inside_run_raises(self, n):
        """Entering the default strategy's scope inside S's replica fn: "Must not nest"."""
        default = default_strategy()
        s = mirrored(n)

        def fn():
            with default.scope():
                pass

        with pytest.raises(RuntimeError, match=re.escape("Must not nest mpidist.Strategy scopes")):
            s.run(fn)

    CROSS_REPLICA_ONLY = {
        "scope": lambda s: s.scope().__enter__(),
        "run": lambda s: s.run(lambda: 1.0),
        "reduce": lambda s: s.reduce("SUM", np.float64(1.0), axis=None),
        "reduce_to": lambda s: s.extended.reduce_to("SUM", np.float64(1.0), "/cpu:0"),
        "batch_reduce_to": lambda s: s.extended.batch_reduce_to("SUM", [(np.float64(1.0), "/cpu:0")]),
        "broadcast_to": lambda s: s.extended.broadcast_to(np.float64(1.0), "/cpu:0"),
        "call_for_each_replica": lambda s: s.extended.call_for_each_replica(lambda: 1.0),
    }

    @pytest.mark.parametrize("method", sorted(CROSS_REPLICA_ONLY))
    @pytest.mark.parametrize("make", [lambda: mirrored(1), lambda: mirrored(2), lambda: mirrored(3),
                                      lambda: mirrored(4), lambda: mpidist.OneDeviceStrategy("/cpu:0")],
                             ids=["mirrored1", "mirrored2", "mirrored3", "mirrored4", "one_device"])
    def test_cross_replica_method_in_replica_context_raises(self, make, method):
        """S.scope()/S.run/S.reduce/S.extended.reduce_to ... inside S's replica context:
        "Method requires being in cross-replica context, use get_replica_context().merge_call()"."""
        s = make()
        call = self.CROSS_REPLICA_ONLY[method]
        with pytest.raises(RuntimeError, match=re.escape(
                "Method requires being in cross-replica context, use "
                "get_replica_context().merge_call()")):
            s.run(lambda: call(s))
        assert snapshot()[1] is False

    @pytest.mark.parametrize("n", REPLICAS)
    def test_other_strategy_run_inside_replica_fn_raises(self, n):
        """S2.run inside S's replica fn: "Mixing different ... <S> is not <S2>"."""
        s, s2 = mirrored(n), mirrored(2)
        with pytest.raises(RuntimeError, match=re.escape(
                f"Mixing different mpidist.Strategy objects: {s!r} is not {s2!r}")):
            s.run(lambda: s2.run(lambda: 1.0))

    @pytest.mark.parametrize("n", REPLICAS)
    def test_colocate_vars_with_without_scope_raises(self, n):
        """colocate_vars_with with no scope: 'Need to be inside "with strategy.scope()" for <S>'."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(1.0)
        with pytest.raises(RuntimeError, match=re.escape(
                f'Need to be inside "with strategy.scope()" for {s!r}')):
            with s.extended.colocate_vars_with(v):
                pass

    def test_colocate_vars_with_in_other_strategy_scope_raises(self):
        """colocate_vars_with inside another strategy's scope: "Mixing different"."""
        s, s2 = mirrored(2), mirrored(2)
        with s.scope():
            v = mpidist.Variable(1.0)
        with s2.scope():
            with pytest.raises(RuntimeError, match=re.escape(
                    f"Mixing different mpidist.Strategy objects: {s2!r} is not {s!r}")):
                with s.extended.colocate_vars_with(v):
                    pass

    @pytest.mark.parametrize("n", REPLICAS)
    def test_colocate_vars_with_inside_scope_works(self, n):
        """Control: inside S.scope(), colocate_vars_with(v) is accepted."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(1.0)
            with s.extended.colocate_vars_with(v):
                w = mpidist.Variable(2.0)
        assert [float(np.asarray(c)) for c in s.experimental_local_results(w)] == [2.0] * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_gather_in_replica_context_raises(self, n):
        """Strategy.gather in replica context: RuntimeError naming all_gather."""
        s = mirrored(n)
        value = s.experimental_distribute_values_from_function(lambda ctx: np.ones((1, 2)))
        with pytest.raises(RuntimeError, match=re.escape(
                "mpidist.Strategy.gather method requires cross-replica context, use "
                "get_replica_context().all_gather() instead")):
            s.run(lambda: s.gather(value, 0))


# ------------------------------------------------------------------------------------------
# 1.4 experimental_set_strategy
# ------------------------------------------------------------------------------------------


class TestExperimentalSetStrategy:
    """1.4: experimental_set_strategy acts like a global `with strategy.scope()`."""

    @pytest.mark.parametrize("n", REPLICAS)
    def test_set_then_replace_then_clear(self, n):
        s, s2 = mirrored(n), mpidist.OneDeviceStrategy("/cpu:0")
        default = default_strategy()
        top_ctx = mpidist.get_replica_context()

        mpidist.experimental_set_strategy(s)
        assert snapshot() == (s, True, None, True)

        mpidist.experimental_set_strategy(s2)
        assert snapshot() == (s2, True, None, True)

        mpidist.experimental_set_strategy(None)
        assert snapshot() == (default, False, top_ctx, False)

    def test_setting_the_default_strategy_goes_back_to_the_default(self):
        s, default = mirrored(2), default_strategy()
        top_ctx = mpidist.get_replica_context()
        mpidist.experimental_set_strategy(s)
        mpidist.experimental_set_strategy(default)
        assert snapshot() == (default, False, top_ctx, False)
        mpidist.experimental_set_strategy(default)  # when nothing is set: still the default
        assert mpidist.get_strategy() is default and mpidist.has_strategy() is False

    def test_set_none_when_nothing_set(self):
        default = default_strategy()
        mpidist.experimental_set_strategy(None)
        assert mpidist.get_strategy() is default
        assert mpidist.has_strategy() is False

    def test_set_same_twice(self):
        s = mirrored(2)
        mpidist.experimental_set_strategy(s)
        mpidist.experimental_set_strategy(s)
        assert snapshot() == (s, True, None, True)
        mpidist.experimental_set_strategy(None)
        assert mpidist.has_strategy() is False

    @pytest.mark.parametrize("target", ["other", "same", "none"])
    def test_inside_with_scope_raises(self, target):
        """Called inside a `with` scope: RuntimeError "Must not be called inside a
        `mpidist.Strategy` scope." (also for None and for the same strategy)."""
        s = mirrored(2)
        arg = {"other": mirrored(2), "same": s, "none": None}[target]
        with s.scope():
            with pytest.raises(RuntimeError,
                               match=re.escape("Must not be called inside a `mpidist.Strategy` scope")):
                mpidist.experimental_set_strategy(arg)
            assert snapshot() == (s, True, None, True)
        assert mpidist.has_strategy() is False

    def test_run_under_global_strategy(self):
        """With S set globally, S.run works and its replicas see S (a global scope is a scope)."""
        s = mirrored(2)
        mpidist.experimental_set_strategy(s)
        seen = []
        s.run(lambda: seen.append(snapshot()[:2] + (snapshot()[3],)))
        assert seen == [(s, True, False)] * 2
        assert snapshot() == (s, True, None, True)

    def test_other_scope_under_global_strategy_raises(self):
        """With S set globally, entering S2.scope() is "Mixing different" (1.3)."""
        s, s2 = mirrored(2), mirrored(2)
        mpidist.experimental_set_strategy(s)
        with pytest.raises(RuntimeError, match=re.escape(
                f"Mixing different mpidist.Strategy objects: {s!r} is not {s2!r}")):
            with s2.scope():
                pass


# ------------------------------------------------------------------------------------------
# 1.5 ReplicaContext API
# ------------------------------------------------------------------------------------------


def run_collect(strategy, fn):
    """Run fn(ctx) on every replica; return the results sorted by replica id."""
    out = {}

    def replica_fn():
        ctx = mpidist.get_replica_context()
        out[int(ctx.replica_id_in_sync_group)] = fn(ctx)

    strategy.run(replica_fn)
    return [out[i] for i in sorted(out)]


class TestReplicaContextAPI:
    """1.5: num_replicas_in_sync, replica_id_in_sync_group, strategy, devices."""

    @pytest.mark.parametrize("n", REPLICAS)
    def test_num_replicas_in_sync(self, n):
        s = mirrored(n)
        assert s.num_replicas_in_sync == n
        assert run_collect(s, lambda ctx: ctx.num_replicas_in_sync) == [n] * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_replica_ids_are_int32_scalars_0_to_n_minus_1(self, n):
        s = mirrored(n)
        ids = run_collect(s, lambda ctx: ctx.replica_id_in_sync_group)
        assert len(ids) == n
        assert [int(i) for i in ids] == list(range(n))
        for rid in ids:
            assert is_int32_scalar(rid), f"{rid!r} ({type(rid).__name__}) is not an int32 scalar"

    @pytest.mark.parametrize("n", REPLICAS)
    def test_replica_context_strategy(self, n):
        s = mirrored(n)
        assert run_collect(s, lambda ctx: ctx.strategy is s) == [True] * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_devices_is_own_worker_device(self, n):
        """devices (deprecated) = [worker_devices[replica id]] for MirroredStrategy."""
        s = mirrored(n)
        devices = run_collect(s, lambda ctx: list(ctx.devices))
        assert devices == [[s.extended.worker_devices[i]] for i in range(n)]
        assert len(set(d[0] for d in devices)) == n

    def test_one_device_replica_context(self):
        s = mpidist.OneDeviceStrategy("/cpu:0")
        (rid, num, strat), = run_collect(
            s, lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, ctx.strategy))
        assert is_int32_scalar(rid) and int(rid) == 0
        assert num == 1
        assert strat is s

    def test_default_replica_context_id_is_python_int_zero(self):
        """_DefaultReplicaContext.replica_id_in_sync_group is the Python int 0."""
        ctx = mpidist.get_replica_context()
        rid = ctx.replica_id_in_sync_group
        assert type(rid) is int and rid == 0
        assert ctx.num_replicas_in_sync == 1

    def test_default_run_replica_id_is_int32_zero(self):
        """All non-default replica contexts (even default.run's) give an int32 scalar."""
        default = default_strategy()
        rid = default.run(lambda: mpidist.get_replica_context().replica_id_in_sync_group)
        assert is_int32_scalar(rid) and int(rid) == 0


class TestReplicaContextConstructor:
    """1.5: ReplicaContext(strategy, replica_id_in_sync_group=x) validates x."""

    @pytest.mark.parametrize("bad", ["0", 1.5, [0], (1,), object()],
                             ids=["str", "float", "list", "tuple", "object"])
    def test_non_int_id_raises(self, bad):
        s = mirrored(2)
        with pytest.raises(ValueError,
                           match="replica_id_in_sync_group can only be an integer, a Tensor or None"):
            mpidist.ReplicaContext(s, replica_id_in_sync_group=bad)

    @pytest.mark.parametrize("good, expected", [(0, 0), (1, 1), (3, 3), (np.int32(2), 2),
                                                (np.array(1, dtype=np.int32), 1)],
                             ids=["0", "1", "3", "np.int32", "0d-array"])
    def test_int_id_accepted(self, good, expected):
        s = mirrored(4)
        ctx = mpidist.ReplicaContext(s, replica_id_in_sync_group=good)
        assert ctx.strategy is s
        assert ctx.num_replicas_in_sync == 4
        rid = ctx.replica_id_in_sync_group
        assert is_int32_scalar(rid) and int(rid) == expected

    def test_none_id_accepted(self):
        s = mirrored(2)
        ctx = mpidist.ReplicaContext(s, replica_id_in_sync_group=None)
        assert ctx.strategy is s


class TestMergeCallOnNonCurrentContext:
    """1.5: merge_call on a context that is not current: the three RuntimeErrors."""

    @pytest.mark.parametrize("n", REPLICAS)
    def test_in_cross_replica_context(self, n):
        """No replica context current (inside S.scope()): "Need to be inside
        `call_for_each_replica()`"."""
        s = mirrored(n)
        ctx = first_local(s, s.run(mpidist.get_replica_context))
        assert isinstance(ctx, mpidist.ReplicaContext)
        called = []
        with s.scope():
            with pytest.raises(RuntimeError, match=re.escape("Need to be inside `call_for_each_replica()`")):
                ctx.merge_call(lambda strategy: called.append(1))
        assert called == []

    @pytest.mark.parametrize("n", REPLICAS)
    def test_stale_context_of_same_strategy(self, n):
        """Another replica context of the same strategy is current: "Mismatching ReplicaContext."."""
        s = mirrored(n)
        stale = first_local(s, s.run(mpidist.get_replica_context))
        called = []

        def fn():
            assert mpidist.get_replica_context() is not stale
            stale.merge_call(lambda strategy: called.append(1))

        with pytest.raises(RuntimeError, match=re.escape("Mismatching ReplicaContext.")):
            s.run(fn)
        assert called == []

    @pytest.mark.parametrize("n", REPLICAS)
    def test_constructed_context_of_same_strategy(self, n):
        """A freshly constructed ReplicaContext of S, used inside S.run: "Mismatching ReplicaContext."."""
        s = mirrored(n)
        other = mpidist.ReplicaContext(s, replica_id_in_sync_group=0)
        with pytest.raises(RuntimeError, match=re.escape("Mismatching ReplicaContext.")):
            s.run(lambda: other.merge_call(lambda strategy: None))

    @pytest.mark.parametrize("n", REPLICAS)
    def test_context_of_other_strategy_at_top_level(self, n):
        """Top level (default replica context current), context of S:
        "Mismatching mpidist.Strategy objects: <default> is not <S>."."""
        default = default_strategy()
        s = mirrored(n)
        ctx = first_local(s, s.run(mpidist.get_replica_context))
        with pytest.raises(RuntimeError, match=re.escape(
                f"Mismatching mpidist.Strategy objects: {default!r} is not {s!r}.")):
            ctx.merge_call(lambda strategy: None)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_context_of_other_strategy_inside_run(self, n):
        """Inside S2.run, context of S: "Mismatching mpidist.Strategy objects: <S2> is not <S>."."""
        s, s2 = mirrored(2), mirrored(n)
        ctx = first_local(s, s.run(mpidist.get_replica_context))
        with pytest.raises(RuntimeError, match=re.escape(
                f"Mismatching mpidist.Strategy objects: {s2!r} is not {s!r}.")):
            s2.run(lambda: ctx.merge_call(lambda strategy: None))
