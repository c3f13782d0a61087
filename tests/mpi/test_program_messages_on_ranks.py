"""The program's own messages on MPI_COMM_WORLD are never taken by mpidist, nor mpidist's by
the program: a receive posted with ``MPI.ANY_SOURCE`` and ``MPI.ANY_TAG`` while strategies are
built gets the program's message, never one of mpidist's; after a meeting so slow that ranks
announced their arrival, nothing of mpidist is left waiting on it.

Size-agnostic: run under mpiexec -n 1, 2 and 4 (and on 2 simulated nodes) by
tests/test_mpi_launch.py; with one rank there is nobody to message, and each case checks the
strategy alone.
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.comm.arrival import ANNOUNCE_AFTER_SECONDS

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
USER_TAG = 5


def build_strategy():
    strategy = mpidist.MultiWorkerMirroredStrategy()
    total = strategy.reduce("SUM", strategy.run(lambda: np.ones(2)), axis=None)
    np.testing.assert_array_equal(total, np.full(2, float(size)))
    return strategy


def exchange_around(build):
    """Rank 0 posts a receive for anything, from anyone, before the strategy is built; the
    last rank sends the program's message once it is built. Rank 0 must receive exactly that
    message, and nothing else must be waiting for it afterwards."""
    if size == 1:
        build()
        return
    box = np.zeros(3, dtype=np.int64)
    status = MPI.Status()
    request = comm.Irecv(box, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) if rank == 0 else None
    build()
    if rank == size - 1:
        comm.Send(np.array([7, 8, 9], dtype=np.int64), dest=0, tag=USER_TAG)
    if rank == 0:
        deadline = time.monotonic() + 30
        while not request.Test(status):
            assert time.monotonic() < deadline, "the program's message never came"
            time.sleep(0.001)
        assert (status.Get_source(), status.Get_tag()) == (size - 1, USER_TAG), \
            f"rank 0's receive took tag {status.Get_tag()} from rank {status.Get_source()}"
        assert box.tolist() == [7, 8, 9]
        leftover = comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        assert not leftover, "a message of mpidist is still waiting on MPI_COMM_WORLD"
    comm.Barrier()


def test_a_quick_meeting_sends_nothing_on_the_programs_communicator():
    exchange_around(build_strategy)


@pytest.mark.parametrize("late", ["rank 0", "the last rank"])
def test_a_slow_meeting_takes_back_every_arrival_message(late):
    """Ranks that wait more than a second announce their arrival to rank 0 (so that a meeting
    that never completes can name the missing): once the meeting completes, rank 0 takes every
    one of those messages, and the program's next receive for anything gets its own message.
    (A receive for anything that rank 0 had posted before such a slow meeting could match an
    announcement: the limit docs/multi_worker.md states.)"""
    late_rank = 0 if late == "rank 0" else size - 1
    if rank == late_rank:
        time.sleep(ANNOUNCE_AFTER_SECONDS + 0.5)
    build_strategy()
    exchange_around(lambda: None)
