"""How the ranks of a parameter-server job exchange messages: point-to-point, never pickled
arrays, every wait polled against a deadline (ps-design.md §2.3, §2.5).

Two transports with one interface:

- ``MPITransport``: two duplicates of ``MPI_COMM_WORLD`` (``data``: anyone <-> parameter servers;
  ``ctrl``: chief <-> workers, so closures never match variable traffic). Sends are ``Isend``s
  kept until complete; receives are matched probes (``Improbe`` + ``Message.Recv``), so two
  threads of a rank never take each other's messages. Every MPI call is made under one lock
  (MPI_THREAD_SERIALIZED is enough), taken with a deadline: a thread wedged inside MPI is
  named, never a silent hang of the others.
- ``LocalTransport``: the same over in-process mailboxes, one per simulated rank (threads), for
  unit tests and in-process clusters (TF's own tests run an in-process cluster too).

A message is one contiguous buffer. Waiting spins briefly, then sleeps with an exponential
backoff capped at ``MPIDIST_PS_POLL_MAX_SLEEP``, so an idle rank does not burn a core. Every wait
for a message goes through ``mpidist.core.waiting`` with a finite deadline and a report (what,
on whom, since when). A send never blocks: it is an ``Isend`` kept until complete; a send to a
peer that died never completes, so ``close`` waits for pending sends for a bounded time, then
abandons them and says to whom they were (``unsent``).
"""

import os
import threading
import time
from collections import deque
from typing import Any

from mpidist.comm.peer_watch import Peer, watch_peers
from mpidist.config import get_config
from mpidist.core.waiting import Wait, wait_until
from mpidist.errors import DeadlineExceededError

__all__ = ["ANY", "DATA", "CTRL", "Backoff", "Transport", "MPITransport", "LocalFabric",
           "LocalTransport"]

ANY = -1    # any source / any tag
DATA = 0    # variable requests and replies
CTRL = 1    # closures, results, heartbeats, shutdown

Received = tuple[int, int, Any]  # (source, tag, buffer)

# Polls of ``recv`` before its bounded wait starts, without yielding: a few µs in all.
QUICK_POLLS = 16


class Backoff:
    """Polling pace: retry for ``spin_seconds``, yielding the core between tries (a reply
    usually comes within microseconds: 5.9 µs round trips polling against 330 µs when
    sleeping after 64 tries; without the yield a peer placed on the same core waits for our
    whole time slice, 2.5 ms round trips measured), then sleep, doubling from 50 µs to
    ``max_sleep``. ``reset()`` after work arrives. The first ``quick_polls`` pauses after a
    reset return at once: the next message of an exchange usually follows within a few µs,
    and a yield on a busy machine can hand the core away for a whole time slice."""

    def __init__(self, max_sleep: float | None = None, spin_seconds: float | None = None,
                 quick_polls: int = QUICK_POLLS) -> None:
        config = get_config()
        self.max_sleep = config.ps_poll_max_sleep if max_sleep is None else max_sleep
        self.spin_seconds = config.ps_poll_spin_seconds if spin_seconds is None else spin_seconds
        self.quick_polls = quick_polls
        self.reset()

    @classmethod
    def for_reply(cls) -> "Backoff":
        """The pace of a wait for an answer that normally comes within microseconds: keep
        polling for 20 ms. Sleeping sooner lets the two ranks of an exchange settle on one core
        (the scheduler sees them idle) and every exchange then costs a sleep: 2.8 ms round
        trips measured against 12 µs."""
        return cls(spin_seconds=max(get_config().ps_poll_spin_seconds, 0.02))

    def reset(self) -> None:
        self._spin_until = time.perf_counter() + self.spin_seconds
        self._sleep = 50e-6
        self._quick = self.quick_polls

    def pause(self, at_most: float | None = None) -> None:
        """One pause between polls (at most ``at_most`` seconds): a yield while spinning, else
        a sleep. The deadline belongs to the caller (``wait_until``'s ``pause``)."""
        if self._quick:
            self._quick -= 1
            return
        if time.perf_counter() < self._spin_until:
            os.sched_yield()  # a peer sharing this core runs now, not after our time slice
            return
        time.sleep(self._sleep if at_most is None else min(self._sleep, at_most))
        self._sleep = min(self._sleep * 2, self.max_sleep)


class Transport:
    """The interface both transports implement. ``rank``/``size`` are the job's."""

    rank: int
    size: int

    def send(self, channel: int, dest: int, tag: int, message: Any) -> Any:
        """Send ``message`` (bytes-like, contiguous); returns at once. The transport keeps the
        buffer alive until it is sent. Returns None when the message is already sent, else a
        handle for ``sent``: until then ``message`` must not change (it is not copied)."""
        raise NotImplementedError

    def sent(self, handle: Any) -> bool:
        """Whether the message of ``handle`` (from ``send``) has left its buffer."""
        return True

    def try_recv(self, channel: int, source: int = ANY, tag: int = ANY) -> Received | None:
        """The first message matching (source, tag) on ``channel``, or None at once."""
        raise NotImplementedError

    def recv(self, channel: int, source: int, tag: int, what: str, on: str, timeout: float,
             setting: str | None = None, pace: Backoff | None = None) -> Received:
        """Wait for a matching message, at most ``timeout`` seconds; past it
        DeadlineExceededError with ``wait_until``'s report (``what``, ``on``, since when, and
        ``setting``, the knob that raises the deadline)."""
        # A reply usually comes within microseconds: a few plain polls first, before the
        # bounded wait's deadline, report and pace are built (about 2 µs per request).
        for _ in range(QUICK_POLLS):
            got = self.try_recv(channel, source, tag)
            if got is not None:
                return got
        box: list[Received] = []

        def ready() -> bool:
            got = self.try_recv(channel, source, tag)
            if got is not None:
                box.append(got)
            return got is not None

        wait_until(ready, what, on, timeout=timeout, setting=setting,
                   pause=(pace or Backoff.for_reply()).pause, poll=0.01)
        return box[0]

    def recv_into(self, channel: int, source: int, tag: int, out: Any, what: str, on: str,
                  timeout: float, setting: str | None = None) -> None:
        """Receive the next (source, tag) message straight into ``out`` (a writable buffer of
        its exact size): the second message of a large payload, without a copy. Bounded as
        ``recv``."""
        raise NotImplementedError

    def progress(self) -> None:
        """Release the buffers of sends that have completed (called from polling loops, so a
        large message is freed once it has left, not when many sends have piled up)."""

    def unsent(self) -> list[int]:
        """The destinations of sends not yet complete (after ``close``: abandoned)."""
        return []

    def gone(self) -> dict[int, str]:
        """Ranks whose process is known to have ended without leaving the job, each with a
        description (pid and host): the chief knows of every rank, the others of the chief."""
        return {}

    def close(self, timeout: float = 5.0) -> None:
        """Finish pending sends (bounded by ``timeout`` seconds, then abandoned)."""

    @property
    def owns_process(self) -> bool:
        """Whether a rank of this transport is a whole process (MPI), not a thread."""
        return False


class MPITransport(Transport):
    """Point-to-point messages over two duplicates of ``MPI_COMM_WORLD``. Building it is
    collective: every rank of the job must build it, in the same order as other collectives."""

    def __init__(self) -> None:
        from mpidist.comm.arrival import private_duplicate  # noqa: PLC0415 - MPI starts only when needed
        from mpidist.comm.mpi import install_abort_on_exception, mpi_module  # noqa: PLC0415 - MPI starts only when needed

        self._mpi = mpi = mpi_module()
        world = mpi.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        if self.size > 1:  # an uncaught error on any rank ends the job instead of a hang
            install_abort_on_exception()
        # Every rank must arrive (bounded by MPIDIST_CONSTRUCTION_TIMEOUT, then a report).
        self._comms = (private_duplicate(world, "a ParameterServerStrategy job (its data channel)"),
                       private_duplicate(world, "a ParameterServerStrategy job (its control "
                                                "channel)"))
        self._lock = threading.Lock()
        self._lock_timeout = get_config().ps_timeout
        self._holder: tuple[int, str, int, float] = (0, "", -1, 0.0)  # for _enter's report
        # (request, buffer, dest) of Isends not yet complete: the buffer stays alive until then.
        self._pending: list[tuple[Any, Any, int]] = []
        self._status = mpi.Status()
        # A process that ends is seen at once through a socket, not through MPI: nothing is
        # sent to it after that (MPI may wedge on a send to a dead rank), and the chief need
        # not wait for three missed heartbeats.
        self._gone: dict[int, str] = {}
        self._watch = watch_peers(self._comms[CTRL], on_lost=self._note_gone)

    def _note_gone(self, peer: Peer, stopped: bool) -> None:
        how = "stopped by a signal" if stopped else "ended without leaving the job"
        self._gone = {**self._gone, peer.rank: f"its process (pid {peer.pid} on {peer.host}) {how}"}

    def gone(self) -> dict[int, str]:
        return self._gone

    @property
    def owns_process(self) -> bool:
        return True

    def _enter(self, call: str, peer: int) -> None:
        """Take the lock every MPI call is made under, bounded: a thread wedged inside MPI
        (MPICH may never return from a send to a dead rank) must not hang every other thread
        of this rank, the failure detector's included. Past the PS timeout, DeadlineExceeded
        names what the holder is doing and since when."""
        if not self._lock.acquire(False) and not self._lock.acquire(timeout=self._lock_timeout):
            ident, held_call, held_peer, since = self._holder
            thread = next((t.name for t in threading.enumerate() if t.ident == ident),
                          f"{ident} (ended)")
            raise DeadlineExceededError(
                f"{threading.current_thread().name} of rank {self.rank} waited "
                f"{self._lock_timeout:g} s to make an MPI call ({call}, rank {peer}): thread "
                f"{thread} has been inside {held_call} (rank {held_peer}) for "
                f"{time.monotonic() - since:.1f} s. The MPI library is wedged, most likely on a "
                f"rank that died; this rank cannot go on (MPIDIST_PS_TIMEOUT is "
                f"{self._lock_timeout:g} s).")
        # The thread's id, not its name: this runs on every MPI call (a name costs 0.15 µs).
        self._holder = (threading.get_ident(), call, peer, time.monotonic())

    def send(self, channel: int, dest: int, tag: int, message: Any) -> Any:
        self._enter("MPI_Isend", dest)
        try:
            if self._pending:
                self._reap()
            request = self._comms[channel].Isend(message, dest, tag)
            if request.Test():
                return None
            self._pending.append((request, message, dest))
            return request
        finally:
            self._lock.release()

    def sent(self, handle: Any) -> bool:
        self._enter("MPI_Test", -1)
        try:
            return bool(handle.Test())
        finally:
            self._lock.release()

    def _reap(self) -> None:
        self._pending = [p for p in self._pending if not p[0].Test()]

    def progress(self) -> None:
        if self._pending:
            self._enter("MPI_Test of pending sends", -1)
            try:
                self._reap()
            finally:
                self._lock.release()

    def unsent(self) -> list[int]:
        return sorted({dest for _, _, dest in list(self._pending)})

    def try_recv(self, channel: int, source: int = ANY, tag: int = ANY) -> Received | None:
        mpi = self._mpi
        self._enter("MPI_Improbe", source)
        try:
            status = self._status
            message = self._comms[channel].Improbe(
                mpi.ANY_SOURCE if source == ANY else source, mpi.ANY_TAG if tag == ANY else tag,
                status)
            if message is None:
                return None
            buffer = bytearray(status.Get_count(mpi.BYTE))
            found_source, found_tag = status.Get_source(), status.Get_tag()
            message.Recv(buffer)  # wait-ok: a matched message (Improbe) is already here
        finally:
            self._lock.release()
        return found_source, found_tag, buffer

    def recv_into(self, channel: int, source: int, tag: int, out: Any, what: str, on: str,
                  timeout: float, setting: str | None = None) -> None:
        self._enter("MPI_Irecv", source)
        try:
            request = self._comms[channel].Irecv(out, source, tag)
        finally:
            self._lock.release()

        def done() -> bool:
            self._enter("MPI_Test", source)
            try:
                return bool(request.Test())
            finally:
                self._lock.release()

        def expire(wait: Wait, now: float) -> Any:
            self._enter("MPI_Cancel", source)
            try:
                request.Cancel()
            finally:
                self._lock.release()
            raise wait.error(now)

        wait_until(done, what, on, timeout=timeout, setting=setting,
                   pause=Backoff.for_reply().pause, poll=0.01, on_expiry=expire)

    def close(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` seconds) for pending sends to complete, then abandon the
        rest: a send to a dead peer never completes (``unsent()`` names the peers)."""
        def all_sent() -> bool:
            self.progress()
            return not self._pending

        try:
            wait_until(all_sent, "pending sends to complete", f"ranks {self.unsent()}",
                       timeout=timeout,
                       setting="the transport's close timeout")
        except DeadlineExceededError:
            pass  # abandoned: the caller learns to whom from unsent()


class LocalFabric:
    """The mailboxes of an in-process cluster: one deque per (rank, channel) and one
    condition for all. ``transport(rank)`` is that rank's view."""

    _registry: dict[str, "LocalFabric"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, size: int) -> None:
        self.size = size
        self._boxes: dict[tuple[int, int], deque[Received]] = {
            (r, c): deque() for r in range(size) for c in (DATA, CTRL)}
        self._cond = threading.Condition()
        # The chief's PSClient once its strategy exists (TaskRuntime sets it): the cluster's
        # shutdown stops that job, whichever cluster's chief is current on the thread by then.
        self.chief_client: Any = None

    @classmethod
    def register(cls, token: str, fabric: "LocalFabric") -> None:
        with cls._registry_lock:
            cls._registry[token] = fabric

    @classmethod
    def lookup(cls, token: str) -> "LocalFabric":
        with cls._registry_lock:
            fabric = cls._registry.get(token)
        if fabric is None:
            raise ValueError(f"No in-process cluster {token!r} is running in this process: build the "
                             "cluster with mpidist.ps.local.InProcessCluster.")
        return fabric

    @classmethod
    def unregister(cls, token: str) -> None:
        with cls._registry_lock:
            cls._registry.pop(token, None)

    def transport(self, rank: int) -> "LocalTransport":
        return LocalTransport(self, rank)

    def post(self, dest: int, channel: int, item: Received) -> None:
        with self._cond:
            self._boxes[(dest, channel)].append(item)
            self._cond.notify_all()

    def take(self, rank: int, channel: int, source: int, tag: int) -> Received | None:
        with self._cond:
            box = self._boxes[(rank, channel)]
            for i, item in enumerate(box):
                if (source == ANY or item[0] == source) and (tag == ANY or item[1] == tag):
                    del box[i]
                    return item
        return None

    def wait_for_mail(self, timeout: float) -> None:
        """One bounded pause of a ``wait_until`` (woken early by new mail)."""
        with self._cond:
            self._cond.wait(timeout)  # wait-ok: one bounded pause of wait_until


class LocalTransport(Transport):
    """One simulated rank of a ``LocalFabric``. Messages are copied on send, as MPI would."""

    def __init__(self, fabric: LocalFabric, rank: int) -> None:
        self._fabric = fabric
        self.rank, self.size = rank, fabric.size

    @property
    def fabric(self) -> LocalFabric:
        """The in-process cluster this simulated rank belongs to."""
        return self._fabric

    def send(self, channel: int, dest: int, tag: int, message: Any) -> Any:
        if not 0 <= dest < self.size:
            raise ValueError(f"rank {dest} is not in this {self.size}-rank in-process cluster.")
        self._fabric.post(dest, channel, (self.rank, tag, bytearray(message)))
        return None  # copied: already sent

    def try_recv(self, channel: int, source: int = ANY, tag: int = ANY) -> Received | None:
        return self._fabric.take(self.rank, channel, source, tag)

    def recv(self, channel: int, source: int, tag: int, what: str, on: str, timeout: float,
             setting: str | None = None, pace: Backoff | None = None) -> Received:
        box: list[Received] = []

        def ready() -> bool:
            got = self._fabric.take(self.rank, channel, source, tag)
            if got is not None:
                box.append(got)
            return got is not None

        wait_until(ready, what, on, timeout=timeout, setting=setting,
                   pause=self._fabric.wait_for_mail)
        return box[0]

    def recv_into(self, channel: int, source: int, tag: int, out: Any, what: str, on: str,
                  timeout: float, setting: str | None = None) -> None:
        _, _, data = self.recv(channel, source, tag, what, on, timeout, setting)
        memoryview(out).cast("B")[:] = data
