"""MultiWorkerMirroredStrategy training in which one rank dies of a real fault mid-training.

Usage: ``real_fault.py VICTIM HOW [STEPS]``: every rank runs STEPS (default 6) steps of one
all-reduce each; at step 2 rank VICTIM dies by HOW, with nothing caught and no mpidist code
told:

- ``SIGKILL``: ``os.kill(os.getpid(), SIGKILL)``, what the kernel's OOM killer does;
- ``SIGSEGV``: a real segmentation fault, reading address 0 (``ctypes.string_at(0)``);
- ``exit3``: ``os._exit(3)``, a process that leaves without running any handler;
- ``none``: nobody dies (the clean run the others are compared with).

The survivors are then waiting for the victim in step 2's all-reduce. Each rank prints
``rank R: step S sum ...`` after each step and ``rank R: reached the end`` at the end.
"""

import ctypes
import os
import signal
import sys

from _common import make_strategy, say, train_step

victim, how = int(sys.argv[1]), sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
strategy, rank, size = make_strategy()


def die():
    if how == "exit3":
        os._exit(3)
    if how == "SIGSEGV":
        ctypes.string_at(0)  # a read of address 0: the kernel sends SIGSEGV
    os.kill(os.getpid(), getattr(signal, how))
    raise SystemExit(f"rank {rank} survived {how}")  # must not happen


for step in range(steps):
    if step == 2 and rank == victim and how != "none":
        die()
    total = train_step(strategy)
    say(f"rank {rank}: step {step} sum {total.tolist()}")
say(f"rank {rank}: reached the end")
