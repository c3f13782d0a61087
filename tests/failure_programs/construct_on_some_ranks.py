"""A strategy built on some ranks only, or with another configuration on some ranks.

Usage: construct_on_some_ranks.py CASE, CASE one of
  mwms-exit      rank 0 builds MultiWorkerMirroredStrategy, the others end their program
  mwms-sleep     rank 0 builds it, the others sleep (never build, never exit)
  mwms-comm      every rank built mpidist's communicator before; then only rank 0 builds it,
                 the others sleep
  ps-missing     the last rank never builds ParameterServerStrategy (it sleeps)
  ps-layout      the last rank asks for 2 parameter servers, the others for 1

Each must end by itself (MPIDIST_CONSTRUCTION_TIMEOUT) with a report naming the ranks.
"""

import sys
import time

from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver

case = sys.argv[1]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
last = rank == size - 1

if case == "mwms-comm":
    from mpidist.comm.communicator import world_communicator

    world_communicator()
if case.startswith("mwms"):
    if rank == 0:
        mpidist.MultiWorkerMirroredStrategy()
        print(f"rank {rank}: built", flush=True)
    elif case != "mwms-exit":
        time.sleep(600)
elif case == "ps-missing":
    if last:
        time.sleep(600)
    mpidist.experimental.ParameterServerStrategy(MPIClusterResolver(num_ps=1))
elif case == "ps-layout":
    mpidist.experimental.ParameterServerStrategy(MPIClusterResolver(num_ps=2 if last else 1))
print(f"rank {rank}: end", flush=True)
