"""slurm/train.py's training (the digits MLP under ``fit``, a ``BackupAndRestore`` backup every
``--save-freq`` steps) in which one rank calls ``MPI_Abort`` after step ``--abort-at``: what an
MPI library's fatal error does to a job step. The launcher then kills every rank of the step
at once, guards included, so nothing on the node gets to clear the MPI library's shared memory
or to report that the program finished.

    srun -n 2 python -m mpidist.guard -- python abort_in_step.py --backup-dir DIR --abort-at 12
"""

import argparse
import sys
import time
from pathlib import Path

from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "slurm"))

import train  # noqa: E402 - slurm/train.py: its model, data and backup callback

import mpidist  # noqa: E402


class AbortAt(mpidist.callbacks.Callback):
    def __init__(self, step, rank, seconds):
        self.step, self.rank, self.seconds, self.done = step, rank, seconds, 0

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        time.sleep(self.seconds)
        if self.done == self.step and MPI.COMM_WORLD.rank == self.rank:
            print(f"abort_in_step.py: rank {self.rank} calls MPI_Abort after step {self.step}",
                  flush=True)
            MPI.COMM_WORLD.Abort(3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backup-dir", default=None)
    parser.add_argument("--save-freq", type=int, default=5)
    parser.add_argument("--abort-at", type=int, default=12)
    parser.add_argument("--abort-rank", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    backup = train.BackupAndRequeue(args.backup_dir or train.default_backup_dir(), args.save_freq)
    strategy = train.make_strategy(0, "mpi")
    (x, y), _ = train.digits_mlp.load_digits()
    with strategy.scope():
        model = train.digits_mlp.MLP()
        optimizer = mpidist.optimizers.SGD(0.1, momentum=0.9)
    mpidist.fit(model, train.digits_mlp.train_dataset(x, y), epochs=5, optimizer=optimizer,
                strategy=strategy, verbose=0,
                callbacks=[backup, AbortAt(args.abort_at, args.abort_rank, args.step_seconds)])
    print("abort_in_step.py: training ended without the abort", flush=True)


if __name__ == "__main__":
    main()
