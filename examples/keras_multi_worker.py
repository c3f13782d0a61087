"""TensorFlow's "Multi-worker training with Keras" tutorial, ported: ``tf.distribute`` renamed
to ``mpidist``, Keras 3 on its JAX backend, MNIST swapped for scikit-learn's 8x8 digits (no
download), ``tf.data`` for ``mpidist.data``. Each MPI rank is a worker; rank 0 is the chief.

    mpiexec -n 2 python examples/keras_multi_worker.py            # 2 workers
    python examples/keras_multi_worker.py                         # 1 worker
    srun --mpi=pmi2 -n 4 python examples/keras_multi_worker.py    # under Slurm

The model is built and compiled in ``strategy.scope()``; ``model.fit`` splits each global batch
(64 rows per worker, as in the tutorial) across the workers and sums their gradients; BackupAndRestore and
ModelCheckpoint write on the chief only; EarlyStopping decides the same on every worker; the
chief saves a ``.keras`` file that plain Keras loads. The chief prints one JSON line.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras is imported

import argparse
import json
import tempfile

import keras
import numpy as np

import mpidist
from mpidist.data import Dataset


def digits(seed=0):
    """1797 8x8 digit images in [0, 1]; a fixed 1500 / 297 split (the tutorial's MNIST)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype("float32")
    y = data.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def digits_dataset(global_batch_size):
    (x_train, y_train), _ = digits()
    return Dataset.from_tensor_slices((x_train, y_train)).shuffle(1500, seed=1).repeat().batch(
        global_batch_size)


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.Input(shape=(8, 8)),
        keras.layers.Reshape(target_shape=(8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.05),
                  metrics=["accuracy"])
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=70)
    parser.add_argument("--dir", help="where the chief writes backups, checkpoints and the "
                                      "model (default: a new temporary directory)")
    args = parser.parse_args(argv)

    strategy = mpidist.MultiWorkerMirroredStrategy()
    per_worker_batch_size = 64
    global_batch_size = per_worker_batch_size * strategy.num_replicas_in_sync
    multi_worker_dataset = digits_dataset(global_batch_size)

    keras.utils.set_random_seed(0)  # the chief's initial weights are every worker's
    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_and_compile_cnn_model()

    is_chief = strategy.extended.should_checkpoint
    comm = strategy.extended.communicator
    directory = comm.all_gather_object(args.dir or (tempfile.mkdtemp() if is_chief else None))[0]
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir=os.path.join(directory, "backup")),
        keras.callbacks.ModelCheckpoint(os.path.join(directory, "ckpt",
                                                     "weights.{epoch:02d}.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="loss", patience=1),
    ]
    history = multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs,
                                     steps_per_epoch=args.steps_per_epoch, callbacks=callbacks,
                                     verbose=2 if is_chief else 0)

    _, (x_test, y_test) = digits()
    loss, accuracy = multi_worker_model.evaluate(x_test, y_test, batch_size=global_batch_size,
                                                 verbose=0)
    model_path = os.path.join(directory, "model.keras")
    if is_chief:
        multi_worker_model.save(model_path)
        print(json.dumps({"workers": comm.size, "epochs": len(history.epoch),
                          "loss": history.history["loss"], "test_loss": loss,
                          "test_accuracy": accuracy, "model": model_path}), flush=True)
    return history, accuracy


if __name__ == "__main__":
    main()
