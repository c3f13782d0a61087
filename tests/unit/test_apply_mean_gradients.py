"""``Optimizer.apply_mean_gradients`` (fit's update): the gradients and the loss totals summed in
one all-reduce, the gradients divided by the global example count. The fused path (the totals
in the head of the packed gradient buffer, the division in place) gives the bits of the
per-variable path, under every in-process strategy, dtype and optimizer; mistakes are errors
that leave the variables as they were."""

import numpy as np
import pytest

import mpidist

STRATEGIES = {
    "one_device": lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    "mirrored1": lambda: mpidist.MirroredStrategy(["/cpu:0"]),
    "mirrored2": lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    "default": mpidist.get_strategy,
}
OPTIMIZERS = {
    "sgd": lambda: mpidist.optimizers.SGD(0.1),
    "momentum": lambda: mpidist.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: mpidist.optimizers.Adam(0.01),
    "clipvalue": lambda: mpidist.optimizers.Adam(0.01, clipvalue=0.05),
    "clipnorm": lambda: mpidist.optimizers.SGD(0.1, clipnorm=0.3),
}
SHAPES = [(3, 4), (5,), (), (2, 2, 2)]


def _unfused(make_opt):
    """The per-variable path: a subclass that overrides _update_step is never fused."""
    def make():
        opt = make_opt()
        cls = type(opt)
        opt.__class__ = type("Unfused" + cls.__name__, (cls,),
                             {"_update_step": lambda self, *a: cls._update_step(self, *a)})
        return opt
    return make


def _train(strategy, make_opt, dtype, steps=4, totals_dtype=np.float64, grad_dtype=None):
    rng = np.random.default_rng(0)
    with strategy.scope():
        vs = [mpidist.Variable(rng.standard_normal(s).astype(dtype), name=f"v{i}")
              for i, s in enumerate(SHAPES)]
        opt = make_opt()
    replicas = strategy.num_replicas_in_sync
    grads = [[[rng.standard_normal(s).astype(grad_dtype or dtype) for s in SHAPES]
              for _ in range(replicas)] for _ in range(steps)]
    # Replicas hold different numbers of examples: the mean is over all of them.
    totals = [[np.array([rng.random() * 10, 3 + r + k], totals_dtype) for r in range(replicas)]
              for k in range(steps)]
    summed = []
    for k in range(steps):
        def step(k=k):
            r = mpidist.get_replica_context().replica_id_in_sync_group
            return opt.apply_mean_gradients(zip(grads[k][r], vs), totals[k][r])
        out = strategy.run(step)
        summed.append(np.asarray(strategy.experimental_local_results(out)[0]))
    expected_totals = [np.sum(t, axis=0) for t in totals]
    return [v.numpy() for v in vs], opt, summed, expected_totals


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fused_mean_gives_the_per_variable_bits(strategy, name, dtype):
    make = STRATEGIES[strategy]
    want, _, _, _ = _train(make(), _unfused(OPTIMIZERS[name]), dtype)
    got, opt, summed, expected = _train(make(), OPTIMIZERS[name], dtype)
    for a, b in zip(got, want):
        assert a.dtype == dtype and np.array_equal(a, b)
    for s, e in zip(summed, expected):
        np.testing.assert_allclose(s, e, rtol=1e-12)
    assert int(opt.iterations.numpy()) == 4
    if name != "clipnorm" and strategy != "mirrored2":  # one local replica: the fused path
        assert any(p is not None for p in opt._plans.values())


def test_the_mean_is_the_sum_over_the_global_count():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    with strategy.scope():
        v = mpidist.Variable(np.zeros(2), name="w")
        opt = mpidist.optimizers.SGD(1.0)

    def step():
        r = mpidist.get_replica_context().replica_id_in_sync_group
        # replica r holds r + 1 examples, each with gradient (1, r)
        return opt.apply_mean_gradients([(np.array([r + 1.0, r * (r + 1.0)]), v)],
                                        np.array([0.5 * (r + 1), r + 1.0]))

    out = strategy.run(step)
    # sum of gradients (6, 0 + 2 + 6) over 6 examples
    np.testing.assert_array_equal(v.numpy(), -np.array([1.0, 8 / 6]))
    np.testing.assert_array_equal(strategy.experimental_local_results(out)[0], [3.0, 6.0])


@pytest.mark.parametrize("strategy", ["one_device", "mirrored2"])
def test_float32_totals_ride_with_float32_gradients(strategy):
    got, _, summed, expected = _train(STRATEGIES[strategy](), OPTIMIZERS["adam"], np.float32,
                                      totals_dtype=np.float32)
    want, _, _, _ = _train(STRATEGIES[strategy](), _unfused(OPTIMIZERS["adam"]), np.float32,
                           totals_dtype=np.float32)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    for s, e in zip(summed, expected):
        np.testing.assert_allclose(s, e, rtol=1e-6)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("variables, gradients", [(np.float32, np.float64),
                                                  (np.float64, np.float32)])
def test_gradients_of_another_dtype_are_divided_in_their_own_dtype(strategy, variables,
                                                                  gradients):
    """The mean is taken in the gradients' dtype, then cast to the variable's, as the
    per-variable path does (dividing after a cast would round differently)."""
    make = STRATEGIES[strategy]
    got, _, _, _ = _train(make(), OPTIMIZERS["momentum"], variables, grad_dtype=gradients)
    want, _, _, _ = _train(make(), _unfused(OPTIMIZERS["momentum"]), variables,
                           grad_dtype=gradients)
    for a, b in zip(got, want):
        assert a.dtype == variables and np.array_equal(a, b)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("totals, error", [
    (np.array([1.0, 0.0]), "0 examples"),
    (np.array([1.0, np.nan]), "nan examples"),
    (np.array([1.0, 2.0, 3.0]), "2 real numbers"),
    (np.float64(4.0), "2 real numbers"),
    (np.array([1 + 2j, 2]), "2 real numbers"),
    (np.array([True, True]), "2 real numbers"),
    ("ab", "2 real numbers"),
    ([1.0, [2.0]], "2 real numbers"),
    ([1.0, 0], "0 examples"),
])
def test_bad_totals_are_errors_that_change_nothing(strategy, fused, totals, error):
    strat = STRATEGIES[strategy]()
    with strat.scope():
        v = mpidist.Variable(np.ones(3), name="w")
        make = OPTIMIZERS["momentum"] if fused else _unfused(OPTIMIZERS["momentum"])
        opt = make()
    ok = np.array([1.0, 2.0])
    strat.run(lambda: opt.apply_mean_gradients([(np.ones(3), v)], ok))  # slots exist, plan too
    before = v.numpy().copy()
    with pytest.raises(ValueError, match=error):
        strat.run(lambda: opt.apply_mean_gradients([(np.ones(3), v)], totals))
    np.testing.assert_array_equal(v.numpy(), before)
    assert int(opt.iterations.numpy()) == 1


def test_outside_replica_context_is_an_error():
    strategy = mpidist.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        v = mpidist.Variable(np.ones(3), name="w")
        opt = mpidist.optimizers.SGD(0.1)
        with pytest.raises(RuntimeError, match="inside the step that `strategy.run` runs"):
            opt.apply_mean_gradients([(np.ones(3), v)], np.array([1.0, 2.0]))
    np.testing.assert_array_equal(v.numpy(), np.ones(3))


@pytest.mark.parametrize("spelling", [
    lambda s, n: [s, n],                                  # a list of Python numbers
    lambda s, n: (s, int(n)),                             # a tuple with an int count
    lambda s, n: np.array([s, n], np.float32),            # float32 as it is
    lambda s, n: np.array([int(s), int(n)]),              # integers
])
def test_totals_may_be_any_two_real_numbers(spelling):
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        v = mpidist.Variable(np.zeros(2), name="w")
        opt = mpidist.optimizers.SGD(1.0)
    for _ in range(2):  # the first step builds the slots, the second takes the fused path
        out = strategy.run(lambda: opt.apply_mean_gradients([(np.array([4.0, 8.0]), v)],
                                                            spelling(6.0, 4.0)))
        np.testing.assert_array_equal(np.asarray(out), [6.0, 4.0])
    np.testing.assert_array_equal(v.numpy(), [-2.0, -4.0])
