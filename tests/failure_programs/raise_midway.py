"""One rank raises in the middle of training while the others wait in a collective with no
timeout: the uncaught exception must end the whole job, with that rank's traceback.

Usage: ``raise_midway.py RANK WHERE``: RANK raises at step 1, WHERE is ``loop`` (in the
training loop, between steps) or ``replica`` (inside the function given to strategy.run).
"""

import sys

import numpy as np
from _common import arg, make_strategy, say

bad, where = int(arg(1, 1)), sys.argv[2]
strategy, rank, size = make_strategy()


def replica_fn(step):
    if where == "replica" and step == 1 and rank == bad:
        raise RuntimeError("boom on purpose")
    return np.ones(3)


for step in range(3):
    if where == "loop" and step == 1 and rank == bad:
        raise RuntimeError("boom on purpose")
    strategy.reduce("SUM", strategy.run(replica_fn, args=(step,)), axis=None)
    say(f"rank {rank}: step {step} done")
say(f"rank {rank}: reached the end (must not happen)")
