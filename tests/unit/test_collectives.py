"""Replica-context collectives: all_reduce, all_gather, merge_call, and
strategy.extended.call_for_each_replica.

Spec: /work/shared/reference/tf-distribute-semantics.md sections 2.5, 2.6, 2.7 and 5.8.
``S(N)`` is a MirroredStrategy over N virtual CPU devices.
"""

import threading

import numpy as np
import pytest

import mpidist
from replicas import mirrored, rid

REPLICAS = [1, 2, 3, 4]

def ctx():
    return mpidist.get_replica_context()


def local(strategy, value):
    """LR(x): the local components as numpy arrays."""
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


class _Recorder:
    """Thread-safe per-replica record of what each replica saw."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seen = {}

    def put(self, key, value):
        with self._lock:
            self.seen[key] = value


class _Boom(Exception):
    """A user exception type that mpidist knows nothing about."""


# ---------------------------------------------------------------------------------------
# 2.5 ReplicaContext.all_reduce
# ---------------------------------------------------------------------------------------


class TestAllReduce:
    @pytest.mark.parametrize("n", REPLICAS)
    @pytest.mark.parametrize("op", ["SUM", mpidist.ReduceOp.SUM, "sum", "Sum"])
    def test_sum_every_replica(self, n, op):
        """2.5: value rid+1, SUM -> N(N+1)/2 on every replica (string ops accepted)."""
        s = mirrored(n)
        out = s.run(lambda: ctx().all_reduce(op, np.float64(rid() + 1)))
        assert [float(v) for v in local(s, out)] == [n * (n + 1) / 2] * n

    @pytest.mark.parametrize("n", REPLICAS)
    @pytest.mark.parametrize("op", ["MEAN", mpidist.ReduceOp.MEAN, "mean", "Mean"])
    def test_mean_every_replica(self, n, op):
        """2.5: value rid+1, MEAN -> (N+1)/2 on every replica."""
        s = mirrored(n)
        out = s.run(lambda: ctx().all_reduce(op, np.float64(rid() + 1)))
        assert [float(v) for v in local(s, out)] == [(n + 1) / 2] * n

    def test_two_replica_literal(self):
        """2.5 example (N=2): SUM -> [3, 3]; MEAN -> [1.5, 1.5]."""
        s = mirrored(2)
        out = s.run(lambda: (ctx().all_reduce("SUM", np.float64(rid() + 1)),
                             ctx().all_reduce("MEAN", np.float64(rid() + 1))))
        assert [float(v) for v in local(s, out[0])] == [3.0, 3.0]
        assert [float(v) for v in local(s, out[1])] == [1.5, 1.5]

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_result_seen_inside_each_replica(self, n):
        """2.5: every replica receives the reduced value (element-wise over arrays)."""
        s = mirrored(n)
        rec = _Recorder()

        def fn():
            r = int(rid())
            out = ctx().all_reduce("SUM", np.array([r + 1.0, 10.0 * (r + 1)]))
            rec.put(r, np.asarray(out).copy())

        s.run(fn)
        t = n * (n + 1) / 2
        assert sorted(rec.seen) == list(range(n))
        for r in range(n):
            np.testing.assert_array_equal(rec.seen[r], [t, 10 * t])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_nested_structure(self, n):
        """2.5 example: {"a": x, "b": [10x, 100x]} SUM -> {"a": T, "b": [10T, 100T]} on every replica."""
        s = mirrored(n)
        rec = _Recorder()

        def fn():
            x = np.float64(rid() + 1)
            out = ctx().all_reduce("SUM", {"a": x, "b": [10 * x, 100 * x]})
            rec.put(int(rid()), out)
            return out

        out = s.run(fn)
        t = n * (n + 1) / 2
        for r in range(n):
            got = rec.seen[r]
            assert type(got) is dict and set(got) == {"a", "b"}
            assert isinstance(got["b"], list) and len(got["b"]) == 2
            assert float(got["a"]) == t
            assert [float(v) for v in got["b"]] == [10 * t, 100 * t]
        assert [float(v) for v in local(s, out["a"])] == [t] * n

    def test_nested_two_replica_literal(self):
        """2.5 literal (N=2): {"a": 3, "b": [30, 300]}."""
        s = mirrored(2)

        def fn():
            x = np.float64(rid() + 1)
            return ctx().all_reduce("SUM", {"a": x, "b": [10 * x, 100 * x]})

        out = s.run(fn)
        for comp in s.experimental_local_results(out):
            assert float(comp["a"]) == 3.0
            assert [float(v) for v in comp["b"]] == [30.0, 300.0]

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_int_mean_float64(self, n):
        """2.5: int32 MEAN of rid+1 -> float64 (N+1)/2 (1.5 for N=2)."""
        s = mirrored(n)
        out = s.run(lambda: ctx().all_reduce("MEAN", np.int32(rid() + 1)))
        vals = local(s, out)
        assert all(v.dtype == np.float64 for v in vals)
        assert [float(v) for v in vals] == [(n + 1) / 2] * n

    def test_int_sum_keeps_dtype(self):
        """2.5 / 2.3: int32 SUM keeps int32 (3 for N=2)."""
        s = mirrored(2)
        out = s.run(lambda: ctx().all_reduce("SUM", np.int32(rid() + 1)))
        vals = local(s, out)
        assert all(v.dtype == np.int32 for v in vals)
        assert [int(v) for v in vals] == [3, 3]

    def test_unknown_op(self):
        """2.5 / 2.3: an unknown op string -> ValueError "'MAX' is not a valid ReduceOp"."""
        s = mirrored(2)
        with pytest.raises(ValueError, match="'MAX' is not a valid ReduceOp"):
            s.run(lambda: ctx().all_reduce("max", np.float64(rid())))

    def test_default_replica_context_identity(self):
        """2.5: default replica context: all_reduce("SUM", 3.) -> 3.0 (identity)."""
        assert float(ctx().all_reduce("SUM", 3.0)) == 3.0
        assert float(ctx().all_reduce("MEAN", 3.0)) == 3.0
        out = ctx().all_reduce("SUM", {"a": np.array([1.0, 2.0])})
        np.testing.assert_array_equal(out["a"], [1.0, 2.0])

    def test_one_device_identity(self):
        """9.8: OneDevice all_reduce is the identity."""
        s = mpidist.OneDeviceStrategy("/cpu:0")
        out = s.run(lambda: ctx().all_reduce("SUM", np.array([3.0, 4.0])))
        np.testing.assert_array_equal(out, [3.0, 4.0])


# ---------------------------------------------------------------------------------------
# 2.6 ReplicaContext.all_gather
# ---------------------------------------------------------------------------------------


class TestAllGather:
    def test_unequal_leading_dims_literal(self):
        """2.6 example (N=2): fill([1+r, 2], r) axis 0 -> [[0,0],[1,1],[1,1]] on both."""
        s = mirrored(2)
        out = s.run(lambda: ctx().all_gather(np.full((1 + int(rid()), 2), int(rid())), axis=0))
        vals = local(s, out)
        assert len(vals) == 2
        for v in vals:
            np.testing.assert_array_equal(v, [[0, 0], [1, 1], [1, 1]])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_unequal_leading_dims(self, n):
        """2.6: sizes along axis may differ; concatenation in replica order on every replica."""
        s = mirrored(n)
        rec = _Recorder()

        def fn():
            r = int(rid())
            out = ctx().all_gather(np.full((1 + r, 2), r), axis=0)
            rec.put(r, np.asarray(out).copy())

        s.run(fn)
        expected = np.concatenate([np.full((1 + r, 2), r) for r in range(n)])
        assert expected.shape == (n * (n + 1) // 2, 2)
        assert sorted(rec.seen) == list(range(n))
        for r in range(n):
            np.testing.assert_array_equal(rec.seen[r], expected)

    @pytest.mark.parametrize("n", [2, 3])
    def test_nested(self, n):
        """2.6 example: [[1,2,3], [[1,2],[3,4]]] -> each leaf concatenated N times."""
        s = mirrored(n)
        rec = _Recorder()

        def fn():
            out = ctx().all_gather([np.array([1, 2, 3]), np.array([[1, 2], [3, 4]])], axis=0)
            rec.put(int(rid()), out)

        s.run(fn)
        for r in range(n):
            got = rec.seen[r]
            assert isinstance(got, list) and len(got) == 2
            np.testing.assert_array_equal(got[0], [1, 2, 3] * n)
            np.testing.assert_array_equal(got[1], [[1, 2], [3, 4]] * n)

    def test_nested_two_replica_literal(self):
        """2.6 literal (N=2): [[1,2,3,1,2,3], [[1,2],[3,4],[1,2],[3,4]]]."""
        s = mirrored(2)
        out = s.run(lambda: ctx().all_gather([np.array([1, 2, 3]), np.array([[1, 2], [3, 4]])], axis=0))
        for comp in s.experimental_local_results(out):
            np.testing.assert_array_equal(comp[0], [1, 2, 3, 1, 2, 3])
            np.testing.assert_array_equal(comp[1], [[1, 2], [3, 4], [1, 2], [3, 4]])

    def test_axis1_literal(self):
        """2.6 example (N=2): reshape(range(4),(2,2)) + 10r, axis 1 -> [[0,1,10,11],[2,3,12,13]]."""
        s = mirrored(2)
        out = s.run(lambda: ctx().all_gather(np.arange(4).reshape(2, 2) + 10 * int(rid()), axis=1))
        vals = local(s, out)
        assert len(vals) == 2
        for v in vals:
            np.testing.assert_array_equal(v, [[0, 1, 10, 11], [2, 3, 12, 13]])

    @pytest.mark.parametrize("n", REPLICAS)
    @pytest.mark.parametrize("axis", [1, -1])
    def test_axis1(self, n, axis):
        """2.6: axis 1 concatenation in replica order for N replicas."""
        s = mirrored(n)
        out = s.run(lambda: ctx().all_gather(np.arange(4).reshape(2, 2) + 10 * int(rid()), axis=axis))
        expected = np.concatenate([np.arange(4).reshape(2, 2) + 10 * r for r in range(n)], axis=1)
        vals = local(s, out)
        assert len(vals) == n
        for v in vals:
            assert v.shape == (2, 2 * n)
            np.testing.assert_array_equal(v, expected)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_scalars_fail(self, n):
        """2.6: scalar leaves -> ValueError."""
        s = mirrored(n)
        with pytest.raises(ValueError, match=r"(?i)scalar|rank"):
            s.run(lambda: ctx().all_gather(np.float64(rid()), axis=0))

    def test_one_device_identity(self):
        """9.8: OneDevice all_gather is the identity."""
        s = mpidist.OneDeviceStrategy("/cpu:0")
        out = s.run(lambda: ctx().all_gather(np.array([3.0, 4.0]), axis=0))
        np.testing.assert_array_equal(out, [3.0, 4.0])


# ---------------------------------------------------------------------------------------
# 2.7 ReplicaContext.merge_call
# ---------------------------------------------------------------------------------------


class TestMergeCallArguments:
    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_regrouping(self, n):
        """2.7 example: args=(rid+1.,), kwargs={"b": 5. (distinct), "c": 3} ->
        a=PerReplica([1..N]), b=PerReplica([5]*N), c=3; merge_fn runs once in cross-replica context."""
        s = mirrored(n)
        calls = []

        def merge_fn(strategy, a, b=None, c=None):
            calls.append(dict(strategy=strategy, a=a, b=b, c=c,
                              cross=mpidist.in_cross_replica_context(),
                              rc=mpidist.get_replica_context(),
                              current=mpidist.get_strategy(),
                              thread=threading.current_thread()))

        def fn():
            ctx().merge_call(merge_fn, args=(np.float64(rid() + 1.0),),
                             kwargs={"b": np.float64(5.0), "c": 3})

        s.run(fn)
        assert len(calls) == 1
        call = calls[0]
        assert call["strategy"] is s and call["current"] is s
        assert call["cross"] is True and call["rc"] is None
        assert isinstance(call["a"], mpidist.PerReplica)
        assert [float(v) for v in call["a"].values] == [float(i + 1) for i in range(n)]
        assert isinstance(call["b"], mpidist.PerReplica)
        assert [float(v) for v in call["b"].values] == [5.0] * n
        assert call["c"] == 3 and not isinstance(call["c"], mpidist.DistributedValues)
        assert call["thread"] is threading.main_thread()

    def test_single_replica_plain_values(self):
        """2.7: with one replica every argument is the identical object -> plain value."""
        s = mirrored(1)
        calls = []

        def fn():
            ctx().merge_call(lambda strategy, a: calls.append((strategy, a)), args=(np.float64(4.0),))

        s.run(fn)
        assert len(calls) == 1
        strategy, a = calls[0]
        assert strategy is s
        assert not isinstance(a, mpidist.DistributedValues)
        assert float(a) == 4.0

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_nested_arguments(self, n):
        """2.7: nested args/kwargs are regrouped leaf-wise (same rule as run's return)."""
        s = mirrored(n)
        shared = np.array([1.0])
        calls = []

        def fn():
            r = np.float64(rid())
            ctx().merge_call(lambda strategy, pair, kw=None: calls.append((pair, kw)),
                             args=([r, shared],), kwargs={"kw": {"x": 2 * r, "s": shared}})

        s.run(fn)
        pair, kw = calls[0]
        assert isinstance(pair, list) and len(pair) == 2
        assert [float(v) for v in pair[0].values] == [float(i) for i in range(n)]
        assert pair[1] is shared
        assert type(kw) is dict
        assert [float(v) for v in kw["x"].values] == [2.0 * i for i in range(n)]
        assert kw["s"] is shared


class TestMergeCallReturn:
    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_select_replica(self, n):
        """2.7 example: merge_fn returns (sum, a, 7, [a, b]) -> replica i gets (sum, a_i, 7, [a_i, b_i]);
        after run: sum unwrapped, a -> PerReplica."""
        s = mirrored(n)
        rec = _Recorder()
        t = n * (n + 1) / 2

        def merge_fn(strategy, a, b):
            total = strategy.reduce("SUM", a, axis=None)
            return (total, a, 7, [a, b])

        def fn():
            r = int(rid())
            got = ctx().merge_call(merge_fn, args=(np.float64(r + 1.0), np.float64(100.0 + r)))
            rec.put(r, got)
            return got

        out = s.run(fn)
        for r in range(n):
            total, a_r, seven, (a_r2, b_r) = rec.seen[r]
            assert not isinstance(total, mpidist.DistributedValues) and float(total) == t
            assert not isinstance(a_r, mpidist.DistributedValues) and float(a_r) == r + 1.0
            assert seven == 7
            assert float(a_r2) == r + 1.0 and float(b_r) == 100.0 + r
        # the same total object went to every replica
        assert all(rec.seen[r][0] is rec.seen[0][0] for r in range(n))
        assert isinstance(out, tuple) and len(out) == 4
        assert not isinstance(out[0], mpidist.DistributedValues) and float(out[0]) == t
        assert isinstance(out[1], mpidist.PerReplica)
        assert [float(v) for v in local(s, out[1])] == [i + 1.0 for i in range(n)]
        assert out[2] == 7
        assert isinstance(out[3], list)
        assert [float(v) for v in local(s, out[3][1])] == [100.0 + i for i in range(n)]

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_reduce_to_mirrored_gives_component(self, n):
        """2.7: returning extended.reduce_to("SUM", a, a) (Mirrored) gives each replica its component."""
        s = mirrored(n)
        rec = _Recorder()

        def fn():
            got = ctx().merge_call(lambda strategy, a: strategy.extended.reduce_to("SUM", a, a),
                                   args=(np.float64(rid() + 1.0),))
            rec.put(int(rid()), got)
            return got

        out = s.run(fn)
        t = n * (n + 1) / 2
        for r in range(n):
            assert not isinstance(rec.seen[r], mpidist.DistributedValues)
            assert float(rec.seen[r]) == t
        assert [float(v) for v in local(s, out)] == [t] * n

    def test_reduce_to_two_replica_literal(self):
        """2.7 literal (N=2): 3.0 on each replica."""
        s = mirrored(2)
        out = s.run(lambda: ctx().merge_call(lambda st, a: st.extended.reduce_to("SUM", a, a),
                                             args=(np.float64(rid() + 1.0),)))
        assert [float(v) for v in local(s, out)] == [3.0, 3.0]

    @pytest.mark.parametrize("n", REPLICAS)
    def test_several_merge_calls(self, n):
        """2.7: replicas may make several merge_calls, each running merge_fn once."""
        s = mirrored(n)
        count = []

        def merge_fn(strategy, a):
            count.append(1)
            return strategy.extended.reduce_to("SUM", a, a) if n > 1 else a

        def fn():
            x = ctx().merge_call(merge_fn, args=(np.float64(rid() + 1.0),))
            return ctx().merge_call(merge_fn, args=(np.float64(x) * (rid() + 1),))

        out = s.run(fn)
        t = n * (n + 1) / 2
        assert len(count) == 2
        assert [float(v) for v in local(s, out)] == [t * t] * n


class TestMergeCallErrors:
    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_only_first_replica_calls(self, n):
        """2.7: different numbers of merge_calls -> RuntimeError."""
        s = mirrored(n)

        def fn():
            if rid() == 0:
                ctx().merge_call(lambda strategy: None)
            return np.float64(rid())

        with pytest.raises(RuntimeError, match=r"Some replicas made a different number of "
                                               r"replica_context\(\)\.merge_call\(\) calls"):
            s.run(fn)

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_last_replica_calls_twice(self, n):
        """2.7: one replica making an extra merge_call -> RuntimeError."""
        s = mirrored(n)

        def fn():
            ctx().merge_call(lambda strategy: None)
            if rid() == n - 1:
                ctx().merge_call(lambda strategy: None)

        with pytest.raises(RuntimeError, match="Some replicas made a different number"):
            s.run(fn)

    @pytest.mark.parametrize("n", REPLICAS)
    def test_replica_exception_propagates(self, n):
        """2.7: an exception raised in a replica fn propagates out of run with its own type."""
        s = mirrored(n)

        def fn():
            if rid() == n - 1:
                raise _Boom("replica failed")
            return np.float64(rid())

        with pytest.raises(_Boom, match="replica failed"):
            s.run(fn)
        with pytest.raises(KeyError, match="missing"):
            s.run(lambda: {}["missing"])

    @pytest.mark.parametrize("n", REPLICAS)
    def test_merge_fn_exception_propagates(self, n):
        """2.7: an exception raised in merge_fn propagates out of run with its own type."""
        s = mirrored(n)

        def merge_fn(strategy):
            raise _Boom("merge failed")

        with pytest.raises(_Boom, match="merge failed"):
            s.run(lambda: ctx().merge_call(merge_fn))

    @pytest.mark.parametrize("n", [2, 3, 4])
    def test_exception_while_others_wait_in_merge_call(self, n):
        """2.7: a replica failing while the others wait in merge_call raises the original error."""
        s = mirrored(n)

        def fn():
            if rid() == n - 1:
                raise _Boom("late replica failed")
            ctx().merge_call(lambda strategy: None)

        with pytest.raises(_Boom, match="late replica failed"):
            s.run(fn)

    @pytest.mark.parametrize("n", [2, 3])
    def test_strategy_usable_after_errors(self, n):
        """2.7: after a failed run the next run works normally."""
        s = mirrored(n)
        with pytest.raises(_Boom):
            s.run(lambda: ctx().merge_call(lambda st: (_ for _ in ()).throw(_Boom("x"))))
        out = s.run(lambda: ctx().all_reduce("SUM", np.float64(rid() + 1)))
        assert [float(v) for v in local(s, out)] == [n * (n + 1) / 2] * n


class TestMergeCallDefault:
    def test_default_replica_context(self):
        """2.7: default replica context: merge_fn(default_strategy, *args, **kwargs) in cross-replica mode."""
        default = mpidist.get_strategy()
        seen = []

        def merge_fn(strategy, x, y=0):
            seen.append((strategy, mpidist.in_cross_replica_context(), mpidist.get_replica_context(),
                         mpidist.get_strategy(), mpidist.has_strategy()))
            return x + y

        assert ctx().merge_call(merge_fn, args=(np.float64(1.0),), kwargs={"y": np.float64(2.0)}) == 3.0
        assert len(seen) == 1
        strategy, cross, rc, current, has = seen[0]
        assert strategy is default and current is default
        assert cross is True and rc is None and has is False
        # back in the default replica context afterwards
        assert mpidist.get_replica_context() is not None
        assert mpidist.in_cross_replica_context() is False


# ---------------------------------------------------------------------------------------
# 5.8 strategy.extended.call_for_each_replica
# ---------------------------------------------------------------------------------------


class TestCallForEachReplica:
    @pytest.mark.parametrize("n", REPLICAS)
    def test_replica_ids(self, n):
        """5.8: call_for_each_replica(lambda: rid()) -> PerReplica [0, ..., N-1]."""
        s = mirrored(n)
        out = s.extended.call_for_each_replica(lambda: rid())
        if n > 1:
            assert isinstance(out, mpidist.PerReplica)
        assert [int(v) for v in local(s, out)] == list(range(n))

    def test_two_replica_literal(self):
        """5.8 literal (N=2): PerReplica [0, 1]."""
        s = mirrored(2)
        out = s.extended.call_for_each_replica(lambda: rid())
        assert isinstance(out, mpidist.PerReplica)
        assert [int(v) for v in out.values] == [0, 1]

    @pytest.mark.parametrize("n", REPLICAS)
    def test_unwraps_and_regroups_like_run(self, n):
        """5.8: same as run: args/kwargs unwrapped per replica, results regrouped."""
        s = mirrored(n)
        x = mpidist.PerReplica([np.float64(i + 1) for i in range(n)])
        c = np.array(9.0)
        out = s.extended.call_for_each_replica(lambda a, k=None: (a * 10 + k, c), args=(x,),
                                               kwargs={"k": x})
        assert out[1] is c
        assert [float(v) for v in local(s, out[0])] == [11.0 * (i + 1) for i in range(n)]

    def test_collectives_inside(self):
        """5.8: replica fns run in replica context, so all_reduce works inside."""
        s = mirrored(3)
        out = s.extended.call_for_each_replica(lambda: ctx().all_reduce("SUM", np.float64(rid() + 1)))
        assert [float(v) for v in local(s, out)] == [6.0, 6.0, 6.0]

    def test_no_args_type_check(self):
        """5.8: no positional-args type check (run would raise ValueError for a non list/tuple)."""
        s = mirrored(2)
        with pytest.raises(ValueError, match="positional args must be a list or tuple"):
            s.run(lambda a, b: a + b, args=np.array([1.0, 2.0]))
        out = s.extended.call_for_each_replica(lambda a, b: a + b, args=np.array([1.0, 2.0]))
        assert [float(v) for v in local(s, out)] == [3.0, 3.0]

    def test_replica_context_runtime_error(self):
        """5.8: must be cross-replica or default context -> RuntimeError inside a replica fn."""
        s = mirrored(2)
        with pytest.raises(RuntimeError, match="Method requires being in cross-replica context"):
            s.run(lambda: s.extended.call_for_each_replica(lambda: 1))

    def test_default_strategy(self):
        """5.8: default strategy runs fn once in a ReplicaContext with id 0."""
        default = mpidist.get_strategy()
        calls = []

        def fn(a, b=None):
            c = ctx()
            calls.append((c, int(c.replica_id_in_sync_group), c.num_replicas_in_sync,
                          mpidist.get_strategy(), mpidist.in_cross_replica_context()))
            return a + b

        out = default.extended.call_for_each_replica(fn, args=(np.float64(1.0),),
                                                     kwargs={"b": np.float64(2.0)})
        assert not isinstance(out, mpidist.DistributedValues) and out == 3.0
        assert len(calls) == 1
        c, r, n, current, cross = calls[0]
        assert isinstance(c, mpidist.ReplicaContext)
        assert (r, n, cross) == (0, 1, False)
        assert current is default

    def test_default_run_replica_id_is_int32(self):
        """1.2 / 5.8: inside default.run a plain ReplicaContext with id int32 0; top level gives int 0."""
        default = mpidist.get_strategy()
        rid_in_run = default.run(lambda: ctx().replica_id_in_sync_group)
        assert isinstance(rid_in_run, np.int32) and rid_in_run == 0
        top = ctx().replica_id_in_sync_group
        assert type(top) is int and top == 0
