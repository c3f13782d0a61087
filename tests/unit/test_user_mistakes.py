"""The corpus of single-process user mistakes (issue 14): each must end in a clear error of the
type TensorFlow raises (or the documented mpidist one) that names the offending value and says
the fix, raised before anything changes (variables on every replica, slots, iterations, metric
state). Run under the default strategy, OneDevice and Mirrored with 2 and 4 CPU replicas.

Each case is ``(id, strategies, action(world), error type, message regex)``; ``test_mistake``
runs one case on one strategy; the scenario tests/scenarios/test_user_mistakes_sweep.py runs
them all again in one test and checks that no AttributeError / KeyError / IndexError /
unpacking error escapes.
"""

import collections

import numpy as np
import pytest

import mpidist
from user_mistakes_world import ALL, DISTRIBUTED, STRATEGIES_ONLY, World, assert_same
from user_mistakes_cases_more import MORE_CASES

Case = collections.namedtuple("Case", "id kinds action error match")

rc = mpidist.get_replica_context


def _other_strategy_var(w):
    other = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]) if w.kind != "mirrored2" else \
        mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    with other.scope():
        return mpidist.Variable(np.zeros(3), name="foreign")


def _stale_context(w):
    """A replica context kept after its ``run`` ended."""
    return w.s.experimental_local_results(w.s.run(lambda: rc()))[0]


def _nested_scopes(w):
    other = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    with w.s.scope():
        with other.scope():
            pass


CASES = [
    # -- reductions of non-numbers: never a silent OR or a string ---------------------------
    Case("reduce_sum_bool", ALL, lambda w: w.s.reduce("SUM", w.bools), TypeError,
         r"Strategy.reduce cannot reduce a value of dtype bool with ReduceOp.SUM.*astype\(np.int32\)"),
    Case("reduce_mean_bool", ALL, lambda w: w.s.reduce("MEAN", w.bools), TypeError,
         r"dtype bool with ReduceOp.MEAN.*Cast it first"),
    Case("reduce_sum_bool_axis", ALL, lambda w: w.s.reduce("SUM", w.bools, axis=0), TypeError,
         r"dtype bool with ReduceOp.SUM"),
    Case("reduce_sum_strings", ALL,
         lambda w: w.s.reduce("SUM", w.s.run(lambda: np.array(["a", "b"]))), TypeError,
         r"dtype <U1 .*only numbers"),
    Case("reduce_mean_strings_axis", ALL,
         lambda w: w.s.reduce("MEAN", w.s.run(lambda: np.array(["a"])), axis=0), TypeError,
         r"dtype <U1 with ReduceOp.MEAN"),
    Case("reduce_python_string", ALL, lambda w: w.s.reduce("SUM", "abc"), TypeError,
         r"Got 'abc'.*Cast it first"),
    Case("reduce_none", ALL, lambda w: w.s.reduce("SUM", None), TypeError,
         r"cannot reduce None with ReduceOp.SUM"),
    Case("reduce_objects", ALL,
         lambda w: w.s.reduce("SUM", w.s.run(lambda: np.array([object()]))), TypeError,
         r"dtype object"),
    Case("reduce_python_bool", ALL, lambda w: w.s.reduce("MEAN", True), TypeError,
         r"dtype bool.*Got True"),
    Case("reduce_to_bool", ALL, lambda w: w.s.extended.reduce_to("SUM", w.bools, "/cpu:0"),
         TypeError, r"reduce_to cannot reduce a value of dtype bool with ReduceOp.SUM"),
    Case("batch_reduce_to_bool", ALL,
         lambda w: w.s.extended.batch_reduce_to("SUM", [(w.floats, "/cpu:0"), (w.bools, "/cpu:0")]),
         TypeError, r"batch_reduce_to cannot reduce a value of dtype bool"),
    Case("all_reduce_bool", ALL,
         lambda w: w.s.run(lambda: rc().all_reduce("SUM", np.array([True]))), TypeError,
         r"ReplicaContext.all_reduce cannot reduce a value of dtype bool"),
    Case("all_reduce_nested_string", ALL,
         lambda w: w.s.run(lambda: rc().all_reduce("MEAN", {"a": 1.0, "b": "x"})), TypeError,
         r"ReplicaContext.all_reduce cannot reduce a value of dtype <U1.*Got 'x'"),
    Case("cross_device_ops_reduce_bool", DISTRIBUTED,
         lambda w: mpidist.ReductionToOneDevice().reduce("SUM", w.bools, "/cpu:0"), TypeError,
         r"CrossDeviceOps.reduce cannot reduce a value of dtype bool"),
    Case("cross_device_ops_batch_reduce_str", DISTRIBUTED,
         lambda w: mpidist.ReductionToOneDevice().batch_reduce(
             "SUM", [(mpidist.PerReplica(["a", "b"]), "/cpu:0")]), TypeError,
         r"CrossDeviceOps.batch_reduce cannot reduce a value of dtype <U1"),
    # -- reduce: op and axis --------------------------------------------------------------
    Case("reduce_op_max", ALL, lambda w: w.s.reduce("MAX", w.floats), ValueError,
         r"'MAX' is not a valid ReduceOp; use one of \['SUM', 'MEAN'\]"),
    Case("reduce_op_int", ALL, lambda w: w.s.reduce(3, w.floats), TypeError,
         r"Expected `reduce_op` to be a `mpidist.ReduceOp` or a string, not: 3"),
    Case("reduce_op_aggregation", ALL,
         lambda w: w.s.extended.reduce_to(mpidist.VariableAggregation.SUM, w.floats, "/cpu:0"),
         AssertionError, r"takes a ReduceOp, not VariableAggregation.SUM; convert it"),
    Case("reduce_axis_list", ALL, lambda w: w.s.reduce("SUM", w.floats, axis=[0]), TypeError,
         r"not the list \[0\]: pass axis=\(0,\)"),
    Case("reduce_axis_string", ALL, lambda w: w.s.reduce("SUM", w.floats, axis="0"), TypeError,
         r"Expected `axis` to be an integer or a tuple of integers, not: '0'"),
    Case("reduce_axis_float", ALL, lambda w: w.s.reduce("MEAN", w.floats, axis=0.0), TypeError,
         r"not: 0.0"),
    Case("reduce_axis_bool", ALL, lambda w: w.s.reduce("SUM", w.floats, axis=True), TypeError,
         r"not: True"),
    Case("reduce_axis_out_of_range", ALL, lambda w: w.s.reduce("SUM", w.floats, axis=2),
         ValueError, r"Invalid reduction dimension 2 for input with 1 dimensions: axis must be in \[-1, 1\)"),
    Case("reduce_axis_of_scalar", ALL,
         lambda w: w.s.reduce("MEAN", w.s.run(lambda: np.float64(1.0)), axis=0), ValueError,
         r"Invalid reduction dimension 0 for input with 0 dimensions"),
    Case("reduce_in_replica_context", STRATEGIES_ONLY,
         lambda w: w.s.run(lambda: w.s.reduce("SUM", 1.0)), RuntimeError,
         r"requires being in cross-replica context, use get_replica_context\(\).merge_call\(\)"),
    Case("reduce_sum_mirrored_variable", DISTRIBUTED,
         lambda w: w.s.extended.reduce_to("SUM", w.v, "/cpu:0"), AssertionError,
         r"Cannot reduce a MirroredVariable with SUM.*Use MEAN"),
    Case("reduce_sum_plain_value_n_replicas", DISTRIBUTED, lambda w: w.s.reduce("SUM", 2.0),
         ValueError, r"A non-DistributedValues value 2.0 cannot be reduced.*ReduceOp.MEAN"),
    Case("reduce_perreplica_wrong_count", DISTRIBUTED,
         lambda w: w.s.reduce("SUM", mpidist.PerReplica([1.0] * (w.n + 1))), ValueError,
         r"with \d components was passed to a strategy with \d local replicas"),
    # -- reduce_to / batch_reduce_to destinations and pairs ---------------------------------
    Case("reduce_to_destination_int", ALL, lambda w: w.s.extended.reduce_to("SUM", w.floats, 5),
         ValueError, r"destinations must be one of .* got int 5"),
    Case("reduce_to_destination_empty", ALL,
         lambda w: w.s.extended.reduce_to("SUM", w.floats, " "), ValueError,
         r"destinations can not be empty: pass a device string such as '/cpu:0'"),
    Case("reduce_to_destination_list", ALL,
         lambda w: w.s.extended.reduce_to("SUM", w.floats, ["/cpu:0"]), AssertionError,
         r"destinations must be a single .* not a list"),
    Case("reduce_to_destination_bad_device", ALL,
         lambda w: w.s.extended.reduce_to("SUM", w.floats, "/tpu:0"), ValueError,
         r"Cannot parse device string '/tpu:0'.*such as '/cpu:0'"),
    Case("batch_reduce_to_not_a_list", ALL, lambda w: w.s.extended.batch_reduce_to("SUM", 5),
         TypeError, r"value_destination_pairs must be a list of \(value, destinations\) tuples, got int 5"),
    Case("batch_reduce_to_list_pair", ALL,
         lambda w: w.s.extended.batch_reduce_to("SUM", [[w.floats, "/cpu:0"]]), ValueError,
         r"should be a tuple \(value, destinations\); got list"),
    Case("batch_reduce_to_triple", ALL,
         lambda w: w.s.extended.batch_reduce_to("SUM", [(w.floats, "/cpu:0", 1)]), ValueError,
         r"should be a tuple of size 2; got a tuple of size 3"),
    Case("batch_reduce_to_list_destination", ALL,
         lambda w: w.s.extended.batch_reduce_to("SUM", [(w.floats, ["/cpu:0"])]), AssertionError,
         r"not a list"),
    Case("broadcast_to_none", STRATEGIES_ONLY, lambda w: w.s.extended.broadcast_to(1.0, None),
         AssertionError, r"broadcast_to needs destinations"),
    # -- run / merge_call / update ---------------------------------------------------------
    Case("run_not_callable", ALL, lambda w: w.s.run(5), TypeError,
         r"Strategy.run: `fn` must be a callable .* got int 5; pass the function itself"),
    Case("run_result_not_function", ALL, lambda w: w.s.run(w.v.assign(w.v)), TypeError,
         r"`fn` must be a callable"),
    Case("run_args_not_tuple", ALL, lambda w: w.s.run(lambda a: a, args=5), ValueError,
         r"positional args must be a list or tuple, got <class 'int'>"),
    Case("run_kwargs_list", ALL, lambda w: w.s.run(lambda: 1, kwargs=[1]), ValueError,
         r"kwargs must be a dict, got <class 'list'>"),
    Case("run_kwargs_int_keys", ALL, lambda w: w.s.run(lambda **k: 1, kwargs={1: 2}), TypeError,
         r"kwargs keys must be argument names \(strings\), got 1; pass positional values in `args`"),
    Case("run_inside_other_strategy_run", STRATEGIES_ONLY,
         lambda w: w.s.run(lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).run(lambda: 1)),
         RuntimeError, r"Mixing different mpidist.Strategy objects"),
    Case("nested_scopes_of_two_strategies", STRATEGIES_ONLY, _nested_scopes, RuntimeError,
         r"Mixing different mpidist.Strategy objects: .* is not "),
    Case("merge_fn_not_callable", ALL, lambda w: w.s.run(lambda: rc().merge_call(5)), TypeError,
         r"merge_call: `merge_fn` must be a callable taking \(strategy, \*args, \*\*kwargs\), got int 5"),
    Case("merge_call_args_int", ALL,
         lambda w: w.s.run(lambda: rc().merge_call(lambda s, *a: 1, args=5)), ValueError,
         r"merge_call: positional args must be a list or tuple, got <class 'int'>; e.g. args=\(value,\)"),
    Case("merge_call_kwargs_list", ALL,
         lambda w: w.s.run(lambda: rc().merge_call(lambda s: 1, kwargs=[1])), ValueError,
         r"merge_call: kwargs must be a dict, got <class 'list'>"),
    Case("merge_call_outside_run", STRATEGIES_ONLY, lambda w: _stale_context(w).merge_call(lambda s: 1),
         RuntimeError, r"Mismatching mpidist.Strategy objects: .*_DefaultDistributionStrategy.* is not "),
    Case("update_fn_not_callable", ALL, lambda w: w.s.extended.update(w.v, 5), TypeError,
         r"StrategyExtended.update: `fn` must be a callable .* got int 5"),
    Case("update_kwargs_list", ALL, lambda w: w.s.extended.update(w.v, lambda c: c, kwargs=[1]),
         ValueError, r"kwargs must be a dict, got <class 'list'>"),
    Case("update_non_slot_fn_not_callable", ALL,
         lambda w: w.s.extended.update_non_slot(w.v, "fn"), TypeError,
         r"update_non_slot: `fn` must be a callable .* got str 'fn'"),
    Case("update_non_slot_in_replica_context", STRATEGIES_ONLY,
         lambda w: w.s.run(lambda: w.s.extended.update_non_slot(w.v, lambda: 1)), RuntimeError,
         r"requires being in cross-replica context"),
    Case("call_for_each_replica_not_callable", ALL,
         lambda w: w.s.extended.call_for_each_replica(None), TypeError,
         r"call_for_each_replica: `fn` must be a callable .* got NoneType None"),
] + MORE_CASES

_BY_ID = {c.id: c for c in CASES}
assert len(_BY_ID) == len(CASES), "case ids must be unique"
PARAMS = [pytest.param(c.id, kind, id=f"{c.id}-{kind}") for c in CASES for kind in c.kinds]


def test_corpus_size():
    """Issue 14 asks for at least 80 distinct mistakes."""
    assert len(CASES) >= 80


@pytest.mark.parametrize("case_id,kind", PARAMS)
def test_mistake(case_id, kind):
    case = _BY_ID[case_id]
    world = World(kind)
    before = world.snapshot()
    with pytest.raises(case.error, match=case.match) as info:
        case.action(world)
    assert type(info.value) not in (AttributeError, KeyError, IndexError)
    assert_same(before, world.snapshot())
    assert not mpidist.has_strategy()


@pytest.mark.parametrize("kind", ALL)
def test_world_numbers(kind):
    """The world the mistakes run against: one SGD(0.1, momentum 0.9) step of summed
    gradients 0.5·N and 1·N, one metric update of [1, 3] per replica."""
    world = World(kind)
    n = world.n
    for c in world.s.experimental_local_results(world.v):
        np.testing.assert_allclose(np.asarray(c), [1 - 0.05 * n, 2 - 0.05 * n, 3 - 0.05 * n])
    for c in world.s.experimental_local_results(world.w):
        np.testing.assert_allclose(np.asarray(c), np.full((2, 2), 1 - 0.1 * n))
    assert int(np.asarray(world.opt.iterations)) == 1
    assert world.metric.result() == 2.0


@pytest.mark.parametrize("kind", ALL)
def test_bool_max_style_counting_works_after_cast(kind):
    """The fix the bool error suggests gives the count of True values over all replicas."""
    world = World(kind)
    counted = world.s.run(lambda: np.array([True, False, True]).astype(np.int32))
    assert int(world.s.reduce("SUM", counted, axis=0)) == 2 * world.n
