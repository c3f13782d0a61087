"""One rank dies without a word (os._exit, or a signal) while the others train.

Usage: ``die.py RANK HOW WHERE``: RANK dies at step 2; HOW is ``exit3`` (os._exit(3)),
``SIGKILL``, ``SIGSEGV`` or ``SIGTERM`` (sent to itself), or ``none`` (nobody dies: a clean
run); WHERE is ``between`` (after step 1's collectives, in the training loop) or ``inside``
(in step 2's all-reduce, waiting for a peer that sleeps: a helper thread kills the rank there).

Each step is one ``strategy.reduce``, one all-reduce: after the strategy's set-up collective
(#1), step k's all-reduce is collective #k+2.
"""

import os
import signal
import sys
import threading
import time

import numpy as np
from _common import make_strategy, say

victim, how, where = int(sys.argv[1]), sys.argv[2], sys.argv[3]
strategy, rank, size = make_strategy()


def die():
    if how == "exit3":
        os._exit(3)
    os.kill(os.getpid(), getattr(signal, how))
    time.sleep(10)  # a handled signal would come back here: must not happen


for step in range(4):
    if step == 2 and rank == victim and how != "none":
        if where == "between":
            die()
        threading.Timer(0.5, die).start()  # fires while this rank waits in the all-reduce
    if step == 2 and where == "inside" and rank != victim:
        time.sleep(3)  # the victim waits for us inside step 2's all-reduce, and dies there
    total = strategy.reduce("SUM", strategy.run(lambda: np.ones(3)), axis=None)
    say(f"rank {rank}: step {step} sum {total.tolist()}")
say(f"rank {rank}: reached the end")
