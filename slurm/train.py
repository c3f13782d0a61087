"""The program the batch scripts in slurm/ run by default: the digits MLP of
examples/digits_mlp.py, trained with MultiWorkerMirroredStrategy under ``mpidist.fit`` with
``BackupAndRestore``, so that a job stopped before its time limit and requeued resumes where it
stopped and ends with the weights of an uninterrupted run.

    srun --mpi=pmi2 -n 2 python slurm/train.py --backup-dir backups/run1
    mpiexec -n 2 python slurm/train.py --backup-dir backups/run1      # the same, outside Slurm

Each rank drives one device: its GPU (``/gpu:<node-local rank % visible GPUs>``, mpidist's
default) when GPUs are visible, else one CPU device (``--replicas R``: R CPU replicas per rank).

Requeue protocol (see docs/slurm.md): on SIGUSR1 (which the batch script forwards from Slurm's
``--signal=B:USR1@<seconds>``) the ranks agree at the end of the current step, back up the
training state, and every rank exits with status 75 (EX_TEMPFAIL); the batch script then runs
``scontrol requeue``. The requeued job (same job id, same backup directory) restores the
backup and trains on. A backup is also written every ``--save-freq`` steps, for jobs that are
killed without warning (node failure, preemption). The backup is deleted when training ends.

The chief prints the progress (one line per epoch), ``resumed from the backup at step K``
after a restart, and at the end the test accuracy (``--json``: one JSON line with the accuracy,
the replica count, the steps, the step the run resumed from, and the final weights).
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import digits_mlp  # noqa: E402 - the examples folder is not a package

import mpidist  # noqa: E402

REQUEUE_EXIT = 75  # EX_TEMPFAIL: backed up, stopped early, run me again


class Preempted(Exception):
    """Raised on every rank, after the backup, to leave ``fit`` without its end-of-training
    work (which would delete the backup)."""


class BackupAndRequeue(mpidist.callbacks.BackupAndRestore):
    """``BackupAndRestore`` that also backs up and stops when a signal asks it to.

    The signal may reach the ranks at different steps, so after every step the ranks add up
    their flags (one tiny all-reduce): all of them stop after the same step, and the backup,
    which is collective, is written by all of them together.
    """

    def __init__(self, backup_dir, save_freq, signum=signal.SIGUSR1):
        super().__init__(backup_dir, save_freq=save_freq)
        self.requested = False
        self.resumed_from = 0
        self.stopped_at = None
        self.signum = signum
        signal.signal(signum, self._on_signal)  # early: USR1's default action ends the process

    def _on_signal(self, signum, frame):
        del frame
        self.requested = True

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # restores the latest backup, if there is one
        self.resumed_from = int(self.optimizer.iterations.numpy())
        if self.resumed_from and self.strategy.extended.should_checkpoint:  # the chief
            print(f"train.py: resumed from the backup at step {self.resumed_from} in "
                  f"{self.backup_dir}", flush=True)

    def on_train_end(self, logs=None):
        # Training is done and the backup is about to go: a signal from now on must not stop
        # or kill the program (a requeue would train again from scratch). Ignored, not just
        # handled: CPython gives a handled signal its default action back while it shuts down,
        # and USR1's default ends the process.
        signal.signal(self.signum, signal.SIG_IGN)
        super().on_train_end(logs)  # deletes the backup

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)  # the regular backup every save_freq steps
        flag = np.float64(1.0 if self.requested else 0.0)
        if float(np.asarray(self.strategy.reduce("SUM", flag, axis=None))) == 0.0:
            return
        step = int(self.optimizer.iterations.numpy())
        if self.save_freq == "epoch" or step % self.save_freq != 0:  # not backed up just now
            self.backup_now(batch)
        self.stopped_at = step
        raise Preempted(step)


class SlowDown(mpidist.callbacks.Callback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def make_strategy(replicas, resolver):
    if resolver == "slurm":
        return mpidist.MultiWorkerMirroredStrategy(mpidist.cluster_resolver.SlurmClusterResolver())
    if replicas:
        devices = [f"/cpu:{i}" for i in range(replicas)]
        return mpidist.MultiWorkerMirroredStrategy(
            mpidist.cluster_resolver.MPIClusterResolver(local_devices=devices))
    return mpidist.MultiWorkerMirroredStrategy()  # one GPU per rank, or /cpu:0


def default_backup_dir():
    """$MPIDIST_BACKUP_DIR (the batch scripts set it), else one per job: an array's tasks
    (one job each, running the same command) by array and task id, as ``scontrol`` names them
    (``JOBID_TASK``), so a requeued task resumes its own backup, never another task's."""
    name = os.environ.get("SLURM_JOB_NAME", "mpidist")
    job = os.environ.get("SLURM_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if task is not None:
        job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', job)}_{task}"
    fallback = f"backups/{name}-{job}" if job else "backups/local"
    return os.environ.get("MPIDIST_BACKUP_DIR") or fallback


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backup-dir", default=None,
                        help="where the training state is backed up (default: $MPIDIST_BACKUP_DIR, "
                             "else backups/<job name>-<job id>, or -<array job id>_<task id> in "
                             "an array); on a filesystem every node sees")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--save-freq", default="20",
                        help="back up every N steps, or 'epoch' (default 20)")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--replicas", type=int, default=0,
                        help="CPU replicas per rank (default 0: mpidist's choice, one GPU per rank "
                             "or /cpu:0)")
    parser.add_argument("--resolver", choices=["mpi", "slurm"], default="mpi",
                        help="the cluster resolver: MPIClusterResolver (default) or "
                             "SlurmClusterResolver (under srun only)")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep this long after every step: a slow job, to try the requeue "
                             "path by hand (the tests use it too)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON line (chief only)")
    args = parser.parse_args(argv)
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)

    backup = BackupAndRequeue(args.backup_dir or default_backup_dir(), save_freq)
    callbacks = [backup] + ([SlowDown(args.step_seconds)] if args.step_seconds > 0 else [])
    strategy = make_strategy(args.replicas, args.resolver)
    chief = strategy.extended.should_checkpoint  # rank 0 of the job
    (x, y), test = digits_mlp.load_digits()
    with strategy.scope():
        model = digits_mlp.MLP()
        optimizer = mpidist.optimizers.SGD(args.learning_rate, momentum=0.9)
        accuracy = mpidist.metrics.SparseCategoricalAccuracy()
    try:
        mpidist.fit(model, digits_mlp.train_dataset(x, y), epochs=args.epochs,
                    optimizer=optimizer, strategy=strategy, metrics=[accuracy],
                    callbacks=callbacks, verbose=0 if args.json else 2)
    except Preempted:
        if chief:
            print(f"train.py: signal received: backed up at step {backup.stopped_at} in "
                  f"{backup.backup_dir}; exiting with {REQUEUE_EXIT} to be requeued", flush=True)
        sys.exit(REQUEUE_EXIT)
    except Exception as err:
        # The reason in the job's output log too (the traceback goes to the error log), e.g.
        # another live run of the same job holding the backup directory.
        if chief:
            print(f"train.py: training stopped: {type(err).__name__}: {err}", flush=True)
        raise
    test_logs = mpidist.evaluate(model, mpidist.data.Dataset.from_tensor_slices(test).batch(
        digits_mlp.GLOBAL_BATCH), strategy=strategy, metrics=[accuracy])
    if not chief:
        return
    steps = int(optimizer.iterations.numpy())
    result = test_logs["sparse_categorical_accuracy"]
    if args.json:
        weights = [np.asarray(v.numpy()).tolist() for v in model.trainable_variables]
        print(json.dumps({"accuracy": result, "replicas": strategy.num_replicas_in_sync,
                          "steps": steps, "resumed_from": backup.resumed_from,
                          "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                          "weights": weights}), flush=True)
    else:
        print(f"train.py: {strategy.num_replicas_in_sync} replicas, {steps} steps: "
              f"test accuracy {result:.4f}", flush=True)


if __name__ == "__main__":
    main()
