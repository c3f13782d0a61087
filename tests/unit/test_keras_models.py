"""Keras 3 models (JAX backend) under the in-process strategies: the same numbers as plain Keras
on the same global batches, and TF's errors for the mistakes people make."""

import os

os.environ["KERAS_BACKEND"] = "jax"  # before Keras is imported, as docs/keras.md says

import subprocess
import sys

import keras
import numpy as np
import pytest

import mpidist
from mpidist.data import Dataset
from mpidist.training.keras_parts import callbacks_for_rank, remove_directory

rng = np.random.default_rng(0)
X = rng.normal(size=(75, 6)).astype("float32")  # batches of 16: the last one (11) is uneven
Y = (X @ rng.normal(size=(6, 3))).argmax(axis=1)


def make_model(seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                              keras.layers.Dropout(0.0), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    return model


def weights(model):
    return [w.numpy() for w in model.weights]


STRATEGIES = {
    "one_device": lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    "mirrored_2": lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    "mirrored_3": lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"]),
    "central_storage_2": lambda: mpidist.experimental.CentralStorageStrategy(["/cpu:0",
                                                                               "/cpu:1"]),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_fit_evaluate_predict_match_plain_keras_on_the_same_global_batches(name):
    reference = make_model()
    keras.utils.set_random_seed(3)
    expected = reference.fit(X, Y, batch_size=16, epochs=2, verbose=0,
                             validation_split=0.2).history
    with STRATEGIES[name]().scope():
        model = make_model()
    keras.utils.set_random_seed(3)
    history = model.fit(X, Y, batch_size=16, epochs=2, verbose=0, validation_split=0.2).history
    for got, want in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(got, want, atol=2e-6)
    assert history.keys() == expected.keys()
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(X, Y, batch_size=10, verbose=0),
                               reference.evaluate(X, Y, batch_size=10, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(model.predict(X, batch_size=7, verbose=0),
                               reference.predict(X, verbose=0), atol=1e-5)


def test_an_mpidist_dataset_is_read_by_fit_evaluate_and_predict_under_a_strategy():
    reference = make_model()
    reference.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = make_model()
    dataset = Dataset.from_tensor_slices((X, Y)).batch(16)
    model.fit(dataset, epochs=2, verbose=0)
    for got, want in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(got, want, atol=2e-6)
    np.testing.assert_allclose(model.evaluate(dataset, verbose=0),
                               reference.evaluate(X, Y, batch_size=16, verbose=0), rtol=1e-5)
    assert model.predict(Dataset.from_tensor_slices(X).batch(16), verbose=0).shape == (75, 3)


def test_an_mpidist_dataset_is_read_by_a_plain_keras_model_too():
    model = make_model()
    dataset = Dataset.from_tensor_slices((X, Y)).batch(16)
    history = model.fit(dataset, epochs=1, verbose=0, validation_data=dataset)
    assert len(history.history["loss"]) == len(history.history["val_loss"]) == 1


def test_a_model_created_outside_the_scope_cannot_be_compiled_inside_it():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        with pytest.raises(ValueError, match=r"(?s)sequential\w*/dense\w*/kernel.*was not created in the "
                                             r"scope of .*MirroredStrategy.*strategy.scope"):
            model.compile(optimizer="sgd", loss="mse")
    assert not model.compiled  # nothing changed


def test_a_model_compiled_outside_the_scope_cannot_fit_inside_it():
    model = make_model()
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        for method, call in [("fit", lambda: model.fit(X, Y, verbose=0)),
                             ("evaluate", lambda: model.evaluate(X, Y, verbose=0)),
                             ("predict", lambda: model.predict(X, verbose=0))]:
            with pytest.raises(ValueError, match=rf"model.{method}\(\) was called in the scope "
                                                 r"of .*compiled in no strategy's scope"):
                call()


def test_a_model_of_another_strategy_cannot_fit_in_this_one():
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = make_model()
    with mpidist.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(ValueError, match=r"compiled in the scope of .*MirroredStrategy"):
            model.fit(X, Y, verbose=0)
    model.fit(X, Y, epochs=1, verbose=0)  # outside every scope: under its own strategy


class CustomStep(keras.Sequential):
    def train_step(self, state, data):
        return super().train_step(state, data)


def test_a_custom_train_step_is_refused_with_the_way_that_works():
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = CustomStep([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(NotImplementedError, match=r"CustomStep overrides train_step.*"
                                                   r"compute_loss"):
        model.fit(X, np.zeros((75, 3)), verbose=0)


def test_a_subclassed_model_built_lazily_inside_fit_trains_under_its_strategy():
    class TwoLayers(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(12, activation="relu")
            self.out = keras.layers.Dense(3)

        def call(self, x):
            return self.out(self.hidden(x))

    def build():
        keras.utils.set_random_seed(1)
        model = TwoLayers()
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        return model

    reference = build()
    reference.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = build()
    model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(got, want, atol=2e-6)


def test_other_ranks_write_their_callbacks_files_in_a_temporary_directory(tmp_path):
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "w.{epoch:02d}.weights.h5"),
                                                 save_weights_only=True, monitor="val_loss")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=3)
    logger = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    stop = keras.callbacks.EarlyStopping(patience=2)
    mine, directory = callbacks_for_rank([checkpoint, backup, logger, stop], is_chief=False)
    try:
        assert mine[3] is stop  # deciders are shared, writers are copies
        assert mine[0].filepath.startswith(directory)
        assert mine[0].filepath.endswith("w.{epoch:02d}.weights.h5")
        assert (mine[0].monitor, mine[0].save_weights_only) == ("val_loss", True)
        assert mine[1].backup_dir.startswith(directory) and mine[1].save_freq == 3
        assert mine[2].filename.startswith(directory)
        assert checkpoint.filepath == str(tmp_path / "w.{epoch:02d}.weights.h5")  # unchanged
        assert backup.backup_dir == str(tmp_path / "backup")
    finally:
        remove_directory(directory)
    assert not os.path.exists(directory)
    assert callbacks_for_rank([checkpoint], is_chief=True) == ([checkpoint], None)


def test_a_backend_other_than_jax_is_named_with_the_fix():
    program = (
        "import os; os.environ['KERAS_BACKEND'] = 'numpy'\n"
        "import keras, mpidist\n"
        "with mpidist.MirroredStrategy(['/cpu:0', '/cpu:1']).scope():\n"
        "    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
        "    model.compile(optimizer='sgd', loss='mse')\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert "ValueError: mpidist distributes Keras models on the JAX backend, but Keras runs " \
           "on 'numpy'" in out.stderr
    assert "KERAS_BACKEND=jax" in out.stderr


def test_importing_mpidist_first_makes_jax_the_backend_unless_the_user_chose_one(tmp_path):
    program = "import mpidist, keras; print(keras.backend.backend())"
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["KERAS_HOME"] = str(tmp_path)  # Keras writes "tensorflow" here at its first import
    for _ in range(2):  # a fresh config, then the one Keras wrote
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[-1] == "jax"
    (tmp_path / "keras.json").write_text('{"backend": "numpy"}')  # the user's own choice
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.stdout.split()[-1] == "numpy"


def test_parameter_server_strategy_refuses_a_keras_model_naming_the_supported_way():
    from ps_cluster import ps_job

    with ps_job(num_ps=1, num_workers=1) as (strategy, _):
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
            with pytest.raises(NotImplementedError, match=r"ParameterServerStrategy is not "
                                                          r"supported.*MultiWorkerMirrored"):
                model.compile(optimizer="sgd", loss="mse")


def test_per_replica_batches_where_global_ones_go_are_named():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = make_model()
    distributed = strategy.experimental_distribute_dataset(
        Dataset.from_tensor_slices((X, Y)).batch(16))
    with pytest.raises(mpidist.errors.InvalidArgumentError,
                       match="iterator over a distributed dataset.*Pass the DistributedDataset"):
        model.fit(iter(distributed), epochs=1, verbose=0)

    def per_replica_batches():  # what iterating a distributed dataset by hand gives
        for x, y in distributed:
            yield x, y

    # Keras inspects the first element itself: mpidist's PerReplica names the misuse there.
    with pytest.raises(ValueError, match=r"PerReplica object while not inside a replica "
                                         r"context"):
        model.fit(per_replica_batches(), epochs=1, steps_per_epoch=2, verbose=0)
    model.fit(distributed, epochs=1, verbose=0)  # the DistributedDataset itself is read
