"""Ranks all-reduce tensors that do not match; every rank must get the same clear
InvalidArgumentError, catch it, and carry on with a correct collective.

Usage: ``mismatch.py WHAT [uncaught]`` (``uncaught``: let the error end the job) where WHAT is
  shape   -- rank 1 reduces shape (4,), the others (5,) (one replica per rank, strategy.reduce);
  dtype   -- rank 1 reduces float32, the others float64;
  replica -- two CPU replicas per rank, ReplicaContext.all_reduce inside strategy.run, rank 1's
             replicas hold length 4, the others' length 5.
"""

import sys

import numpy as np
from _common import make_strategy, say, train_step

import mpidist

what = sys.argv[1]
devices = ["/cpu:0", "/cpu:1"] if what == "replica" else None
strategy, rank, size = make_strategy(local_devices=devices)
train_step(strategy)
length = 4 if (rank == 1 and what != "dtype") else 5
dtype = np.float32 if (rank == 1 and what == "dtype") else np.float64
if sys.argv[2:] == ["uncaught"]:
    train_step(strategy, length, dtype)
try:
    if what == "replica":
        def step():
            ctx = mpidist.get_replica_context()
            return ctx.all_reduce("SUM", np.ones(length, dtype=dtype))

        strategy.run(step)
    else:
        train_step(strategy, length, dtype)
    say(f"rank {rank}: mismatched collective succeeded (must not happen)")
except mpidist.errors.InvalidArgumentError as err:
    say(f"caught on rank {rank}: {type(err).__name__}: {err}")
# The error left the ranks in step: a correct collective still works.
total = train_step(strategy)
say(f"rank {rank}: after the error, sum = {total.tolist()}")
