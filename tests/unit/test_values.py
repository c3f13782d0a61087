"""DistributedValues, PerReplica, Mirrored and values_from_function: spec section 3
(tf-distribute-semantics.md), plus 2.8's operator rules for PerReplica / Mirrored.

Components are NumPy arrays / Python objects; TF's "tf.distribute" reads "mpidist".
"""

import threading

import numpy as np
import pytest

import mpidist
from replicas import mirrored

REPLICAS = [1, 2, 3, 4]


def expected_format(name, values, conv):
    """The exact repr/str layout of 3: "%s:{\\n%s\\n}" % (name, ",\\n".join("  %d: %r"))."""
    return "%s:{\n%s\n}" % (name, ",\n".join("  %d: %s" % (i, conv(v)) for i, v in enumerate(values)))


# ------------------------------------------------------------------------------------------
# DistributedValues basics
# ------------------------------------------------------------------------------------------


class TestDistributedValuesBasics:
    """3: DistributedValues(values) stores tuple(values); .values returns it; _primary = [0]."""

    @pytest.mark.parametrize("cls", [mpidist.DistributedValues, mpidist.PerReplica, mpidist.Mirrored])
    @pytest.mark.parametrize("n", REPLICAS)
    def test_values_is_tuple_in_order(self, cls, n):
        items = [np.array([float(i), 10.0 * i]) for i in range(n)]
        dv = cls(items)
        assert isinstance(dv.values, tuple)
        assert len(dv.values) == n
        for got, want in zip(dv.values, items):
            assert got is want
        assert dv._primary is items[0]

    def test_values_from_generator(self):
        dv = mpidist.PerReplica(x * 2 for x in range(3))
        assert dv.values == (0, 2, 4)

    def test_kinds_are_distributed_values(self):
        assert issubclass(mpidist.PerReplica, mpidist.DistributedValues)
        assert issubclass(mpidist.Mirrored, mpidist.DistributedValues)
        assert not issubclass(mpidist.PerReplica, mpidist.Mirrored)
        assert not issubclass(mpidist.Mirrored, mpidist.PerReplica)


# ------------------------------------------------------------------------------------------
# repr / str
# ------------------------------------------------------------------------------------------


class TestReprStr:
    """3: repr uses %r of components, str uses %s, in the exact "Name:{\\n  i: v,\\n...\\n}" layout."""

    def test_per_replica_repr_literal(self):
        assert repr(mpidist.PerReplica(["a", "b"])) == "PerReplica:{\n  0: 'a',\n  1: 'b'\n}"

    def test_per_replica_str_literal(self):
        assert str(mpidist.PerReplica(["a", "b"])) == "PerReplica:{\n  0: a,\n  1: b\n}"

    def test_mirrored_repr_and_str_literal(self):
        m = mpidist.Mirrored(["x", "x", "x"])
        assert repr(m) == "Mirrored:{\n  0: 'x',\n  1: 'x',\n  2: 'x'\n}"
        assert str(m) == "Mirrored:{\n  0: x,\n  1: x,\n  2: x\n}"

    def test_single_component(self):
        assert repr(mpidist.PerReplica([7])) == "PerReplica:{\n  0: 7\n}"

    @pytest.mark.parametrize("cls, name", [(mpidist.PerReplica, "PerReplica"),
                                           (mpidist.Mirrored, "Mirrored")])
    @pytest.mark.parametrize("n", REPLICAS)
    def test_array_components(self, cls, name, n):
        items = [np.array([i, i + 1], dtype=np.int32) for i in range(n)]
        dv = cls(items)
        assert repr(dv) == expected_format(name, items, repr)
        assert str(dv) == expected_format(name, items, str)
        # str uses the components' str: "[0 1]" rather than "array([0, 1], dtype=int32)"
        assert "  0: [0 1]" in str(dv)
        assert "  0: array([0, 1], dtype=int32)" in repr(dv)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_run_result_repr(self, n):
        """The PerReplica that run returns for replica ids prints its int32 components."""
        s = mirrored(n)
        pr = s.run(lambda: mpidist.get_replica_context().replica_id_in_sync_group)
        assert isinstance(pr, mpidist.PerReplica)
        ids = [np.int32(i) for i in range(n)]
        assert repr(pr) == expected_format("PerReplica", ids, repr)
        assert str(pr) == "PerReplica:{\n" + ",\n".join(f"  {i}: {i}" for i in range(n)) + "\n}"

    @pytest.mark.parametrize("sync, name", [
        (mpidist.VariableSynchronization.ON_WRITE, "MirroredVariable"),
        (mpidist.VariableSynchronization.ON_READ, "SyncOnReadVariable"),
    ])
    @pytest.mark.parametrize("n", REPLICAS)
    def test_distributed_variable_class_names(self, sync, name, n):
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(1.5, synchronization=sync, aggregation=mpidist.VariableAggregation.SUM)
        assert type(v).__name__ == name
        text = repr(v)
        assert text.startswith(name + ":{\n  0: ")
        assert text.endswith("\n}")
        assert text == expected_format(name, v.values, repr)
        assert text.count("\n  ") == n


# ------------------------------------------------------------------------------------------
# PerReplica: no arithmetic, no array conversion
# ------------------------------------------------------------------------------------------

PER_REPLICA_OPERATORS = {
    "add": lambda p: p + 1,
    "radd": lambda p: 1 + p,
    "sub": lambda p: p - 1.0,
    "mul": lambda p: p * 2,
    "rmul": lambda p: 2 * p,
    "truediv": lambda p: p / 2,
    "pow": lambda p: p ** 2,
    "add_self": lambda p: p + p,
    "neg": lambda p: -p,
    "lt": lambda p: p < 1,
}


class TestPerReplicaNoArithmetic:
    """2.8 / 3: Python operators on a PerReplica raise TypeError (no operator overloads)."""

    @pytest.mark.parametrize("op", sorted(PER_REPLICA_OPERATORS))
    @pytest.mark.parametrize("n", REPLICAS)
    def test_operator_raises_type_error(self, op, n):
        pr = mpidist.PerReplica([float(i) for i in range(n)])
        with pytest.raises(TypeError):
            PER_REPLICA_OPERATORS[op](pr)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_operator_on_run_result_raises(self, n):
        s = mirrored(n)
        pr = s.experimental_distribute_values_from_function(
            lambda ctx: np.array([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1))
        with pytest.raises(TypeError):
            pr + 1.0

    @pytest.mark.parametrize("n", REPLICAS)
    def test_no_attribute_delegation(self, n):
        """A PerReplica does not pretend to be its components (unlike Mirrored)."""
        pr = mpidist.PerReplica([np.zeros(3) for _ in range(n)])
        with pytest.raises(AttributeError):
            pr.shape  # noqa: B018

    @pytest.mark.parametrize("n", REPLICAS)
    def test_asarray_outside_replica_context(self, n):
        """np.asarray(PerReplica) at top level -> ValueError ("It looks like you are using a
        PerReplica object while not inside a replica context ...")."""
        pr = mpidist.PerReplica([np.array([1.0, 2.0]) for _ in range(n)])
        with pytest.raises(ValueError, match="It looks like you are using a PerReplica object while "
                                             "not inside a replica context, which is not supported"):
            np.asarray(pr)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_asarray_in_cross_replica_context(self, n):
        s = mirrored(n)
        pr = s.experimental_distribute_values_from_function(lambda ctx: np.array([1.0, 2.0]))
        with s.scope():
            with pytest.raises(ValueError, match="It looks like you are using a PerReplica object"):
                np.asarray(pr)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_asarray_inside_replica_context(self, n):
        """Flattening a PerReplica inside a replica context with N>1 -> ValueError."""
        s = mirrored(n)
        pr = s.experimental_distribute_values_from_function(lambda ctx: np.array([1.0, 2.0]))
        with pytest.raises(ValueError, match="Flattening a PerReplica to components is not "
                                             "supported in replica context"):
            s.run(lambda: np.asarray(pr))


# ------------------------------------------------------------------------------------------
# Mirrored: delegates operators and attributes
# ------------------------------------------------------------------------------------------


def broadcast(s, value):
    """strategy.extended.broadcast_to(value, per_replica_dest) in cross-replica context."""
    dest = s.experimental_distribute_values_from_function(lambda ctx: np.float64(0.0))
    with s.scope():
        return s.extended.broadcast_to(value, dest)


class TestMirroredDelegation:
    """2.8 / 3: Mirrored overloads operators and delegates attributes to the current
    component (primary in cross-replica context where no device matches)."""

    @pytest.mark.parametrize("n", REPLICAS)
    def test_broadcast_to_plus_one(self, n):
        """`strategy.extended.broadcast_to(np.float64(3.), per_replica_dest) + 1.` == 4.0."""
        s = mirrored(n)
        m = broadcast(s, np.float64(3.0))
        with s.scope():
            result = m + 1.0
        assert float(result) == 4.0
        assert not isinstance(result, mpidist.DistributedValues)
        assert float(broadcast(s, np.float64(3.0)) + 1.0) == 4.0  # top level too

    @pytest.mark.parametrize("n", REPLICAS)
    def test_broadcast_array_plus_one(self, n):
        """Same with a 0-d array (a "tensor"): a Mirrored for N > 1, the array for N = 1."""
        s = mirrored(n)
        m = broadcast(s, np.array(3.0))
        if n > 1:
            assert isinstance(m, mpidist.Mirrored)
            assert [float(v) for v in m.values] == [3.0] * n
        else:
            assert not isinstance(m, mpidist.DistributedValues)
        with s.scope():
            assert float(m + 1.0) == 4.0
        assert float(m + 1.0) == 4.0

    @pytest.mark.parametrize("n", REPLICAS)
    def test_scalar_operators(self, n):
        m = mpidist.Mirrored([np.float64(3.0) for _ in range(n)])
        assert float(m + 1.0) == 4.0
        assert float(1.0 + m) == 4.0
        assert float(m - 1.0) == 2.0
        assert float(10.0 - m) == 7.0
        assert float(m * 2.0) == 6.0
        assert float(2.0 * m) == 6.0
        assert float(m / 2.0) == 1.5
        assert float(6.0 / m) == 2.0
        assert float(m ** 2) == 9.0
        assert float(-m) == -3.0
        assert float(m) == 3.0
        assert int(m) == 3
        assert bool(m < 4.0) and not bool(m > 4.0)
        assert float(np.asarray(m)) == 3.0

    @pytest.mark.parametrize("n", REPLICAS)
    def test_array_attributes_and_operators(self, n):
        s = mirrored(n)
        m = broadcast(s, np.array([1.0, 2.0, 4.0]))
        assert isinstance(m, mpidist.Mirrored) == (n > 1)
        assert m.shape == (3,)
        assert m.dtype == np.float64
        assert float(m.sum()) == 7.0
        assert float(m[2]) == 4.0
        assert len(m) == 3
        np.testing.assert_array_equal(m + 1.0, [2.0, 3.0, 5.0])
        np.testing.assert_array_equal(m * m, [1.0, 4.0, 16.0])
        assert float(m @ np.array([1.0, 1.0, 1.0])) == 7.0
        np.testing.assert_array_equal(np.asarray(m), [1.0, 2.0, 4.0])

    def test_primary_outside_replica_context(self):
        """With no current device matching, a Mirrored reads as its primary (component 0)."""
        m = mpidist.Mirrored([np.float64(1.0), np.float64(2.0)])
        assert float(m + 0.0) == 1.0
        assert float(m) == 1.0

    @pytest.mark.parametrize("n", REPLICAS)
    def test_current_device_component_in_replica_context(self, n):
        """Inside run, a (captured) Mirrored reads as the component on the replica's device."""
        s = mirrored(n)
        devices = s.experimental_distribute_values_from_function(lambda ctx: 0.0).devices
        m = mpidist.Mirrored([np.float64(10.0 + i) for i in range(n)], devices)
        result = s.run(lambda: m + 0.0)
        assert [float(v) for v in s.experimental_local_results(result)] == [10.0 + i for i in range(n)]


# ------------------------------------------------------------------------------------------
# experimental_distribute_values_from_function
# ------------------------------------------------------------------------------------------


class TestDistributeValuesFromFunction:
    """3: value_fn(ValueContext(i, N)) for i = 0..N-1, in order, on the calling thread;
    always a PerReplica for MirroredStrategy; unwrapped for default and OneDevice."""

    @pytest.mark.parametrize("n", REPLICAS)
    def test_calls_in_order_on_calling_thread(self, n):
        s = mirrored(n)
        calls = []

        def value_fn(ctx):
            calls.append((threading.get_ident(), ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
            return np.float64(ctx.replica_id_in_sync_group)

        s.experimental_distribute_values_from_function(value_fn)
        me = threading.get_ident()
        assert calls == [(me, i, n) for i in range(n)]

    @pytest.mark.parametrize("n", REPLICAS)
    def test_value_context_argument(self, n):
        s = mirrored(n)
        seen = []
        s.experimental_distribute_values_from_function(lambda ctx: seen.append(ctx))
        assert len(seen) == n
        for i, ctx in enumerate(seen):
            assert isinstance(ctx, mpidist.ValueContext)
            assert ctx.replica_id_in_sync_group == i
            assert ctx.num_replicas_in_sync == n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_index_example(self, n):
        """`lambda ctx: arr[ctx.replica_id_in_sync_group]`, arr = [3., 2., 1., 0.] -> (3., 2., ...)."""
        arr = [3.0, 2.0, 1.0, 0.0]
        s = mirrored(n)
        pr = s.experimental_distribute_values_from_function(lambda ctx: arr[ctx.replica_id_in_sync_group])
        assert isinstance(pr, mpidist.PerReplica)
        assert pr.values == tuple(arr[:n])
        assert s.experimental_local_results(pr) == tuple(arr[:n])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_python_scalars_still_per_replica(self, n):
        """`lambda ctx: ctx.num_replicas_in_sync` -> PerReplica((N,) * N), even for N = 1."""
        s = mirrored(n)
        pr = s.experimental_distribute_values_from_function(lambda ctx: ctx.num_replicas_in_sync)
        assert type(pr) is mpidist.PerReplica
        assert pr.values == (n,) * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_identical_object_still_per_replica(self, n):
        """Returning the same object from every call still gives a PerReplica."""
        s = mirrored(n)
        shared = np.array([5.0, 6.0])
        pr = s.experimental_distribute_values_from_function(lambda ctx: shared)
        assert type(pr) is mpidist.PerReplica
        assert len(pr.values) == n
        assert all(v is shared for v in pr.values)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_no_copy_to_replica_devices(self, n):
        """Values are used as returned (no copy): component i is the object value_fn returned."""
        s = mirrored(n)
        arrays = [np.full((2,), float(i)) for i in range(n)]
        pr = s.experimental_distribute_values_from_function(lambda ctx: arrays[ctx.replica_id_in_sync_group])
        assert all(got is want for got, want in zip(pr.values, arrays))

    @pytest.mark.parametrize("n", REPLICAS)
    def test_result_feeds_run(self, n):
        """The PerReplica hands replica i its own component in run."""
        s = mirrored(n)
        pr = s.experimental_distribute_values_from_function(
            lambda ctx: np.float64(10.0 * (ctx.replica_id_in_sync_group + 1)))
        out = s.run(lambda x: x + 1.0, args=(pr,))
        assert [float(v) for v in s.experimental_local_results(out)] == [10.0 * (i + 1) + 1.0 for i in range(n)]

    def test_inside_scope(self):
        s = mirrored(2)
        with s.scope():
            pr = s.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)
        assert type(pr) is mpidist.PerReplica
        assert pr.values == (0, 1)

    def test_default_strategy_returns_unwrapped(self):
        """Default strategy: value_fn(ValueContext()) unwrapped: (0, 1) for fn -> (id, n)."""
        default = mpidist.get_strategy()
        calls = []

        def value_fn(ctx):
            calls.append(ctx)
            return (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync)

        result = default.experimental_distribute_values_from_function(value_fn)
        assert result == (0, 1)
        assert type(result) is tuple
        assert len(calls) == 1 and isinstance(calls[0], mpidist.ValueContext)

    def test_one_device_returns_unwrapped(self):
        s = mpidist.OneDeviceStrategy("/cpu:0")
        obj = np.array([1.0, 2.0])
        assert s.experimental_distribute_values_from_function(lambda ctx: obj) is obj
        result = s.experimental_distribute_values_from_function(
            lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
        assert result == (0, 1)
        assert not isinstance(result, mpidist.DistributedValues)


# ------------------------------------------------------------------------------------------
# ValueContext
# ------------------------------------------------------------------------------------------


class TestValueContext:
    """3: ValueContext(replica_id_in_sync_group=0, num_replicas_in_sync=1) and its str."""

    def test_defaults(self):
        ctx = mpidist.ValueContext()
        assert ctx.replica_id_in_sync_group == 0
        assert ctx.num_replicas_in_sync == 1

    def test_keywords(self):
        ctx = mpidist.ValueContext(replica_id_in_sync_group=3, num_replicas_in_sync=8)
        assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (3, 8)

    def test_str_exact(self):
        """str(ValueContext(2, 4)), with TF's two spaces before "total" and tf.distribute
        renamed mpidist."""
        assert str(mpidist.ValueContext(2, 4)) == \
            "mpidist.ValueContext(replica id 2,  total replicas in sync: 4)"
