"""The last rank skips one collective that every other rank issues, then goes on to the end.

Usage: ``skip.py TIMEOUT SLEEP`` (TIMEOUT 0: no timeout). With a timeout the skipping rank
sleeps SLEEP seconds before finishing, so the others' collective times out naming it; without
one it goes straight to the end, where its at-exit ``finalize()`` meets the others' collective
and must be reported as a mismatch. Either way the job must die quickly.

The other ranks print the error they get in one line before letting it propagate (the
excepthook then ends the job), so the test can read it whole.
"""

import time

from _common import arg, make_strategy, say, train_step

import mpidist

timeout, sleep = arg(1, 0.0) or None, arg(2, 0.0)
strategy, rank, size = make_strategy(timeout)
train_step(strategy)
say(f"rank {rank}: first step done")
if rank == size - 1:
    say(f"rank {rank}: skipping the second step")
    time.sleep(sleep)
else:
    try:
        train_step(strategy)
    except mpidist.errors.MpidistError as err:
        say(f"rank {rank}: {type(err).__name__}: {err}")
        raise
    say(f"rank {rank}: second step done (must not happen)")
say(f"rank {rank}: reached the end")
