"""The last rank is frozen (SIGSTOP) inside a collective, after it entered it: the others'
deadline must name it, though every rank entered the collective.

Usage: ``freeze.py TIMEOUT``. After a first step, the last rank enters the second step's
collective at once and stops itself 0.5 s later (a timer thread sends SIGSTOP: the process is
then frozen inside the collective, as under Ctrl-Z, a debugger or a hung node); the others
enter 1 s later. Their collective times out after TIMEOUT seconds; each prints its error in one
line, rank 0 sends SIGCONT to the frozen rank (so that the job can end), and the error ends the
job.
"""

import os
import signal
import threading
import time

from _common import arg, make_strategy, say, train_step
from mpi4py import MPI

import mpidist

timeout = arg(1, 3.0)
strategy, rank, size = make_strategy(timeout)
pids = MPI.COMM_WORLD.allgather(os.getpid())
train_step(strategy)
say(f"rank {rank}: first step done")
victim = size - 1
if rank == victim:
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    train_step(strategy)
    say(f"rank {rank}: second step done (must not happen before the others failed)")
else:
    time.sleep(1.0)
    try:
        train_step(strategy)
    except mpidist.errors.MpidistError as err:
        say(f"rank {rank}: {type(err).__name__}: {err}")
        if rank == 0:
            os.kill(pids[victim], signal.SIGCONT)
        raise
    say(f"rank {rank}: second step done (must not happen)")
say(f"rank {rank}: reached the end")
