"""Noticing a dead peer at once: a rank that dies (SIGKILL, a segfault, ``os._exit``) ends the
whole collective job within seconds, with a report naming it, instead of leaving the other
ranks waiting for it in a collective.

Why a mechanism of our own: MPI tells the survivors nothing. MPICH's blocking and non-blocking
collectives wait for a dead peer forever (its SIGUSR1 failure notice under Hydra's
``-disable-auto-cleanup`` only counts deaths), and Hydra itself ends the other nodes' ranks only
when a rank was killed by a signal: after an exit code (``os._exit(3)``), or in the
fault-tolerant mode, the survivors wait. Only the collective deadline would end them, minutes
later.

The mechanism: each Communicator of several ranks keeps one TCP connection from every rank to
its rank 0 (a star; set up once, at construction, with one broadcast of rank 0's address). The
kernel closes a process's sockets however the process ends, so rank 0 reads end-of-file from a
rank that died and every rank reads it from a rank 0 that died; no heartbeat, no polling, no
cost on the collectives. A rank that leaves normally says goodbye first (at exit, after the
communicator's exit meeting), so only an end without goodbye counts as a death (bytes are
gathered until the goodbye is whole: it may come in pieces). The rank that noticed names the
dead rank, its pid and its host at once (under a plain ``mpiexec`` the launcher kills every
rank milliseconds after one ends, and says nothing of an ``os._exit``); after a short grace
(the launcher often ends the job itself meanwhile) it ends the job with MPI_Abort (every rank,
every node, whatever the launcher's clean-up mode).

A parameter-server job survives a dead worker: its transport watches with ``on_lost``, which
hears of each death (rank 0, the chief, of every rank's; the others of the chief's) instead of
ending the job, so the chief stops sending to a dead rank at once rather than after three
missed heartbeats. ``MPIDIST_PEER_WATCH=0`` turns the watch off (the collective deadline, or
the parameter servers' heartbeats, then find the dead).
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from mpidist.comm.exit_sequence import at_exit
from mpidist.comm.mpi import abort_job, on_abort, rank_label
from mpidist.config import get_config
from mpidist.logs import get_logger

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["PeerWatch", "Peer", "OnLost", "watch_peers", "close_watches", "GRACE_SECONDS",
           "ENV_VARIABLE"]

log = get_logger("mpidist.comm")

ENV_VARIABLE = "MPIDIST_PEER_WATCH"
GRACE_SECONDS = 1.0  # after a death, before ending the job: the launcher's clean-up comes first
_LATER_SPOKE_SECONDS = 2.0  # a dead rank 0: rank 1 reports, the others only if it could not
_CONNECT_SECONDS = 5.0
_HELLO = b"mpidist-peer-watch"
_BYE = b"bye\n"
_ERROR = b"err\n"  # leaving by abort_job, with its own report: MPI_Abort ends every rank
_STOP = b"stop\n"  # stopped by a signal, with its own line: the job must still be ended


class Peer(NamedTuple):
    """A rank as the watch names it in a report."""

    rank: int
    pid: int
    host: str

    def describe(self, size: int) -> str:
        return f"rank {self.rank} of {size} (pid {self.pid} on {self.host})"


# ``on_lost(peer, stopped)``: a watched rank ended without goodbye (``stopped``: by a signal,
# after its own line). Called on the watch's thread: it must be quick, make no MPI call and
# not raise.
OnLost = Callable[[Peer, bool], None]

_started: list[PeerWatch] = []  # every watch of this process, for close_watches


def watch_peers(comm: MPI.Comm, hosts: list[str] | None = None,
                on_lost: OnLost | None = None) -> PeerWatch | None:
    """Start watching the ranks of ``comm`` (collective over it: every rank calls it once, right
    after the communicator is built); None when alone, when ``MPIDIST_PEER_WATCH=0``, or when no
    connection could be made (a warning says why; the collective deadline remains).

    Without ``on_lost`` a death ends the job on every rank (a collective job cannot go on);
    with it, the job goes on and ``on_lost`` hears of each death rank 0 sees, or of rank 0's.

    The watch says goodbye by itself at exit (the exit sequence's ``leave`` phase, after the
    communicators' exit meetings)."""
    if comm.Get_size() == 1 or not get_config().peer_watch:
        return None
    watch = PeerWatch(comm, hosts, on_lost)
    if not watch.start():
        return None
    at_exit("leave", watch.close)
    on_abort(watch.leave_with_report)
    _started.append(watch)
    return watch


def close_watches() -> None:
    """Say goodbye on every watch of this process: for a rank that leaves on purpose without
    running the exit sequence (``os._exit`` after a lost rank), so that it is no death."""
    for watch in _started:
        watch.close()


class PeerWatch:
    """The watch of one communicator's ranks: rank 0 holds a connection from every other rank.

    Args:
        comm: The communicator whose ranks are watched (its construction just completed on
            every rank, so the one broadcast here cannot wait for a missing rank).
        hosts: The host of every rank, for reports (default: each rank's ``gethostname``).
        on_lost: Told of each death instead of ending the job (see ``watch_peers``).

    Attributes:
        rank, size: This rank and the communicator's size.
        lost: The Peer whose death this rank noticed, or None.
    """

    def __init__(self, comm: MPI.Comm, hosts: list[str] | None = None,
                 on_lost: OnLost | None = None) -> None:
        self._comm = comm
        self._on_lost = on_lost
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._hosts = hosts
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self.lost: Peer | None = None
        os.register_at_fork(after_in_child=self._forget_in_child)

    # -- set-up --------------------------------------------------------------------------
    def start(self) -> bool:
        """Connect (collective); whether this rank is watched."""
        token = secrets.token_hex(8)
        listener, offer = None, None
        if self.rank == 0:
            try:
                listener = socket.create_server(("", 0), family=socket.AF_INET,
                                                backlog=self.size)
                offer = (_addresses(), listener.getsockname()[1], token, os.getpid(),
                         socket.gethostname())
            except OSError as err:
                log.warning("no watch of dead ranks (rank 0 cannot listen: %s): a rank that "
                            "dies is noticed only at the collective deadline", err)
        # Every rank has just built the communicator: this broadcast meets them all at once.
        offer = self._comm.bcast(offer, root=0)  # wait-ok: all ranks are here (see above)
        if offer is None:
            return False
        addresses, port, token, hub_pid, hub_host = offer
        self._hub = Peer(0, hub_pid, self._host_of(0, hub_host))
        if listener is not None:
            self._sockets.append(listener)
            self._start_thread(self._watch_ranks, listener, token)
            return True
        connection = _connect(addresses, port, hub_host)
        if connection is None:
            log.warning("no watch of dead ranks on rank %d: rank 0's address (%s, port %d) is "
                        "unreachable; a dead rank is noticed only at the collective deadline",
                        self.rank, ", ".join(addresses), port)
            return False
        hello = f"{_HELLO.decode()} {token} {self.rank} {os.getpid()} {socket.gethostname()}\n"
        try:
            connection.sendall(hello.encode())
        except OSError:
            connection.close()
            return False
        self._sockets.append(connection)
        self._start_thread(self._watch_hub, connection)
        return True

    def _start_thread(self, target: Callable[..., None], *args: Any) -> None:
        self._thread = threading.Thread(target=target, args=args, daemon=True,
                                        name="mpidist-peer-watch")
        self._thread.start()

    def _host_of(self, rank: int, fallback: str) -> str:
        hosts = self._hosts
        return hosts[rank] if hosts is not None and rank < len(hosts) else fallback

    # -- the watching threads ------------------------------------------------------------
    def _watch_ranks(self, listener: socket.socket, token: str) -> None:
        """Rank 0: accept every rank's connection, then wait for one to end."""
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ, "accept")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not self._closing.is_set():
            for key, _ in selector.select():  # wait-ok: the watch's idle thread, for life
                if key.data == "wake":
                    return
                if key.data == "accept":
                    self._accept(listener, token, selector)
                    continue
                (peer, heard), connection = key.data, cast(socket.socket, key.fileobj)
                try:
                    data = connection.recv(64)
                except OSError:
                    data = b""
                heard.extend(data)
                if _BYE in heard or _ERROR in heard or self._closing.is_set():
                    selector.unregister(connection)
                    connection.close()
                    continue
                if not data:
                    if self._on_lost is None:
                        self._lost(peer, stopped=_STOP in heard)
                        return
                    selector.unregister(connection)  # the job goes on: watch the others
                    connection.close()
                    self._on_lost(peer, _STOP in heard)

    def _accept(self, listener: socket.socket, token: str,
                selector: selectors.BaseSelector) -> None:
        try:
            connection, _ = listener.accept()
        except OSError as err:  # EMFILE, ENFILE, ENOBUFS: that rank stays unwatched
            log.warning("the watch of dead ranks could not accept a rank's connection (%s): "
                        "a rank whose connection is missing is noticed only at the collective "
                        "deadline", err)
            return
        try:
            connection.settimeout(_CONNECT_SECONDS)  # the hello follows the connect at once
            words = connection.recv(512).decode(errors="replace").split()
            connection.settimeout(None)
        except OSError:
            connection.close()
            return
        if len(words) != 5 or words[0] != _HELLO.decode() or words[1] != token \
                or not words[2].isdigit() or not words[3].isdigit():
            connection.close()  # not one of ours
            return
        rank = int(words[2])
        peer = Peer(rank, int(words[3]), self._host_of(rank, words[4]))
        self._sockets.append(connection)
        selector.register(connection, selectors.EVENT_READ, (peer, bytearray()))

    def _watch_hub(self, connection: socket.socket) -> None:
        """Every other rank: wait for rank 0's connection to end."""
        heard = bytearray()
        while True:
            try:
                data = connection.recv(64)  # wait-ok: the watch's idle thread, for life
            except OSError:
                data = b""
            heard.extend(data)
            if _BYE in heard or _ERROR in heard or self._closing.is_set():
                return
            if not data:
                break
        if self._on_lost is not None:
            self._on_lost(self._hub, _STOP in heard)
            return
        if self.rank > 1:  # rank 1 ends the job; the others only if it could not
            self._closing.wait(_LATER_SPOKE_SECONDS)  # wait-ok: a short fixed delay
        self._lost(self._hub, stopped=_STOP in heard)

    def _lost(self, peer: Peer, stopped: bool = False) -> None:
        """``peer`` ended without goodbye: say so now (the launcher may kill this rank any
        moment), then after the grace end the job (unless this rank is leaving too, or MPI is
        already finalized: then every collective is behind us). A peer ``stopped`` by a
        signal printed its own line: the job is ended without another."""
        mpi = sys.modules.get("mpi4py.MPI")
        if self._closing.is_set() or (mpi is not None and mpi.Is_finalized()):
            return
        self.lost = peer
        if stopped:
            if self._closing.wait(GRACE_SECONDS):  # wait-ok: the launcher's clean-up first
                return
            abort_job(f"{peer.describe(self.size)} was stopped (its line above says how); "
                      "the job cannot continue without it: ending it on every rank.", code=1)
        message = (
            f"{peer.describe(self.size)} is gone: its process ended without leaving the job "
            "(os._exit, or killed by a signal such as SIGKILL or SIGSEGV; its launcher, or "
            "`mpidist run`'s report, says which). The collectives of this job cannot complete "
            "without it (a MultiWorkerMirroredStrategy job does not survive a lost rank): "
            "ending the job on every rank. Resume from the last checkpoint "
            "(BackupAndRestore) once the cause is fixed.")
        try:
            sys.stderr.write(f"[mpidist {rank_label()}] {message}\n")  # one write, at once
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if self._closing.wait(GRACE_SECONDS):  # wait-ok: the launcher's clean-up comes first
            return
        if mpi is not None and mpi.Is_finalized():
            return
        abort_job("", code=1)  # the line above said it

    # -- leaving -------------------------------------------------------------------------
    def leave_with_report(self, stopped: bool) -> None:
        """This rank ends with its own report: ``abort_job`` (MPI_Abort then ends every rank)
        or, ``stopped``, a signal's line. Tell the peers, so that none reports it as a silent
        death as well (after a stop they still end the job, which cannot go on without it)."""
        if self._closing.is_set():
            return
        self._closing.set()  # its own end is no peer's death to report either
        self._tell_peers(_STOP if stopped else _ERROR)

    def close(self) -> None:
        """Leave: say goodbye to the peers, so that this rank's exit is no death. Call it once
        this rank has made its last collective (at exit, after the exit meeting)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._tell_peers(_BYE)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _tell_peers(self, note: bytes) -> None:
        for sock in self._sockets:
            try:
                if sock.type == socket.SOCK_STREAM and sock.fileno() >= 0:
                    sock.send(note)
            except OSError:
                pass  # a listener, or a peer already gone

    def _forget_in_child(self) -> None:
        """A forked child (a data-loading worker) must not hold this rank's connections open:
        its parent's death would then go unseen."""
        self._closing.set()
        for sock in (*self._sockets, self._wake_r, self._wake_w):
            sock.close()


def _addresses() -> list[str]:
    """Addresses other hosts may reach this one at: the host name's IPv4 addresses, then the
    name itself."""
    host = socket.gethostname()
    try:
        found = [a for a in socket.gethostbyname_ex(host)[2] if not a.startswith("127.")]
    except OSError:
        found = []
    return [*dict.fromkeys(found), host]


def _connect(addresses: list[str], port: int, hub_host: str) -> socket.socket | None:
    """A connection to rank 0's listener, loopback first when it runs on this host."""
    candidates = (["127.0.0.1"] if hub_host == socket.gethostname() else []) + addresses
    for address in candidates:
        try:
            connection = socket.create_connection((address, port), timeout=_CONNECT_SECONDS)
        except OSError:
            continue
        connection.settimeout(None)  # from now on it waits for the end, however long
        return connection
    return None
