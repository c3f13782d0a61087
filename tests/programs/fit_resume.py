"""Trains the digits MLP with BackupAndRestore; with KILL_AT_STEP=k the process (every rank)
dies abruptly after global step k, as a job killed by the scheduler would. Writes the final
weights (chief) to OUT as .npy files. Used by tests/test_fit_resume.py.

    python fit_resume.py OUT BACKUP_DIR [--multi-worker] [--replicas R] [--save-freq N]
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import digits_mlp

import mpidist


class KillAt(mpidist.callbacks.Callback):
    def __init__(self, step):
        self.step = step
        self.done = 0

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.done == self.step:
            sys.stdout.flush()
            os._exit(17)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("backup_dir")
    parser.add_argument("--strategy", default="mirrored")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--save-freq", default="5")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    train, _ = digits_mlp.load_digits()
    strategy = digits_mlp.make_strategy(args.strategy, args.replicas)
    with strategy.scope():
        model = digits_mlp.MLP()
        optimizer = mpidist.optimizers.Adam(0.01)
        accuracy = mpidist.metrics.SparseCategoricalAccuracy()
    callbacks = [mpidist.callbacks.BackupAndRestore(args.backup_dir, save_freq=save_freq)]
    if os.environ.get("KILL_AT_STEP"):
        callbacks.append(KillAt(int(os.environ["KILL_AT_STEP"])))
    history = mpidist.fit(model, digits_mlp.train_dataset(*train), epochs=args.epochs,
                          optimizer=optimizer, strategy=strategy, metrics=[accuracy],
                          callbacks=callbacks, verbose=0)
    if strategy.extended.should_checkpoint:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for i, v in enumerate(model.trainable_variables):
            np.save(out / f"w{i}.npy", np.asarray(v.numpy()))
        np.save(out / "iterations.npy", np.asarray(optimizer.iterations.numpy()))
        np.save(out / "loss.npy", np.asarray(history.history["loss"]))
        np.save(out / "accuracy.npy", np.asarray(history.history["sparse_categorical_accuracy"]))


if __name__ == "__main__":
    main()
