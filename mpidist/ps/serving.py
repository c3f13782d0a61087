"""How a parameter-server job starts, serves and ends: what a ps or worker rank runs
(``run_task``), the chief's wait for its workers (``await_workers``) and its shutdown of the job
(``shutdown_job``). Below the strategy: the strategy's constructor and ``mpidist.Server``
(``service``) both serve through ``run_task``.

Start: each worker says HELLO to the chief with its GPU count; the chief waits (bounded by
``MPIDIST_PS_CONNECT_TIMEOUT``) and checks that the workers agree. End: at the chief's exit the
coordinator stops the workers, then the parameter servers; every ``run_task`` returns, so the
job ends by itself with exit code 0 (TF's servers never return: tensorflow#25858).

A job that lost a rank (a worker dead, silent or stuck; a failed ps) cannot end with
MPI_Finalize, which waits for every rank: the chief reports what was lost, tells every rank to
leave without it, and leaves with exit code 1 (``liveness``); so does a job whose parameter
server failed even if the program caught the PSUnavailableError. A ps or worker rank whose
chief is gone leaves with exit code 1 and a report.
"""

import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError
from mpidist.ps import messages
from mpidist.ps.liveness import (CHIEF_GONE_EXIT_CODE, ChiefGoneError, leave_without_finalize,
                                 skip_finalize_at_exit)
from mpidist.ps.roles import check_worker_devices
from mpidist.ps.runtime import TaskRuntime, stop_workers
from mpidist.ps.server import ParameterServer
from mpidist.ps.transport import CTRL
from mpidist.ps.wire import Tag
from mpidist.ps.worker import WorkerLoop

if TYPE_CHECKING:
    from mpidist.ps.strategy import ParameterServerStrategy

__all__ = ["run_task", "await_workers", "shutdown_job"]


def run_task(runtime: TaskRuntime, strategy: Any = None) -> None:
    """Serve this rank's role until the chief shuts the job down, then return. A worker runs
    its closures under ``strategy`` (this rank's ParameterServerStrategy; required for a
    worker). When the chief says a rank is lost, this process will leave without MPI_Finalize
    at its exit; when the chief is gone, it leaves now (exit code 1, with the report)."""
    if runtime.task_type == "ps":
        task: ParameterServer | WorkerLoop = ParameterServer(runtime.transport, runtime.roles,
                                                             runtime.faults)
    elif runtime.task_type == "worker":
        if strategy is None:
            raise ValueError(f"run_task: {runtime.where} is a worker: it runs closures under its "
                             "ParameterServerStrategy, so pass strategy= (mpidist.Server builds "
                             "one).")
        task = WorkerLoop(runtime, strategy)
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
        hello = messages.decode(Tag.HELLO, buffer)
        assert isinstance(hello, messages.Hello)
        counts[hello.task_id] = hello.gpus
    replicas = check_worker_devices([counts[t] for t in sorted(counts)])
    if replicas > 1:
        raise NotImplementedError(
            f"The workers have {replicas} GPUs each; ParameterServerStrategy runs one replica per "
            "worker in this version: give each worker one GPU (one rank per GPU) or none.")
    return replicas


def shutdown_job(strategy: "ParameterServerStrategy") -> None:
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
    if runtime.stopped:
        # Ctrl-C: every rank got it and printed its line; the chief neither waits for the
        # closures nor for goodbyes from ranks that are gone (that took 30 s and more).
        if runtime.pulse is not None:
            runtime.pulse.stop()
        stop_workers(runtime.transport, runtime.roles, (), 0.0, finalize=False)  # no waiting
        leave_without_finalize(128 + signal.SIGINT)
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
