"""Create the default MultiWorkerMirroredStrategy and print its replica count.

Run with or without mpiexec by the launch-check tests: a launcher variable (PMI_SIZE,
SLURM_NTASKS, ...) announcing more tasks than MPI sees must stop it with a clear RuntimeError.
"""

import mpidist

strategy = mpidist.MultiWorkerMirroredStrategy()
print(f"num_replicas_in_sync {strategy.num_replicas_in_sync}", flush=True)
