"""StrategyExtended (spec §5) for MirroredStrategy (1-4 virtual CPU devices), OneDeviceStrategy
and the default strategy: reduce_to, batch_reduce_to, broadcast_to, update, colocate_vars_with,
value_container, the device/role properties, non_slot_devices, call_for_each_replica, read_var."""

import re
import threading

import numpy as np
import pytest

import mpidist
from replicas import mirrored, rid
from mpidist import ReduceOp, VariableAggregation, VariableSynchronization

LOCAL = "/job:localhost/replica:0/task:0/device:"
REPLICAS = [1, 2, 3, 4]
MULTI = [2, 3, 4]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def devices(n):
    return tuple(LOCAL + f"CPU:{i}" for i in range(n))


def per_replica(s, fn):
    """PerReplica with component fn(i) on replica i."""
    return s.experimental_distribute_values_from_function(lambda ctx: fn(ctx.replica_id_in_sync_group))


def ones_to_n(s):
    """PerReplica [1., 2., ..., N.] (float64 scalars)."""
    return per_replica(s, lambda i: np.array(float(i + 1)))


def comps(var):
    """The component values of a distributed variable, as floats."""
    return [float(c.numpy()) for c in var.values]


def local(s, x):
    return [np.asarray(c) for c in s.experimental_local_results(x)]


def assert_result(result, n, expected):
    """Spec §5.1: >1 destination device -> Mirrored (one copy per device); 1 -> plain array."""
    if n > 1:
        assert isinstance(result, mpidist.Mirrored)
        assert len(result.values) == n
        for c in result.values:
            assert isinstance(c, np.ndarray)
            np.testing.assert_array_equal(c, expected)
    else:
        assert isinstance(result, np.ndarray)
        assert not isinstance(result, mpidist.DistributedValues)
        np.testing.assert_array_equal(result, expected)


def default_strategy():
    s = mpidist.get_strategy()
    assert not mpidist.has_strategy()
    return s


def one_device(device="/cpu:0"):
    return mpidist.OneDeviceStrategy(device)


NON_DIST_SUM = r"A non-DistributedValues value .* cannot be reduced with the given reduce op ReduceOp\.SUM"
BAD_DEST = "destinations must be one of a `DistributedValues` object"
COLOCATE = r"`colocate_vars_with` must only be passed a variable created in this .*Strategy\.scope\(\)"


def need_scope(s):
    return re.escape(f'Need to be inside "with strategy.scope()" for {s!r}')


# --------------------------------------------------------------------------------------------
# §5.1 reduce_to — MirroredStrategy
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestMirroredReduceTo:
    @pytest.mark.parametrize("agg", list(VariableAggregation))
    def test_variable_aggregation_as_op_assertion(self, n, agg):
        """A VariableAggregation passed as reduce_op -> AssertionError (with a message)."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            with pytest.raises(AssertionError) as info:
                s.extended.reduce_to(agg, v, v)
        assert str(info.value)

    def test_list_or_tuple_destinations_assertion(self, n):
        """destinations given as a list / tuple -> AssertionError."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            for dest in (["/cpu:0"], ("/cpu:0",), [v], []):
                with pytest.raises(AssertionError) as info:
                    s.extended.reduce_to("SUM", v, dest)
                assert str(info.value)

    @pytest.mark.parametrize("bad", [3, 0, 2.5, None, object()])
    def test_bad_destination_type_value_error(self, n, bad):
        """An int (or other non-destination) -> ValueError 'destinations must be one of ...'."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            with pytest.raises(ValueError, match=BAD_DEST):
                s.extended.reduce_to("SUM", v, bad)

    def test_empty_string_destination_value_error(self, n):
        """destinations '' -> ValueError 'destinations can not be empty'."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            with pytest.raises(ValueError, match="destinations can not be empty"):
                s.extended.reduce_to("SUM", v, "")
            with pytest.raises(ValueError, match="destinations can not be empty"):
                s.extended.reduce_to("MEAN", v, "")

    def test_unknown_op_string_value_error(self, n):
        """An unknown op string -> ValueError "'MAX' is not a valid ReduceOp"."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            with pytest.raises(ValueError, match="'MAX' is not a valid ReduceOp"):
                s.extended.reduce_to("max", v, v)

    def test_to_variable_sum_and_mean(self, n):
        """PerReplica [1..N] -> dest=var: SUM N(N+1)/2, MEAN (N+1)/2, Mirrored over var's devices."""
        s = mirrored(n)
        v = ones_to_n(s)
        total = n * (n + 1) / 2
        with s.scope():
            var = mpidist.Variable(10.0)
            summed = s.extended.reduce_to(ReduceOp.SUM, v, var)
            mean = s.extended.reduce_to(ReduceOp.MEAN, v, var)
        assert_result(summed, n, total)
        assert_result(mean, n, total / n)
        if n > 1:
            assert [str(d) for d in summed.devices] == list(devices(n))

    def test_string_op_any_case(self, n):
        """reduce_op strings are upper-cased: 'sum', 'Mean'."""
        s = mirrored(n)
        v = ones_to_n(s)
        total = n * (n + 1) / 2
        with s.scope():
            assert_result(s.extended.reduce_to("sum", v, "/cpu:0"), 1, total)
            assert_result(s.extended.reduce_to("Mean", v, "/cpu:0"), 1, total / n)

    def test_to_device_string_plain_array(self, n):
        """dest='/cpu:0' -> a plain array holding the sum."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            out = s.extended.reduce_to("SUM", v, "/cpu:0")
        assert type(out) is np.ndarray
        assert out.dtype == np.float64
        assert float(out) == n * (n + 1) / 2

    def test_to_per_replica_mirrored(self, n):
        """dest=PerReplica -> Mirrored with one copy per destination device."""
        s = mirrored(n)
        v = ones_to_n(s)
        dest = per_replica(s, lambda i: np.zeros(()))
        with s.scope():
            out = s.extended.reduce_to("SUM", v, dest)
        assert_result(out, n, n * (n + 1) / 2)

    def test_vector_values(self, n):
        """Element-wise: replica i holds [i+1, 10(i+1)] -> SUM [T, 10T]."""
        s = mirrored(n)
        v = per_replica(s, lambda i: np.array([i + 1.0, 10.0 * (i + 1)]))
        total = n * (n + 1) / 2
        with s.scope():
            out = s.extended.reduce_to("SUM", v, v)
        assert_result(out, n, [total, 10 * total])

    def test_destination_variable_not_updated(self, n):
        """Reducing to a variable does not write the variable."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            var = mpidist.Variable(10.0)
            s.extended.reduce_to("SUM", v, var)
            s.extended.reduce_to("MEAN", v, var)
        assert comps(var) == [10.0] * n

    def test_input_not_modified(self, n):
        """The PerReplica's components are unchanged by the reduction."""
        s = mirrored(n)
        v = ones_to_n(s)
        with s.scope():
            s.extended.reduce_to("SUM", v, v)
        assert [float(c) for c in v.values] == [float(i + 1) for i in range(n)]

    def test_mirrored_mean_returned_as_is(self, n):
        """A Mirrored value with MEAN is returned as-is (the same object)."""
        s = mirrored(n)
        m = mpidist.Mirrored([np.array(3.0) for _ in range(n)])
        with s.scope():
            assert s.extended.reduce_to("MEAN", m, "/cpu:0") is m
            assert s.extended.reduce_to(ReduceOp.MEAN, m, m) is m

    def test_mirrored_sum_assertion(self, n):
        """A Mirrored value with SUM -> AssertionError."""
        s = mirrored(n)
        m = mpidist.Mirrored([np.array(3.0) for _ in range(n)])
        with s.scope():
            with pytest.raises(AssertionError) as info:
                s.extended.reduce_to("SUM", m, "/cpu:0")
        assert str(info.value)

    def test_mirrored_variable_mean_as_is_sum_assertion(self, n):
        """A MirroredVariable counts as mirrored: MEAN -> itself, SUM -> AssertionError."""
        s = mirrored(n)
        with s.scope():
            var = mpidist.Variable(4.0)
            assert s.extended.reduce_to("MEAN", var, var) is var
            with pytest.raises(AssertionError):
                s.extended.reduce_to("SUM", var, var)
        assert comps(var) == [4.0] * n

    def test_sync_on_read_variable_reduced_as_per_replica(self, n):
        """An ON_READ variable is reduced like a PerReplica of its components."""
        s = mirrored(n)
        with s.scope():
            var = mpidist.Variable(0.0, synchronization=VariableSynchronization.ON_READ,
                                   aggregation=VariableAggregation.SUM)
            s.extended.update(var, lambda c, x: c.assign(x), args=(ones_to_n(s),))
            out = s.extended.reduce_to("SUM", var, "/cpu:0")
            mean = s.extended.reduce_to("MEAN", var, "/cpu:0")
        assert float(out) == n * (n + 1) / 2
        assert float(mean) == (n + 1) / 2

    def test_non_distributed_mean_returned_unchanged(self, n):
        """A plain value with MEAN is returned unchanged (same object)."""
        s = mirrored(n)
        x = np.array([2.0, 3.0])
        f = 2.5
        with s.scope():
            assert s.extended.reduce_to("MEAN", x, "/cpu:0") is x
            assert s.extended.reduce_to("MEAN", f, "/cpu:0") is f

    def test_non_distributed_sum(self, n):
        """A plain value with SUM: N>1 -> ValueError 'A non-DistributedValues value ...';
        N==1 -> broadcast to the destinations (a copy)."""
        s = mirrored(n)
        x = np.array(2.0)
        with s.scope():
            var = mpidist.Variable(0.0)
            if n > 1:
                with pytest.raises(ValueError, match=NON_DIST_SUM):
                    s.extended.reduce_to("SUM", x, "/cpu:0")
                with pytest.raises(ValueError, match=NON_DIST_SUM):
                    s.extended.reduce_to("SUM", 2.0, var)
            else:
                out = s.extended.reduce_to("SUM", x, "/cpu:0")
                assert type(out) is np.ndarray and float(out) == 2.0
                assert not np.shares_memory(out, x)
                out = s.extended.reduce_to("SUM", x, var)
                assert type(out) is np.ndarray and float(out) == 2.0
        assert comps(var) == [0.0] * n

    def test_non_distributed_all_zeros_sum(self, n):
        """A NumPy value that is all zeros reduces (SUM) to zeros of its shape and dtype."""
        s = mirrored(n)
        z = np.zeros((2, 3), dtype=np.float32)
        with s.scope():
            out = s.extended.reduce_to("SUM", z, "/cpu:0")
        out = np.asarray(out)
        assert out.shape == (2, 3)
        assert out.dtype == np.float32
        assert not out.any()

    def test_requires_cross_replica_context(self, n):
        """Calling reduce_to inside strategy.run -> RuntimeError (cross-replica only)."""
        s = mirrored(n)
        v = ones_to_n(s)

        def fn():
            return s.extended.reduce_to("SUM", v, "/cpu:0")

        with pytest.raises(RuntimeError, match="Method requires being in cross-replica context"):
            s.run(fn)

    def test_merge_call_reduce_to_gives_each_replica_its_component(self, n):
        """merge_fn returning reduce_to(SUM, a, a) (Mirrored) gives each replica the sum."""
        s = mirrored(n)

        def fn():
            def merge_fn(strategy, a):
                return strategy.extended.reduce_to("SUM", a, a)

            r = mpidist.get_replica_context().merge_call(merge_fn, args=(np.array(rid() + 1.0),))
            assert isinstance(r, np.ndarray)
            return r

        out = s.run(fn)
        assert [float(c) for c in local(s, out)] == [n * (n + 1) / 2] * n


# --------------------------------------------------------------------------------------------
# §5.1 reduce_to — default and OneDevice strategies (one replica: identity)
# --------------------------------------------------------------------------------------------

class TestSingleReplicaReduceTo:
    @pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
    def test_value_returned_unchanged(self, make):
        """reduce_to returns the value itself for SUM and MEAN."""
        s = make()
        x = np.array([1.0, 2.0])
        with s.scope():
            assert s.extended.reduce_to("SUM", x, "/cpu:0") is x
            assert s.extended.reduce_to(ReduceOp.MEAN, x, "/cpu:0") is x
            out = s.extended.batch_reduce_to("SUM", [(x, "/cpu:0"), (x, x)])
            assert isinstance(out, list) and len(out) == 2
            assert out[0] is x and out[1] is x

    @pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
    def test_assertions(self, make):
        """VariableAggregation as op / list destinations -> AssertionError on every strategy."""
        s = make()
        x = np.array(1.0)
        with s.scope():
            with pytest.raises(AssertionError):
                s.extended.reduce_to(VariableAggregation.SUM, x, "/cpu:0")
            with pytest.raises(AssertionError):
                s.extended.reduce_to("SUM", x, ["/cpu:0"])
            with pytest.raises(AssertionError):
                s.extended.batch_reduce_to(VariableAggregation.MEAN, [(x, "/cpu:0")])

    def test_one_device_reduce_with_axis_within_value(self):
        """OneDevice: strategy.reduce with an axis reduces within the value (§2.3/§9.8)."""
        s = one_device()
        with s.scope():
            assert float(s.reduce("MEAN", np.array([1.0, 2.0, 3.0]), axis=0)) == 2.0
            x = np.array([1.0, 2.0])
            assert s.reduce("SUM", x, axis=None) is x


# --------------------------------------------------------------------------------------------
# §5.2 batch_reduce_to
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestBatchReduceTo:
    def test_spec_example(self, n):
        """[(pr, var), (pr, '/cpu:0')] SUM -> [Mirrored sum, array sum]."""
        s = mirrored(n)
        pr = ones_to_n(s)
        total = n * (n + 1) / 2
        with s.scope():
            var = mpidist.Variable(0.0)
            out = s.extended.batch_reduce_to("SUM", [(pr, var), (pr, "/cpu:0")])
        assert isinstance(out, list) and len(out) == 2
        assert_result(out[0], n, total)
        assert_result(out[1], 1, total)
        assert comps(var) == [0.0] * n

    def test_equals_reduce_to_per_pair(self, n):
        """Each result equals reduce_to on its pair (SUM and MEAN)."""
        s = mirrored(n)
        a = ones_to_n(s)
        b = per_replica(s, lambda i: np.array([i, 2.0 * i]))
        for op in ("SUM", "MEAN"):
            with s.scope():
                pairs = [(a, a), (b, "/cpu:0"), (b, b)]
                batch = s.extended.batch_reduce_to(op, pairs)
                single = [s.extended.reduce_to(op, v, d) for v, d in pairs]
            assert len(batch) == 3
            for got, want in zip(batch, single):
                assert type(got) is type(want)
                for g, w in zip(local(s, got) if isinstance(got, mpidist.Mirrored) else [got],
                                local(s, want) if isinstance(want, mpidist.Mirrored) else [want]):
                    np.testing.assert_array_equal(g, w)

    def test_mixed_mirrored_and_per_replica_pairs(self, n):
        """A Mirrored + MEAN pair is passed through as-is among reduced pairs."""
        s = mirrored(n)
        a = ones_to_n(s)
        m = mpidist.Mirrored([np.array(7.0) for _ in range(n)])
        with s.scope():
            out = s.extended.batch_reduce_to("MEAN", [(a, "/cpu:0"), (m, "/cpu:0")])
        assert float(out[0]) == (n + 1) / 2
        assert out[1] is m

    def test_element_not_tuple_value_error(self, n):
        """An element that is not a tuple -> ValueError '... should be a tuple.'"""
        s = mirrored(n)
        pr = ones_to_n(s)
        with s.scope():
            with pytest.raises(ValueError, match="Each element of `value_destination_pairs` should be a tuple"):
                s.extended.batch_reduce_to("SUM", [[pr, "/cpu:0"]])
            with pytest.raises(ValueError, match="Each element of `value_destination_pairs` should be a tuple"):
                s.extended.batch_reduce_to("SUM", [(pr, "/cpu:0"), pr])

    def test_element_wrong_size_value_error(self, n):
        """A tuple of the wrong length -> ValueError '... should be a tuple of size 2.'"""
        s = mirrored(n)
        pr = ones_to_n(s)
        with s.scope():
            with pytest.raises(ValueError, match="should be a tuple of size 2"):
                s.extended.batch_reduce_to("SUM", [(pr, "/cpu:0", pr)])
            with pytest.raises(ValueError, match="should be a tuple of size 2"):
                s.extended.batch_reduce_to("SUM", [(pr,)])

    def test_variable_aggregation_assertion(self, n):
        """A VariableAggregation as reduce_op -> AssertionError."""
        s = mirrored(n)
        pr = ones_to_n(s)
        with s.scope():
            with pytest.raises(AssertionError):
                s.extended.batch_reduce_to(VariableAggregation.SUM, [(pr, "/cpu:0")])


# --------------------------------------------------------------------------------------------
# §5.3 broadcast_to
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestMirroredBroadcastTo:
    def test_none_destinations_assertion(self, n):
        """destinations=None -> AssertionError."""
        s = mirrored(n)
        with s.scope():
            with pytest.raises(AssertionError) as info:
                s.extended.broadcast_to(np.array(5.0), None)
        assert str(info.value)

    def test_list_destinations_assertion(self, n):
        """destinations a list -> AssertionError."""
        s = mirrored(n)
        with s.scope():
            with pytest.raises(AssertionError):
                s.extended.broadcast_to(np.array(5.0), ["/cpu:0"])

    def test_python_numbers_returned_unchanged(self, n):
        """Python int / float are returned unchanged (the same object)."""
        s = mirrored(n)
        big = 10 ** 6 + 1
        f = 2.5
        with s.scope():
            var = mpidist.Variable(0.0)
            assert s.extended.broadcast_to(big, var) is big
            assert s.extended.broadcast_to(f, var) is f
            assert s.extended.broadcast_to(f, "/cpu:0") is f

    def test_array_to_variable_mirrored_copies(self, n):
        """An array to var -> Mirrored with a copy per var device (N>1); one device -> array."""
        s = mirrored(n)
        x = np.array([5.0, 6.0])
        with s.scope():
            var = mpidist.Variable([0.0, 0.0])
            out = s.extended.broadcast_to(x, var)
        assert_result(out, n, [5.0, 6.0])
        for c in (out.values if n > 1 else (out,)):
            assert not np.shares_memory(c, x)
        if n > 1:
            assert [str(d) for d in out.devices] == list(devices(n))
        assert [list(c.numpy()) for c in var.values] == [[0.0, 0.0]] * n

    def test_array_to_device_string_plain_array(self, n):
        """A single device string -> a plain array."""
        s = mirrored(n)
        with s.scope():
            out = s.extended.broadcast_to(np.array(5.0), f"/cpu:{n - 1}")
        assert type(out) is np.ndarray
        assert float(out) == 5.0

    def test_array_to_per_replica(self, n):
        """A PerReplica destination -> Mirrored over its devices."""
        s = mirrored(n)
        dest = ones_to_n(s)
        with s.scope():
            out = s.extended.broadcast_to(np.array(5.0), dest)
        assert_result(out, n, 5.0)

    def test_mirrored_result_acts_as_value(self, n):
        """The Mirrored result converts / computes like its component: broadcast + 1 -> 6.0."""
        s = mirrored(n)
        with s.scope():
            var = mpidist.Variable(0.0)
            out = s.extended.broadcast_to(np.array(5.0), var)
            assert float(out + 1.0) == 6.0
            assert float(np.asarray(out)) == 5.0


class TestSingleReplicaBroadcastTo:
    def test_default_none_returns_tensor(self):
        """Default strategy: destinations=None returns the tensor itself."""
        s = default_strategy()
        x = np.array([1.0, 2.0])
        assert s.extended.broadcast_to(x, None) is x

    def test_default_non_none_not_implemented(self):
        """Default strategy: any non-None destinations -> NotImplementedError 'TODO'."""
        s = default_strategy()
        with pytest.raises(NotImplementedError, match="TODO"):
            s.extended.broadcast_to(np.array(1.0), "/cpu:0")
        with pytest.raises(NotImplementedError, match="TODO"):
            s.extended.broadcast_to(3.0, "/cpu:0")

    def test_one_device(self):
        """OneDevice: None -> AssertionError; else the value (one device -> plain array)."""
        s = one_device()
        with s.scope():
            with pytest.raises(AssertionError):
                s.extended.broadcast_to(np.array(5.0), None)
            out = s.extended.broadcast_to(np.array([5.0]), "/cpu:0")
            assert type(out) is np.ndarray
            np.testing.assert_array_equal(out, [5.0])
            f = 2.5
            assert s.extended.broadcast_to(f, "/cpu:0") is f


# --------------------------------------------------------------------------------------------
# §5.4 update
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestMirroredUpdate:
    def test_cross_replica_assign(self, n):
        """v=5; update(v, var.assign(x), args=(7.,)) -> Mirrored [7]*N; components [7]*N."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(5.0)
            out = s.extended.update(v, lambda var, x: var.assign(x), args=(np.array(7.0),))
        assert comps(v) == [7.0] * n
        assert [float(c) for c in local(s, out)] == [7.0] * n
        if n > 1:
            assert isinstance(out, mpidist.Mirrored)
            assert len(out.values) == n

    def test_called_once_per_component_in_order(self, n):
        """fn receives each component variable once, in replica order."""
        s = mirrored(n)
        seen = []
        with s.scope():
            v = mpidist.Variable(5.0)
            s.extended.update(v, lambda var: seen.append(var))
        assert len(seen) == n
        assert all(a is b for a, b in zip(seen, v.values))

    def test_fn_runs_in_cross_replica_context(self, n):
        """Inside fn: get_strategy() is S, has_strategy(), no replica context, cross-replica —
        also when update is called from the top level."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(5.0)
        seen = []

        def fn(var):
            seen.append((mpidist.get_strategy() is s, mpidist.has_strategy(),
                         mpidist.get_replica_context(), mpidist.in_cross_replica_context()))

        s.extended.update(v, fn)
        assert seen == [(True, True, None, True)] * n

    def test_distributed_args_unwrapped_plain_args_broadcast(self, n):
        """PerReplica / Mirrored args and kwargs give component i to component i; plain values
        go to every component unchanged."""
        s = mirrored(n)
        pr = ones_to_n(s)
        m = mpidist.Mirrored([np.array(0.5) for _ in range(n)])
        got = []

        def fn(var, x, y, z=None, w=None):
            got.append((x, y, z, w))
            return var.assign(x * 10.0 + y + z + w)

        with s.scope():
            v = mpidist.Variable(0.0)
            s.extended.update(v, fn, args=(pr, m), kwargs={"z": 100.0, "w": pr})
        assert comps(v) == [10.0 * (i + 1) + 0.5 + 100.0 + (i + 1) for i in range(n)]
        for i, (x, y, z, w) in enumerate(got):
            assert x is pr.values[i]
            assert y is m.values[i]
            assert z == 100.0
            assert w is pr.values[i]

    def test_update_assignment_is_plain_even_with_sum_aggregation(self, n):
        """Inside an update fn, assigning the component is a plain write (no aggregation)."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(0.0, aggregation=VariableAggregation.SUM)
            s.extended.update(v, lambda var, x: var.assign(x), args=(ones_to_n(s),))
        assert comps(v) == [float(i + 1) for i in range(n)]

    def test_group_true_structure_regrouped_leafwise(self, n):
        """fn returning a tuple -> a tuple of Mirrored (one per leaf)."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(3.0)
            out = s.extended.update(v, lambda var: (var.read_value(), var.read_value() * 2.0))
        assert isinstance(out, tuple) and len(out) == 2
        assert [float(c) for c in local(s, out[0])] == [3.0] * n
        assert [float(c) for c in local(s, out[1])] == [6.0] * n
        if n > 1:
            assert isinstance(out[0], mpidist.Mirrored)
            assert isinstance(out[1], mpidist.Mirrored)

    def test_group_false_tuple_per_component(self, n):
        """group=False -> a tuple with one result per component."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(5.0)
            out = s.extended.update(v, lambda var, x: var.assign_add(x), args=(ones_to_n(s),), group=False)
        assert isinstance(out, tuple)
        assert len(out) == n
        assert [float(r) for r in out] == [5.0 + i + 1 for i in range(n)]
        assert comps(v) == [5.0 + i + 1 for i in range(n)]

    def test_group_false_structure(self, n):
        """group=False with a tuple result -> per leaf, a tuple over components."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(2.0)
            out = s.extended.update(v, lambda var: (var.read_value(), var.read_value() + 1.0), group=False)
        assert isinstance(out, tuple) and len(out) == 2
        assert isinstance(out[0], tuple) and len(out[0]) == n
        assert [float(x) for x in out[0]] == [2.0] * n
        assert [float(x) for x in out[1]] == [3.0] * n

    def test_non_array_result_returned(self, n):
        """`lambda var: 42` -> 42 (fn still runs on every component)."""
        s = mirrored(n)
        calls = []

        def fn(var):
            calls.append(var)
            return 42

        with s.scope():
            v = mpidist.Variable(5.0)
            assert s.extended.update(v, fn) == 42
        assert len(calls) == n

    def test_replica_context_each_replica_gets_its_component(self, n):
        """update() in replica context merge_calls; replica i gets component i's result."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(0.0)
        seen = {}
        lock = threading.Lock()

        def step():
            r = s.extended.update(v, lambda var, x: var.assign(x), args=(np.array(rid() + 1.0),))
            with lock:
                seen[int(rid())] = r
            return r

        out = s.run(step)
        assert comps(v) == [float(i + 1) for i in range(n)]
        assert [float(c) for c in local(s, out)] == [float(i + 1) for i in range(n)]
        assert sorted(seen) == list(range(n))
        for i, r in seen.items():
            assert not isinstance(r, mpidist.DistributedValues)
            assert float(r) == i + 1.0

    def test_replica_context_plain_arg_applied_once_per_component(self, n):
        """A value identical on all replicas reaches update once: each component += 1 once."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(5.0)
        s.run(lambda: s.extended.update(v, lambda var, x: var.assign_add(x), args=(1.0,)))
        assert comps(v) == [6.0] * n

    def test_sync_on_read_variable(self, n):
        """update on an ON_READ variable applies fn to every component."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(1.0, synchronization=VariableSynchronization.ON_READ,
                                 aggregation=VariableAggregation.SUM)
            s.extended.update(v, lambda var, x: var.assign_add(x), args=(ones_to_n(s),))
        assert comps(v) == [1.0 + i + 1 for i in range(n)]


class TestSingleReplicaUpdate:
    @pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
    def test_fn_called_on_var_with_args(self, make):
        """update(var, fn, args, kwargs) = fn(var, *args, **kwargs), result returned."""
        s = make()
        seen = []
        with s.scope():
            v = mpidist.Variable(5.0)

        def fn(var, x, y=0.0):
            seen.append(var)
            return var.assign(x + y)

        out = s.extended.update(v, fn, args=(np.array(7.0),), kwargs={"y": 1.0})
        assert len(seen) == 1 and seen[0] is v
        assert float(v.numpy()) == 8.0
        assert not isinstance(out, mpidist.DistributedValues)
        assert float(out) == 8.0

    @pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
    def test_group_false_one_tuples(self, make):
        """group=False -> the result's nest with each leaf a 1-tuple."""
        s = make()
        with s.scope():
            v = mpidist.Variable(5.0)
        out = s.extended.update(v, lambda var, x: var.assign(x), args=(np.array(7.0),), group=False)
        assert isinstance(out, tuple) and len(out) == 1
        assert float(out[0]) == 7.0
        out = s.extended.update(v, lambda var: (var.read_value(), 42), group=False)
        assert isinstance(out, tuple) and len(out) == 2
        assert isinstance(out[0], tuple) and len(out[0]) == 1 and float(out[0][0]) == 7.0
        assert out[1] == (42,)

    @pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
    def test_non_array_result(self, make):
        """`lambda var: 42` -> 42."""
        s = make()
        with s.scope():
            v = mpidist.Variable(5.0)
        assert s.extended.update(v, lambda var: 42) == 42


# --------------------------------------------------------------------------------------------
# §5.5 colocate_vars_with
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestColocateVarsWith:
    def test_variables_inside_get_same_devices(self, n):
        """Variables created inside get the devices of the colocation variable."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(1.0)
            with s.extended.colocate_vars_with(v):
                w = mpidist.Variable(2.0)
            u = mpidist.Variable(3.0)
        assert isinstance(w, mpidist.MirroredVariable)
        assert [c.device for c in w.values] == [c.device for c in v.values]
        assert [c.device for c in w.values] == list(devices(n))
        assert comps(w) == [2.0] * n
        assert [c.device for c in u.values] == list(devices(n))

    def test_not_a_variable_value_error(self, n):
        """A non-variable -> ValueError '... must only be passed a variable created in this
        ...Strategy.scope(), not: 5'."""
        s = mirrored(n)
        with s.scope():
            with pytest.raises(ValueError, match=COLOCATE + ", not: 5"):
                s.extended.colocate_vars_with(5)

    def test_variable_of_other_strategy_value_error(self, n):
        """A variable of another strategy -> ValueError '... not <v> created in scope: <S2>'."""
        s, other = mirrored(n), mirrored(n)
        with other.scope():
            foreign = mpidist.Variable(1.0)
        with s.scope():
            with pytest.raises(ValueError, match="(?s)" + COLOCATE + ".*created in scope:"):
                s.extended.colocate_vars_with(foreign)

    def test_plain_variable_value_error(self, n):
        """A plain (non-distributed) variable -> ValueError '`colocate_vars_with` must only ...'."""
        s = mirrored(n)
        plain = mpidist.Variable(1.0)
        with s.scope():
            with pytest.raises(ValueError, match=COLOCATE):
                s.extended.colocate_vars_with(plain)

    def test_outside_scope_runtime_error(self, n):
        """Outside the strategy's scope -> RuntimeError 'Need to be inside "with strategy.scope()" for <S>'."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(1.0)
        with pytest.raises(RuntimeError, match=need_scope(s)):
            s.extended.colocate_vars_with(v)


class TestOneDeviceColocate:
    def test_one_device_colocate(self):
        """OneDevice: variable from its scope colocates; 5 -> ValueError; outside -> RuntimeError."""
        s = one_device("/cpu:0")
        with s.scope():
            v = mpidist.Variable(1.0)
            with s.extended.colocate_vars_with(v):
                w = mpidist.Variable(2.0)
            with pytest.raises(ValueError, match=COLOCATE + ", not: 5"):
                s.extended.colocate_vars_with(5)
        assert w.device == v.device == LOCAL + "CPU:0"
        assert float(w.numpy()) == 2.0
        with pytest.raises(RuntimeError, match=need_scope(s)):
            s.extended.colocate_vars_with(v)


# --------------------------------------------------------------------------------------------
# §5.6 value_container
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
@pytest.mark.parametrize("sync", [VariableSynchronization.ON_WRITE, VariableSynchronization.ON_READ])
def test_value_container_mirrored(n, sync):
    """Component -> its distributed variable; the variable -> itself; anything else -> itself;
    invariant: value is one of experimental_local_results(value_container(value))."""
    s = mirrored(n)
    pr = ones_to_n(s)
    x = np.array(3.0)
    with s.scope():
        v = mpidist.Variable(1.0, synchronization=sync, aggregation=VariableAggregation.SUM)
        for c in v.values:
            assert s.extended.value_container(c) is v
        assert s.extended.value_container(v) is v
        assert s.extended.value_container(x) is x
        for c in pr.values:
            assert s.extended.value_container(c) is c
        for value in list(v.values) + [x] + list(pr.values):
            container = s.extended.value_container(value)
            assert any(r is value for r in s.experimental_local_results(container))


@pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
def test_value_container_single_replica(make):
    """Default / OneDevice: value_container returns its argument."""
    s = make()
    x = np.array(3.0)
    with s.scope():
        v = mpidist.Variable(1.0)
        assert s.extended.value_container(v) is v
        assert s.extended.value_container(x) is x
        assert any(r is v for r in s.experimental_local_results(s.extended.value_container(v)))


# --------------------------------------------------------------------------------------------
# §5.7 device / role properties
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
def test_properties_mirrored(n):
    """Mirrored: canonical worker_devices, parameter_devices = worker_devices, N replicas,
    checkpoint/summary/init True, not between-graph, no cluster resolver."""
    s = mirrored(n)
    ext = s.extended
    assert ext.worker_devices == devices(n)
    assert tuple(ext.parameter_devices) == devices(n)
    assert s.num_replicas_in_sync == n
    assert ext.should_checkpoint is True
    assert ext.should_save_summary is True
    assert ext.experimental_should_init is True
    assert ext.experimental_between_graph is False
    assert s.cluster_resolver is None


@pytest.mark.parametrize("device, canonical", [("/cpu:0", LOCAL + "CPU:0"), ("/cpu:1", LOCAL + "CPU:1"),
                                               ("CPU:0", LOCAL + "CPU:0")])
def test_properties_one_device(device, canonical):
    """OneDevice(d): worker_devices = parameter_devices = (d,), 1 replica, flags as Mirrored."""
    s = one_device(device)
    ext = s.extended
    assert tuple(ext.worker_devices) == (canonical,)
    assert tuple(ext.parameter_devices) == (canonical,)
    assert s.num_replicas_in_sync == 1
    assert ext.should_checkpoint is True
    assert ext.should_save_summary is True
    assert ext.experimental_should_init is True
    assert ext.experimental_between_graph is False
    assert s.cluster_resolver is None


def test_properties_default():
    """Default: worker_devices / parameter_devices raise RuntimeError; 1 replica;
    should_checkpoint / should_save_summary True; cluster_resolver None."""
    s = default_strategy()
    ext = s.extended
    with pytest.raises(RuntimeError, match=r"worker_devices\(\) method unsupported by default"):
        _ = ext.worker_devices
    with pytest.raises(RuntimeError, match=r"parameter_devices\(\) method unsupported by default"):
        _ = ext.parameter_devices
    assert s.num_replicas_in_sync == 1
    assert ext.should_checkpoint is True
    assert ext.should_save_summary is True
    assert s.cluster_resolver is None


# --------------------------------------------------------------------------------------------
# §5.8 call_for_each_replica, non_slot_devices
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
def test_call_for_each_replica_mirrored(n):
    """call_for_each_replica(lambda: rid()) -> PerReplica [0..N-1]."""
    s = mirrored(n)
    with s.scope():
        out = s.extended.call_for_each_replica(rid)
        shifted = s.extended.call_for_each_replica(lambda x: x + rid(), args=(ones_to_n(s),))
    assert [int(c) for c in local(s, out)] == list(range(n))
    assert [float(c) for c in local(s, shifted)] == [2.0 * i + 1 for i in range(n)]
    if n > 1:
        assert isinstance(out, mpidist.PerReplica)


def test_call_for_each_replica_default():
    """Default: fn runs once in a replica context with id 0 of 1 replica."""
    s = default_strategy()
    calls = []

    def fn(a, b=0):
        ctx = mpidist.get_replica_context()
        calls.append((ctx is not None, int(ctx.replica_id_in_sync_group), ctx.num_replicas_in_sync))
        return a + b

    assert s.extended.call_for_each_replica(fn, args=(2,), kwargs={"b": 3}) == 5
    assert calls == [(True, 0, 1)]


@pytest.mark.parametrize("n", REPLICAS)
def test_non_slot_devices_mirrored(n):
    """Mirrored: non_slot_devices(var_list) -> all devices."""
    s = mirrored(n)
    with s.scope():
        a = mpidist.Variable(1.0, name="a")
        b = mpidist.Variable(2.0, name="b")
        assert tuple(s.extended.non_slot_devices([b, a])) == devices(n)


def test_non_slot_devices_default():
    """Default: non_slot_devices(var_list) -> min(var_list, key=name)."""
    s = default_strategy()
    b = mpidist.Variable(1.0, name="b")
    a = mpidist.Variable(2.0, name="a")
    c = mpidist.Variable(3.0, name="c")
    assert s.extended.non_slot_devices([b, c, a]) is a
    assert s.extended.non_slot_devices([c, b]) is b


# --------------------------------------------------------------------------------------------
# read_var (§4.4 / §4.5)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
def test_read_var_mirrored_is_snapshot_of_current_value(n):
    """Mirrored variable: read_var -> the current value (an array, not the variable), a snapshot."""
    s = mirrored(n)
    with s.scope():
        v = mpidist.Variable(5.0)
        out = s.extended.read_var(v)
        assert not isinstance(out, (mpidist.Variable, mpidist.DistributedValues))
        assert float(out) == 5.0
        v.assign(9.0)
        assert float(out) == 5.0
        assert float(s.extended.read_var(v)) == 9.0


@pytest.mark.parametrize("n", REPLICAS)
@pytest.mark.parametrize(
    "agg, expected",
    [(VariableAggregation.SUM, lambda n: n * (n + 1) / 2),
     (VariableAggregation.MEAN, lambda n: (n + 1) / 2),
     (VariableAggregation.ONLY_FIRST_REPLICA, lambda n: 1.0)],
    ids=["SUM", "MEAN", "ONLY_FIRST_REPLICA"],
)
def test_read_var_sync_on_read_aggregates(n, agg, expected):
    """ON_READ variable with components [1..N]: read_var -> the aggregated value."""
    s = mirrored(n)
    with s.scope():
        v = mpidist.Variable(0.0, synchronization=VariableSynchronization.ON_READ, aggregation=agg)
        s.extended.update(v, lambda c, x: c.assign(x), args=(ones_to_n(s),))
        assert comps(v) == [float(i + 1) for i in range(n)]
        out = s.extended.read_var(v)
    assert not isinstance(out, (mpidist.Variable, mpidist.DistributedValues))
    assert float(out) == expected(n)


@pytest.mark.parametrize("make", [default_strategy, one_device], ids=["default", "one_device"])
def test_read_var_single_replica(make):
    """Default / OneDevice: read_var(v) -> v's value as an array."""
    s = make()
    with s.scope():
        v = mpidist.Variable([1.0, 2.0])
        out = s.extended.read_var(v)
    assert not isinstance(out, mpidist.Variable)
    np.testing.assert_array_equal(out, [1.0, 2.0])
