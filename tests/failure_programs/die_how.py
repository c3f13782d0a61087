"""MultiWorkerMirroredStrategy steps in which rank VICTIM leaves at step 2 by HOW, under a plain
launcher (no guard).

Usage: ``die_how.py VICTIM HOW``: ``exit1`` (``os._exit(1)``: no handler runs), ``SIGTERM``
(sent to itself: the stop line, then the signal's death). Each rank prints ``rank R: step S
sum ...`` after each step.
"""

import os
import signal
import sys
import time

from _common import make_strategy, say, train_step

victim, how = int(sys.argv[1]), sys.argv[2]
strategy, rank, size = make_strategy()
for step in range(6):
    if step == 2 and rank == victim:
        if how == "exit1":
            os._exit(1)
        if how == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    total = train_step(strategy)
    say(f"rank {rank}: step {step} sum {total.tolist()}")
say(f"rank {rank}: reached the end")
