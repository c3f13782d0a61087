"""Keras' conventions in fit/evaluate: metrics by name, a lone callback, label shapes."""

import numpy as np
import pytest

import mpidist
from mpidist.training.metric_names import METRIC_NAMES, metric_from

from linear_model import LinearModel


def _setup():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model, opt = LinearModel(), mpidist.optimizers.SGD(0.1)
    x = np.arange(16.0).reshape(8, 2) / 16
    y = x @ np.array([1.0, 2.0])
    return model, opt, mpidist.data.Dataset.from_tensor_slices((x, y)).batch(4), x, y


def test_metrics_by_name_match_the_objects_and_numpy():
    model, opt, ds, x, y = _setup()
    history = mpidist.fit(model, ds, epochs=1, optimizer=opt, metrics=["mse", "mae"],
                          callbacks=mpidist.callbacks.Callback(), verbose=0)  # a lone callback
    assert set(history.history) == {"loss", "mse", "mae"}
    logs = mpidist.evaluate(model, ds, metrics=["mse", "mean_absolute_error"])
    pred = x @ np.asarray(model.w)[:, 0]
    np.testing.assert_allclose(logs["mse"], np.mean((pred - y) ** 2))
    np.testing.assert_allclose(logs["mean_absolute_error"], np.mean(np.abs(pred - y)))
    np.testing.assert_allclose(logs["loss"], logs["mse"])  # the model's loss is the squared error


@pytest.mark.parametrize("name", sorted(METRIC_NAMES))
def test_every_known_name_builds_its_class_named_as_given(name):
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        metric = metric_from(name, "fit")
    assert type(metric) is METRIC_NAMES[name] and metric.name == name


def test_an_unknown_name_lists_the_known_ones():
    model, opt, ds, *_ = _setup()
    with pytest.raises(ValueError, match=r"unknown metric name 'msee'; the known names are .*'mse'"):
        mpidist.fit(model, ds, optimizer=opt, metrics=["msee"], verbose=0)


@pytest.mark.parametrize("metrics,fix", [
    (mpidist.metrics.Mean(), r"pass a list, e\.g\. \[.*\], even for one item"),
    ("mse", r"pass a list, e\.g\. \['mse'\]"),
    ([mpidist.metrics.Mean], r"pass an instance, Mean\(\)"),
])
def test_metrics_not_in_a_list_is_keras_typeerror_with_the_fix(metrics, fix):
    model, opt, ds, *_ = _setup()
    before = np.array(model.w.numpy())
    with pytest.raises(TypeError, match=fix):
        mpidist.fit(model, ds, optimizer=opt, metrics=metrics, verbose=0)
    np.testing.assert_array_equal(model.w.numpy(), before)


def test_keras_2_batch_hooks_are_called_as_keras_3_calls_them():
    """A callback written for Keras 2 overrides ``on_batch_begin`` / ``on_batch_end``: Keras 3
    still calls them (its ``on_train_batch_*`` defaults forward), and so does fit. One that
    overrides ``on_train_batch_end`` itself is not called twice."""
    class Keras2(mpidist.callbacks.Callback):
        def __init__(self):
            self.seen = []

        def on_batch_begin(self, batch, logs=None):
            self.seen.append(("begin", batch))

        def on_batch_end(self, batch, logs=None):
            self.seen.append(("end", batch, sorted(logs)))

    class Keras3(Keras2):
        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(("train_end", batch))

    model, opt, ds, _, _ = _setup()
    old, new = Keras2(), Keras3()
    mpidist.fit(model, ds, epochs=1, optimizer=opt, callbacks=[old, new], verbose=0)
    assert old.seen == [("begin", 0), ("end", 0, ["loss"]), ("begin", 1), ("end", 1, ["loss"])]
    assert new.seen == [("begin", 0), ("train_end", 0), ("begin", 1), ("train_end", 1)]


class StopAt(mpidist.callbacks.Callback):
    """Sets Keras's ``model.stop_training`` at the end of an epoch or of a step."""

    def __init__(self, epoch=None, batch=None):
        self.epoch, self.batch = epoch, batch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.model.stop_training = True


def test_stop_training_ends_fit_as_keras_does():
    """Set at an epoch's end (EarlyStopping's way): no further epoch. Set after a step: the
    epoch ends there, its on_epoch_end still runs, and fit returns. fit clears the flag when it
    starts, as Keras does, so the next fit trains."""
    model, opt, ds, _, _ = _setup()
    history = mpidist.fit(model, ds, epochs=5, optimizer=opt, callbacks=[StopAt(epoch=1)],
                          verbose=0)
    assert history.epoch == [0, 1] and int(opt.iterations.numpy()) == 2 * 2
    assert model.stop_training is True
    history = mpidist.fit(model, ds, epochs=5, optimizer=opt, callbacks=[StopAt(batch=0)],
                          verbose=0)
    assert history.epoch == [0] and int(opt.iterations.numpy()) == 4 + 1
    history = mpidist.fit(model, ds, epochs=2, optimizer=opt, verbose=0)
    assert history.epoch == [0, 1] and int(opt.iterations.numpy()) == 5 + 4
