"""The progress board: where each rank is in its sequence of collectives.

Every rank of a node writes its own row in an MPI-3 shared-memory window on each collective
(two integer stores, no message), so a rank whose collective has timed out can read which of
its neighbours never arrived, even while they compute. Ranks on other nodes are asked with a
message; those that are not stuck in a collective themselves do not answer, which is the answer.

A row also holds the rank's pid and a heartbeat: a thread of the rank stores the monotonic
clock there every ``PULSE_SECONDS``, whatever the rank is doing. Progress says where a rank is;
the heartbeat says whether it is alive: a rank stopped (SIGSTOP, Ctrl-Z, a debugger) or frozen
inside a collective's transfer has entered the collective like the others, and only its silent
heartbeat names it.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt

from mpidist.core.waiting import join_thread, wait_until
from mpidist.errors import DeadlineExceededError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["ProgressBoard", "RankProgress", "OPERATIONS", "PULSE_SECONDS"]

# Operation names the board can record; a row stores the index.
OPERATIONS = ("none", "all_reduce", "broadcast", "all_gather", "all_gather_object", "barrier",
              "finalize")
# entered sequence number, operation index, completed sequence number, heartbeat (monotonic
# clock, ms; 0 before the first), pid
_FIELDS = 5
_BOARD_TAG = 7_301
PULSE_SECONDS = 0.25  # the heartbeat's period


class RankProgress(tuple[int, str, int, float, int]):
    """``(entered, operation, completed, silent, pid)`` for one rank; ``silent``: the seconds
    since its last heartbeat when the row was read (-1: none yet)."""

    __slots__ = ()

    def __new__(cls, entered: int, operation: str, completed: int, silent: float = -1.0,
                pid: int = 0) -> Self:
        return super().__new__(cls, (int(entered), str(operation), int(completed),
                                     float(silent), int(pid)))

    def __getnewargs__(self) -> tuple[int, str, int, float, int]:
        # Boards travel pickled between nodes: unpickling calls __new__ with these.
        return self.entered, self.operation, self.completed, self.silent, self.pid

    @property
    def entered(self) -> int:
        return self[0]

    @property
    def operation(self) -> str:
        return self[1]

    @property
    def completed(self) -> int:
        return self[2]

    @property
    def silent(self) -> float:
        return self[3]

    @property
    def pid(self) -> int:
        return self[4]


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
        self._mine[4] = os.getpid()
        self._world_ranks = list(node_world_ranks)
        self._stop = threading.Event()
        self._pulse = threading.Thread(target=self._beat, name="mpidist-board-pulse",
                                       daemon=True)
        self._pulse.start()

    def _beat(self) -> None:
        mine = self._mine
        while True:
            mine[3] = time.monotonic_ns() // 1_000_000  # CLOCK_MONOTONIC: one clock per node
            if self._stop.wait(PULSE_SECONDS):  # wait-ok: the pulse's period, until free()
                return

    def enter(self, seq: int, operation: str) -> None:
        self._mine[1] = OPERATIONS.index(operation)
        self._mine[0] = seq

    def complete(self, seq: int) -> None:
        self._mine[2] = seq

    def snapshot(self) -> dict[int, RankProgress]:
        """``{world_rank: RankProgress}`` for every rank of this node."""
        now = time.monotonic_ns() // 1_000_000
        return {rank: RankProgress(row[0], OPERATIONS[int(row[1]) % len(OPERATIONS)], row[2],
                                   (now - row[3]) / 1000 if row[3] else -1.0, row[4])
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
        self._stop.set()
        try:  # it writes into the window: stopped before the window is freed
            join_thread(self._pulse, timeout=5.0)
        except DeadlineExceededError:  # never seen; a leaked window beats a write to freed memory
            return
        self._window.Free()
