"""The communicator's topology and its all-reduce algorithms on real ranks: one node, or two
simulated nodes (tests/test_mpi_launch.py sets MPIDIST_TEST_NODES for the 2 x 2 launch).

Every algorithm (the MPI library's, shared memory, hierarchical) gives the same exact sums;
several packs under one agreement give the same numbers as one pack, and a mismatch in the
packs is still an error on every rank.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

from mpidist.comm.communicator import world_communicator
from mpidist.config import get_config
from mpidist.errors import InvalidArgumentError

world = MPI.COMM_WORLD
rank = world.Get_rank()
size = world.Get_size()
NODES = int(os.environ.get("MPIDIST_TEST_NODES", "1"))


@pytest.mark.mpi
def test_the_launch_gives_the_nodes_asked_for_and_the_threshold_of_that_topology():
    comm = world_communicator()
    assert comm.num_nodes == NODES
    assert comm.local_size == size // NODES
    config = get_config()
    crossover = config.shm_min_bytes_across_nodes if NODES > 1 else config.shm_min_bytes_one_node
    assert comm.shm_min_bytes == max(config.shm_min_bytes, crossover)
    assert comm.has_shared_memory == (comm.local_size > 1)
    assert comm.thread_level == MPI.Query_thread()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["auto", "mpi", "shm"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_every_algorithm_gives_the_exact_sum(algorithm, dtype):
    comm = world_communicator()
    saved = comm.allreduce_algorithm
    comm.allreduce_algorithm = algorithm
    try:
        for n in (1, 1000, 300_001):  # odd sizes: uneven chunks per local rank
            buf = np.arange(n, dtype=dtype) * (rank + 1)
            comm.all_reduce(buf)
            np.testing.assert_array_equal(buf, np.arange(n, dtype=dtype) * (size * (size + 1) // 2))
            send = np.full(n, rank + 1, dtype=dtype)
            out = np.empty_like(send)
            comm.all_reduce(out, send=send)
            assert np.all(out == size * (size + 1) // 2) and np.all(send == rank + 1)
    finally:
        comm.allreduce_algorithm = saved


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["auto", "shm"])
def test_packs_under_one_agreement_sum_like_one_pack(algorithm):
    comm = world_communicator()
    saved = comm.allreduce_algorithm
    comm.allreduce_algorithm = algorithm
    try:
        bounds = [(0, 7), (7, 70_000), (70_000, 70_001), (70_001, 200_000)]
        buf = np.arange(200_000, dtype=np.float64) + rank
        comm.all_reduce_packs(buf, bounds)
        expected = size * np.arange(200_000, dtype=np.float64) + size * (size - 1) / 2
        np.testing.assert_array_equal(buf, expected)
        one = np.arange(10, dtype=np.float32) + rank
        comm.all_reduce_packs(one, [(0, 10)], op="max")
        np.testing.assert_array_equal(one, np.arange(10, dtype=np.float32) + size - 1)
    finally:
        comm.allreduce_algorithm = saved


@pytest.mark.mpi
def test_packs_that_differ_between_ranks_are_an_error_on_every_rank():
    if size == 1:
        pytest.skip("a mismatch needs two ranks; this test runs again at 2 and 4 ranks")
    comm = world_communicator()
    buf = np.ones(100, dtype=np.float32)
    bounds = [(0, 50), (50, 100)] if rank == 0 else [(0, 60), (60, 100)]
    with pytest.raises(InvalidArgumentError, match="They differ in: packs"):
        comm.all_reduce_packs(buf, bounds)
    comm.barrier()  # the ranks are still in step
    buf = np.ones(4, dtype=np.float32)
    comm.all_reduce_packs(buf, [(0, 2), (2, 4)])
    np.testing.assert_array_equal(buf, np.full(4, float(size)))
