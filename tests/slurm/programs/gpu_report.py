"""One JSON line per rank: MPI rank and size, node-local rank, what Slurm set and the GPUs
this process may see (CUDA_VISIBLE_DEVICES), and the devices mpidist's default resolver picks.
Submitted through the GPU batch scripts on the test cluster's fake GPUs."""

import json
import os

import mpidist

resolver = mpidist.cluster_resolver.MPIClusterResolver()
strategy = mpidist.MultiWorkerMirroredStrategy(resolver)
print("REPORT " + json.dumps({
    "rank": resolver.communicator.rank,
    "size": resolver.communicator.size,
    "local_rank": resolver.local_rank,
    "slurm_localid": os.environ.get("SLURM_LOCALID"),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "slurm_cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"),
    "devices": resolver.local_devices(),
    "num_replicas_in_sync": strategy.num_replicas_in_sync,
}), flush=True)
