"""Meeting the other ranks when mpidist first needs them, under a deadline.

Building a communicator is collective: every rank of the job must arrive. A rank that never
does (a strategy built behind ``if rank == 0``, a rank that exited early or died before) would
leave the others blocked in MPI_Comm_dup forever. ``private_duplicate`` uses the non-blocking
MPI_Comm_idup and waits for it through ``mpidist.core.waiting`` with the construction
deadline (``MPIDIST_CONSTRUCTION_TIMEOUT``); past it, the job is ended with a report, since
a pending collective leaves MPI unusable.

A rank that leaves the program without ever arriving says so: at exit, where MPI runs and no
communicator of mpidist was built in this process, it posts a small departure note to every
other rank (``announce_departure``, registered on first import). The ranks waiting here see
it at once and name the rank that left, instead of waiting for the deadline.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from mpidist.comm.exit_sequence import at_exit
from mpidist.comm.mpi import abort_job, install_abort_on_exception, mpi_module
from mpidist.comm.roll_call import RollCall
from mpidist.core.waiting import Wait, WaitKind, deadline_seconds, wait_until
from mpidist.errors import DeadlineExceededError, UnavailableError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["private_duplicate", "announce_departure"]

# On MPI_COMM_WORLD, below MPI's guaranteed MPI_TAG_UB (32767); only probed for, never
# received, so a program's own receives never see it unless they post this very tag.
_DEPARTURE_TAG = 32_741
# A rank still waiting after this long tells rank 0 it came (comm/roll_call.py): sooner, and
# every meeting would send on the program's own communicator.
ANNOUNCE_AFTER_SECONDS = 1.0
_MAX_DEPARTURE_NOTES = 1024  # job sizes up to which a departing rank tells every other rank
_state = {"arrived": False}


def private_duplicate(base: MPI.Comm, purpose: str) -> MPI.Comm:
    """A duplicate of ``base`` (so mpidist's traffic never matches the program's own), made
    once every rank of ``base`` has arrived; DeadlineExceededError, then the end of the job
    at exit, when some never do.

    Args:
        base: The communicator every rank must duplicate (usually MPI_COMM_WORLD).
        purpose: What is being built, for the report, e.g. ``"MultiWorkerMirroredStrategy"``.
    """
    roll_call = RollCall(mpi_module(), base)  # names the ranks that never come
    duplicate, request = base.Idup()
    rank, size = base.Get_rank(), base.Get_size()
    mpi = sys.modules["mpi4py.MPI"]
    world = mpi.COMM_WORLD
    status = mpi.Status()
    left: list[int] = []

    started = time.monotonic()
    announce_after = min(ANNOUNCE_AFTER_SECONDS, deadline_seconds(WaitKind.CONSTRUCTION) / 4)

    def arrived() -> bool:
        if request.Test():
            return True
        if time.monotonic() - started > announce_after:
            roll_call.announce()  # the meeting is slow: a report may be needed
        if world.Iprobe(mpi.ANY_SOURCE, _DEPARTURE_TAG, status):
            left.append(status.Get_source())
            raise_departed()
        return False

    def raise_departed() -> NoReturn:
        reason = (
            f"rank {rank} of {size} was waiting for every rank of the job to build {purpose}, "
            f"but rank {left[0]} ended its program without building it. Every rank must build "
            "the same strategy, in the same order (e.g. not behind `if rank == 0:`).")
        install_abort_on_exception()
        at_exit("abort", functools.partial(abort_job, f"ending the job: {reason}"))
        raise UnavailableError(reason)

    def expire(wait: Wait, now: float) -> NoReturn:
        reason = (
            f"rank {rank} of {size} waited {now - wait.started:.0f} s for every rank of the job "
            f"to build {purpose} (the first collective mpidist makes), and not all arrived: "
            f"{roll_call.report(min(wait.timeout, 5.0))} "
            "Every rank must build the same strategy, in the same order: a rank that skips it "
            "(e.g. behind `if rank == 0:`), exits early or died leaves the others here. "
            f"If some ranks are only slow to start, raise {wait.setting} "
            f"(now {wait.timeout:g} s).")
        # The idup stays pending, so MPI cannot finalize: end the job at exit, or now if the
        # error is not caught.
        install_abort_on_exception()
        at_exit("abort", functools.partial(abort_job, f"ending the job: {reason}"))
        raise DeadlineExceededError(reason)

    wait_until(arrived, f"every rank to build {purpose}", f"the {size} ranks of the job",
               kind=WaitKind.CONSTRUCTION, on_expiry=expire)
    roll_call.settle(duplicate)
    _state["arrived"] = True
    return duplicate


def announce_departure() -> None:
    """At exit: if MPI runs here, across ranks, and this process never met the others through
    ``private_duplicate``, tell every other rank that it left (one small eager message each,
    not waited for), so none waits for it until a deadline."""
    mpi = sys.modules.get("mpi4py.MPI")
    if _state["arrived"] or mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    world = mpi.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if size == 1 or size > _MAX_DEPARTURE_NOTES:
        return  # above it, n * (n - 1) notes at exit cost more than they save
    note = bytearray(1)
    for peer in range(size):
        if peer != rank:
            world.Isend(note, peer, _DEPARTURE_TAG).Free()  # completes on its own (eager)


at_exit("depart", announce_departure)
