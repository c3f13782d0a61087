"""Create the default MultiWorkerMirroredStrategy and say how many replicas it has. Under
``srun --mpi=none -n N`` every rank initialises MPI alone (size 1) while Slurm announced N
tasks: creating the strategy must fail with mpidist's launch-check error. The error is printed
as one line per process (tracebacks of several ranks can interleave), then re-raised.
"""

import os
import sys

import mpidist

try:
    strategy = mpidist.MultiWorkerMirroredStrategy()
except RuntimeError as err:
    sys.stdout.write(f"task {os.environ.get('SLURM_PROCID')}: RuntimeError: {err}\n")
    sys.stdout.flush()
    raise
print(f"task {os.environ.get('SLURM_PROCID')}: num_replicas_in_sync "
      f"{strategy.num_replicas_in_sync}", flush=True)
