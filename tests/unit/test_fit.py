"""mpidist.fit / evaluate and the callbacks: the same weights under every strategy and replica
count (partial final batches included), logs and metrics, callback hooks, checkpoints, and
errors. The progress display, in a Python process of its own, is the scenario
tests/scenarios/test_fit_progress.py."""

import os

import numpy as np
import pytest

import mpidist
from mpidist.data import Dataset

from replicas import mirrored

RNG = np.random.default_rng(0)
X = RNG.standard_normal((50, 3))
Y = X @ np.array([1.5, -2.0, 0.5]) + 0.3 + 0.01 * RNG.standard_normal(50)


class Linear:
    """Least squares, y ≈ x·w + b, with per-example loss (err²) and hand-written gradients."""

    def __init__(self):
        self.w = mpidist.Variable(np.zeros(3), name="w")
        self.b = mpidist.Variable(0.0, name="b")

    @property
    def trainable_variables(self):
        return [self.w, self.b]

    def predict(self, x):
        return x @ self.w.read_value() + self.b.read_value()

    def loss_and_gradients(self, x, y):
        err = self.predict(x) - y
        return err**2, [2 * x.T @ err, np.asarray(2 * err.sum())]


class Within(mpidist.metrics.Mean):
    """Fraction of predictions within 0.1 of the target (a Mean of booleans)."""

    def update_state(self, y, predictions):
        super().update_state(np.abs(predictions - y) < 0.1)


def train(strategy, epochs=4, batch=16, **kwargs):
    with strategy.scope():
        model = Linear()
        optimizer = mpidist.optimizers.SGD(0.05, momentum=0.5)
    ds = Dataset.from_tensor_slices((X, Y)).shuffle(50, seed=2).batch(batch)
    kwargs.setdefault("verbose", 0)
    history = mpidist.fit(model, ds, epochs=epochs, optimizer=optimizer, strategy=strategy,
                          **kwargs)
    return model, optimizer, history


def host(v):
    return np.asarray(v.numpy())


# -- the same numbers everywhere -------------------------------------------------------------------
def test_same_weights_under_every_strategy_with_partial_batches():
    ref_model, ref_opt, ref_hist = train(mpidist.OneDeviceStrategy("/cpu:0"))
    assert int(ref_opt.iterations.numpy()) == 4 * 4  # 50 rows in batches of 16: 4 steps
    for strategy in (mpidist.get_strategy(), mirrored(2), mirrored(3), mirrored(4)):
        model, opt, hist = train(strategy)
        for a, b in zip(model.trainable_variables, ref_model.trainable_variables):
            np.testing.assert_allclose(host(a), host(b), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-12)
        assert int(opt.iterations.numpy()) == 16


def test_the_update_is_the_gradient_of_the_global_mean_loss():
    # One step, batch of all 50 rows, plain SGD: w1 = w0 - lr * mean gradient.
    strategy = mirrored(3)
    with strategy.scope():
        model = Linear()
        optimizer = mpidist.optimizers.SGD(0.1)
    history = mpidist.fit(model, Dataset.from_tensor_slices((X, Y)).batch(50), epochs=1,
                          optimizer=optimizer, strategy=strategy, verbose=0)
    np.testing.assert_allclose(host(model.w), -0.1 * (2 * X.T @ (-Y)) / 50, rtol=1e-12)
    np.testing.assert_allclose(history.history["loss"], [np.mean(Y**2)], rtol=1e-12)


def test_loss_and_metrics_in_the_logs():
    strategy = mirrored(2)
    with strategy.scope():
        model = Linear()
        optimizer = mpidist.optimizers.Adam(0.1)
        within = Within(name="within")
    history = mpidist.fit(model, Dataset.from_tensor_slices((X, Y)).batch(10), epochs=30,
                          optimizer=optimizer, strategy=strategy, metrics=[within], verbose=0)
    assert set(history.history) == {"loss", "within"}
    assert history.epoch == list(range(30))
    assert history.history["loss"][-1] < history.history["loss"][0] / 10
    logs = mpidist.evaluate(model, Dataset.from_tensor_slices((X, Y)).batch(7), strategy=strategy,
                            metrics=[within])
    predictions = X @ host(model.w) + float(host(model.b))
    np.testing.assert_allclose(logs["loss"], np.mean((predictions - Y) ** 2), rtol=1e-12)
    assert logs["within"] == pytest.approx(np.mean(np.abs(predictions - Y) < 0.1), abs=1e-12)


def test_steps_per_epoch_and_initial_epoch():
    strategy = mirrored(2)
    _, optimizer, history = train(strategy, epochs=3, steps_per_epoch=2, initial_epoch=1)
    assert int(optimizer.iterations.numpy()) == 4
    assert history.epoch == [1, 2]


# -- callbacks ---------------------------------------------------------------------------------------
class Recorder(mpidist.callbacks.Callback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin", self.params["epochs"], self.params["steps"]))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch_end", batch, round(logs["loss"], 12) >= 0))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, sorted(logs)))

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))


def test_callback_hooks_in_order():
    recorder = Recorder()
    train(mirrored(2), epochs=2, batch=25, callbacks=[recorder])
    assert recorder.events == [
        ("train_begin", 2, 2),
        ("epoch_begin", 0), ("batch_end", 0, True), ("batch_end", 1, True), ("epoch_end", 0, ["loss"]),
        ("epoch_begin", 1), ("batch_end", 0, True), ("batch_end", 1, True), ("epoch_end", 1, ["loss"]),
        ("train_end",),
    ]
    assert recorder.model is not None and recorder.strategy is not None


def test_model_checkpoint_saves_every_epoch_and_restores(tmp_path):
    strategy = mirrored(2)
    checkpoints = mpidist.callbacks.ModelCheckpoint(tmp_path, max_to_keep=2)
    model, optimizer, _ = train(strategy, epochs=3, callbacks=[checkpoints])
    assert [os.path.basename(p) for p in checkpoints.manager.checkpoints] == ["ckpt-2", "ckpt-3"]
    assert mpidist.train.latest_checkpoint(tmp_path).endswith("ckpt-3")
    # Restore into a fresh model under another strategy and replica count.
    other = mirrored(3)
    with other.scope():
        fresh = Linear()
        fresh_optimizer = mpidist.optimizers.SGD(0.05, momentum=0.5)
    fresh_optimizer.build(fresh.trainable_variables)
    from mpidist.training.callbacks import ModelVariables

    checkpoint = mpidist.train.Checkpoint(model=ModelVariables(fresh), optimizer=fresh_optimizer)
    checkpoint.restore(mpidist.train.latest_checkpoint(tmp_path)).assert_consumed()
    for a, b in zip(fresh.trainable_variables, model.trainable_variables):
        np.testing.assert_array_equal(host(a), host(b))
    assert int(fresh_optimizer.iterations.numpy()) == int(optimizer.iterations.numpy())


def test_model_checkpoint_formats_a_keras_filepath_each_save_and_keeps_them_all(tmp_path):
    pattern = str(tmp_path / "ckpt" / "weights.{epoch:02d}-{loss:.3f}")
    checkpoints = mpidist.callbacks.ModelCheckpoint(pattern, max_to_keep=1)
    model, _, history = train(mirrored(2), epochs=3, callbacks=[checkpoints])
    losses = history.history["loss"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        f"weights.{epoch + 1:02d}-{loss:.3f}" for epoch, loss in enumerate(losses)]
    from mpidist.training.callbacks import ModelVariables

    fresh = Linear()
    last = str(tmp_path / "ckpt" / f"weights.03-{losses[-1]:.3f}")
    mpidist.train.Checkpoint(model=ModelVariables(fresh)).restore(last).expect_partial()
    for a, b in zip(fresh.trainable_variables, model.trainable_variables):
        np.testing.assert_array_equal(host(a), host(b))
    with pytest.raises(KeyError, match=r"cannot format the path .*\{acc\}.*'epoch', 'loss'"):
        train(mirrored(2), epochs=1, callbacks=[
            mpidist.callbacks.ModelCheckpoint(str(tmp_path / "w.{acc}"))])


def test_backup_and_restore_on_a_clean_run_leaves_nothing(tmp_path):
    backup = mpidist.callbacks.BackupAndRestore(tmp_path / "backup", save_freq=3)
    model, _, _ = train(mirrored(2), callbacks=[backup])
    reference, _, _ = train(mirrored(2))
    np.testing.assert_array_equal(host(model.w), host(reference.w))
    assert not (tmp_path / "backup").exists()


def test_bad_callback_arguments():
    with pytest.raises(ValueError, match="save_freq must be 'epoch' or a positive number"):
        mpidist.callbacks.BackupAndRestore("/tmp/x", save_freq=0)
    with pytest.raises(ValueError, match="save_freq"):
        mpidist.callbacks.ModelCheckpoint("/tmp/x", save_freq="batch")


# -- errors --------------------------------------------------------------------------------------------
def test_fit_errors():
    strategy = mirrored(2)
    with strategy.scope():
        model = Linear()
        optimizer = mpidist.optimizers.SGD(0.1)
    ds = Dataset.from_tensor_slices((X, Y)).batch(10)
    with pytest.raises(TypeError, match="lacks \\['loss_and_gradients'\\]"):
        mpidist.fit(object.__new__(type("M", (), {"trainable_variables": []})), ds,
                    optimizer=optimizer, strategy=strategy)
    with pytest.raises(ValueError, match="expect a dataset of \\(x, y\\) pairs"):
        mpidist.fit(model, Dataset.from_tensor_slices(X).batch(10), optimizer=optimizer,
                    strategy=strategy, verbose=0)

    class WrongGradients(Linear):
        def loss_and_gradients(self, x, y):
            loss, grads = super().loss_and_gradients(x, y)
            return loss, grads[:1]

    with strategy.scope():
        wrong = WrongGradients()
    with pytest.raises(ValueError, match="returned 1 gradients for 2 trainable variables"):
        mpidist.fit(wrong, ds, optimizer=optimizer, strategy=strategy, verbose=0)
    with pytest.raises(RuntimeError, match="outside strategy.run"):
        strategy.run(lambda: mpidist.fit(model, ds, optimizer=optimizer, strategy=strategy))


# -- which strategy fit and evaluate run under ---------------------------------------------------
def _model_and_optimizer(strategy):
    with strategy.scope():
        return Linear(), mpidist.optimizers.SGD(0.05, momentum=0.5)


def _dataset():
    return Dataset.from_tensor_slices((X, Y)).batch(16)


def test_fit_without_strategy_uses_the_strategy_of_the_models_variables():
    """As docs/training.md shows: build in strategy.scope(), then fit(model, ...) with no
    strategy=. It must train under that strategy (same weights as passing it), not the
    default one."""
    strategy = mirrored(2)
    implicit, opt = _model_and_optimizer(strategy)
    mpidist.fit(implicit, _dataset(), epochs=2, optimizer=opt, verbose=0)
    explicit, opt2 = _model_and_optimizer(strategy)
    mpidist.fit(explicit, _dataset(), epochs=2, optimizer=opt2, strategy=strategy, verbose=0)
    np.testing.assert_array_equal(implicit.w.numpy(), explicit.w.numpy())
    assert float(np.abs(implicit.w.numpy()).sum()) > 0.1  # it trained
    logs = mpidist.evaluate(implicit, _dataset())
    assert logs == mpidist.evaluate(implicit, _dataset(), strategy=strategy)


def test_fit_with_another_strategy_than_the_variables_names_both_and_trains_nothing():
    owner, other = mirrored(2), mirrored(2)
    model, opt = _model_and_optimizer(owner)
    for call in (lambda: mpidist.fit(model, _dataset(), optimizer=opt, strategy=other, verbose=0),
                 lambda: mpidist.evaluate(model, _dataset(), strategy=other)):
        with pytest.raises(ValueError, match=r"strategy=MirroredStrategy at 0x[0-9a-f]+ but the "
                           r"model's variables were created under MirroredStrategy at") as info:
            call()
        assert f"{id(other):#x}" in str(info.value) and f"{id(owner):#x}" in str(info.value)
        assert "Pass the strategy whose scope created the model" in str(info.value)
    np.testing.assert_array_equal(model.w.numpy(), np.zeros(3))
    assert int(opt.iterations.numpy()) == 0


def test_fit_with_an_optimizer_of_another_scope_is_refused_before_training():
    model, _ = _model_and_optimizer(mirrored(2))
    loose = mpidist.optimizers.SGD(0.05)  # created outside the scope
    with pytest.raises(ValueError, match=r"the optimizer was created outside any strategy's "
                       r"scope but the model's variables under MirroredStrategy"):
        mpidist.fit(model, _dataset(), optimizer=loose, verbose=0)
    np.testing.assert_array_equal(model.w.numpy(), np.zeros(3))


def test_fit_with_variables_of_two_strategies_names_them():
    first, second = mirrored(2), mirrored(2)
    model, opt = _model_and_optimizer(first)
    with second.scope():
        model.b = mpidist.Variable(0.0, name="b2")
    with pytest.raises(ValueError, match=r"belong to 2 different strategies .*'w:0'.*'b2:0'"):
        mpidist.fit(model, _dataset(), optimizer=opt, verbose=0)


@pytest.mark.parametrize("optimizer", [None, "sgd", 0.1])
def test_fit_with_something_else_than_an_optimizer_says_what_to_pass(optimizer):
    model, _ = _model_and_optimizer(mpidist.OneDeviceStrategy("/cpu:0"))
    with pytest.raises(TypeError, match=r"optimizer must be an mpidist.optimizers optimizer"):
        mpidist.fit(model, _dataset(), optimizer=optimizer, verbose=0)
