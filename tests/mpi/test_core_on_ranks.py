"""The single-process core inside a real MPI job: every rank runs its own strategies, with
replica threads beside MPI, and gets the same numbers.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpidist

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()


@pytest.mark.mpi
def test_world_has_the_size_the_launcher_asked_for():
    """A wrong PMI makes every rank a singleton; catch that here rather than in later tests."""
    assert size == int(os.environ["MPIDIST_TEST_NPROCS"])
    assert sorted(comm.allgather(rank)) == list(range(size))


@pytest.mark.mpi
def test_import_mpidist_does_not_load_cupy_or_numba_cuda():
    assert "cupy" not in sys.modules
    assert "numba.cuda" not in sys.modules


@pytest.mark.mpi
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_mirrored_run_and_reduce_agree_across_ranks(replicas):
    strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])

    def step(x):
        rid = mpidist.get_replica_context().replica_id_in_sync_group
        return x * (rid + 1) + rank

    # Rank-dependent input so that a rank answering for another would be noticed.
    out = strategy.reduce("SUM", strategy.run(step, args=(np.arange(4.0),)), axis=None)
    expected = np.arange(4.0) * replicas * (replicas + 1) / 2 + rank * replicas
    np.testing.assert_array_equal(out, expected)
    everyone = comm.allgather(out - rank * replicas)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])


@pytest.mark.mpi
@pytest.mark.parametrize("replicas", [2, 4])
def test_merge_call_and_mpi_allreduce_in_one_step(replicas):
    """Replica threads merge first; the merged value then crosses ranks with MPI Allreduce,
    called only on the main thread (the merge function runs there)."""
    strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])

    def merge_fn(strat, value):
        local = strat.reduce("SUM", value, axis=None)
        total = np.empty_like(local)
        comm.Allreduce(local, total, op=MPI.SUM)
        return total

    def step():
        rid = mpidist.get_replica_context().replica_id_in_sync_group
        return mpidist.get_replica_context().merge_call(merge_fn, args=(np.float64(rid + 1),))

    result = strategy.run(step)
    expected = size * replicas * (replicas + 1) / 2
    assert float(result) == expected


@pytest.mark.mpi(min_size=2)
def test_ranks_see_distinct_inputs():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.array([rank * 10 + ctx.replica_id_in_sync_group], dtype=np.int64))
    local = strategy.gather(values, axis=0)
    gathered = np.concatenate(comm.allgather(local))
    np.testing.assert_array_equal(gathered, np.array([[r * 10, r * 10 + 1] for r in range(size)]).ravel())
