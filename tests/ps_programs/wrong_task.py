"""A parameter-server job in which one rank's TF_CONFIG names a task that is not its own (rank
2 of 3 says it is ps:0, which is rank 1). That rank must fail at once, naming itself and the
fix; the others must not wait for it (the job ends with its error).

Usage: ``wrong_task.py``.
"""

import json
import os

from mpi4py import MPI

import mpidist

rank = MPI.COMM_WORLD.Get_rank()
own = [("chief", 0), ("ps", 0), ("worker", 0)][rank]
task = ("ps", 0) if rank == 2 else own
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3"]},
    "task": {"type": task[0], "index": task[1]}})
mpidist.experimental.ParameterServerStrategy(mpidist.cluster_resolver.TFConfigClusterResolver())
print(f"rank {rank}: must not happen: the strategy was created", flush=True)
