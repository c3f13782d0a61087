"""Keras's own metrics and callbacks in ``mpidist.fit``: metrics summed across replicas as TF
sums metric variables, callbacks driven by fit's global logs, files written by the chief."""

import os

os.environ["KERAS_BACKEND"] = "jax"  # before Keras is imported

import csv

import keras
import numpy as np
import pytest

import mpidist
from mpidist.data import Dataset
from linear_model import LinearModel

rng = np.random.default_rng(0)
X = rng.normal(size=(60, 2))
Y = X @ np.array([1.5, -2.0]) + 0.1 * rng.normal(size=60)


def data():
    return Dataset.from_tensor_slices((X, Y)).batch(20)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_keras_metric_gives_the_value_of_the_same_metric_over_the_global_batch(devices):
    strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(devices)])
    with strategy.scope():
        model = LinearModel()
        optimizer = mpidist.optimizers.SGD(0.05)
    history = mpidist.fit(model, data(), epochs=2, optimizer=optimizer, strategy=strategy,
                          metrics=[keras.metrics.MeanAbsoluteError(name="keras_mae"), "mae"],
                          verbose=0)
    np.testing.assert_allclose(history.history["keras_mae"], history.history["mae"], rtol=1e-6)
    # RMSE is not the mean of per-batch values: only summed state gives the global figure.
    errors = model.predict(X)[:, 0] - Y
    results = mpidist.evaluate(model, data(), strategy=strategy,
                               metrics=[keras.metrics.RootMeanSquaredError(name="rmse")])
    np.testing.assert_allclose(results["rmse"], np.sqrt(np.mean(errors ** 2)), rtol=1e-5)


def test_a_keras_metric_that_builds_its_state_from_the_data_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"R2Score.*first update.*reset_state"):
        mpidist.fit(LinearModel(), data(), optimizer=mpidist.optimizers.SGD(0.05),
                    metrics=[keras.metrics.R2Score()], verbose=0)
    built = keras.metrics.R2Score(name="r2")
    built.update_state(Y[:2].reshape(-1, 1), Y[:2].reshape(-1, 1))
    built.reset_state()
    model = LinearModel()
    mpidist.fit(model, data(), epochs=3, optimizer=mpidist.optimizers.SGD(0.05), verbose=0)
    results = mpidist.evaluate(model, data(), metrics=[built])
    expected = keras.metrics.R2Score()
    expected.update_state(Y.reshape(-1, 1), model.predict(X))
    np.testing.assert_allclose(results["r2"], float(expected.result()), rtol=1e-5)


def test_keras_callbacks_drive_mpidist_fit(tmp_path):
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = LinearModel()
        optimizer = mpidist.optimizers.SGD(0.05)
    log = tmp_path / "log.csv"
    rates = []
    history = mpidist.fit(model, data(), epochs=6, optimizer=optimizer, strategy=strategy,
                          verbose=0, callbacks=[
                              keras.callbacks.LearningRateScheduler(
                                  lambda epoch, lr: rates.append(lr) or lr / 2),
                              keras.callbacks.CSVLogger(str(log)),
                              # cannot improve by 1e9: stops after the second epoch
                              keras.callbacks.EarlyStopping(monitor="loss", patience=1,
                                                            min_delta=1e9)])
    assert history.epoch == [0, 1]
    assert rates == [0.05, 0.025]  # the schedule read and set fit's optimizer
    assert optimizer.learning_rate == 0.0125
    with open(log) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    np.testing.assert_allclose([float(r["loss"]) for r in rows], history.history["loss"])


def test_a_single_keras_callback_is_taken_as_a_list_of_one():
    model = LinearModel()
    history = mpidist.fit(model, data(), epochs=3, optimizer=mpidist.optimizers.SGD(0.05),
                          verbose=0, callbacks=keras.callbacks.EarlyStopping(
                              monitor="loss", patience=0, min_delta=1e9))
    assert history.epoch == [0, 1]


def test_what_is_neither_a_metric_nor_a_keras_metric_is_refused_naming_both():
    with pytest.raises(TypeError, match=r"'metrics'.*a Metric or a string or a KerasMetric"):
        mpidist.fit(LinearModel(), data(), optimizer=mpidist.optimizers.SGD(0.05),
                    metrics=[object()], verbose=0)
