"""Deadlines of collectives: the Waiter that completes a collective's MPI calls, and the
Watchdog thread that ends the job when a blocking call outlives its deadline.

Both report through the collective guard that made them (``collective_guard``): it knows the
collective's number and which ranks never arrived.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from mpidist.comm.mpi import abort_job
from mpidist.core.waiting import Wait, wait_until
from mpidist.logs import get_logger

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpidist.comm.collective_call import CollectiveCall
    from mpidist.comm.collective_guard import CollectiveGuard

__all__ = ["Waiter", "Watchdog"]

log = get_logger("mpidist.comm")


class Waiter:
    """Completes the MPI calls of one collective, against its deadline.

    ``wait(request, what)`` polls a non-blocking request through the library's one bounded
    wait (``mpidist.core.waiting``): past the deadline it raises DeadlineExceededError naming
    the missing ranks, and once the wait has stalled for ``MPIDIST_STALL_SECONDS`` it logs
    them. ``blocking(...)`` runs the blocking form once every rank has agreed to be in this
    collective (the MPI library's blocking algorithms are faster than its non-blocking ones
    for large buffers); a watchdog thread then ends the job if the call outlives the
    deadline, since a blocking call cannot be interrupted.

    Args:
        guard: The collective guard of the communicator.
        call: The collective whose calls this completes.
        timeout: Seconds (finite: the guard gives the configured default when the caller
            gives none).

    Attributes:
        agreed: Set by the guard once every rank has agreed on the call.
    """

    __slots__ = ("_guard", "_call", "_timeout", "agreed")

    def __init__(self, guard: CollectiveGuard, call: CollectiveCall, timeout: float) -> None:
        self._guard = guard
        self._call = call
        self._timeout = timeout
        self.agreed = False

    def __call__(self, request: MPI.Request, what: str) -> None:
        for _ in range(64):  # most collectives end within these tests: no Wait built for them
            if request.Test():
                return
        guard, call = self._guard, self._call

        def expire(wait: Wait, now: float) -> NoReturn:
            guard.timed_out(call, what, wait.timeout)

        def stall(wait: Wait, now: float) -> None:
            log.warning("%s", guard.stall_report(call, what, now - wait.started))

        # More ranks than cores: give the core to the peer we wait for (a rank that spins
        # through its time slice made every 4-rank collective on 2 cores cost ~1 ms).
        # The description is built only for a report: this path runs whenever this rank
        # arrives first, and describing the call costs more than the wait often does.
        wait_until(request.Test, lambda: f"collective #{guard.seq} {call.describe()} ({what})",
                   "the other ranks", timeout=self._timeout, setting=self._setting(),
                   pause=_yield, spins=64, on_expiry=expire, on_stall=stall)

    def _setting(self) -> str:
        return "CommunicationOptions(timeout_seconds=...) or MPIDIST_COLLECTIVE_TIMEOUT"

    def blocking(self, call_blocking: Callable[[], Any],
                 start_nonblocking: Callable[[], MPI.Request], what: str) -> None:
        """Run ``call_blocking`` once the ranks have agreed, else wait for the request that
        ``start_nonblocking`` returns."""
        if not self.agreed:
            self(start_nonblocking(), what)
            return
        watchdog = self._guard.watchdog()
        # The watched tuple is set and cleared inline: this runs once per collective.
        watchdog.watched = (time.monotonic() + self._timeout, self._call, what, self._timeout)
        try:
            call_blocking()
        finally:
            watchdog.watched = None


def _yield(_at_most: float) -> None:
    os.sched_yield()


class Watchdog(threading.Thread):
    """Ends the job when a blocking collective outlives its deadline (checked every 50 ms).

    The one wait that cannot go through ``mpidist.core.waiting``: a blocking MPI call cannot
    be polled, so this thread bounds it from outside."""

    def __init__(self, guard: CollectiveGuard) -> None:
        super().__init__(name="mpidist-collective-watchdog", daemon=True)
        self._guard = guard
        # ``(deadline, call, what, timeout)`` while a blocking call runs, else None: past the
        # deadline (``time.monotonic()``) the job ends. Set and cleared by ``Waiter.blocking``.
        self.watched: tuple[float, CollectiveCall, str, float] | None = None

    def run(self) -> None:
        while True:
            time.sleep(0.05)  # wait-ok: the watchdog's own tick, for the job's lifetime
            watched = self.watched
            if watched is not None and time.monotonic() >= watched[0]:
                _, call, what, timeout = watched
                guard = self._guard
                abort_job(
                    f"DeadlineExceededError: Collective has timed out during execution: "
                    f"collective #{guard.seq} {call.describe()} ({what}) did not complete within "
                    f"{timeout:g} s on rank {guard.rank}, after every rank had entered it. "
                    f"{guard.missing_report(call, grace=0.5, other_thread=True)} Ending the job.")
