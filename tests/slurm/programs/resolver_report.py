"""Build SlurmClusterResolver and MultiWorkerMirroredStrategy(SlurmClusterResolver()) under
srun and print one JSON line per rank: what the resolver says, what MPI says, what Slurm set,
and the result of a reduce across the workers. Used by tests/slurm/test_slurm_jobs.py.

    srun -n N python resolver_report.py ['{"chief": 1, "worker": N-1}']
"""

import json
import os
import sys

import numpy as np

import mpidist
from mpidist.cluster_resolver import SlurmClusterResolver

SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
                   "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_ID",
                   "SLURM_STEP_ID", "PMI_SIZE", "PMI_RANK")

jobs = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
resolver = SlurmClusterResolver(jobs=jobs)  # from the environment alone, before MPI starts
report = {
    "task_type": resolver.task_type,
    "task_id": resolver.task_id,
    "cluster_spec": resolver.cluster_spec().as_dict(),
    "local_rank": resolver.local_rank,
    "master": resolver.master(),
    "num_accelerators": resolver.num_accelerators(),
}
strategy = mpidist.MultiWorkerMirroredStrategy(SlurmClusterResolver(jobs=jobs))

from mpi4py import MPI  # noqa: E402 - started by the strategy

world = MPI.COMM_WORLD


def replica_value():
    ctx = mpidist.get_replica_context()
    return np.float64(ctx.replica_id_in_sync_group + 1)


per_replica = strategy.run(replica_value)
report.update({
    "rank": world.Get_rank(),
    "size": world.Get_size(),
    "host": MPI.Get_processor_name(),
    "num_replicas_in_sync": strategy.num_replicas_in_sync,
    "is_chief": bool(strategy.extended.should_checkpoint),
    "strategy_task": [strategy.extended._task_type, strategy.extended._task_id],
    "reduce_sum_replicas": float(strategy.reduce("SUM", per_replica, axis=None)),
    "reduce_sum_workers": float(strategy.reduce("SUM", np.float64(world.Get_rank() + 1),
                                                axis=None)),
    "env": {name: os.environ.get(name) for name in SLURM_VARIABLES},
})
print("REPORT " + json.dumps(report), flush=True)
