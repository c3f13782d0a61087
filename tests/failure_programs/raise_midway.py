"""One rank raises in the middle of training while the others wait in a collective with no
timeout: the uncaught exception must end the whole job, with that rank's traceback.

Usage: ``raise_midway.py RANK`` (the rank that raises).
"""

from _common import arg, make_strategy, say, train_step

bad = int(arg(1, 1))
strategy, rank, size = make_strategy()
for step in range(3):
    if step == 1 and rank == bad:
        raise RuntimeError("boom on purpose")
    train_step(strategy)
    say(f"rank {rank}: step {step} done")
say(f"rank {rank}: reached the end (must not happen)")
