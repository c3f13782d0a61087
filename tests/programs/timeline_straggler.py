"""Runs known collectives on the world communicator; the last rank sleeps before each one, so
it arrives last. Used by tests/test_timeline.py with MPIDIST_TIMELINE set."""

import time

import numpy as np

from mpidist.comm.communicator import world_communicator

comm = world_communicator()
buf = np.ones(4096, dtype=np.float32)
for _step in range(5):
    if comm.rank == comm.size - 1:
        time.sleep(0.05)
    comm.all_reduce(buf)
comm.broadcast(np.zeros(10, dtype=np.int64))
comm.barrier()
print(f"rank {comm.rank} done", flush=True)
