"""Who arrived: the roll call that lets a meeting of all ranks name the ranks that never came.

A collective that some ranks never enter (a strategy built behind ``if rank == 0:``) shows
the ranks that did enter only that it does not complete; MPI does not say who is missing.
A rank that has waited at such a meeting for a while (``announce_after``) tells rank 0 that it
has arrived, with one small non-blocking message on a reserved tag of the base communicator.
If the meeting completes, the ranks count on the new communicator how many such messages were
sent and rank 0 takes exactly those (none is left unmatched). If it does not, rank 0 counts the
messages that came, names the ranks that did not, and sends that list to the ranks that came,
so every waiting rank reports the same names.

Why only after a while: the base communicator is the program's own (MPI_COMM_WORLD), and a
program receiving with ``MPI.ANY_TAG`` could take mpidist's message. A meeting whose ranks all
come within ``announce_after`` sends nothing on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core.waiting import WaitKind, wait_until
from mpidist.errors import DeadlineExceededError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["RollCall", "ARRIVED_TAG", "MISSING_TAG", "describe_ranks"]

# Reserved tags (below MPI's guaranteed TAG_UB of 32767), far from the small tags programs use.
ARRIVED_TAG = 32101
MISSING_TAG = 32102


def describe_ranks(ranks: list[int]) -> str:
    """``"rank 3"`` or ``"ranks 1, 2, 5"``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


class RollCall:
    """One roll call on ``base``: made when a rank arrives at a meeting (before it waits).

    Args:
        mpi: The ``mpi4py.MPI`` module.
        base: The communicator of the meeting (its ranks are the ones named).
    """

    def __init__(self, mpi: Any, base: MPI.Comm) -> None:
        self._mpi = mpi
        self._base = base
        self.rank, self.size = base.Get_rank(), base.Get_size()
        self._mine = np.array([self.rank], dtype=np.int32)  # alive until the send completes
        self._sent: Any = None

    def announce(self) -> None:
        """Tell rank 0 that this rank has arrived (once; rank 0 itself sends nothing). Called
        when the meeting has not completed within ``announce_after``."""
        if self._sent is None and self.rank != 0 and self.size > 1:
            self._sent = self._base.Isend(self._mine, dest=0, tag=ARRIVED_TAG)

    def settle(self, met: MPI.Comm) -> None:
        """After the meeting completed, on ``met`` (the communicator it built, whose ranks are
        the base's): rank 0 takes exactly the arrival messages that were sent, the senders
        finish their send. Every rank arrived, so both end at once (bounded all the same)."""
        if self.size == 1:
            return
        sent = np.array([int(self._sent is not None)], dtype=np.int32)
        count = np.zeros(1, dtype=np.int32)
        met.Allreduce(sent, count)  # wait-ok: every rank has arrived (the meeting completed)
        if not count[0]:
            return
        if self.rank != 0:
            if self._sent is not None:
                wait_until(self._sent.Test, "rank 0 to take this rank's arrival message",
                           "rank 0", kind=WaitKind.CONSTRUCTION)
            return
        boxes = [np.zeros(1, dtype=np.int32) for _ in range(int(count[0]))]
        requests = [self._base.Irecv(box, source=self._mpi.ANY_SOURCE, tag=ARRIVED_TAG)
                    for box in boxes]
        wait_until(lambda: self._mpi.Request.Testall(requests),
                   "every rank's arrival message", f"the {self.size} ranks",
                   kind=WaitKind.CONSTRUCTION)

    def missing(self, grace: float = 2.0) -> list[int] | None:
        """After the meeting timed out: the ranks that never arrived, the same list on every
        rank that did; None where rank 0 (which counts) did not answer within ``grace``
        seconds, e.g. because it is missing itself."""
        if self.size == 1:
            return []
        if self.rank == 0:
            arrived = self._arrivals()
            missing = [r for r in range(1, self.size) if r not in arrived]
            report = np.array(missing, dtype=np.int32)
            self._reports = (report, [self._base.Isend(report, dest=r, tag=MISSING_TAG)
                                      for r in sorted(arrived)])  # kept alive; never awaited
            return missing
        return self._report_from_rank0(grace)

    def _arrivals(self) -> set[int]:
        mpi, status = self._mpi, self._mpi.Status()
        arrived: set[int] = set()
        box = np.zeros(1, dtype=np.int32)
        while True:
            message = self._base.Improbe(mpi.ANY_SOURCE, ARRIVED_TAG, status)
            if message is None:
                return arrived
            message.Recv(box)  # wait-ok: the message is already matched (Improbe)
            arrived.add(status.Get_source())

    def _report_from_rank0(self, grace: float) -> list[int] | None:
        mpi, status = self._mpi, self._mpi.Status()
        found: list[Any] = []

        def answered() -> bool:
            found.append(self._base.Improbe(0, MISSING_TAG, status))
            return found[-1] is not None

        try:
            wait_until(answered, "rank 0's list of the missing ranks", "rank 0", timeout=grace)
        except DeadlineExceededError:
            return None
        box = np.zeros(status.Get_count(mpi.INT32_T), dtype=np.int32)
        found[-1].Recv(box)  # wait-ok: the message is already matched (Improbe)
        return [int(r) for r in box]

    def report(self, grace: float = 2.0) -> str:
        """A sentence naming the missing ranks (for the timeout's error)."""
        missing = self.missing(grace)
        if missing is None:
            return (f"Rank 0, which counts the arrivals, did not answer within {grace:g} s: it "
                    "has not arrived either (the other missing ranks are unknown here).")
        if not missing:
            return ("Every rank has arrived by now: one of them was slower than the deadline.")
        came = self.size - len(missing)
        return (f"{describe_ranks(missing)} of {self.size} never arrived "
                f"({came} did).")
