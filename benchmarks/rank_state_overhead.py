"""Cost of the rank-state hooks (mpidist.comm.rank_state) per collective.

    python benchmarks/rank_state_overhead.py                       # one rank
    mpidist run -n 2 -- python benchmarks/rank_state_overhead.py   # under the guard

Times an 8-byte all-reduce with the communicator's rank-state writer switched on and off in
interleaved rounds of the same process, and prints both medians and their difference.
"""

import os
import time

import numpy as np

from mpidist.comm.communicator import world_communicator
from mpidist.comm.rank_state import RankStateWriter, create_state_file

comm = world_communicator()
writer = comm.guard.rank_state  # the benchmark switches the hook itself
created = None
if writer is None:  # alone, without the guard: make a file and attach it ourselves
    created = create_state_file()
    writer = RankStateWriter.attach(created, comm.rank, comm.size)
buf = np.ones(1)
calls = 20000 if comm.size == 1 else 5000
times = {"off": [], "on": []}
for _ in range(15):
    for mode in ("off", "on"):
        comm.guard.rank_state = writer if mode == "on" else None
        comm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            comm.all_reduce(buf)
        times[mode].append((time.perf_counter() - start) / calls * 1e6)
comm.guard.rank_state = writer
if comm.rank == 0:
    off, on = (sorted(times[m])[len(times[m]) // 2] for m in ("off", "on"))
    print(f"{comm.size} rank(s), 8-byte all_reduce, median of 15 interleaved rounds: "
          f"hooks off {off:.3f} us, on {on:.3f} us, difference {on - off:+.3f} us", flush=True)
if created:
    os.unlink(created)
