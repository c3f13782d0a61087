"""The repeating step's shortcuts (issue 13, item 2) keep every check and every bit.

``GradientChecks`` compares a repeating call with the last one in C-level passes; the fused
plan skips its per-gradient test once a signature passed; replica threads get their share of
the BLAS threads. Each shortcut must fall back to the full path on any difference.
"""

import numpy as np
import pytest

import mpidist
from mpidist.backend import threads
from mpidist.training.gradient_checks import GradientChecks


def _model(strategy, shapes, kind="sgd"):
    rng = np.random.default_rng(3)
    with strategy.scope():
        variables = [mpidist.Variable(rng.standard_normal(s).astype(np.float32), name=f"w{i}")
                     for i, s in enumerate(shapes)]
        opt = (mpidist.optimizers.SGD(0.05, momentum=0.9) if kind == "sgd"
               else mpidist.optimizers.Adam(0.01))
    return variables, opt


def _numpy_sgd_momentum(weights, grads_per_step, lr=0.05, momentum=0.9):
    w = [x.copy() for x in weights]
    m = [np.zeros_like(x) for x in weights]
    t = np.float32
    for grads in grads_per_step:
        for k, g in enumerate(grads):
            g = g.astype(np.float32, copy=False)
            m[k] = t(momentum) * m[k] - t(lr) * g
            w[k] = w[k] + m[k]
    return w


@pytest.mark.parametrize("as_list", [False, True])
def test_repeating_step_with_odd_gradients_gives_numpy_bits(as_list):
    """Non-contiguous and float64 gradients, 2-D and 1-D, many variables: the flattened pack
    rounds and orders exactly as the per-variable NumPy rule."""
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    shapes = [(3, 4), (5,), (2, 3)] * 40
    variables, opt = _model(strategy, shapes)
    start = [np.asarray(v).copy() for v in variables]
    rng = np.random.default_rng(7)
    steps = []
    for _step in range(4):
        grads = []
        for k, s in enumerate(shapes):
            g = rng.standard_normal(s[::-1]).T if len(s) == 2 else rng.standard_normal(s)
            grads.append(g if k % 2 else g.astype(np.float32))
        steps.append(grads)
    for grads in steps:
        pairs = list(zip(grads, variables)) if as_list else zip(grads, variables)
        strategy.run(lambda p=pairs: opt.apply_gradients(p))
    want = _numpy_sgd_momentum(start, steps)
    for v, w in zip(variables, want):
        np.testing.assert_array_equal(np.asarray(v), w)
    assert int(np.asarray(opt.iterations)) == 4


def test_checks_after_a_repeating_step_still_catch_every_mistake():
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    variables, opt = _model(strategy, [(2, 3), (4,)])
    grads = [np.ones((2, 3), np.float32), np.ones(4, np.float32)]
    for _ in range(2):
        strategy.run(lambda: opt.apply_gradients(zip(grads, variables)))
    before = [np.asarray(v).copy() for v in variables]

    def fails(pairs, error, match):
        with pytest.raises(error, match=match):
            strategy.run(lambda: opt.apply_gradients(pairs))

    fails(zip([np.ones((3, 2), np.float32), grads[1]], variables), ValueError,
          r"Gradient of shape \(3, 2\) does not match variable 'w0:0'")
    fails(zip(variables, grads), TypeError, "the order is \\(gradient, variable\\)")
    fails(zip([grads[0], np.ones(4, np.complex64)], variables), TypeError,
          "gradients must be real numbers")
    fails([(grads[0], variables[0]), (grads[1], variables[1], 1)], ValueError,
          "must be a \\(gradient, variable\\) pair")
    fails(zip(grads, [variables[0], variables[0]]), ValueError, "appears twice")
    fails(zip([None, None], variables), ValueError, "No gradients provided")
    for v, b in zip(variables, before):  # nothing half-applied
        np.testing.assert_array_equal(np.asarray(v), b)
    assert int(np.asarray(opt.iterations)) == 2
    # and the step still runs after the mistakes
    strategy.run(lambda: opt.apply_gradients(zip(grads, variables)))
    assert int(np.asarray(opt.iterations)) == 3


def test_gradient_checks_signature_is_stable_only_while_calls_repeat():
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    variables, _ = _model(strategy, [(2,), (3,)])
    checks = GradientChecks()
    g = [np.zeros(2, np.float32), np.zeros(3, np.float32)]
    with strategy.scope():
        _, vs1, sig1 = checks.check(zip(g, variables), None, strategy)
        grads, vs2, sig2 = checks.check(zip([x + 1 for x in g], variables), None, strategy)
        assert vs2 is vs1 and sig2 is sig1
        assert [x.tolist() for x in grads] == [[1.0, 1.0], [1.0, 1.0, 1.0]]
        _, vs3, sig3 = checks.check(zip([g[0], g[1].astype(np.float64)], variables), None,
                                    strategy)
        assert vs3 is vs1 and sig3 is not sig1  # same variables, new gradient dtypes
        assert sig3[2] == (np.dtype(np.float32), np.dtype(np.float64))


def test_mirrored_fused_step_matches_numpy():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    shapes = [(4,), (2, 2)] * 10
    variables, opt = _model(strategy, shapes)
    start = [np.asarray(v).copy() for v in variables]
    per_replica = [[np.full(s, 0.5 * (r + 1), np.float32) for s in shapes] for r in range(2)]

    def step():
        r = mpidist.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients(zip(per_replica[r], variables))

    for _ in range(3):
        strategy.run(step)
    summed = [a + b for a, b in zip(*per_replica)]
    want = _numpy_sgd_momentum(start, [summed] * 3)
    for v, w in zip(variables, want):
        for copy in v.values:
            np.testing.assert_array_equal(np.asarray(copy), w)


def test_threads_per_cpu_replica(monkeypatch):
    cores = 8
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    assert threads.threads_per_rank(1, "auto", environ={}, cpu_replicas=2) == 4
    assert threads.threads_per_rank(2, "auto", environ={}, cpu_replicas=2) == 2
    assert threads.threads_per_rank(4, "auto", environ={}, cpu_replicas=4) == 1
    assert threads.threads_per_rank(1, "auto", environ={}, cpu_replicas=1) is None
    assert threads.threads_per_rank(1, "auto", environ={"OPENBLAS_NUM_THREADS": "2"},
                                    cpu_replicas=2) is None  # the user chose
    assert threads.threads_per_rank(1, 3, environ={}, cpu_replicas=2) == 3  # MPIDIST_CPU_THREADS
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert threads.threads_per_rank(1, "auto", environ={}, cpu_replicas=2) == 3


def test_mirrored_strategy_caps_blas_threads_per_cpu_replica(monkeypatch):
    calls = []
    monkeypatch.setattr(threads, "cap_cpu_threads",
                        lambda ranks, setting, cpu_replicas=1: calls.append((ranks, cpu_replicas)))
    mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    mpidist.MirroredStrategy(["/cpu:0"])  # a lone CPU replica leaves the pools alone
    assert calls == [(1, 3)]
