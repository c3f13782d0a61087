"""A long MultiWorkerMirroredStrategy fit with BackupAndRestore, to be stopped from outside.

Usage: ``stop_fit.py BACKUP_DIR``. Each rank prints ``rank R: training`` once the first backup
is written (step 5), then trains on (a step every 20 ms) until a signal stops it: Ctrl-C
(SIGINT to every rank) or SIGTERM to one rank. Each stopped rank must print one line saying
what was saved and how to resume, not a traceback.
"""

import sys
import time

import numpy as np
from _common import make_strategy, say

import mpidist
from mpidist.data import Dataset

backup_dir = sys.argv[1]
strategy, rank, size = make_strategy()


class Linear:
    def __init__(self):
        self.w = mpidist.Variable(np.zeros((2, 1)), name="w")
        self.trainable_variables = [self.w]

    def loss_and_gradients(self, x, y):
        err = x @ np.asarray(self.w) - y.reshape(-1, 1)
        return err[:, 0] ** 2, [2 * x.T @ err / max(len(x), 1)]


class Pace(mpidist.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 5:
            say(f"rank {rank}: training")
        time.sleep(0.02)


with strategy.scope():
    model = Linear()
    optimizer = mpidist.optimizers.SGD(0.01)
x = np.random.default_rng(0).standard_normal((64, 2))
data = Dataset.from_tensor_slices((x, x @ np.array([1.0, -2.0]))).batch(8).repeat()
mpidist.fit(model, data, epochs=1000, steps_per_epoch=100, optimizer=optimizer,
            strategy=strategy, verbose=0,
            callbacks=[mpidist.callbacks.BackupAndRestore(backup_dir, save_freq=5), Pace()])
say(f"rank {rank}: reached the end (must not happen)")
