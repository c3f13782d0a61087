"""The lean ``strategy.run`` of one local replica (MirroredStrategy on one device,
OneDeviceStrategy, the default strategy): the function runs on the calling thread under a
fresh replica context, arguments are unwrapped and results regrouped exactly as before, and
the context stack is left as it was, also when the function raises.
"""

import re

import numpy as np
import pytest

import mpidist
from mpidist.core import state
from mpidist.values.containers import PerReplica


def one_device_strategies():
    return [mpidist.MirroredStrategy(["/cpu:0"]), mpidist.OneDeviceStrategy("/cpu:0")]


STRATEGIES = pytest.mark.parametrize("make", [
    lambda: mpidist.MirroredStrategy(["/cpu:0"]),
    lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    lambda: mpidist.get_strategy(),
], ids=["mirrored-1", "one-device", "default"])


@STRATEGIES
def test_plain_arguments_and_results_pass_unchanged(make):
    s = make()
    x = np.arange(4.0)
    seen = {}

    def fn(a, scale, *, name):
        seen["args"] = (a, scale, name)
        seen["ctx"] = mpidist.get_replica_context()
        seen["cross"] = mpidist.in_cross_replica_context()
        return a

    depth = state.thread_stack_depth()
    assert s.run(fn, args=(x, 2.0), kwargs={"name": "w"}) is x
    assert seen["args"][0] is x and seen["args"][1:] == (2.0, "w")
    assert seen["ctx"].strategy is s and seen["ctx"].num_replicas_in_sync == 1
    assert int(seen["ctx"].replica_id_in_sync_group) == 0
    assert seen["cross"] is False
    assert state.thread_stack_depth() == depth


@STRATEGIES
def test_each_run_gets_a_fresh_replica_context(make):
    s = make()
    first, second = s.run(mpidist.get_replica_context), s.run(mpidist.get_replica_context)
    assert first is not second  # so a kept context is stale in a later run


@pytest.mark.parametrize("make", [lambda: mpidist.MirroredStrategy(["/cpu:0"]),
                                  lambda: mpidist.OneDeviceStrategy("/cpu:0")],
                         ids=["mirrored-1", "one-device"])
def test_distributed_arguments_give_their_component(make):
    s = make()
    x = np.ones(3)
    per_replica = PerReplica([x])
    got = s.run(lambda a, b: (a, b["k"]), args=(per_replica,), kwargs={"b": {"k": per_replica}})
    assert got[0] is x and got[1] is x


def test_one_device_mirrored_refuses_per_replica_of_two():
    s = mpidist.MirroredStrategy(["/cpu:0"])
    two = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).run(lambda: np.ones(2))
    with pytest.raises(ValueError, match="with 2 components was passed to a strategy with 1 local"):
        s.run(lambda a: a, args=(two,))


def test_one_device_mirrored_regroups_structures_and_variables():
    s = mpidist.MirroredStrategy(["/cpu:0"])
    with s.scope():
        v = mpidist.Variable(np.zeros(2))
    x = np.ones(2)
    got = s.run(lambda: {"x": x, "pair": [x, 3], "v": v})
    assert got["x"] is x and got["pair"] == [x, 3] and got["v"] is v
    assert s.run(lambda: v.values[0] if hasattr(v, "values") else v) is v


@STRATEGIES
def test_context_stack_restored_when_fn_raises(make):
    s = make()
    depth = state.thread_stack_depth()
    with pytest.raises(ZeroDivisionError):
        s.run(lambda: 1 / 0)
    assert state.thread_stack_depth() == depth
    assert not mpidist.in_cross_replica_context() or s is mpidist.get_strategy()


def test_run_inside_own_scope_and_refused_elsewhere():
    s, other = mpidist.MirroredStrategy(["/cpu:0"]), mpidist.OneDeviceStrategy("/cpu:0")
    with s.scope():
        assert s.run(lambda: mpidist.get_strategy()) is s
        assert mpidist.in_cross_replica_context()
        with pytest.raises(RuntimeError, match="Mixing different mpidist.Strategy objects"):
            other.run(lambda: None)
    with pytest.raises(RuntimeError, match="Method requires being in cross-replica context"):
        s.run(lambda: s.run(lambda: None))


@pytest.mark.parametrize("value", [np.arange(3.0), [np.ones(2), np.ones(3)],
                                   (np.ones(2, np.int32),), {"a": np.ones(2)}],
                         ids=["array", "list", "tuple", "dict"])
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_all_reduce_with_one_replica_in_all_is_the_identity(value, op):
    for s in one_device_strategies():
        same = s.run(lambda: mpidist.get_replica_context().all_reduce(op, value) is value)
        assert same is True


def test_all_reduce_with_one_replica_still_checks_values():
    s = mpidist.OneDeviceStrategy("/cpu:0")
    with pytest.raises(TypeError, match="ReplicaContext.all_reduce cannot reduce a value of "
                                        "dtype bool"):
        s.run(lambda: mpidist.get_replica_context().all_reduce("SUM", np.ones(2, bool)))
    with pytest.raises(TypeError, match="ReplicaContext.all_reduce cannot reduce"):
        s.run(lambda: mpidist.get_replica_context().all_reduce("SUM", [np.ones(2),
                                                                       np.ones(2, bool)]))


@pytest.mark.parametrize("op", ["SUM", "sum", "Sum", "MEAN", "mean", mpidist.ReduceOp.MEAN])
def test_all_reduce_takes_every_spelling_of_the_op(op):
    s = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    got = s.run(lambda: mpidist.get_replica_context().all_reduce(op, np.full(2, 3.0)))
    want = 6.0 if str(getattr(op, "value", op)).upper() == "SUM" else 3.0
    for component in s.experimental_local_results(got):
        np.testing.assert_array_equal(component, np.full(2, want))


@pytest.mark.parametrize("op, error, message", [
    ("max", ValueError, "'MAX' is not a valid ReduceOp"),
    (["SUM"], TypeError, "Expected `reduce_op` to be a `mpidist.ReduceOp` or a string"),
    (mpidist.VariableAggregation.SUM, TypeError, "not: <VariableAggregation.SUM: 1>"),
], ids=["unknown-name", "list", "aggregation"])
def test_all_reduce_refuses_bad_ops_as_before(op, error, message):
    s = mpidist.OneDeviceStrategy("/cpu:0")
    with pytest.raises(error, match=re.escape(message)):
        s.run(lambda: mpidist.get_replica_context().all_reduce(op, np.ones(2)))
