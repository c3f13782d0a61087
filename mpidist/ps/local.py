"""An in-process parameter-server cluster: the ps and worker tasks run as threads of this
process over mailboxes instead of MPI (TF's tests use an in-process cluster the same way).

For tests and for trying the API without ``mpiexec``::

    with mpidist.ps.local.InProcessCluster(num_ps=2, num_workers=2) as cluster:
        strategy = mpidist.experimental.ParameterServerStrategy(cluster.resolver)
        ...

Every message still goes through the real protocol (requests, pickled closures, results);
only the transport differs. Leaving the ``with`` block shuts the cluster down.
"""

import threading
import uuid
from typing import Any

from mpidist.cluster_resolver.base import SimpleClusterResolver
from mpidist.cluster_resolver.cluster_spec import ClusterSpec
from mpidist.core.waiting import join_thread
from mpidist.errors import DeadlineExceededError
from mpidist.logs import get_logger
from mpidist.ps.client import PSClient
from mpidist.ps.roles import ClusterRoles
from mpidist.ps.runtime import INPROCESS, stop_workers
from mpidist.ps.service import Server, shutdown_job
from mpidist.ps.transport import LocalFabric

__all__ = ["InProcessCluster"]

log = get_logger("mpidist.ps")


class InProcessCluster:
    """A chief, ``num_ps`` parameter servers and ``num_workers`` workers in this process.

    Attributes:
        resolver: The chief's cluster resolver: pass it to ParameterServerStrategy.
        errors: Exceptions that ended a ps or worker thread (empty when all went well).
    """

    def __init__(self, num_ps: int = 1, num_workers: int = 2) -> None:
        if num_ps < 1 or num_workers < 1:
            raise ValueError(f"An in-process cluster needs at least one ps and one worker, got "
                             f"num_ps={num_ps}, num_workers={num_workers}.")
        self._token = f"{INPROCESS}-{uuid.uuid4().hex[:12]}"
        tasks = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
        addresses = [f"{self._token}:{rank}" for rank in range(1 + len(tasks))]
        self.spec = ClusterSpec({"chief": addresses[:1], "ps": addresses[1:1 + num_ps],
                                 "worker": addresses[1 + num_ps:]})
        self._fabric = LocalFabric(1 + len(tasks))
        LocalFabric.register(self._token, self._fabric)
        self.resolver = SimpleClusterResolver(self.spec, task_type="chief", task_id=0,
                                              rpc_layer=INPROCESS)
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._serve, args=task, daemon=True,
                                          name=f"mpidist-inprocess-{task[0]}-{task[1]}")
                         for task in tasks]
        self._num_ps, self._num_workers = num_ps, num_workers
        for thread in self._threads:
            thread.start()

    def _serve(self, task_type: str, task_id: int) -> None:
        resolver = SimpleClusterResolver(self.spec, task_type=task_type, task_id=task_id,
                                         rpc_layer=INPROCESS)
        try:
            Server(resolver).join()  # wait-ok: serves until SHUTDOWN, or until the chief is gone
        except BaseException as exc:  # noqa: BLE001 - reported by the cluster, not lost in a thread
            log.error("in-process %s %d failed: %r", task_type, task_id, exc)
            self.errors.append(exc)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the coordinator (if a strategy was made), the workers and the servers."""
        strategy = self._chief_strategy()
        if strategy is not None:
            shutdown_job(strategy)
        else:  # no chief was made: stop the tasks as its shutdown would
            chief = self._fabric.transport(0)
            roles = ClusterRoles.from_counts(self._num_ps, self._num_workers, rank=0)
            stop_workers(chief, roles, roles.worker_ranks, timeout)
            PSClient(chief, roles).shutdown_servers()
        for thread in self._threads:
            try:
                join_thread(thread, f"in-process task {thread.name!r} to stop", timeout=timeout)
            except DeadlineExceededError:
                pass  # named below with the others
        LocalFabric.unregister(self._token)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"in-process cluster threads did not stop: {alive}")

    def _chief_strategy(self) -> Any:
        """This cluster's chief strategy, or None where none was made. Not the thread's current
        client: a cluster made later on this thread replaces that, and stopping the workers
        here while this cluster's dispatcher still reads their messages lost their goodbyes
        (a 30 s wait)."""
        return getattr(self._fabric.chief_client, "strategy", None)

    def __enter__(self) -> "InProcessCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
