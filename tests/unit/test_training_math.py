"""Spec section 10: compute_average_loss, scale_regularization_loss, get_loss_reduction and the
optimizers' apply_gradients under the default, OneDevice and Mirrored strategies."""

import numpy as np
import pytest

import mpidist
from mpidist.errors import InvalidArgumentError
from mpidist.optimizers import SGD, Adam

from replicas import mirrored, rid


# -- compute_average_loss (10.1) ----------------------------------------------------------------
def test_average_loss_in_the_default_context():
    cal = mpidist.nn.compute_average_loss
    assert float(cal(np.array([1.0, 2.0, 3.0, 4.0]))) == 2.5
    assert float(cal(np.array([1.0, 2.0, 3.0, 4.0]), global_batch_size=8)) == 1.25
    assert float(cal(np.array([1.0, 2.0, 3.0, 4.0]), sample_weight=[1, 0, 2, 1],
                     global_batch_size=4)) == 2.75
    assert float(cal(np.array([1.0, 2.0, 3.0, 4.0]), sample_weight=2)) == 5.0
    assert float(cal(np.array([[1.0, 2.0], [3.0, 4.0]]))) == 5.0  # only dim 0 is the batch
    assert float(cal(np.array([1.0, 2.0]), global_batch_size=0)) == 0.0
    assert cal(np.array([1.0, 2.0], np.float64)).dtype == np.float64
    assert cal(np.array([1.0, 2.0], np.float32)).dtype == np.float32
    assert float(cal(np.array([1.0, 2.0]), global_batch_size=np.int64(4))) == 0.75


def test_average_loss_errors():
    cal = mpidist.nn.compute_average_loss
    with pytest.raises(ValueError, match="Expected a tensor with at least rank 1. Received "
                                         "per_example_loss=3.0 with rank 0"):
        cal(3.0)
    with pytest.raises(TypeError, match="global_batch_size must be an integer"):
        cal(np.array([1.0]), global_batch_size=2.0)
    with pytest.raises(InvalidArgumentError, match="global_batch_size must be non-negative"):
        cal(np.array([1.0]), global_batch_size=-1)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        cal(np.array([1.0, 2.0]), sample_weight=[1.0, 2.0, 3.0])
    s = mirrored(2)
    with s.scope(), pytest.raises(RuntimeError, match="in cross replica context"):
        cal(np.array([1.0, 2.0]))
    with s.scope():
        assert float(cal(np.array([1.0, 2.0]), global_batch_size=4)) == 0.75


def test_average_loss_in_replica_context_sums_to_the_global_mean():
    s = mirrored(2)
    losses = s.experimental_distribute_values_from_function(
        lambda ctx: np.array([1.0, 2.0, 3.0]) * (ctx.replica_id_in_sync_group + 1))
    per_replica = s.run(mpidist.nn.compute_average_loss, args=(losses,))
    assert [float(v) for v in s.experimental_local_results(per_replica)] == [1.0, 2.0]
    assert float(s.reduce("SUM", per_replica, axis=None)) == 3.0


def test_scale_regularization_loss():
    s = mirrored(2)
    out = s.run(lambda: mpidist.nn.scale_regularization_loss(np.array([2.0, 4.0])))
    assert [float(v) for v in s.experimental_local_results(out)] == [3.0, 3.0]
    assert float(mpidist.nn.scale_regularization_loss(4.0)) == 4.0
    with s.scope(), pytest.raises(RuntimeError, match="`scale_regularization_loss` in cross replica"):
        mpidist.nn.scale_regularization_loss(4.0)


def test_loss_reduction_is_sum():
    assert mpidist.get_loss_reduction() is mpidist.ReduceOp.SUM


# -- apply_gradients (10.4) ----------------------------------------------------------------------
def test_sgd_sums_gradients_across_replicas():
    s = mirrored(2)
    with s.scope():
        w = mpidist.Variable(1.0)
        opt = SGD(0.1)
    s.run(lambda: opt.apply_gradients([(np.float64(rid() + 1), w)]))
    assert [float(c.numpy()) for c in w.values] == [0.7, 0.7]
    assert int(opt.iterations.numpy()) == 1


def test_losses_must_be_scaled_by_the_global_batch():
    s = mirrored(2)
    with s.scope():
        w = mpidist.Variable(2.0)
        opt = SGD(1.0)
    xs = s.experimental_distribute_values_from_function(
        lambda ctx: np.array([[1.0, 2.0], [3.0, 4.0]][ctx.replica_id_in_sync_group]))

    def step(x):
        loss = mpidist.nn.compute_average_loss((x * w.read_value()) ** 2 / 2, global_batch_size=4)
        opt.apply_gradients([(np.sum(x * x * w.read_value()) / 4, w)])
        return loss

    losses = s.run(step, args=(xs,))
    assert [float(v) for v in losses.values] == [2.5, 12.5]
    assert [float(c.numpy()) for c in w.values] == [-13.0, -13.0]


def _train(strategy, make_optimizer, steps=5):
    """A few steps of least squares with the given optimizer; returns the weights."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 3))
    y = x @ np.array([1.0, -2.0, 0.5])
    with strategy.scope():
        w = mpidist.Variable(np.zeros(3))
        opt = make_optimizer()
    data = strategy.experimental_distribute_dataset(mpidist.data.Dataset.from_tensor_slices((x, y)).batch(8))

    def step(xb, yb):
        err = xb @ w.read_value() - yb
        opt.apply_gradients([(2 * xb.T @ err / 8, w)])

    for _ in range(steps):
        for xb, yb in data:
            strategy.run(step, args=(xb, yb))
    values = [c.numpy() for c in strategy.experimental_local_results(w)] if \
        isinstance(w, mpidist.DistributedValues) else [w.numpy()]
    for v in values[1:]:
        np.testing.assert_array_equal(v, values[0])  # every copy bit-identical
    return values[0], opt


@pytest.mark.parametrize("make", [
    lambda: SGD(0.05), lambda: SGD(0.05, momentum=0.9), lambda: SGD(0.05, momentum=0.9, nesterov=True),
    lambda: Adam(0.05), lambda: Adam(0.05, amsgrad=True), lambda: SGD(0.05, clipnorm=0.5),
    lambda: SGD(0.05, global_clipnorm=0.5), lambda: Adam(0.05, clipvalue=0.1),
], ids=["sgd", "momentum", "nesterov", "adam", "amsgrad", "clipnorm", "global_clipnorm", "clipvalue"])
def test_same_weights_under_every_strategy(make):
    reference, _ = _train(mpidist.OneDeviceStrategy("/cpu:0"), make)
    for strategy in (mpidist.get_strategy(), mirrored(2), mirrored(3), mirrored(4)):
        got, opt = _train(strategy, make)
        np.testing.assert_allclose(got, reference, rtol=1e-12, atol=1e-14)
        assert int(opt.iterations.numpy()) == 15


def test_sgd_momentum_and_adam_follow_the_formulas():
    w = mpidist.Variable(np.array([1.0, 2.0]))
    opt = SGD(0.1, momentum=0.5)
    g = np.array([1.0, -1.0])
    opt.apply_gradients([(g, w)])
    opt.apply_gradients([(g, w)])
    m1 = -0.1 * g
    m2 = 0.5 * m1 - 0.1 * g
    np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) + m1 + m2)
    np.testing.assert_allclose(opt.get_slot(w, "momentum").numpy(), m2)

    w = mpidist.Variable(np.array([1.0]))
    nesterov = SGD(0.1, momentum=0.5, nesterov=True)
    nesterov.apply_gradients([(np.array([2.0]), w)])
    m = -0.2
    np.testing.assert_allclose(w.numpy(), [1.0 + 0.5 * m - 0.2])

    w = mpidist.Variable(np.array([1.0]))
    adam = Adam(0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    adam.apply_gradients([(np.array([0.5]), w)])
    m, v = 0.05, 0.00025
    alpha = 0.1 * np.sqrt(1 - 0.999) / (1 - 0.9)
    np.testing.assert_allclose(w.numpy(), [1.0 - alpha * m / (np.sqrt(v) + 1e-7)], rtol=1e-12)


def test_slots_are_mirrored_like_their_variables():
    s = mirrored(2)
    with s.scope():
        w = mpidist.Variable(np.zeros(2))
        opt = Adam()
    opt.build([w])
    assert isinstance(opt.get_slot(w, "m"), mpidist.MirroredVariable)
    assert isinstance(opt.iterations, mpidist.MirroredVariable)
    with pytest.raises(ValueError, match="no slot 'momentum'"):
        opt.get_slot(w, "momentum")


def test_apply_gradients_errors():
    s = mirrored(2)
    with s.scope():
        w = mpidist.Variable(np.zeros(2))
        opt = SGD(0.1)
        with pytest.raises(RuntimeError, match="cannot be called in cross-replica context"):
            opt.apply_gradients([(np.ones(2), w)])
    with pytest.raises(ValueError, match="No gradients provided"):
        opt.apply_gradients([(None, w)])
    with pytest.raises(ValueError, match=r"Gradient of shape \(3,\) does not match"):
        s.run(lambda: opt.apply_gradients([(np.ones(3), w)]))
    np.testing.assert_array_equal(w.values[0].numpy(), np.zeros(2))  # left unchanged
    with pytest.raises(ValueError, match="learning_rate must be a finite number"):
        SGD(-1.0)
    with pytest.raises(ValueError, match="momentum must be in"):
        SGD(0.1, momentum=1.5)
    with pytest.raises(ValueError, match="Only one of"):
        SGD(0.1, clipnorm=1.0, clipvalue=1.0)


def test_unaggregated_gradients_are_used_as_given():
    s = mirrored(2)
    with s.scope():
        w = mpidist.Variable(1.0)
        opt = SGD(0.1)
    s.run(lambda: opt.apply_gradients([(np.float64(2.0), w)], experimental_aggregate_gradients=False))
    assert [float(c.numpy()) for c in w.values] == [0.8, 0.8]


def test_learning_rate_schedule():
    w = mpidist.Variable(1.0)
    opt = SGD(lambda step: 0.1 / (step + 1))
    opt.apply_gradients([(np.float64(1.0), w)])
    opt.apply_gradients([(np.float64(1.0), w)])
    assert float(w.numpy()) == pytest.approx(1.0 - 0.1 - 0.05)
