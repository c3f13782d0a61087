"""The last rank sleeps before a collective that the others enter with a short timeout.

Usage: ``timeout.py TIMEOUT SLEEP MODE``. The others must raise DeadlineExceededError after
about TIMEOUT seconds naming the sleeping rank, and the job must end long before the sleep is
over. MODE ``uncaught``: the error propagates (the excepthook ends the job). MODE ``caught``:
each waiting rank catches it and prints it with the time it took, checks that the broken
communicator refuses the next collective, waits for the other waiting ranks (a plain mpi4py
barrier, so that every one of them gets to print) and exits normally; the communicator then
ends the job at exit.
"""

import sys
import time

from _common import arg, make_strategy, now, say, train_step
from mpi4py import MPI

import mpidist

timeout, sleep, mode = arg(1, 1.0), arg(2, 6.0), sys.argv[3]
strategy, rank, size = make_strategy(timeout)
last = size - 1
waiting = MPI.COMM_WORLD.Split(MPI.UNDEFINED if rank == last else 0, rank)
train_step(strategy)
if rank == last:
    say(f"rank {rank}: sleeping {sleep:g} s")
    time.sleep(sleep)
    say(f"rank {rank}: woke up (the job should have ended already)")
    train_step(strategy)
    sys.exit(0)
if mode == "uncaught":
    train_step(strategy)
start = now()
try:
    train_step(strategy)
    say(f"rank {rank}: collective completed (must not happen)")
except mpidist.errors.DeadlineExceededError as err:
    say(f"rank {rank}: DeadlineExceededError after {now() - start:.2f} s: {err}")
try:
    train_step(strategy)
except mpidist.errors.UnavailableError as err:
    say(f"rank {rank}: next collective: UnavailableError: {err}")
waiting.Barrier()
say(f"rank {rank}: exiting")
