"""A MultiWorkerMirroredStrategy job at scale, in three phases (for 16 ranks on 4 simulated
nodes, tests/test_scale_sim.py).

Usage: ``scale_sim.py VICTIM [STEPS]``:

1. exact all-reduce: STEPS (default 3) steps in which rank r contributes r + 1 + step in
   float64 and int64; every rank prints ``rank R: step S sums F I``, which must be exactly
   size * (size + 1) / 2 + size * step on every rank;
2. a collective mismatch: rank 1 reduces a shape (4,) tensor, the others shape (5,); every
   rank catches the InvalidArgumentError and prints ``rank R: mismatch caught: <message>``;
   one correct step follows (``rank R: after the mismatch, sum F``);
3. a death: rank VICTIM kills itself with SIGKILL; the others enter the next all-reduce and
   wait for it (the job must end by itself, with a report naming VICTIM).
"""

import os
import signal
import sys

import numpy as np
from _common import make_strategy, say, train_step

import mpidist

victim = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
strategy, rank, size = make_strategy()

for step in range(steps):
    sums = []
    for dtype in (np.float64, np.int64):
        per_replica = strategy.run(lambda d=dtype: np.full(3, rank + 1 + step, dtype=d))
        sums.append(strategy.reduce("SUM", per_replica, axis=None))
    if not all((s == s[0]).all() for s in sums):
        say(f"rank {rank}: step {step} uneven sums {[s.tolist() for s in sums]}")
    say(f"rank {rank}: step {step} sums {float(sums[0][0])!r} {int(sums[1][0])}")

length = 4 if rank == 1 else 5
try:
    train_step(strategy, length)
    say(f"rank {rank}: mismatched collective succeeded (must not happen)")
except mpidist.errors.InvalidArgumentError as err:
    say(f"rank {rank}: mismatch caught: {err}")
say(f"rank {rank}: after the mismatch, sum {float(train_step(strategy)[0])!r}")

if rank == victim:
    os.kill(os.getpid(), signal.SIGKILL)
train_step(strategy)
say(f"rank {rank}: passed the dead rank's collective (must not happen)")
