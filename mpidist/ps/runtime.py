"""One rank's place in a parameter-server job: its role, its transport, its client, and the
control messages between the chief and the workers (ps-design.md §1, §3).

``TaskRuntime.connect(resolver)`` is where a rank joins the job: it works out the roles from
the cluster resolver, builds the transport (collective over MPI_COMM_WORLD, so every rank of
the job must get here) and the client for variable requests. ``ChiefPulse`` is the chief's
heartbeat to the other ranks (``liveness.ChiefWatch`` listens to it). The messages themselves
are ``messages`` (control channel) and ``wire`` (requests to a ps).
"""

import threading
import time
from collections.abc import Sequence
from typing import Any

from mpidist.cluster_resolver.agreement import agree_on_cluster
from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError
from mpidist.logs import get_logger
from mpidist.ps import messages
from mpidist.ps.client import PSClient, use_client
from mpidist.ps.faults import Faults
from mpidist.ps.roles import ClusterRoles, resolve_roles
from mpidist.ps.transport import CTRL, DATA, LocalFabric, LocalTransport, MPITransport, Transport
from mpidist.ps.wire import REQUEST_TAG, Op, Tag, encode_request

__all__ = ["TaskRuntime", "INPROCESS", "stop_workers", "ChiefPulse"]

log = get_logger("mpidist.ps")

INPROCESS = "inprocess"  # the resolver's rpc_layer that selects an in-process cluster


def stop_workers(transport: Transport, roles: ClusterRoles, waiting_for: Sequence[int],
                 timeout: float, finalize: bool = True) -> None:
    """From the chief: tell every worker to stop, then wait (bounded by ``timeout`` seconds in
    all) for the goodbye of each rank in ``waiting_for`` (a failed worker sends none).
    ``finalize`` False tells them a rank is lost: leave without MPI_Finalize. A send never
    blocks (``Transport.send``), so a dead worker cannot hold the chief here."""
    for rank in roles.worker_ranks:
        messages.send(transport, rank, messages.Shutdown(finalize))
    end = time.monotonic() + timeout
    for rank in waiting_for:
        where = roles.describe(rank)
        try:
            transport.recv(CTRL, rank, Tag.BYE, f"the goodbye of {where}", where,
                           max(end - time.monotonic(), 1e-3), "MPIDIST_PS_TIMEOUT")
        except DeadlineExceededError as err:
            log.warning("%s did not confirm its shutdown: %s", where, err)


class ChiefPulse:
    """The chief's heartbeat: every ``MPIDIST_PS_HEARTBEAT_SECONDS`` a small message to each
    worker (control channel) and each ps (a posted PING), so they can tell a chief that is busy
    from one that is gone. ``skip`` lists ranks known dead (a send to them never completes)."""

    def __init__(self, transport: Transport, roles: ClusterRoles) -> None:
        self._transport = transport
        self._roles = roles
        self.skip: set[int] = set()
        self._stop = threading.Event()
        self._ping = encode_request(Op.PING, 0)[0]
        self._thread = threading.Thread(target=self._run, daemon=True, name="mpidist-chief-pulse")
        self._thread.start()

    def _run(self) -> None:
        interval = get_config().ps_heartbeat_seconds
        while not self._stop.wait(interval):  # wait-ok: the pulse's period, until stop()
            skip = self.skip.union(self._transport.gone())
            for rank in self._roles.worker_ranks:
                if rank not in skip:
                    messages.send(self._transport, rank, messages.Heartbeat())
            for rank in self._roles.ps_ranks:
                if rank not in skip:
                    self._transport.send(DATA, rank, REQUEST_TAG, self._ping)
            self._transport.progress()

    def stop(self) -> None:
        self._stop.set()


_mpi_transport: list[MPITransport] = []
_mpi_lock = threading.Lock()


def _world_transport() -> MPITransport:
    """The process's MPI transport (its communicator duplicates are made once per process)."""
    with _mpi_lock:
        if not _mpi_transport:
            _mpi_transport.append(MPITransport())
        return _mpi_transport[0]


def _inprocess_position(resolver: Any) -> tuple[str, int, int]:
    """(fabric token, world size, rank) of an in-process cluster's task."""
    spec = resolver.cluster_spec()
    if not spec.jobs:  # resolve_roles rejects an empty cluster with TF's message
        return "", 1, 0
    address = spec.task_address(spec.jobs[0], 0)
    token = address.rsplit(":", 1)[0]
    order = [job for job in ("chief", "ps", "worker") if job in spec.jobs]
    size = sum(spec.num_tasks(job) for job in spec.jobs)
    rank = 0
    for job in order:
        if job == resolver.task_type:
            return token, size, rank + int(resolver.task_id or 0)
        rank += spec.num_tasks(job)
    return token, size, -1


class TaskRuntime:
    """What a rank of a parameter-server job holds: roles, transport, client, and the fault
    injector (``faults``: None unless ``MPIDIST_PS_FAULTS`` or a test sets one)."""

    def __init__(self, roles: ClusterRoles, transport: Transport, resolver: Any,
                 faults: Faults | None = None) -> None:
        self.roles = roles
        self.transport = transport
        self.resolver = resolver
        self.client = PSClient(transport, roles)
        self.faults = faults if faults is not None else Faults.from_config().or_none()
        self.pulse: ChiefPulse | None = None  # the chief's heartbeat (start_chief)
        self.ended = False  # the chief has shut the job down (serving.shutdown_job)
        self.stopped = False  # stopped by Ctrl-C: leave at once (every rank is being stopped)
        # A rank of an MPI job is one process; simulated ranks are threads of one process.
        use_client(self.client, process_wide=not isinstance(transport, LocalTransport))
        if isinstance(transport, LocalTransport) and roles.is_chief:
            transport.fabric.chief_client = self.client

    @classmethod
    def connect(cls, resolver: Any) -> "TaskRuntime":
        if getattr(resolver, "rpc_layer", None) == INPROCESS:
            token, size, rank = _inprocess_position(resolver)
            roles = resolve_roles(resolver, size, rank)
            return cls(roles, LocalFabric.lookup(token).transport(roles.rank), resolver)
        # This rank's own task first, from local facts only: a rank whose task is wrong
        # raises (and its error ends the job, printed) before any collective, rather than
        # leaving the others to fail in the agreement without its word.
        from mpidist.comm.mpi import install_abort_on_exception, mpi_module  # noqa: PLC0415 - MPI starts only when needed

        world = mpi_module().COMM_WORLD
        if world.Get_size() > 1:
            install_abort_on_exception()
        roles = resolve_roles(resolver, world.Get_size(), world.Get_rank())
        agree_on_cluster("ParameterServerStrategy", resolver)  # same layout everywhere, bounded
        return cls(roles, _world_transport(), resolver)

    def forget(self, rank: int) -> None:
        """``rank`` is lost to the job: the chief's heartbeat stops going to it (a send to a
        dead rank never completes, and may wedge MPI)."""
        if self.pulse is not None:
            self.pulse.skip.add(rank)

    def note_stop(self, stopped: bool) -> None:
        """(``comm.mpi.on_abort``) The chief ends with its own report: after Ctrl-C (every
        rank is being stopped) the job leaves at once instead of waiting for the ranks."""
        self.stopped = self.stopped or stopped

    @property
    def task_type(self) -> str:
        return self.roles.task_type

    @property
    def where(self) -> str:
        return self.roles.describe(self.roles.rank)

