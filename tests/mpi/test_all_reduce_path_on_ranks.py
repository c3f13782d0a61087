"""The user's all-reduce reaches MPI in at most 6 calls from ``ReplicaContext.all_reduce``
(issue 24): counted with ``sys.setprofile`` on the path that crosses ranks (one host replica
per rank; with one rank the communicator short-circuits and nothing is counted).

mpi4py's methods are Cython functions, which raise no profile event: the communicator hands
its MPI call to the watchdog as a lambda, and that frame's one call is the MPI call.
Run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.strategies.replica_context import ReplicaContext

size = MPI.COMM_WORLD.Get_size()
MAX_CALLS = 6


def calls_to_mpi(strategy, fn):
    """The chain of Python calls from ReplicaContext.all_reduce to the first MPI data call
    of ``strategy.run(fn)``, the MPI call included; None when no call reaches MPI."""
    target = ReplicaContext.all_reduce.__code__
    found = []

    def profile(frame, event, arg):
        if event != "call" or found or frame.f_code.co_name != "<lambda>" \
                or not frame.f_code.co_filename.endswith(("comm/communicator.py",
                                                          "comm/shared_memory.py")):
            return
        chain, f = [], frame
        while f is not None and f.f_code is not target:
            chain.append(f"{f.f_code.co_filename}:{f.f_code.co_name}")
            f = f.f_back
        if f is not None:
            found.append(chain[::-1] + ["MPI"])

    sys.setprofile(profile)
    try:
        strategy.run(fn)
    finally:
        sys.setprofile(None)
    return found[0] if found else None


@pytest.mark.skipif(size == 1, reason="one rank: the communicator never calls MPI")
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [(1024,), (), (3, 5)])
def test_user_all_reduce_reaches_mpi_in_at_most_6_calls(dtype, shape):
    strategy = mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=["/cpu:0"]))
    x = np.ones(shape, dtype)
    fn = lambda: mpidist.get_replica_context().all_reduce("SUM", x)  # noqa: E731
    np.testing.assert_array_equal(strategy.run(fn), x * size)  # warm: the plan is chosen
    chain = calls_to_mpi(strategy, fn)
    assert chain is not None, "no MPI call was seen: the counter no longer finds the path"
    assert len(chain) <= MAX_CALLS, "\n".join(chain)


@pytest.mark.skipif(size == 1, reason="one rank: the communicator never calls MPI")
def test_the_counter_sees_a_longer_path():
    """The counter can fail: values the direct path does not take (an int8 leaf) meet in a
    merge_call and cross many more frames than the bound."""
    strategy = mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=["/cpu:0"]))
    x = np.ones(8, np.float32)
    fn = lambda: mpidist.get_replica_context().all_reduce("SUM", [x, x.astype(np.int8)])  # noqa: E731
    strategy.run(fn)
    chain = calls_to_mpi(strategy, fn)
    assert chain is not None and len(chain) > MAX_CALLS


def test_the_plan_is_chosen_once_for_the_layout():
    from mpidist.ops.collective_all_reduce import HostReplicaPlan
    from mpidist.strategies.reduction_plans import GeneralPlan

    strategy = mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=["/cpu:0"]))
    plan = strategy.extended.reduction_plan()
    assert strategy.extended.reduction_plan() is plan
    assert type(plan) is (HostReplicaPlan if size > 1 else GeneralPlan)
    assert plan.packs_arena is (size > 1)
