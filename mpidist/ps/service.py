"""``mpidist.Server``: TF's ``tf.distribute.Server`` for the ps and worker tasks of a job, and
``serve_task``, the same without the TF surface. Both serve through ``serving.run_task``, as a ps
or worker rank's ``ParameterServerStrategy()`` does; this module builds on the strategy (a
worker runs its closures under one), never the reverse.
"""

from typing import Any

from mpidist.cluster_resolver.base import SimpleClusterResolver
from mpidist.cluster_resolver.cluster_spec import normalize_cluster_spec
from mpidist.ps.runtime import TaskRuntime
from mpidist.ps.serving import await_workers, run_task, shutdown_job
from mpidist.ps.strategy import ParameterServerStrategy

__all__ = ["Server", "serve_task", "await_workers", "shutdown_job"]


def serve_task(runtime: TaskRuntime, strategy: ParameterServerStrategy | None = None) -> None:
    """Serve this rank's role (ps or worker) until the chief shuts the job down; a worker
    without ``strategy`` gets its own (``ParameterServerStrategy.for_task``)."""
    if strategy is None and runtime.task_type == "worker":
        strategy = ParameterServerStrategy.for_task(runtime)
    run_task(runtime, strategy)


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
