"""The progress board: where each rank is in its sequence of collectives.

Every rank of a node writes its own row in an MPI-3 shared-memory window on each collective
(two integer stores, no message), so a rank whose collective has timed out can read which of
its neighbours never arrived, even while they compute. Ranks on other nodes are asked with a
message; those that are not stuck in a collective themselves do not answer, which is the answer.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt

from mpidist.core.waiting import wait_until

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["ProgressBoard", "RankProgress", "OPERATIONS"]

# Operation names the board can record; a row stores the index.
OPERATIONS = ("none", "all_reduce", "broadcast", "all_gather", "all_gather_object", "barrier",
              "finalize")
_FIELDS = 3  # entered sequence number, operation index, completed sequence number
_BOARD_TAG = 7_301


class RankProgress(tuple[int, str, int]):
    """``(entered, operation, completed)`` for one rank."""

    __slots__ = ()

    def __new__(cls, entered: int, operation: str, completed: int) -> Self:
        return super().__new__(cls, (int(entered), str(operation), int(completed)))

    def __getnewargs__(self) -> tuple[int, str, int]:
        # Boards travel pickled between nodes: unpickling calls __new__ with these.
        return self.entered, self.operation, self.completed

    @property
    def entered(self) -> int:
        return self[0]

    @property
    def operation(self) -> str:
        return self[1]

    @property
    def completed(self) -> int:
        return self[2]


class ProgressBoard:
    """One row per rank of the node, in shared memory.

    Args:
        mpi: The ``mpi4py.MPI`` module.
        node: Communicator of the ranks sharing this node's memory.
        node_world_ranks: World rank of each node rank, in node-rank order.
    """

    def __init__(self, mpi: Any, node: MPI.Comm, node_world_ranks: Iterable[int]) -> None:
        self._window = mpi.Win.Allocate_shared(_FIELDS * 8, 8, comm=node)
        self._rows: list[npt.NDArray[np.int64]] = []
        for q in range(node.Get_size()):
            memory, _ = self._window.Shared_query(q)
            self._rows.append(np.frombuffer(memory, dtype=np.int64, count=_FIELDS))
        self._mine = self._rows[node.Get_rank()]
        self._mine[:] = 0
        self._world_ranks = list(node_world_ranks)

    def enter(self, seq: int, operation: str) -> None:
        self._mine[1] = OPERATIONS.index(operation)
        self._mine[0] = seq

    def complete(self, seq: int) -> None:
        self._mine[2] = seq

    def snapshot(self) -> dict[int, RankProgress]:
        """``{world_rank: RankProgress}`` for every rank of this node."""
        return {rank: RankProgress(row[0], OPERATIONS[int(row[1]) % len(OPERATIONS)], row[2])
                for rank, row in zip(self._world_ranks, self._rows)}

    def exchange(self, control: MPI.Comm, world_size: int, grace_seconds: float
                 ) -> dict[int, RankProgress]:
        """This node's snapshot merged with those that stuck ranks of other nodes send back
        within ``grace_seconds``. Each stuck rank sends its whole node's rows, so one stuck rank
        per node is enough for that node to be known."""
        known = self.snapshot()
        if len(known) == world_size:
            return known
        payload = pickle.dumps(known)
        for rank in range(world_size):
            if rank not in known:
                control.isend(payload, dest=rank, tag=_BOARD_TAG)  # left pending: job is ending
        def gather_one() -> bool:
            if control.Iprobe(tag=_BOARD_TAG):  # the message is there: recv returns at once
                known.update(pickle.loads(control.recv(tag=_BOARD_TAG)))  # wait-ok: probed
            return len(known) >= world_size

        wait_until(gather_one, "the progress of ranks on other nodes", "the stuck ranks",
                   timeout=grace_seconds, poll=0.01, on_expiry=lambda wait, now: None)
        return known

    def free(self) -> None:
        self._window.Free()
