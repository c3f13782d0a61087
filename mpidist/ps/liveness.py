"""Whether the chief is still there, and how a rank leaves when a rank of the job is lost
(ps-design.md §4.4).

MPI cannot finalize while a rank of the job is dead (with the mpich wheel's default transport
the survivors wait in MPI_Finalize forever), so once the chief knows of a lost rank (a dead or
stuck worker, a failed ps) it says so in its SHUTDOWN message, and each rank leaves with
``leave_without_finalize``: output flushed, then ``os._exit``. A ps or worker rank that stops
hearing from the chief (whose ``runtime.ChiefPulse`` speaks every
``MPIDIST_PS_HEARTBEAT_SECONDS``) for ``MPIDIST_PS_COORDINATOR_TIMEOUT`` seconds, or whose
chief's process the transport saw end (``Transport.gone``), gets ``ChiefGoneError``
(``ChiefWatch``) and ends the same way, with the report and exit code 1.
"""

import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from mpidist.comm.exit_sequence import at_exit
from mpidist.comm.peer_watch import close_watches
from mpidist.config import get_config
from mpidist.core.waiting import Wait, wait_until
from mpidist.ps.roles import ClusterRoles

__all__ = ["ChiefGoneError", "ChiefWatch", "leave_without_finalize", "skip_finalize_at_exit",
           "CHIEF_GONE_EXIT_CODE", "announce", "loss_report", "ignore_interrupts"]

CHIEF_GONE_EXIT_CODE = 1


class ChiefGoneError(ConnectionError):
    """The chief stopped speaking: the rank that notices ends (``leave_without_finalize``)."""


def announce(message: str) -> None:
    """Write ``message`` to stderr, prefixed with this rank, and flush (before anything that
    may end the process: a launcher interrupts the other ranks when one leaves)."""
    sys.stderr.write(f"[mpidist {_label()}] {message}\n")
    sys.stderr.flush()


def loss_report(roles: ClusterRoles, lost: dict[int, str]) -> str:
    """The chief's one line about the ranks a job lost, and how it ends."""
    what = "; ".join(f"{roles.describe(rank)}: {why}" for rank, why in sorted(lost.items()))
    return (f"the job ends with exit code 1: it lost {what}. Every rank leaves without "
            "MPI_Finalize (it would wait for the lost ranks).")


def ignore_interrupts() -> None:
    """From now on this rank is ending: a launcher's SIGINT (sent when another rank leaves)
    must not cut its report short."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread


def leave_without_finalize(code: int, message: str | None = None) -> None:
    """End this process now without MPI_Finalize (which waits for every rank, dead ones
    included): write ``message`` (prefixed with the rank), flush the output, ``os._exit``."""
    if message:
        announce(message)
    close_watches()  # leaving on purpose: no peer must take this for a death
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _label() -> str:
    from mpidist.comm.mpi import rank_label  # noqa: PLC0415 - only where MPI may run

    return rank_label()


_skip_registered: list[int] = []


def skip_finalize_at_exit(code: int = 0) -> None:
    """At this process's normal exit, leave without MPI_Finalize (a rank of the job is lost)
    with exit code ``code``: the last step of the exit sequence (comm/exit_sequence.py), after
    the goodbyes; mpi4py's MPI_Finalize would come after it. Output is flushed."""
    if _skip_registered:
        return
    _skip_registered.append(code)
    at_exit("end", functools.partial(leave_without_finalize, code))


class ChiefWatch:
    """On a ps or worker rank: when it last heard from the chief, and whether the chief has
    been silent past ``MPIDIST_PS_COORDINATOR_TIMEOUT`` (then ``check`` raises
    ChiefGoneError with a report naming the chief and since when).

    Args:
        roles: The job's roles.
        gone: The transport's ``gone``: ranks whose process is known to have ended. A chief
            among them is gone at once, without waiting out its silence.
    """

    def __init__(self, roles: ClusterRoles,
                 gone: Callable[[], dict[int, str]] = dict) -> None:
        self._roles = roles
        self._gone = gone
        self._wait = Wait("a message or heartbeat from the chief",
                          f"the chief {roles.describe(roles.chief_rank)}",
                          get_config().ps_coordinator_timeout,
                          setting="MPIDIST_PS_COORDINATOR_TIMEOUT")
        self.last = time.monotonic()

    def heard(self, now: float | None = None) -> None:
        self.last = time.monotonic() if now is None else now

    def silent_for(self, now: float) -> float:
        return now - self.last

    def check(self, now: float | None = None) -> None:
        """ChiefGoneError when the chief has been silent past the limit."""
        now = time.monotonic() if now is None else now
        if now - self.last > self._wait.timeout:
            raise self.gone(now)
        ended = self._gone().get(self._roles.chief_rank)
        if ended is not None:
            raise self.ended(ended)

    def ended(self, how: str) -> ChiefGoneError:
        chief = self._roles.describe(self._roles.chief_rank)
        return ChiefGoneError(
            f"the chief {chief} is gone: {how}, without shutting the job down. Ending "
            f"{self._roles.describe()} with exit code 1; restart the job and restore the latest "
            "checkpoint.")

    def gone(self, now: float) -> ChiefGoneError:
        chief = self._roles.describe(self._roles.chief_rank)
        return ChiefGoneError(
            f"the chief {chief} is gone: {self._roles.describe()} has not heard from it for "
            f"{now - self.last:.1f} s (its heartbeat comes every "
            f"{get_config().ps_heartbeat_seconds:g} s; MPIDIST_PS_COORDINATOR_TIMEOUT is "
            f"{self._wait.timeout:g} s). Ending this rank with exit code 1; restart the job and "
            "restore the latest checkpoint.")

    def until(self, ready: Callable[[], bool], what: str, poll: float = 0.01) -> None:
        """Wait until ``ready()`` while the chief speaks (``ready`` calls ``heard``);
        ChiefGoneError when it stops."""
        def expire(wait: Wait, now: float) -> Any:
            raise self.gone(now)

        def ready_while_chief_lives() -> bool:
            if ready():
                return True
            ended = self._gone().get(self._roles.chief_rank)
            if ended is not None:
                raise self.ended(ended)
            return False

        wait_until(ready_while_chief_lives, what, f"the chief {self._roles.describe(self._roles.chief_rank)}",
                   timeout=self._wait.timeout, setting="MPIDIST_PS_COORDINATOR_TIMEOUT",
                   progress=lambda: self.last, poll=poll, on_expiry=expire)
