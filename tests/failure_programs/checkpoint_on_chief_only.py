"""The Horovod habit ``if rank == 0: checkpoint.save(path)`` under MultiWorkerMirroredStrategy:
every rank must get the collective-mismatch error naming the checkpoint call (not a bare
barrier), no file may be written, and the job must go on (saving on every rank then works).

Usage: ``checkpoint_on_chief_only.py DIRECTORY WHAT`` where WHAT is
  save    -- rank 0 calls Checkpoint.save, the others go on to the next training step;
  manager -- rank 0 calls CheckpointManager.save, the others go on to the next step.
"""

import os
import sys

import numpy as np
from _common import make_strategy, say, train_step

import mpidist
from mpidist.train import Checkpoint, CheckpointManager

directory, what = sys.argv[1], sys.argv[2]
strategy, rank, size = make_strategy(timeout_seconds=20)
train_step(strategy)
with strategy.scope():
    w = mpidist.Variable(np.arange(3.0))
checkpoint = Checkpoint(model={"w": w})
manager = CheckpointManager(checkpoint, directory, max_to_keep=2)
prefix = os.path.join(directory, "ck")
try:
    if rank == 0:
        manager.save() if what == "manager" else checkpoint.save(prefix)
    else:
        train_step(strategy)
    say(f"rank {rank}: chief-only save succeeded (must not happen)")
except mpidist.errors.InvalidArgumentError as err:
    say(f"caught on rank {rank}: {type(err).__name__}: {err}")
train_step(strategy)  # every rank has caught it: nothing was written
say(f"rank {rank}: files after the error: {sorted(os.listdir(directory))}, "
    f"save_counter {int(checkpoint.save_counter.numpy())}")
path = manager.save() if what == "manager" else checkpoint.save(prefix)
say(f"rank {rank}: saved on every rank: {os.path.basename(path)}, "
    f"files {sorted(os.listdir(directory))}")
