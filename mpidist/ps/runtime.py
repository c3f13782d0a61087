"""One rank's place in a parameter-server job: its role, its transport, its client, and the
control messages between the chief and the workers (ps-design.md §1, §3).

``TaskRuntime.connect(resolver)`` is where a rank joins the job: it works out the roles from
the cluster resolver, builds the transport (collective over MPI_COMM_WORLD, so every rank of
the job must get here) and the client for variable requests. ``ChiefPulse`` is the chief's
heartbeat to the other ranks (``liveness.ChiefWatch`` listens to it).
"""

import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from mpidist.cluster_resolver.agreement import agree_on_cluster
from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError
from mpidist.logs import get_logger
from mpidist.ps.client import PSClient, use_client
from mpidist.ps.faults import Faults
from mpidist.ps.roles import ClusterRoles, resolve_roles
from mpidist.ps.serialization import dumps_payload, loads_payload, pack_frames, unpack_frames
from mpidist.ps.server import HEARTBEAT_TAG
from mpidist.ps.transport import (CTRL, DATA, LocalFabric, LocalTransport, MPITransport,
                                  Transport)
from mpidist.ps.wire import REQUEST_TAG, Op, encode_request

__all__ = ["TaskRuntime", "Tag", "send_control", "decode_control", "INPROCESS", "Outcome",
           "send_result", "decode_result", "stop_workers", "ChiefPulse"]

log = get_logger("mpidist.ps")

INPROCESS = "inprocess"  # the resolver's rpc_layer that selects an in-process cluster


class Tag:
    """Tags of the control channel (chief <-> workers)."""

    WORK = 1       # chief -> worker: a closure to run
    RESULT = 2     # worker -> chief: its result or error
    HEARTBEAT = HEARTBEAT_TAG  # worker or ps -> chief, chief -> worker: alive
    HELLO = 4      # worker -> chief, once: ready, with its local device count
    SHUTDOWN = 5   # chief -> worker: stop serving
    BYE = 6        # worker -> chief: stopped


class Outcome:
    """How a closure ended, as its RESULT message says."""

    OK = 0
    ERROR = 1
    PREEMPTED = 2  # a worker failure: the chief runs the closure again elsewhere
    STUCK = 3      # past MPIDIST_PS_CLOSURE_TIMEOUT: the closure fails, its worker is abandoned


_RESULT = struct.Struct("<3q")


def send_result(transport: Transport, dest: int, closure_id: int, attempt: int, outcome: int,
                payload: Any) -> None:
    """A closure's RESULT: a fixed header the chief always reads, then the payload (the value's
    frames, or an error) that it unpickles separately, so a result it cannot unpickle still
    fails its own closure instead of going missing."""
    transport.send(CTRL, dest, Tag.RESULT,
                   b"".join((_RESULT.pack(closure_id, attempt, outcome), payload)))


def decode_result(buffer: Any) -> tuple[int, int, int, memoryview]:
    closure_id, attempt, outcome = _RESULT.unpack_from(buffer)
    return closure_id, attempt, outcome, memoryview(buffer)[_RESULT.size:]


def send_control(transport: Transport, dest: int, tag: int, obj: Any) -> None:
    transport.send(CTRL, dest, tag, pack_frames(dumps_payload(obj)))


def decode_control(buffer: Any) -> Any:
    return loads_payload(unpack_frames(buffer))


def stop_workers(transport: Transport, roles: ClusterRoles, waiting_for: Sequence[int],
                 timeout: float, finalize: bool = True) -> None:
    """From the chief: tell every worker to stop, then wait (bounded by ``timeout`` seconds in
    all) for the goodbye of each rank in ``waiting_for`` (a failed worker sends none).
    ``finalize`` False tells them a rank is lost: leave without MPI_Finalize. A send never
    blocks (``Transport.send``), so a dead worker cannot hold the chief here."""
    for rank in roles.worker_ranks:
        send_control(transport, rank, Tag.SHUTDOWN, {"finalize": finalize})
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
            for rank in self._roles.worker_ranks:
                if rank not in self.skip:
                    send_control(self._transport, rank, Tag.HEARTBEAT, None)
            for rank in self._roles.ps_ranks:
                if rank not in self.skip:
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
    """What a rank of a parameter-server job holds: roles, transport, client, faults."""

    def __init__(self, roles: ClusterRoles, transport: Transport, resolver: Any) -> None:
        self.roles = roles
        self.transport = transport
        self.resolver = resolver
        self.client = PSClient(transport, roles)
        self.faults = Faults.from_config()
        self.pulse: ChiefPulse | None = None  # the chief's heartbeat (start_chief)
        self.ended = False  # the chief has shut the job down (service.shutdown_job)
        # A rank of an MPI job is one process; simulated ranks are threads of one process.
        use_client(self.client, process_wide=not isinstance(transport, LocalTransport))

    @classmethod
    def connect(cls, resolver: Any) -> "TaskRuntime":
        if getattr(resolver, "rpc_layer", None) == INPROCESS:
            token, size, rank = _inprocess_position(resolver)
            roles = resolve_roles(resolver, size, rank)
            return cls(roles, LocalFabric.lookup(token).transport(roles.rank), resolver)
        agree_on_cluster("ParameterServerStrategy", resolver)  # same layout everywhere, bounded
        transport = _world_transport()
        roles = resolve_roles(resolver, transport.size, transport.rank)
        return cls(roles, transport, resolver)

    @property
    def task_type(self) -> str:
        return self.roles.task_type

    @property
    def where(self) -> str:
        return self.roles.describe(self.roles.rank)

