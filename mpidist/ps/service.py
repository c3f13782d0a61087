"""What the ps and worker ranks run, ``mpidist.Server``, and how a job starts and ends.

Start: each worker says HELLO to the chief with its GPU count; the chief waits (bounded by
``MPIDIST_PS_CONNECT_TIMEOUT``) and checks that the workers agree. End: at the chief's exit the
coordinator stops the workers, then the parameter servers; every ``Server.join()`` returns, so
the job ends by itself with exit code 0 (TF's servers never return: tensorflow#25858).

A job that lost a rank (a worker dead, silent or stuck; a failed ps) cannot end with
MPI_Finalize, which waits for every rank: the chief reports what was lost, tells every rank to
leave without it, and leaves with exit code 1 (``liveness``); so does a job whose parameter
server failed even if the program caught the PSUnavailableError. A ps or worker rank whose
chief is gone leaves with exit code 1 and a report.
"""

import sys
import time
from typing import Any

from mpidist.cluster_resolver.base import SimpleClusterResolver
from mpidist.cluster_resolver.cluster_spec import normalize_cluster_spec
from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError
from mpidist.logs import get_logger
from mpidist.ps.liveness import (CHIEF_GONE_EXIT_CODE, ChiefGoneError, leave_without_finalize,
                                 skip_finalize_at_exit)
from mpidist.ps.roles import check_worker_devices
from mpidist.ps.runtime import Tag, TaskRuntime, decode_control, stop_workers
from mpidist.ps.server import ParameterServer
from mpidist.ps.strategy import ParameterServerStrategy
from mpidist.ps.transport import CTRL
from mpidist.ps.worker import WorkerLoop

__all__ = ["Server", "serve_task", "await_workers", "shutdown_job"]

log = get_logger("mpidist.ps")


def serve_task(runtime: TaskRuntime, strategy: ParameterServerStrategy | None = None) -> None:
    """Serve this rank's role (ps or worker) until the chief shuts the job down. When the
    chief says a rank is lost, this process will leave without MPI_Finalize at its exit; when
    the chief is gone, it leaves now (exit code 1, with the report)."""
    if runtime.task_type == "ps":
        task: Any = ParameterServer(runtime.transport, runtime.roles, runtime.faults)
    elif runtime.task_type == "worker":
        task = WorkerLoop(runtime, strategy or ParameterServerStrategy.for_task(runtime))
    else:
        raise ValueError(f"{runtime.where} is the chief: it coordinates, it does not serve.")
    try:
        task.serve()
    except ChiefGoneError as gone:
        if not runtime.transport.owns_process:
            raise
        runtime.transport.close(1.0)
        leave_without_finalize(CHIEF_GONE_EXIT_CODE, str(gone))
    if not task.finalize and runtime.transport.owns_process:
        runtime.transport.close(1.0)
        skip_finalize_at_exit(1)


def await_workers(runtime: TaskRuntime) -> int:
    """On the chief: every worker's HELLO; returns the replicas per worker (TF's check of equal
    GPU counts). A worker that never reports in is a DeadlineExceededError naming it."""
    roles = runtime.roles
    timeout = get_config().ps_connect_timeout
    start = time.monotonic()
    counts: dict[int, int] = {}
    for rank in roles.worker_ranks:
        where = roles.describe(rank)
        try:
            _, _, buffer = runtime.transport.recv(
                CTRL, rank, Tag.HELLO, f"{where} to start", where,
                max(timeout - (time.monotonic() - start), 1e-3), "MPIDIST_PS_CONNECT_TIMEOUT")
        except DeadlineExceededError as err:
            raise DeadlineExceededError(
                f"{err} Every rank of the job must build the strategy (or run "
                "mpidist.Server(...).join()).") from None
        task_id, gpus = decode_control(buffer)
        counts[task_id] = gpus
    replicas = check_worker_devices([counts[t] for t in sorted(counts)])
    if replicas > 1:
        raise NotImplementedError(
            f"The workers have {replicas} GPUs each; ParameterServerStrategy runs one replica per "
            "worker in this version: give each worker one GPU (one rank per GPU) or none.")
    return replicas


def shutdown_job(strategy: ParameterServerStrategy) -> None:
    """At the chief's exit: stop the workers (through the coordinator), then the servers. A
    job that lost a rank, or whose parameter server failed, leaves without MPI_Finalize with
    exit code 1 and a report (on every rank: the SHUTDOWN messages say so)."""
    extended = strategy.extended
    runtime = extended.runtime
    if runtime.ended:
        return
    runtime.ended = True
    for stream in (sys.stdout, sys.stderr):  # the program's output first, whatever follows
        stream.flush()
    coordinator = extended.coordinator
    timeout = get_config().ps_timeout
    if coordinator is not None:
        coordinator.shutdown()
        lost, fatal = coordinator.lost, coordinator.fatal
    else:  # no closure ever ran: the workers only wait for the word to stop
        lost, fatal = {}, None
        stop_workers(runtime.transport, runtime.roles, runtime.roles.worker_ranks,
                     min(timeout, 30.0))
    if runtime.pulse is not None:
        runtime.pulse.stop()
    runtime.client.shutdown_servers(finalize=not lost)
    runtime.transport.close()
    if not runtime.transport.owns_process or not (lost or fatal):
        return
    # The coordinator reported the loss before it told the ranks to leave.
    leave_without_finalize(1, None if lost else f"the job ends with exit code 1: a parameter "
                                                f"server failed ({fatal}).")


class Server:
    """TF's ``tf.distribute.Server`` for the ps and worker tasks of a job: ``join()`` serves
    this rank's role and returns when the chief shuts the job down.

    Args:
        server_or_cluster_def: A ClusterSpec (or dict), or a cluster resolver.
        job_name: ``"ps"`` or ``"worker"`` (the resolver's task type when None).
        task_index: The task's index within its job (the resolver's when None).
        protocol: Accepted for TF compatibility: MPI carries the traffic (``"inprocess"``
            selects an in-process cluster for tests).
        start: Accepted for TF compatibility (serving starts in ``join``).
    """

    def __init__(self, server_or_cluster_def: Any, job_name: str | None = None,
                 task_index: int | None = None, protocol: str | None = None, config: Any = None,
                 start: bool = True) -> None:
        resolver = server_or_cluster_def
        if not hasattr(resolver, "cluster_spec"):
            spec = normalize_cluster_spec(server_or_cluster_def)
            resolver = SimpleClusterResolver(spec, task_type=job_name, task_id=task_index,
                                             rpc_layer=protocol)
        elif job_name is not None or task_index is not None:
            resolver = SimpleClusterResolver(
                resolver.cluster_spec(), task_type=job_name or resolver.task_type,
                task_id=resolver.task_id if task_index is None else task_index,
                rpc_layer=protocol or getattr(resolver, "rpc_layer", None))
        self._runtime = TaskRuntime.connect(resolver)
        if self._runtime.task_type == "chief":
            raise ValueError("mpidist.Server serves ps and worker tasks; the chief creates the "
                             "ParameterServerStrategy and a ClusterCoordinator instead.")

    @property
    def target(self) -> str:
        return f"mpi://{self._runtime.where}"

    def start(self) -> None:
        """Nothing to do: serving starts in ``join()``."""

    def join(self) -> None:
        """Serve until the chief shuts the job down, then return."""
        serve_task(self._runtime)
