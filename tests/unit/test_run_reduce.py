"""Strategy.run, experimental_local_results, Strategy.reduce and Strategy.gather.

Spec: /work/shared/reference/tf-distribute-semantics.md sections 2.1, 2.2, 2.3, 2.4 and 2.8.
``S(N)`` is a MirroredStrategy over N virtual CPU devices.
"""

import collections

import numpy as np
import pytest

import mpidist
from replicas import mirrored, rid
from mpidist.errors import InvalidArgumentError

REPLICAS = [1, 2, 3, 4]


def local(strategy, value):
    """LR(x): the local components as numpy arrays."""
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def per_replica(strategy, fn):
    """A PerReplica (plain value when N == 1) of ``fn(replica_id)`` made by strategy.run."""
    return strategy.run(lambda: fn(int(rid())))


# ---------------------------------------------------------------------------------------
# 2.1 Strategy.run: argument checks and unwrapping
# ---------------------------------------------------------------------------------------


class TestRunArguments:
    @pytest.mark.parametrize("bad_args", [5, {"a": 1}, "ab", np.array([1.0])])
    def test_args_must_be_list_or_tuple(self, bad_args):
        """2.1: args that is not a list/tuple -> ValueError naming the type."""
        s = mirrored(2)
        with pytest.raises(ValueError, match=r"positional args must be a list or tuple, got <class '"):
            s.run(lambda *a: None, args=bad_args)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_list_args_accepted(self, n):
        """2.1: args may be a list."""
        s = mirrored(n)
        out = s.run(lambda a, b: a + b, args=[np.float64(1.0), np.float64(2.0)])
        assert local(s, out) == [3.0] * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_per_replica_args_and_kwargs_unwrapped(self, n):
        """2.1 example: x*10 + y + z with x = PerReplica([1., 2., ...]), y plain, z=x -> [12., 23., ...]."""
        s = mirrored(n)
        x = mpidist.PerReplica([float(i + 1) for i in range(n)])
        y = np.float64(1.0)
        out = s.run(lambda x, y, z: x * 10 + y + z, args=(x, y), kwargs={"z": x})
        assert local(s, out) == [11.0 * (i + 1) + 1.0 for i in range(n)]

    def test_example_two_replicas(self):
        """2.1 literal example with N=2: LR == [12., 23.]."""
        s = mirrored(2)
        x = mpidist.PerReplica([1.0, 2.0])
        out = s.run(lambda x, y, z: x * 10 + y + z, args=(x, np.float64(1.0)), kwargs={"z": x})
        assert local(s, out) == [12.0, 23.0]

    @pytest.mark.parametrize("n", REPLICAS)
    def test_nested_args_unwrapped(self, n):
        """2.1: args=([x, {"k": x}],) -> replica i receives [x_i, {"k": x_i}]."""
        s = mirrored(n)
        comps = [np.array([float(i)]) for i in range(n)]
        x = mpidist.PerReplica(comps)
        received = {}

        def fn(arg, kw=None):
            received[int(rid())] = (arg, kw)

        s.run(fn, args=([x, {"k": x}],), kwargs={"kw": (x, 3)})
        assert sorted(received) == list(range(n))
        for i in range(n):
            arg, kw = received[i]
            assert isinstance(arg, list) and isinstance(arg[1], dict)
            assert arg[0] is comps[i]
            assert arg[1]["k"] is comps[i]
            assert isinstance(kw, tuple)
            assert kw[0] is comps[i] and kw[1] == 3

    @pytest.mark.parametrize("n", REPLICAS)
    def test_mirrored_args_unwrapped(self, n):
        """2.1: Mirrored values in args are unwrapped to component i too."""
        s = mirrored(n)
        comps = [np.array([5.0]) for _ in range(n)]
        m = mpidist.Mirrored(comps)
        received = {}

        def fn(a):
            received[int(rid())] = a

        s.run(fn, args=(m,))
        assert all(received[i] is comps[i] for i in range(n))

    @pytest.mark.parametrize("n", REPLICAS)
    def test_plain_and_variable_args_passed_unchanged(self, n):
        """2.1: plain values and distributed variables are passed unchanged to every replica."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(2.0)
        plain = np.array([1.0, 2.0])
        received = {}

        def fn(a, b):
            received[int(rid())] = (a, b)

        s.run(fn, args=(v, plain))
        assert len(received) == n
        assert all(a is v and b is plain for a, b in received.values())


# ---------------------------------------------------------------------------------------
# 2.1 Strategy.run: return merging
# ---------------------------------------------------------------------------------------


class TestRunReturns:
    @pytest.mark.parametrize("n", REPLICAS)
    def test_replica_ids_and_context(self, n):
        """2.1/1.5: each replica has id 0..N-1 (np.int32), num_replicas_in_sync N, strategy current."""
        s = mirrored(n)
        seen = {}

        def fn():
            ctx = mpidist.get_replica_context()
            r = ctx.replica_id_in_sync_group
            seen[int(r)] = (type(r), ctx.num_replicas_in_sync, mpidist.get_strategy() is s,
                            mpidist.in_cross_replica_context())
            return r

        out = s.run(fn)
        assert [int(v) for v in local(s, out)] == list(range(n))
        assert seen == {i: (np.int32, n, True, False) for i in range(n)}

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_distinct_values_become_per_replica(self, n):
        """2.1: distinct per-replica results -> PerReplica in replica order."""
        s = mirrored(n)
        out = s.run(lambda: np.array(7.0) * (rid() + 1))
        assert isinstance(out, mpidist.PerReplica)
        assert local(s, out) == [7.0 * (i + 1) for i in range(n)]

    def test_single_replica_returns_plain_value(self):
        """2.1: with one replica the single result is the identical object -> unwrapped."""
        s = mirrored(1)
        out = s.run(lambda: np.array([7.0]))
        assert not isinstance(out, mpidist.DistributedValues)
        np.testing.assert_array_equal(out, [7.0])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_identical_object_unwrapped(self, n):
        """2.1: S.run(lambda: c) with outer c -> c itself; S.run(lambda: 7) -> 7."""
        s = mirrored(n)
        c = np.array(5.0)
        assert s.run(lambda: c) is c
        assert s.run(lambda: 7) == 7
        assert s.run(lambda: 2.5) == 2.5

    @pytest.mark.parametrize("n", REPLICAS)
    def test_none_returned(self, n):
        """2.1: S.run(lambda: None) -> None."""
        assert mirrored(n).run(lambda: None) is None

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_nested_dict_list_tuple(self, n):
        """2.1 example: {"a": c, "b": [new, c], "t": (1, "x")} -> {"a": c, "b": [PerReplica, c], "t": (1, "x")}."""
        s = mirrored(n)
        c = np.array(5.0)
        out = s.run(lambda: {"a": c, "b": [np.array(1.0), c], "t": (1, "x")})
        assert type(out) is dict and set(out) == {"a", "b", "t"}
        assert out["a"] is c
        assert isinstance(out["b"], list) and len(out["b"]) == 2
        assert isinstance(out["b"][0], mpidist.PerReplica)
        assert local(s, out["b"][0]) == [1.0] * n
        assert out["b"][1] is c
        assert out["t"] == (1, "x") and isinstance(out["t"], tuple)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_namedtuple_rebuilt(self, n):
        """2.1: namedtuples are rebuilt with the same type; leaves merged."""
        s = mirrored(n)
        Pair = collections.namedtuple("Pair", "a b")
        out = s.run(lambda: Pair(np.float64(rid()), 5))
        assert type(out) is Pair
        assert out.b == 5
        assert isinstance(out.a, mpidist.PerReplica)
        assert local(s, out.a) == [float(i) for i in range(n)]

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_tuple_and_list_structure_kept(self, n):
        """2.1: lists -> list, tuples -> tuple, element-wise merging."""
        s = mirrored(n)
        out = s.run(lambda: ([np.float64(rid()), 1], (np.float64(2 * rid()),)))
        assert isinstance(out, tuple) and len(out) == 2
        assert isinstance(out[0], list) and isinstance(out[1], tuple)
        assert out[0][1] == 1
        assert local(s, out[0][0]) == [float(i) for i in range(n)]
        assert local(s, out[1][0]) == [2.0 * i for i in range(n)]

    @pytest.mark.parametrize("n", [2, 3])
    def test_mapping_type_kept(self, n):
        """2.1: Mappings -> same type with the same keys."""
        s = mirrored(n)
        out = s.run(lambda: collections.OrderedDict([("z", np.float64(rid())), ("a", 1)]))
        assert type(out) is collections.OrderedDict
        assert list(out) == ["z", "a"]
        assert out["a"] == 1
        assert local(s, out["z"]) == [float(i) for i in range(n)]

    @pytest.mark.parametrize("n", REPLICAS)
    def test_returning_mirrored_variable_gives_variable(self, n):
        """2.1: S.run(lambda: v) with MirroredVariable v -> v itself."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(3.0)
        assert s.run(lambda: v) is v

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_returning_variable_component_gives_container(self, n):
        """2.1: a component of a distributed variable returned by each replica -> the container."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(3.0)
        comps = s.experimental_local_results(v)
        assert s.run(lambda: comps[int(rid())]) is v

    def test_returning_variable_component_one_replica(self):
        """2.1: with N=1 a variable component still gives its container (value_container(v0) is
        not v0 is checked before the identical-object rule; TF's regroup notes this case)."""
        s = mirrored(1)
        with s.scope():
            v = mpidist.Variable(3.0)
        (comp,) = s.experimental_local_results(v)
        assert comp is not v
        assert s.extended.value_container(comp) is v
        assert s.run(lambda: comp) is v

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_read_value_gives_per_replica(self, n):
        """2.1: S.run(lambda: v.read_value()) -> PerReplica of the component values."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(10.0)
        out = s.run(lambda: v.read_value())
        assert isinstance(out, mpidist.PerReplica)
        assert local(s, out) == [10.0] * n

    @pytest.mark.parametrize("n", REPLICAS)
    def test_num_replicas_in_sync_mirrored(self, n):
        """2.1: Mirrored num_replicas_in_sync == len(devices)."""
        assert mirrored(n).num_replicas_in_sync == n

    def test_num_replicas_in_sync_one_device_and_default(self):
        """2.1: OneDevice / default -> 1."""
        assert mpidist.OneDeviceStrategy("/cpu:0").num_replicas_in_sync == 1
        assert mpidist.get_strategy().num_replicas_in_sync == 1

    def test_one_device_run_returns_plain(self):
        """9.8: OneDevice run returns plain values, replica id 0."""
        s = mpidist.OneDeviceStrategy("/cpu:0")
        out = s.run(lambda x: x * 2 + rid(), args=(np.array([1.0, 2.0]),))
        assert not isinstance(out, mpidist.DistributedValues)
        np.testing.assert_array_equal(out, [2.0, 4.0])


# ---------------------------------------------------------------------------------------
# 2.2 experimental_local_results
# ---------------------------------------------------------------------------------------


class TestLocalResults:
    @pytest.mark.parametrize("n", REPLICAS)
    def test_distributed_value_components(self, n):
        """2.2: DistributedValues -> tuple of components in replica order."""
        s = mirrored(n)
        comps = [np.array(float(i)) for i in range(n)]
        res = s.experimental_local_results(mpidist.PerReplica(comps))
        assert isinstance(res, tuple) and len(res) == n
        assert all(a is b for a, b in zip(res, comps))

    @pytest.mark.parametrize("n", REPLICAS)
    def test_variable_components(self, n):
        """2.2: distributed variables -> component variables named Variable:0, Variable/replica_i:0."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(4.0)
        res = s.experimental_local_results(v)
        assert isinstance(res, tuple) and len(res) == n
        assert all(isinstance(c, mpidist.Variable) for c in res)
        assert all(c is not v for c in res)
        assert [float(np.asarray(c)) for c in res] == [4.0] * n
        assert [c.name for c in res] == ["Variable:0"] + [f"Variable/replica_{i}:0" for i in range(1, n)]

    @pytest.mark.parametrize("n", REPLICAS)
    def test_nested_structure(self, n):
        """2.2: [x, {"k": x, "p": 3}] -> one nest per device, leaves replaced by the i-th component."""
        s = mirrored(n)
        comps = [np.array(float(10 + i)) for i in range(n)]
        x = mpidist.PerReplica(comps)
        res = s.experimental_local_results([x, {"k": x, "p": 3}])
        assert isinstance(res, tuple) and len(res) == n
        for i, item in enumerate(res):
            assert isinstance(item, list)
            assert item[0] is comps[i]
            assert item[1]["k"] is comps[i]
            assert item[1]["p"] == 3

    @pytest.mark.parametrize("n", REPLICAS)
    def test_plain_values(self, n):
        """2.2: anything else -> (value,)."""
        s = mirrored(n)
        arr = np.array([1.0, 2.0])
        assert s.experimental_local_results(3) == (3,)
        res = s.experimental_local_results(arr)
        assert isinstance(res, tuple) and len(res) == 1 and res[0] is arr

    def test_one_device_and_default(self):
        """2.2 / 9.8: OneDevice and default -> (x,)."""
        arr = np.array([1.0])
        assert mpidist.OneDeviceStrategy("/cpu:0").experimental_local_results(arr)[0] is arr
        assert mpidist.get_strategy().experimental_local_results(arr) == (arr,)


# ---------------------------------------------------------------------------------------
# 2.3 Strategy.reduce
# ---------------------------------------------------------------------------------------

R0 = np.array([[1.0, 2.0], [3.0, 4.0]])
R1 = np.array([[2.0, 4.0], [6.0, 8.0]])


def example_pr():
    return mpidist.PerReplica([R0.copy(), R1.copy()])


class TestReduceOp:
    @pytest.mark.parametrize("op,expected", [
        ("sum", 3.0), ("SUM", 3.0), ("Sum", 3.0), ("mean", 1.5), ("Mean", 1.5), ("MEAN", 1.5),
        (mpidist.ReduceOp.SUM, 3.0), (mpidist.ReduceOp.MEAN, 1.5),
    ])
    def test_string_ops_any_case(self, op, expected):
        """2.3: reduce_op is a ReduceOp or a case-insensitive string."""
        s = mirrored(2)
        pr = mpidist.PerReplica([np.array(1.0), np.array(2.0)])
        assert float(s.reduce(op, pr, axis=None)) == expected

    @pytest.mark.parametrize("op", ["max", "MAX", "Max"])
    def test_unknown_op(self, op):
        """2.3: unknown string -> ValueError "'MAX' is not a valid ReduceOp"."""
        s = mirrored(2)
        pr = mpidist.PerReplica([np.array(1.0), np.array(2.0)])
        with pytest.raises(ValueError, match="'MAX' is not a valid ReduceOp"):
            s.reduce(op, pr, axis=None)

    def test_result_is_plain_array(self):
        """2.3: the result is a plain array, not a DistributedValues."""
        s = mirrored(2)
        out = s.reduce("SUM", example_pr(), axis=None)
        assert not isinstance(out, mpidist.DistributedValues)
        assert isinstance(out, (np.ndarray, np.generic))

    def test_reduce_in_replica_context(self):
        """2.3 / 1.3: reduce inside replica context -> RuntimeError."""
        s = mirrored(2)
        with pytest.raises(RuntimeError, match="Method requires being in cross-replica context"):
            s.run(lambda: s.reduce("SUM", np.float64(rid()), axis=None))


class TestReduceExamples:
    @pytest.mark.parametrize("op,axis,expected", [
        ("SUM", None, [[3.0, 6.0], [9.0, 12.0]]),
        ("SUM", 0, [12.0, 18.0]),
        ("SUM", 1, [9.0, 21.0]),
        ("SUM", -1, [9.0, 21.0]),
        ("SUM", (0,), [12.0, 18.0]),
        ("SUM", (0, 1), 30.0),
        ("MEAN", None, [[1.5, 3.0], [4.5, 6.0]]),
        ("MEAN", 0, [3.0, 4.5]),
        ("MEAN", 1, [2.25, 5.25]),
        ("MEAN", -2, [3.0, 4.5]),
        ("MEAN", (0, 1), 3.75),
    ])
    def test_two_replica_table(self, op, axis, expected):
        """2.3 examples: replica0 [[1,2],[3,4]], replica1 [[2,4],[6,8]]."""
        out = mirrored(2).reduce(op, example_pr(), axis=axis)
        np.testing.assert_allclose(np.asarray(out), expected)
        assert np.shape(out) == np.shape(expected)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_generalised_over_replicas(self, n):
        """2.3: replica r = (r+1)*[[1,2],[3,4]]; SUM/MEAN with axis None/0/1."""
        s = mirrored(n)
        pr = per_replica(s, lambda r: R0 * (r + 1))
        t = n * (n + 1) / 2
        np.testing.assert_allclose(s.reduce("SUM", pr, axis=None), R0 * t)
        np.testing.assert_allclose(s.reduce("MEAN", pr, axis=None), R0 * t / n)
        np.testing.assert_allclose(s.reduce("SUM", pr, axis=0), np.array([4.0, 6.0]) * t)
        np.testing.assert_allclose(s.reduce("MEAN", pr, axis=0), np.array([4.0, 6.0]) * t / (2 * n))
        np.testing.assert_allclose(s.reduce("MEAN", pr, axis=1), np.array([3.0, 7.0]) * t / (2 * n))

    def test_list_axis_type_error(self):
        """2.3: a list axis -> TypeError (only int or tuple)."""
        s = mirrored(2)
        for op in ("SUM", "MEAN"):
            with pytest.raises(TypeError, match="list"):
                s.reduce(op, example_pr(), axis=[0])

    def test_non_int_axis_type_error(self):
        """2.3: a non-integer axis for MEAN -> TypeError "Expected `axis` to be an integer..."."""
        with pytest.raises(TypeError, match="Expected `axis` to be an integer"):
            mirrored(2).reduce("MEAN", example_pr(), axis=1.5)

    @pytest.mark.parametrize("op", ["SUM", "MEAN"])
    @pytest.mark.parametrize("axis", [2, -3])
    def test_axis_out_of_range(self, op, axis):
        """2.3: axis out of range (SUM and MEAN) -> ValueError "Invalid reduction dimension"."""
        with pytest.raises(ValueError, match=f"Invalid reduction dimension {axis} for input with 2 dimensions"):
            mirrored(2).reduce(op, example_pr(), axis=axis)

    def test_axis_none_shape_mismatch(self):
        """2.3: axis=None needs equal shapes -> InvalidArgumentError (a ValueError)."""
        pr = mpidist.PerReplica([np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 6.0])])
        with pytest.raises(InvalidArgumentError):
            mirrored(2).reduce("SUM", pr, axis=None)
        assert issubclass(InvalidArgumentError, ValueError)


class TestReduceUnequalAndDtypes:
    def test_unequal_batches_mean_axis0(self):
        """2.3: [1,2,3,4] + [5,6] MEAN/0 -> 3.5 (true global count), SUM/0 -> 21."""
        s = mirrored(2)
        pr = mpidist.PerReplica([np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 6.0])])
        assert float(s.reduce("MEAN", pr, axis=0)) == 3.5
        assert float(s.reduce("SUM", pr, axis=0)) == 21.0

    def test_unequal_batches_three_replicas(self):
        """2.3: MEAN/0 with batches of 4, 2, 0 -> 21/6 = 3.5."""
        s = mirrored(3)
        pr = mpidist.PerReplica([np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 6.0]), np.array([])])
        assert float(s.reduce("MEAN", pr, axis=0)) == 3.5
        assert float(s.reduce("SUM", pr, axis=0)) == 21.0

    def test_empty_replica(self):
        """2.3: [] + [1,2,3] MEAN/0 -> 2.0."""
        pr = mpidist.PerReplica([np.array([]), np.array([1.0, 2.0, 3.0])])
        assert float(mirrored(2).reduce("MEAN", pr, axis=0)) == 2.0

    def test_integer_sum_keeps_dtype(self):
        """2.3: int32 [1,2]+[2,2] SUM -> int32 [3,4]."""
        pr = mpidist.PerReplica([np.array([1, 2], np.int32), np.array([2, 2], np.int32)])
        out = np.asarray(mirrored(2).reduce("SUM", pr, axis=None))
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, [3, 4])

    def test_integer_mean_float64(self):
        """2.3: int32 MEAN/None -> float64 [1.5, 2.0]; MEAN/0 -> float64 1.75."""
        s = mirrored(2)
        pr = mpidist.PerReplica([np.array([1, 2], np.int32), np.array([2, 2], np.int32)])
        out = np.asarray(s.reduce("MEAN", pr, axis=None))
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, [1.5, 2.0])
        out0 = np.asarray(s.reduce("MEAN", pr, axis=0))
        assert out0.dtype == np.float64
        assert float(out0) == 1.75


class TestReduceNonDistributed:
    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_mean_returns_value_unchanged(self, n):
        """2.3: non-distributed value, N>1, MEAN/None -> returned unchanged."""
        val = np.array([2.0, 3.0])
        np.testing.assert_array_equal(mirrored(n).reduce("MEAN", val, axis=None), [2.0, 3.0])

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_sum_raises(self, n):
        """2.3: non-distributed value, N>1, SUM/None -> ValueError "A non-DistributedValues value"."""
        with pytest.raises(ValueError, match="A non-DistributedValues value"):
            mirrored(n).reduce("SUM", np.float64(2.0), axis=None)
        with pytest.raises(ValueError, match="cannot be reduced with the given reduce op ReduceOp.SUM"):
            mirrored(n).reduce("SUM", np.array([2.0, 3.0]), axis=None)

    def test_sum_of_zeros_gives_zeros(self):
        """2.3: an all-zeros NumPy value reduced with SUM returns zeros."""
        out = np.asarray(mirrored(2).reduce("SUM", np.zeros(3), axis=None))
        assert out.shape == (3,)
        np.testing.assert_array_equal(out, [0.0, 0.0, 0.0])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_axis_given_reduces_per_replica(self, n):
        """2.3: with axis, the value goes through run first: SUM [2,3]/0 -> 5N, MEAN -> 2.5."""
        s = mirrored(n)
        assert float(s.reduce("SUM", np.array([2.0, 3.0]), axis=0)) == 5.0 * n
        assert float(s.reduce("MEAN", np.array([2.0, 3.0]), axis=0)) == 2.5

    def test_axis_given_two_replicas_literal(self):
        """2.3 literal: reduce("SUM", [2., 3.], axis=0) -> 10.0 with 2 replicas."""
        assert float(mirrored(2).reduce("SUM", np.array([2.0, 3.0]), axis=0)) == 10.0


class TestReduceDefaultAndOneDevice:
    def test_default_strategy_axis_none_unchanged(self):
        """2.3: default strategy reduce(op, v, None) -> v unchanged (SUM and MEAN)."""
        d = mpidist.get_strategy()
        v = np.array([1.0, 2.0])
        np.testing.assert_array_equal(d.reduce("SUM", v, None), [1.0, 2.0])
        np.testing.assert_array_equal(d.reduce("MEAN", v, None), [1.0, 2.0])

    def test_default_strategy_with_axis(self):
        """2.3: default strategy reduces within the tensor: MEAN [1,2]/0 -> 1.5, SUM -> 3."""
        d = mpidist.get_strategy()
        assert float(d.reduce("MEAN", np.array([1.0, 2.0]), axis=0)) == 1.5
        assert float(d.reduce("SUM", np.array([1.0, 2.0]), axis=0)) == 3.0

    def test_one_device(self):
        """2.3 / 9.8: OneDevice: reduce None -> v; MEAN [1,2,3]/0 -> 2.0."""
        s = mpidist.OneDeviceStrategy("/cpu:0")
        np.testing.assert_array_equal(s.reduce("SUM", np.array([1.0, 2.0]), None), [1.0, 2.0])
        assert float(s.reduce("MEAN", np.array([1.0, 2.0, 3.0]), 0)) == 2.0
        assert float(s.reduce("SUM", np.array([1.0, 2.0, 3.0]), 0)) == 6.0


class TestReduceMirroredAndVariables:
    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_mirrored_mean_is_value(self, n):
        """2.3: reduce(MEAN, Mirrored) -> the value itself."""
        m = mpidist.Mirrored([np.array([3.0, 4.0]) for _ in range(n)])
        np.testing.assert_array_equal(np.asarray(mirrored(n).reduce("MEAN", m, None)), [3.0, 4.0])

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_mirrored_sum_assertion_error(self, n):
        """2.3: reduce(SUM, Mirrored) -> AssertionError."""
        m = mpidist.Mirrored([np.array(3.0) for _ in range(n)])
        with pytest.raises(AssertionError):
            mirrored(n).reduce("SUM", m, None)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_mirrored_variable(self, n):
        """2.3: reduce of a MirroredVariable: MEAN -> its value; SUM -> AssertionError."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(6.0)
        assert float(np.asarray(s.reduce("MEAN", v, None))) == 6.0
        with pytest.raises(AssertionError):
            s.reduce("SUM", v, None)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_sync_on_read_reduced_as_per_replica(self, n):
        """2.3 / 4.4: SyncOnRead (aggregation NONE) components [7, 8, ...] -> SUM, MEAN of components."""
        s = mirrored(n)
        with s.scope():
            v = mpidist.Variable(0.0, synchronization=mpidist.VariableSynchronization.ON_READ,
                                 aggregation=mpidist.VariableAggregation.NONE)
        s.run(lambda: v.assign(np.float64(rid() + 7)))
        comps = [7.0 + i for i in range(n)]
        assert [float(np.asarray(c)) for c in s.experimental_local_results(v)] == comps
        assert float(np.asarray(s.reduce("SUM", v, None))) == sum(comps)
        assert float(np.asarray(s.reduce("MEAN", v, None))) == sum(comps) / n

    def test_sync_on_read_two_replicas_literal(self):
        """4.4 literal: components [7, 8] -> SUM 15.0, MEAN 7.5."""
        s = mirrored(2)
        with s.scope():
            v = mpidist.Variable(0.0, synchronization=mpidist.VariableSynchronization.ON_READ,
                                 aggregation=mpidist.VariableAggregation.NONE)
        s.run(lambda: v.assign(np.float64(rid() + 7)))
        assert float(np.asarray(s.reduce("SUM", v, None))) == 15.0
        assert float(np.asarray(s.reduce("MEAN", v, None))) == 7.5


# ---------------------------------------------------------------------------------------
# 2.4 Strategy.gather
# ---------------------------------------------------------------------------------------


def gather_value(s):
    """Replica r value = reshape(range(6), (1, 2, 3)) + 10 r."""
    return per_replica(s, lambda r: np.arange(6).reshape(1, 2, 3) + 10 * r)


class TestGather:
    def test_axis0(self):
        """2.4: axis 0 -> shape (2,2,3) [[[0,1,2],[3,4,5]],[[10,11,12],[13,14,15]]]."""
        out = mirrored(2).gather(gather_value(mirrored(2)), axis=0)
        assert out.shape == (2, 2, 3)
        np.testing.assert_array_equal(out, [[[0, 1, 2], [3, 4, 5]], [[10, 11, 12], [13, 14, 15]]])

    def test_axis1(self):
        """2.4: axis 1 -> (1,4,3)."""
        out = mirrored(2).gather(gather_value(mirrored(2)), axis=1)
        assert out.shape == (1, 4, 3)
        np.testing.assert_array_equal(out, [[[0, 1, 2], [3, 4, 5], [10, 11, 12], [13, 14, 15]]])

    @pytest.mark.parametrize("axis", [2, -1])
    def test_axis2(self, axis):
        """2.4: axis 2 -> (1,2,6) [[[0,1,2,10,11,12],[3,4,5,13,14,15]]]."""
        out = mirrored(2).gather(gather_value(mirrored(2)), axis=axis)
        assert out.shape == (1, 2, 6)
        np.testing.assert_array_equal(out, [[[0, 1, 2, 10, 11, 12], [3, 4, 5, 13, 14, 15]]])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_replica_order(self, n):
        """2.4: concatenation in replica order for N replicas."""
        s = mirrored(n)
        out = s.gather(gather_value(s), axis=0)
        assert out.shape == (n, 2, 3)
        np.testing.assert_array_equal(out[:, 0, 0], [10 * r for r in range(n)])
        assert not isinstance(out, mpidist.DistributedValues)

    def test_unequal_sizes_along_axis(self):
        """2.4: (1,2,3)+(1,3,3) on axis 1 -> (1,5,3)."""
        pr = mpidist.PerReplica([np.zeros((1, 2, 3)), np.ones((1, 3, 3))])
        out = mirrored(2).gather(pr, axis=1)
        assert out.shape == (1, 5, 3)
        np.testing.assert_array_equal(out[0, :, 0], [0.0, 0.0, 1.0, 1.0, 1.0])

    def test_mismatch_along_other_axis(self):
        """2.4: (1,2,3)+(1,3,3) on axis 0 -> InvalidArgumentError (a ValueError)."""
        pr = mpidist.PerReplica([np.zeros((1, 2, 3)), np.ones((1, 3, 3))])
        with pytest.raises(InvalidArgumentError):
            mirrored(2).gather(pr, axis=0)

    def test_rank0_fails(self):
        """2.4: rank-0 components -> ValueError."""
        s = mirrored(2)
        pr = mpidist.PerReplica([np.float64(1.0), np.float64(2.0)])
        with pytest.raises(ValueError, match=r"(?i)scalar|rank"):
            s.gather(pr, axis=0)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_non_distributed_unchanged(self, n):
        """2.4: a non-distributed value is returned unchanged."""
        val = np.array([1.0, 2.0])
        out = mirrored(n).gather(val, axis=0)
        np.testing.assert_array_equal(out, [1.0, 2.0])
        assert np.shape(out) == (2,)

    def test_replica_context_runtime_error(self):
        """1.3 / 2.4: gather in replica context -> RuntimeError pointing to all_gather."""
        s = mirrored(2)
        with pytest.raises(RuntimeError, match="gather method requires cross-replica context"):
            s.run(lambda: s.gather(np.array([1.0]), axis=0))

    def test_default_and_one_device_identity(self):
        """2.4 / 9.8: default and OneDevice gather -> identity."""
        val = np.array([1.0, 2.0])
        np.testing.assert_array_equal(mpidist.get_strategy().gather(val, 0), [1.0, 2.0])
        np.testing.assert_array_equal(mpidist.OneDeviceStrategy("/cpu:0").gather(val, 0), [1.0, 2.0])


# ---------------------------------------------------------------------------------------
# 2.8 PerReplica misuse
# ---------------------------------------------------------------------------------------


class TestPerReplicaMisuse:
    def test_as_array_outside_replica_context(self):
        """2.8: using a PerReplica as an array outside replica context -> ValueError."""
        pr = mpidist.PerReplica([np.array(1.0), np.array(2.0)])
        with pytest.raises(ValueError, match="It looks like you are using a PerReplica object while not "
                                             "inside a replica context"):
            np.asarray(pr)

    def test_no_operators(self):
        """2.8: Python operators on PerReplica -> TypeError."""
        pr = mpidist.PerReplica([np.array(1.0), np.array(2.0)])
        with pytest.raises(TypeError):
            pr + 1
        with pytest.raises(TypeError):
            pr * 2.0

    def test_flatten_in_replica_context(self):
        """3: converting an outer PerReplica inside replica context (N>1) -> ValueError."""
        s = mirrored(2)
        pr = mpidist.PerReplica([np.array(1.0), np.array(2.0)])
        with pytest.raises(ValueError, match="Flattening a PerReplica to components is not supported in "
                                             "replica context"):
            s.run(lambda: np.asarray(pr))

    def test_mirrored_has_operators(self):
        """2.8: Mirrored values overload operators: broadcast_to(3.) + 1. -> 4.0."""
        s = mirrored(2)
        dest = mpidist.PerReplica([np.array(0.0), np.array(0.0)])
        with s.scope():
            m = s.extended.broadcast_to(np.array(3.0), dest)
        assert isinstance(m, mpidist.Mirrored)
        assert float(m + 1.0) == 4.0
        assert float(2.0 * m) == 6.0
