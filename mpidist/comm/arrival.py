"""Meeting the other ranks when mpidist first needs them, under a deadline.

Building a communicator is collective: every rank of the job must arrive. A rank that never
does (a strategy built behind ``if rank == 0``, a rank that exited early or died before) would
leave the others blocked in MPI_Comm_dup forever. ``private_duplicate`` uses the non-blocking
MPI_Comm_idup and waits for it through ``mpidist.core.waiting`` with the construction
deadline (``MPIDIST_CONSTRUCTION_TIMEOUT``); past it, the job is ended with a report, since
a pending collective leaves MPI unusable.
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING, NoReturn

from mpidist.comm.mpi import abort_job, install_abort_on_exception
from mpidist.core.waiting import Wait, WaitKind, wait_until
from mpidist.errors import DeadlineExceededError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["private_duplicate"]


def private_duplicate(base: MPI.Comm, purpose: str) -> MPI.Comm:
    """A duplicate of ``base`` (so mpidist's traffic never matches the program's own), made
    once every rank of ``base`` has arrived; DeadlineExceededError, then the end of the job
    at exit, when some never do.

    Args:
        base: The communicator every rank must duplicate (usually MPI_COMM_WORLD).
        purpose: What is being built, for the report, e.g. ``"MultiWorkerMirroredStrategy"``.
    """
    duplicate, request = base.Idup()
    rank, size = base.Get_rank(), base.Get_size()

    def expire(wait: Wait, now: float) -> NoReturn:
        reason = (
            f"rank {rank} of {size} waited {now - wait.started:.0f} s for every rank of the job "
            f"to build {purpose} (the first collective mpidist makes), and not all arrived. "
            "Every rank must build the same strategy, in the same order: a rank that skips it "
            "(e.g. behind `if rank == 0:`), exits early or died leaves the others here. "
            f"If some ranks are only slow to start, raise {wait.setting} "
            f"(now {wait.timeout:g} s).")
        # The idup stays pending, so MPI cannot finalize: end the job at exit, or now if the
        # error is not caught.
        install_abort_on_exception()
        atexit.register(abort_job, f"ending the job: {reason}")
        raise DeadlineExceededError(reason)

    wait_until(request.Test, f"every rank to build {purpose}", f"the {size} ranks of the job",
               kind=WaitKind.CONSTRUCTION, on_expiry=expire)
    return duplicate
