"""Create the default MultiWorkerMirroredStrategy and print its replica count.

Run with or without mpiexec by the launch-check tests: a launcher variable (PMI_SIZE,
SLURM_NTASKS, ...) announcing another task count than MPI sees must stop it with a clear
RuntimeError. The error is also printed as one line naming this process's MPI rank (several
ranks' tracebacks can interleave mid-line in the launcher's output), then re-raised.
"""

import sys

import mpidist

try:
    strategy = mpidist.MultiWorkerMirroredStrategy()
except RuntimeError as err:
    from mpi4py import MPI

    sys.stdout.write(f"rank {MPI.COMM_WORLD.Get_rank()}: RuntimeError: {err}\n")
    sys.stdout.flush()
    raise
print(f"num_replicas_in_sync {strategy.num_replicas_in_sync}", flush=True)
