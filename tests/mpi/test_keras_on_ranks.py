"""Keras 3 models under MultiWorkerMirroredStrategy across MPI ranks (run under mpiexec -n 1,
2, 4 by tests/test_mpi_launch.py): TF's multi-worker Keras rules, each checked against one
process training plain Keras on the same global batches."""

import os

os.environ["KERAS_BACKEND"] = "jax"  # before Keras is imported, as docs/keras.md says

import glob

import keras
import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.data import Dataset
from mpidist.errors import InvalidArgumentError

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

# 75 rows in global batches of 16: the last batch (11 rows) splits unevenly on 2 and 4 ranks.
rng = np.random.default_rng(0)
X = rng.normal(size=(75, 6)).astype("float32")
Y = (X @ rng.normal(size=(6, 3))).argmax(axis=1)


def make_model(batch_norm=False, seed=1):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((6,)), keras.layers.Dense(12, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    model = keras.Sequential(layers + [keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def strategy():
    return mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver())


def max_difference(a, b):
    return max(float(np.max(np.abs(u.numpy() - v.numpy())))
               for u, v in zip(a.weights, b.weights))


def same_on_every_rank(value):
    values = comm.allgather(value)
    return all(v == values[0] for v in values)


@pytest.mark.mpi
def test_fit_matches_one_process_on_the_same_global_batches():
    reference = make_model()
    keras.utils.set_random_seed(7)
    expected = reference.fit(X, Y, batch_size=16, epochs=3, validation_data=(X[:30], Y[:30]),
                             verbose=0).history
    with strategy().scope():
        model = make_model(seed=1 + 100 * rank)  # initial weights differ: the chief's win
    keras.utils.set_random_seed(7 + rank)  # so do the shuffles: the chief's must win
    history = model.fit(X, Y, batch_size=16, epochs=3, validation_data=(X[:30], Y[:30]),
                        verbose=0).history
    assert max_difference(model, make_model(seed=1)) > 0.01  # it trained
    assert max_difference(model, reference) < 1e-5
    assert same_on_every_rank(history)  # logs are global: identical everywhere
    for key, values in expected.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(X, Y, verbose=0),
                               reference.evaluate(X, Y, verbose=0), rtol=1e-5)
    predictions = model.predict(X, batch_size=16, verbose=0)
    assert predictions.shape == (75, 3)
    np.testing.assert_allclose(predictions, reference.predict(X, verbose=0), atol=1e-5)


@pytest.mark.mpi
def test_batch_normalization_statistics_agree_and_match_the_same_replicas_in_one_process():
    with strategy().scope():
        model = make_model(batch_norm=True)
    model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    devices = [f"/cpu:{i}" for i in range(size)]
    with mpidist.MirroredStrategy(devices).scope():
        in_process = make_model(batch_norm=True)
    in_process.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    moving = [w.numpy() for w in model.weights if "moving" in w.path]
    assert len(moving) == 2
    assert all(same_on_every_rank(m.tobytes()) for m in moving)
    assert max_difference(model, in_process) < 1e-5


@pytest.mark.mpi
def test_an_mpidist_dataset_of_global_batches_is_sharded_as_tf_does():
    reference = make_model()
    reference.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with strategy().scope():
        model = make_model()
    dataset = Dataset.from_tensor_slices((X, Y)).batch(16)
    model.fit(dataset, epochs=2, verbose=0, validation_data=dataset)
    assert max_difference(model, reference) < 1e-5
    np.testing.assert_allclose(model.evaluate(dataset, verbose=0),
                               reference.evaluate(X, Y, batch_size=16, verbose=0), rtol=1e-5)


@pytest.mark.mpi
def test_callbacks_write_on_the_chief_and_decide_the_same_everywhere(shared_dir):
    with strategy().scope():
        model = make_model()
    checkpoints = os.path.join(shared_dir, "ckpt", "weights.{epoch:02d}.weights.h5")
    log = os.path.join(shared_dir, "log.csv")
    # Patience 0 on a loss that cannot improve past epoch 0's: EarlyStopping must stop every
    # rank after epoch 1; a rank deciding alone would hang or diverge.
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    history = model.fit(X, Y, batch_size=16, epochs=5, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(checkpoints, save_weights_only=True),
        keras.callbacks.CSVLogger(log), stop])
    assert history.epoch == [0, 1]
    comm.Barrier()
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shared_dir, "ckpt", "*")))
    assert names == ["weights.01.weights.h5", "weights.02.weights.h5"]
    with open(log) as f:
        assert len(f.read().strip().splitlines()) == 3  # header + 2 epochs, written once
    saved = os.path.join(shared_dir, "model.keras")
    model.save(saved)  # on every rank, as a TF user might: the chief alone writes it
    comm.Barrier()
    assert sorted(os.listdir(shared_dir)) == ["ckpt", "log.csv", "model.keras"]
    loaded = keras.saving.load_model(saved)  # plain Keras: no strategy
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0),
                               atol=1e-6)


@pytest.mark.mpi
def test_different_arrays_on_the_ranks_fail_on_every_rank():
    with strategy().scope():
        model = make_model()
    if size == 1:
        pytest.skip("one rank has nothing to differ from")
    with pytest.raises(InvalidArgumentError, match=r"first global batch of rank\(s\) \[1"):
        model.fit(X + rank, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)


class StopOnLastRank(keras.callbacks.Callback):
    def __init__(self, at_batch=None):
        super().__init__()
        self.at_batch = at_batch

    def on_train_batch_end(self, batch, logs=None):
        if self.at_batch == batch and rank == size - 1:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self.at_batch is None and epoch == 1 and rank == size - 1:
            self.model.stop_training = True


@pytest.mark.mpi
def test_a_stop_asked_on_one_rank_at_an_epoch_end_stops_every_rank():
    with strategy().scope():
        model = make_model()
    history = model.fit(X, Y, batch_size=16, epochs=5, verbose=0, callbacks=[StopOnLastRank()])
    assert history.epoch == [0, 1]
    assert same_on_every_rank(model.weights[0].numpy().tobytes())


@pytest.mark.mpi
def test_a_stop_asked_mid_epoch_on_one_rank_fails_on_every_rank_instead_of_hanging():
    if size == 1:
        pytest.skip("one rank always agrees with itself")
    with strategy().scope():
        model = make_model()
    with pytest.raises(InvalidArgumentError, match="Ranks issued different collectives"):
        model.fit(X, Y, batch_size=16, epochs=2, verbose=0, callbacks=[StopOnLastRank(1)])


class InterruptAfter(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt  # the job is killed after this epoch's backup


@pytest.mark.mpi
def test_backup_and_restore_resumes_every_rank_from_the_chiefs_backup(shared_dir):
    reference = make_model()
    reference.fit(X, Y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    backup = os.path.join(shared_dir, "backup")
    with strategy().scope():
        model = make_model()
    with pytest.raises(KeyboardInterrupt):
        model.fit(X, Y, batch_size=16, epochs=4, shuffle=False, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup), InterruptAfter(1)])
    comm.Barrier()
    with strategy().scope():
        resumed = make_model(seed=5 + rank)  # a new process would start from other weights
    history = resumed.fit(X, Y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                          callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert history.epoch == [2, 3]  # from the chief's backup of epoch 1, on every rank
    assert max_difference(resumed, reference) < 1e-5
    comm.Barrier()
    assert not os.path.exists(backup)  # removed by the chief at the end
