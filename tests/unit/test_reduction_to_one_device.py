"""ReductionToOneDevice (spec §6.1 CrossDeviceOps interface, §6.2 ReductionToOneDevice), used
directly and as MirroredStrategy(cross_device_ops=...)."""

import functools

import numpy as np
import pytest

import mpidist
from mpidist.errors import InvalidArgumentError

LOCAL = "/job:localhost/replica:0/task:0/device:"
REPLICAS = [1, 2, 3, 4]


def cpus(n):
    return [f"/cpu:{i}" for i in range(n)]


def strategy(n, **kwargs):
    return mpidist.MirroredStrategy(cpus(n), **kwargs)


def per_replica(s, fn):
    """A PerReplica with component fn(i) on replica i of strategy s."""
    return s.experimental_distribute_values_from_function(lambda ctx: fn(ctx.replica_id_in_sync_group))


def example_values(s, dtype=np.float32):
    """Spec §6.2 example: replica i holds [i+1, 10(i+1)]."""
    return per_replica(s, lambda i: np.array([i + 1, 10 * (i + 1)], dtype=dtype))


def components(result):
    return [np.asarray(c) for c in result.values]


def device_names(value):
    return [str(d) for d in value.devices]


def assert_mirrored_on(result, devices, expected, dtype=None):
    """result is a Mirrored with one component per device in `devices`, each == expected."""
    assert isinstance(result, mpidist.Mirrored)
    assert device_names(result) == list(devices)
    assert len(result.values) == len(devices)
    for c in components(result):
        np.testing.assert_array_equal(c, expected)
        if dtype is not None:
            assert c.dtype == dtype


def assert_plain(result, expected, dtype=None):
    """result is a plain ndarray (not a DistributedValues) equal to expected."""
    assert isinstance(result, np.ndarray)
    assert not isinstance(result, mpidist.DistributedValues)
    np.testing.assert_array_equal(result, expected)
    if dtype is not None:
        assert result.dtype == dtype


# --------------------------------------------------------------------------------------------
# §6.2 worked example (N = 8)
# --------------------------------------------------------------------------------------------

class TestSpecExampleEightReplicas:
    def test_sum_to_value_devices_mirrored_on_all_8(self):
        """SUM of [i+1, 10(i+1)] over 8 replicas to the value itself -> Mirrored [36, 360] x 8."""
        s = strategy(8)
        v = example_values(s)
        out = mpidist.ReductionToOneDevice().reduce(mpidist.ReduceOp.SUM, v, v)
        assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(8)], [36, 360], np.float32)

    def test_mean_to_single_device_plain_array(self):
        """MEAN to '/cpu:1' -> a plain array [4.5, 45]."""
        s = strategy(8)
        v = example_values(s)
        out = mpidist.ReductionToOneDevice().reduce(mpidist.ReduceOp.MEAN, v, "/cpu:1")
        assert_plain(out, [4.5, 45.0], np.float32)

    def test_custom_accumulation_fn_mean_divides_by_count(self):
        """accumulation_fn=max + MEAN -> max / 8 = [1, 10] (MEAN still divides by the count)."""
        s = strategy(8)
        v = example_values(s)
        seen = []

        def acc(values):
            seen.append(len(values))
            return np.max(np.stack(values), axis=0)

        rtod = mpidist.ReductionToOneDevice(accumulation_fn=acc)
        out = rtod.reduce("MEAN", v, "/cpu:0")
        assert_plain(out, [1.0, 10.0])
        assert seen == [8]

    def test_custom_accumulation_fn_sum(self):
        """accumulation_fn=max + SUM -> the max itself, [8, 80], on every destination device."""
        s = strategy(8)
        v = example_values(s)
        rtod = mpidist.ReductionToOneDevice(accumulation_fn=lambda xs: np.max(np.stack(xs), axis=0))
        out = rtod.reduce("SUM", v, v)
        assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(8)], [8, 80])

    def test_accumulation_fn_gets_a_list(self):
        """accumulation_fn receives list(v.values), in replica order."""
        s = strategy(4)
        v = example_values(s)
        got = []

        def acc(values):
            got.append(values)
            return values[0] + values[1] + values[2] + values[3]

        mpidist.ReductionToOneDevice(accumulation_fn=acc).reduce("SUM", v, "/cpu:0")
        assert isinstance(got[0], list)
        assert [list(np.asarray(x)) for x in got[0]] == [[1, 10], [2, 20], [3, 30], [4, 40]]

    def test_through_mirrored_strategy(self):
        """MirroredStrategy(cross_device_ops=ReductionToOneDevice()) gives the same numbers."""
        s = strategy(8, cross_device_ops=mpidist.ReductionToOneDevice())
        v = example_values(s)
        with s.scope():
            summed = s.extended.reduce_to("SUM", v, v)
            mean = s.extended.reduce_to("MEAN", v, "/cpu:1")
        assert_mirrored_on(summed, list(s.extended.worker_devices), [36, 360], np.float32)
        assert_plain(mean, [4.5, 45.0], np.float32)
        assert_plain(s.reduce("SUM", v, axis=None), [36, 360], np.float32)
        assert_plain(s.reduce("MEAN", v, axis=None), [4.5, 45.0], np.float32)


# --------------------------------------------------------------------------------------------
# §6.2 algorithm over 1..4 replicas
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestReduce:
    def test_sum_and_mean_to_value(self, n):
        """SUM -> sum of components, MEAN -> sum / N, broadcast to every device of dest."""
        s = strategy(n)
        v = example_values(s, np.float64)
        total = n * (n + 1) / 2
        rtod = mpidist.ReductionToOneDevice()
        devices = [LOCAL + f"CPU:{i}" for i in range(n)]
        summed = rtod.reduce(mpidist.ReduceOp.SUM, v, v)
        mean = rtod.reduce(mpidist.ReduceOp.MEAN, v, v)
        if n == 1:
            assert_plain(summed, [1.0, 10.0])
            assert_plain(mean, [1.0, 10.0])
        else:
            assert_mirrored_on(summed, devices, [total, 10 * total], np.float64)
            assert_mirrored_on(mean, devices, [total / n, 10 * total / n], np.float64)

    def test_single_device_destination_plain_array(self, n):
        """A destination with one device (device string) gives a plain array."""
        s = strategy(n)
        v = example_values(s, np.float64)
        total = n * (n + 1) / 2
        out = mpidist.ReductionToOneDevice().reduce("sum", v, f"/cpu:{n - 1}")
        assert_plain(out, [total, 10 * total], np.float64)

    def test_string_reduce_op_any_case(self, n):
        """reduce_op may be 'sum' / 'Mean' (case-insensitive)."""
        s = strategy(n)
        v = example_values(s, np.float64)
        total = n * (n + 1) / 2
        rtod = mpidist.ReductionToOneDevice()
        assert_plain(rtod.reduce("Sum", v, "/cpu:0"), [total, 10 * total])
        assert_plain(rtod.reduce("mEaN", v, "/cpu:0"), [total / n, 10 * total / n])

    def test_int_mean_float64_int_sum_keeps_dtype(self, n):
        """Integer SUM keeps the dtype; integer MEAN is true division -> float64."""
        s = strategy(n)
        rtod = mpidist.ReductionToOneDevice()
        for dtype in (np.int32, np.int64):
            v = per_replica(s, lambda i, dt=dtype: np.array([i + 1, 2 * (i + 1)], dtype=dt))
            total = n * (n + 1) // 2
            summed = rtod.reduce("SUM", v, "/cpu:0")
            assert_plain(summed, [total, 2 * total], dtype)
            if n > 1:
                mean = rtod.reduce("MEAN", v, "/cpu:0")
                assert_plain(mean, [total / n, 2 * total / n], np.float64)

    def test_destination_devices_follow_destination(self, n):
        """The result lives on dest's devices, not the value's: a Mirrored dest on other devices."""
        s = strategy(n)
        v = example_values(s, np.float64)
        other = strategy(4)
        dest = per_replica(other, lambda i: np.zeros(2))
        out = mpidist.ReductionToOneDevice().reduce("SUM", v, dest)
        total = n * (n + 1) / 2
        assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(4)], [total, 10 * total])

    def test_reduce_to_device_argument(self, n):
        """reduce_to_device picks where to reduce; the result still goes to dest."""
        s = strategy(n)
        v = example_values(s, np.float64)
        total = n * (n + 1) / 2
        rtod = mpidist.ReductionToOneDevice(reduce_to_device=f"/cpu:{n - 1}")
        assert_plain(rtod.reduce("SUM", v, "/cpu:0"), [total, 10 * total])
        out = rtod.reduce("MEAN", v, v)
        if n > 1:
            assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(n)],
                               [total / n, 10 * total / n])

    def test_inputs_not_modified(self, n):
        """Reducing leaves the input components unchanged and does not alias them."""
        s = strategy(n)
        v = example_values(s, np.float64)
        before = [c.copy() for c in components(v)]
        out = mpidist.ReductionToOneDevice().reduce("SUM", v, v)
        for c, b in zip(components(v), before):
            np.testing.assert_array_equal(c, b)
        outs = components(out) if isinstance(out, mpidist.Mirrored) else [out]
        for o in outs:
            for c in v.values:
                assert not np.shares_memory(o, c)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_shape_mismatch_invalid_argument(n):
    """Components of different shapes -> mpidist.errors.InvalidArgumentError (a ValueError)."""
    s = strategy(n)
    v = per_replica(s, lambda i: np.ones(4 if i == 0 else 2))
    with pytest.raises(InvalidArgumentError, match=r"same (size and )?shape"):
        mpidist.ReductionToOneDevice().reduce("SUM", v, v)
    with pytest.raises(InvalidArgumentError, match=r"same (size and )?shape"):
        mpidist.ReductionToOneDevice().reduce("MEAN", v, "/cpu:0")
    with pytest.raises(InvalidArgumentError, match=r"same (size and )?shape"):
        mpidist.ReductionToOneDevice().batch_reduce("SUM", [(v, v)])
    assert issubclass(InvalidArgumentError, ValueError)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64])
def test_dtypes_exact_vs_numpy(n, dtype):
    """SUM equals NumPy's sequential add in the input dtype bit for bit; MEAN = that / N
    (float dtypes keep their dtype, integers give float64). float16 is summed exactly (in
    float64) and rounded once, so it equals the correctly rounded sum."""
    rng = np.random.default_rng(1234 + n)
    if np.dtype(dtype).kind == "f":
        arrays = [rng.standard_normal((3, 5)).astype(dtype) for _ in range(n)]
    else:
        arrays = [rng.integers(-1000, 1000, size=(3, 5)).astype(dtype) for _ in range(n)]
    s = strategy(n)
    v = per_replica(s, lambda i: arrays[i])
    rtod = mpidist.ReductionToOneDevice()

    if dtype == np.float16:
        exact = functools.reduce(np.add, [a.astype(np.float64) for a in arrays])
        expected_sum, expected_mean = exact.astype(dtype), (exact / n).astype(dtype)
    else:
        expected_sum = functools.reduce(np.add, arrays)
        expected_mean = expected_sum / n
    summed = rtod.reduce("SUM", v, "/cpu:0")
    assert summed.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(summed, expected_sum)

    mean = rtod.reduce("MEAN", v, "/cpu:0")
    assert mean.dtype == (np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.float64)
    np.testing.assert_array_equal(mean, expected_mean)

    mirrored = rtod.reduce("SUM", v, v)
    for c in components(mirrored):
        assert c.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(c, expected_sum)


# --------------------------------------------------------------------------------------------
# §6.1 non-distributed input and the single-component shortcut
# --------------------------------------------------------------------------------------------

class TestNonDistributedAndShortcut:
    def test_plain_array_is_wrapped(self):
        """A plain array is reduced as a 1-component PerReplica: SUM and MEAN give the value."""
        x = np.array([1.5, -2.0])
        rtod = mpidist.ReductionToOneDevice()
        assert_plain(rtod.reduce("SUM", x, "/cpu:0"), [1.5, -2.0], np.float64)
        assert_plain(rtod.reduce("MEAN", x, "/cpu:0"), [1.5, -2.0], np.float64)
        assert_plain(rtod.reduce("SUM", x, "/cpu:1"), [1.5, -2.0], np.float64)
        assert_plain(rtod.reduce("MEAN", x, "/cpu:1"), [1.5, -2.0], np.float64)

    def test_plain_array_to_multi_device_destination(self):
        """A wrapped plain value reduced to a 3-device destination -> Mirrored copies of it."""
        s = strategy(3)
        dest = per_replica(s, lambda i: np.zeros(2))
        x = np.array([3.0, 4.0])
        out = mpidist.ReductionToOneDevice().reduce("SUM", x, dest)
        assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(3)], [3.0, 4.0], np.float64)

    def test_shortcut_single_component_same_device(self):
        """1 component on the destination's device -> an identity copy: accumulation_fn is not
        called and integer MEAN keeps its dtype."""
        s = strategy(1)
        v = per_replica(s, lambda i: np.array([7, 9], dtype=np.int32))
        calls = []

        def acc(values):
            calls.append(values)
            return values[0] * 100

        rtod = mpidist.ReductionToOneDevice(accumulation_fn=acc)
        out = rtod.reduce("MEAN", v, "/cpu:0")
        assert_plain(out, [7, 9], np.int32)
        assert calls == []
        assert out is not v.values[0]
        assert not np.shares_memory(out, v.values[0])

        out2 = rtod.reduce("SUM", v, v)
        assert_plain(out2, [7, 9], np.int32)
        assert calls == []

    def test_no_shortcut_to_another_device(self):
        """1 component but a destination on another device -> reduce_implementation runs."""
        s = strategy(1)
        v = per_replica(s, lambda i: np.array([7, 9], dtype=np.int32))
        calls = []

        def acc(values):
            calls.append(len(values))
            return values[0] * 100

        out = mpidist.ReductionToOneDevice(accumulation_fn=acc).reduce("SUM", v, "/cpu:1")
        assert calls == [1]
        assert_plain(out, [700, 900])

    def test_mean_of_one_int_component_elsewhere_is_float64(self):
        """MEAN that is actually reduced divides with '/', so one int component gives float64."""
        s = strategy(1)
        v = per_replica(s, lambda i: np.array([3, 4], dtype=np.int32))
        out = mpidist.ReductionToOneDevice().reduce("MEAN", v, "/cpu:1")
        assert_plain(out, [3.0, 4.0], np.float64)


# --------------------------------------------------------------------------------------------
# batch_reduce
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", REPLICAS)
class TestBatchReduce:
    def test_equals_per_pair_reduce(self, n):
        """batch_reduce returns a list, one result per pair, each equal to reduce(pair)."""
        s = strategy(n)
        a = example_values(s, np.float64)
        b = per_replica(s, lambda i: np.full((2, 2), float(i)))
        c = per_replica(s, lambda i: np.array(i + 1, dtype=np.int32))
        rtod = mpidist.ReductionToOneDevice()
        pairs = [(a, a), (b, "/cpu:0"), (c, a)]
        for op in ("SUM", "MEAN"):
            batch = rtod.batch_reduce(op, pairs)
            assert isinstance(batch, list)
            assert len(batch) == 3
            for (value, dest), got in zip(pairs, batch):
                want = rtod.reduce(op, value, dest)
                assert type(got) is type(want)
                if isinstance(want, mpidist.Mirrored):
                    assert device_names(got) == device_names(want)
                    for g, w in zip(components(got), components(want)):
                        assert g.dtype == w.dtype
                        np.testing.assert_array_equal(g, w)
                else:
                    assert got.dtype == want.dtype
                    np.testing.assert_array_equal(got, want)

    def test_concrete_values(self, n):
        """[(pr, pr), (pr, '/cpu:0')] SUM -> [Mirrored sum, array sum]."""
        s = strategy(n)
        pr = per_replica(s, lambda i: np.array(float(i + 1)))
        total = n * (n + 1) / 2
        first, second = mpidist.ReductionToOneDevice().batch_reduce("SUM", [(pr, pr), (pr, "/cpu:0")])
        if n == 1:
            assert_plain(first, total)
        else:
            assert_mirrored_on(first, [LOCAL + f"CPU:{i}" for i in range(n)], total)
        assert_plain(second, total)

    def test_pairs_must_be_tuples(self, n):
        """A pair that is not a tuple -> ValueError '... should be a tuple'."""
        s = strategy(n)
        pr = example_values(s)
        rtod = mpidist.ReductionToOneDevice()
        with pytest.raises(ValueError, match="Each element of `value_destination_pairs` should be a tuple"):
            rtod.batch_reduce("SUM", [[pr, pr]])
        with pytest.raises(ValueError, match="Each element of `value_destination_pairs` should be a tuple"):
            rtod.batch_reduce("SUM", [(pr, pr), pr])

    def test_pairs_must_have_size_two(self, n):
        """A tuple of the wrong length -> ValueError '... should be a tuple of size 2'."""
        s = strategy(n)
        pr = example_values(s)
        rtod = mpidist.ReductionToOneDevice()
        with pytest.raises(ValueError, match="should be a tuple of size 2"):
            rtod.batch_reduce("SUM", [(pr, pr, pr)])
        with pytest.raises(ValueError, match="should be a tuple of size 2"):
            rtod.batch_reduce("SUM", [(pr,)])

    def test_batch_through_strategy(self, n):
        """MirroredStrategy(cross_device_ops=RTOD).extended.batch_reduce_to gives the same."""
        s = strategy(n, cross_device_ops=mpidist.ReductionToOneDevice())
        pr = per_replica(s, lambda i: np.array(float(i + 1)))
        total = n * (n + 1) / 2
        with s.scope():
            first, second = s.extended.batch_reduce_to("MEAN", [(pr, pr), (pr, "/cpu:0")])
        if n == 1:
            assert_plain(first, total / n)
        else:
            assert_mirrored_on(first, list(s.extended.worker_devices), total / n)
        assert_plain(second, total / n)


# --------------------------------------------------------------------------------------------
# broadcast
# --------------------------------------------------------------------------------------------

class TestBroadcast:
    def test_one_device_gives_array_copy(self):
        """broadcast(x, '/cpu:0') -> a plain array equal to x (a copy)."""
        x = np.array([5.0, 6.0])
        out = mpidist.ReductionToOneDevice().broadcast(x, "/cpu:0")
        assert_plain(out, [5.0, 6.0], np.float64)
        assert not np.shares_memory(out, x)

    def test_python_float_one_device(self):
        """broadcast(5., '/cpu:0') -> an array 5.0 (float64)."""
        out = mpidist.ReductionToOneDevice().broadcast(5.0, "/cpu:0")
        assert_plain(out, 5.0, np.float64)

    @pytest.mark.parametrize("n", [2, 3, 4, 8])
    def test_per_replica_destination_gives_mirrored(self, n):
        """broadcast(5., per_replica on N devices) -> Mirrored with N copies, one per device."""
        s = strategy(n)
        dest = per_replica(s, lambda i: np.zeros(3))
        out = mpidist.ReductionToOneDevice().broadcast(5.0, dest)
        assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(n)], 5.0)

        x = np.arange(3.0)
        out = mpidist.ReductionToOneDevice().broadcast(x, dest)
        assert_mirrored_on(out, [LOCAL + f"CPU:{i}" for i in range(n)], [0.0, 1.0, 2.0])
        for c in out.values:
            assert not np.shares_memory(c, x)

    def test_through_strategy_broadcast_to(self):
        """MirroredStrategy(cross_device_ops=RTOD).extended.broadcast_to to a PerReplica."""
        s = strategy(3, cross_device_ops=mpidist.ReductionToOneDevice())
        dest = per_replica(s, lambda i: np.zeros(1))
        with s.scope():
            out = s.extended.broadcast_to(np.array([2.0]), dest)
        assert_mirrored_on(out, list(s.extended.worker_devices), [2.0])


# --------------------------------------------------------------------------------------------
# Destination validation (§6.1 -> §5.1 errors) and construction
# --------------------------------------------------------------------------------------------

class TestValidation:
    def test_empty_string_destination(self):
        """destinations '' -> ValueError 'destinations can not be empty'."""
        s = strategy(2)
        v = example_values(s)
        with pytest.raises(ValueError, match="destinations can not be empty"):
            mpidist.ReductionToOneDevice().reduce("SUM", v, "")

    @pytest.mark.parametrize("bad", [3, 2.5, None, object()])
    def test_bad_destination_type(self, bad):
        """destinations neither distributed value, variable nor device string -> ValueError."""
        s = strategy(2)
        v = example_values(s)
        with pytest.raises(ValueError, match="destinations must be one of a `DistributedValues` object"):
            mpidist.ReductionToOneDevice().reduce("SUM", v, bad)

    def test_bad_reduce_op_string(self):
        """An unknown reduce op string -> ValueError "'MAX' is not a valid ReduceOp"."""
        s = strategy(2)
        v = example_values(s)
        with pytest.raises(ValueError, match="'MAX' is not a valid ReduceOp"):
            mpidist.ReductionToOneDevice().reduce("max", v, v)

    def test_is_a_cross_device_ops(self):
        """ReductionToOneDevice is a CrossDeviceOps, default arguments None."""
        rtod = mpidist.ReductionToOneDevice()
        assert isinstance(rtod, mpidist.CrossDeviceOps)
        assert rtod.accumulation_fn is None
        assert rtod.reduce_to_device is None

    @pytest.mark.parametrize(
        "bad", ["nccl", 5, mpidist.ReductionToOneDevice, object(), [mpidist.ReductionToOneDevice()]]
    )
    def test_mirrored_strategy_rejects_non_cross_device_ops(self, bad):
        """MirroredStrategy(cross_device_ops=<not a CrossDeviceOps>) -> TypeError."""
        with pytest.raises(TypeError, match="cross_device_ops"):
            mpidist.MirroredStrategy(cpus(2), cross_device_ops=bad)
