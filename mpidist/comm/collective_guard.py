"""The collective guard: what makes a communicator's collectives fail loudly instead of hanging.

Every collective runs inside ``with guard.collective(call, timeout) as wait:``, which

1. takes the communicator's lock, numbers the collective and records on the progress board
   (and in the rank-state file, when ``mpidist.guard`` gave one) that this rank entered it;
2. unless checks are off, has the ranks agree on the call's fingerprint (sequence number,
   operation, dtype, shape, reduce op, root, the user's public calls) with one 16-byte
   all-reduce; a disagreement raises the same clear InvalidArgumentError on every rank
   before any data moves;
3. hands the caller the Waiter that completes its data calls against the deadline: past
   ``timeout`` it raises DeadlineExceededError naming the ranks that never arrived;
4. on the way out records that the collective completed (board, rank-state file, timeline).

After a timeout the guard is broken (an MPI request is left pending): further collectives
raise UnavailableError, and the communicator ends the job at exit.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from mpidist.comm.board import ProgressBoard
from mpidist.comm.collective_call import CollectiveCall
from mpidist.comm.deadlines import Waiter, Watchdog
from mpidist.comm.failure_reports import mismatch_error, missing_ranks_report
from mpidist.comm.gather import all_gather_bytes
from mpidist.comm.rank_state import RankStateWriter
from mpidist.comm.timeline import Timeline
from mpidist.errors import DeadlineExceededError, UnavailableError
from mpidist.logs import get_logger

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpidist.comm.topology import Topology
    from mpidist.config import Config

__all__ = ["CollectiveGuard", "CollectiveScope"]

log = get_logger("mpidist.comm")


class CollectiveGuard:
    """Numbers, checks and watches the collectives of one communicator.

    Args:
        mpi: The ``mpi4py.MPI`` module.
        data: The communicator the collectives run on (the fingerprint agreement too).
        control: A communicator off the data path, for the board exchange after a timeout.
        topology: Where the ranks of ``data`` run.
        config: mpidist's settings (checks, stall warnings, timeline, rank-state file).
        threads_may_overlap: Whether MPI allows calls from several threads at once
            (THREAD_MULTIPLE).

    Attributes:
        rank, size: This rank and the number of ranks.
        seq: The number of the current (or last) collective; the first is 1.
        lock: Held for the whole of each collective: one collective at a time per process.
        check_collectives: Whether the ranks agree on each call's fingerprint.
        stall_seconds: A wait logs the missing ranks after this long (None: never).
        default_timeout: The deadline of a collective whose caller gives none
            (``MPIDIST_COLLECTIVE_TIMEOUT``): every collective has one.
        board: This node's ProgressBoard.
        rank_state: The rank-state file's writer, or None.
        timeline: The timeline recorder (``MPIDIST_TIMELINE``), or None.
        debug: Whether each collective is logged with its duration.
        broken: Why no collective may run any more, or None while they may.
    """

    def __init__(self, mpi: Any, data: MPI.Comm, control: MPI.Comm,
                 topology: Topology, config: Config, threads_may_overlap: bool) -> None:
        self.rank = topology.rank
        self.size = topology.size
        self.seq = 0
        self.lock = threading.RLock()
        self.check_collectives = config.check_collectives
        self.stall_seconds = config.stall_warning_seconds
        self.default_timeout = config.collective_timeout
        self.board = ProgressBoard(mpi, topology.node, topology.node_ranks)
        self.rank_state = RankStateWriter.attach(config.rank_state_path, self.rank, self.size)
        self.timeline = Timeline(config.timeline_path, self.rank, self.size, topology.hosts) \
            if config.timeline_path else None
        self.debug = log.isEnabledFor(logging.DEBUG)  # a line per collective
        self.broken: str | None = None
        self._data = data
        self._control = control
        self._topology = topology
        self._max = mpi.MAX
        # Below MULTIPLE, only the thread inside the collective may call MPI (the watchdog
        # then reports from this node's board alone).
        self._threads_may_overlap = threads_may_overlap
        self._fp_send = np.zeros(2, dtype=np.int64)
        self._fp_recv = np.zeros(2, dtype=np.int64)
        self._watchdog: Watchdog | None = None

    def collective(self, call: CollectiveCall, timeout: float | None) -> CollectiveScope:
        """``with guard.collective(call, timeout) as wait:`` runs one collective (see the
        module's docstring); ``wait`` is its Waiter. ``timeout`` None: the default deadline."""
        return CollectiveScope(self, call, self.default_timeout if timeout is None else timeout)

    def refuse(self) -> NoReturn:
        """Raise the error of a collective asked for once the guard is broken."""
        raise UnavailableError(
            f"mpidist's communicator was aborted by an earlier failure ({self.broken}) and "
            "cannot run more collectives; restart the job (from a checkpoint)."
        )

    def agree(self, call: CollectiveCall, wait: Waiter) -> None:
        """Have every rank compare ``call``'s fingerprint; raise the mismatch error on all of
        them when they differ. MAX of ``(fp, -fp)`` gives ``(max, -min)``: equal only when
        every rank sent the same ``fp``."""
        fp = call.fingerprint(self.seq)
        self._fp_send[0], self._fp_send[1] = fp, -fp
        wait(self._data.Iallreduce(self._fp_send, self._fp_recv, self._max),
             "fingerprint agreement")
        if self._fp_recv[0] != -self._fp_recv[1]:
            self._mismatch(call)

    def _mismatch(self, call: CollectiveCall) -> NoReturn:
        # Every rank saw the disagreement (MAX and -MAX differ for all), so all gather this.
        mine = (self.seq, call.operation, call.fields, call.calls)
        payload = np.frombuffer(pickle.dumps(mine), dtype=np.uint8)
        wait = Waiter(self, CollectiveCall("all_gather_object"), self.default_timeout)
        entries = [pickle.loads(part.tobytes())
                   for part in all_gather_bytes(self._data, payload, wait)]
        raise mismatch_error(self.rank, entries)

    def timed_out(self, call: CollectiveCall, what: str, timeout: float) -> NoReturn:
        """Break the guard and raise DeadlineExceededError for ``call`` (its step ``what``)."""
        report = self.missing_report(call, grace=min(2.0, timeout))
        self.broken = f"collective #{self.seq} {call.describe()} timed out on rank {self.rank}"
        raise DeadlineExceededError(
            f"Collective has timed out during execution: collective #{self.seq} "
            f"{call.describe()} ({what}) did not complete within {timeout:g} s on rank "
            f"{self.rank}. {report} The job cannot continue: this rank ends the job when it "
            "exits (if a rank is just slow, raise the deadline: "
            "CommunicationOptions(timeout_seconds=...) or MPIDIST_COLLECTIVE_TIMEOUT)."
        )

    def stall_report(self, call: CollectiveCall, what: str, waited: float) -> str:
        """The warning for a collective that has waited ``waited`` seconds (its deadline not yet
        passed)."""
        return (f"rank {self.rank} has waited {waited:.0f} s in collective #{self.seq} "
                f"{call.describe()} ({what}). {self.missing_report(call, grace=0.5)}")

    def missing_report(self, call: CollectiveCall, grace: float,
                       other_thread: bool = False) -> str:
        """Which ranks never arrived at the current collective, from the progress boards: this
        node's, and those that stuck ranks of other nodes send within ``grace`` seconds (asked
        unless ``other_thread`` runs this while MPI allows one thread at a time)."""
        topology = self._topology
        ask = topology.num_nodes > 1 and (self._threads_may_overlap or not other_thread)
        known = self.board.exchange(self._control, self.size, grace) if ask \
            else self.board.snapshot()
        return missing_ranks_report(known, ask, self.seq, call.operation, topology)

    def watchdog(self) -> Watchdog:
        """The watchdog thread for blocking calls, started on first use."""
        if self._watchdog is None:
            self._watchdog = Watchdog(self)
            self._watchdog.start()
        return self._watchdog

    def close(self, reason: str) -> None:
        """Free the progress board; from now on collectives are refused, naming ``reason``."""
        self.board.free()
        self.broken = reason


class CollectiveScope:
    """One collective under the guard: entered with the lock taken, the board and rank-state
    file updated and the fingerprint agreed; left with its completion recorded."""

    __slots__ = ("_guard", "_call", "_timeout", "_wait", "_start", "_agreed")

    def __init__(self, guard: CollectiveGuard, call: CollectiveCall, timeout: float) -> None:
        self._guard = guard
        self._call = call
        self._timeout = timeout

    def __enter__(self) -> Waiter:
        guard = self._guard
        guard.lock.acquire()  # wait-ok: held by a collective, itself bounded by its deadline
        try:
            if guard.broken is not None:
                guard.refuse()
            guard.seq += 1
            guard.board.enter(guard.seq, self._call.operation)
            if guard.rank_state is not None:  # for mpidist.guard's report if this rank dies
                guard.rank_state.enter(guard.seq, self._call)
            self._wait = Waiter(guard, self._call, self._timeout)
            self._start = time.time_ns() if guard.timeline is not None or guard.debug else 0
            if guard.check_collectives and guard.size > 1:
                guard.agree(self._call, self._wait)
                self._wait.agreed = True
            self._agreed = time.time_ns() if guard.timeline is not None else 0
        except BaseException:
            guard.lock.release()
            raise
        return self._wait

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        guard = self._guard
        if exc_type is None:
            guard.board.complete(guard.seq)
            if guard.rank_state is not None:
                guard.rank_state.complete(guard.seq)
            if guard.timeline is not None:
                # Without the agreement the whole collective counts as waiting.
                agreed = self._agreed if self._wait.agreed else time.time_ns()
                guard.timeline.record(guard.seq, self._call, self._start, agreed, time.time_ns())
            if guard.debug:
                log.debug("collective #%d %s: %.1f us", guard.seq, self._call.describe(),
                          (time.time_ns() - self._start) / 1000)
        guard.lock.release()
