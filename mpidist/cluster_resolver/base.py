"""ClusterResolver, the interface strategies use to learn the cluster and their place in it.

A resolver answers three questions: which tasks exist (``cluster_spec()``), which one am I
(``task_type``, ``task_id``) and how many accelerators each task has (``num_accelerators()``).
``SimpleClusterResolver`` holds given answers; the others read them from the environment.
ClusterSpec and the multi-worker rules are re-exported here so one import serves strategies.
"""

from __future__ import annotations

import abc
from typing import Any

from mpidist.backend import num_gpus
from mpidist.cluster_resolver.cluster_spec import ClusterSpec, normalize_cluster_spec
from mpidist.cluster_resolver.multi_worker import (
    collective_leader,
    id_in_cluster,
    is_chief,
    num_workers,
    task_count,
    validate_cluster_spec,
)

__all__ = [
    "ClusterResolver",
    "SimpleClusterResolver",
    "ClusterSpec",
    "format_master_url",
    "normalize_cluster_spec",
    "collective_leader",
    "id_in_cluster",
    "is_chief",
    "num_workers",
    "task_count",
    "validate_cluster_spec",
    "configuration_facts",
]


def configuration_facts(resolver: ClusterResolver) -> dict[str, Any]:
    """What every rank's copy of ``resolver`` must agree on, as plain data: its kind, the
    cluster it describes and the settings it was given (not this task's own place in it, nor
    what it found on this node). Strategies check these across ranks when they are built
    (``mpidist.comm.config_agreement``)."""
    spec = resolver.cluster_spec()
    facts: dict[str, Any] = {
        "cluster resolver": type(resolver).__name__,
        "cluster_spec": normalize_cluster_spec(spec).as_dict() if spec else {},
        "rpc_layer": resolver.rpc_layer,
    }
    facts.update(resolver._settings_to_agree())  # the hook of this module's class
    return facts


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """``"<rpc_layer>://<master>"``, or ``master`` alone when there is no rpc layer."""
    if rpc_layer is not None and not isinstance(rpc_layer, str):
        raise TypeError(f"rpc_layer must be a protocol name such as 'grpc', or None; got "
                        f"{type(rpc_layer).__name__} {rpc_layer!r}.")
    return f"{rpc_layer}://{master}" if rpc_layer else master


def master_address(spec: ClusterSpec, task_type: str, task_id: int) -> str:
    """``spec``'s address of the task ``master(task_type, task_id)`` names; an error names
    master's arguments (ClusterSpec's own call them job_name and task_index)."""
    try:
        return spec.task_address(task_type, task_id)
    except (TypeError, ValueError) as exc:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (f"master(task_type={task_type!r}, task_id={task_id!r}): "
                        f"{exc.args[0]}",) + exc.args[1:]
        raise


class ClusterResolver(abc.ABC):
    """Abstract base of all cluster resolvers.

    Subclasses implement ``cluster_spec()`` and ``master()``. Where task type, task id and rpc
    layer apply, they either override the properties or set ``self._task_type``,
    ``self._task_id`` and ``self._rpc_layer`` and use the getters and setters defined here.

    - ``task_type``: the job of this process (``"chief"``, ``"worker"``, ``"ps"``,
      ``"evaluator"``), or None when not applicable.
    - ``task_id``: the index of this process in its job, or None.
    - ``rpc_layer``: the protocol named in master URLs (``"grpc"``), or None.
    """

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The cluster as it is now, as a ClusterSpec (re-read on every call, never cached)."""

    @abc.abstractmethod
    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """The address of a task as ``"<rpc_layer>://host:port"``, or ``""`` when there is none.

        Args:
            task_type: the job of the task; defaults to this task's.
            task_id: the index of the task; defaults to this task's.
            rpc_layer: the protocol prefix; defaults to ``self.rpc_layer``.
        """

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: object = None) -> dict[str, int]:
        """Accelerators per task, e.g. ``{"GPU": 2}``; ``{}`` when there are none.

        The base class counts the GPUs this process can see (TF lists the devices of a session;
        with one process per task the answer is the same). Arguments are accepted for
        compatibility and unused.
        """
        del task_type, task_id, config_proto
        count = num_gpus()
        return {"GPU": count} if count else {}

    def _settings_to_agree(self) -> dict[str, Any]:
        """Settings given to this resolver that every rank's copy must share (a dict of plain
        data; see ``configuration_facts``). None beyond the cluster by default."""
        return {}

    @property
    def environment(self) -> str:
        """``"google"`` inside Google, ``""`` elsewhere; always ``""`` for mpidist's resolvers."""
        return ""

    @property
    def task_type(self) -> str | None:
        """The job of this process, or None."""
        return getattr(self, "_task_type", None)

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The index of this process within its job, or None."""
        return getattr(self, "_task_id", None)

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The protocol of master URLs, or None."""
        return getattr(self, "_rpc_layer", None)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer


class SimpleClusterResolver(ClusterResolver):
    """A resolver that returns what it was given.

    Example (on worker 1 of 2)::

        cluster = ClusterSpec({"worker": ["w0:2222", "w1:2222"]})
        resolver = SimpleClusterResolver(cluster, task_type="worker", task_id=1,
                                         num_accelerators={"GPU": 8}, rpc_layer="grpc")

    Args:
        cluster_spec: a ClusterSpec.
        master: the address ``master()`` returns when no task is named.
        task_type: the job of this process.
        task_id: the index of this process in its job.
        environment: returned by ``environment``.
        num_accelerators: returned by ``num_accelerators()``; None means ``{}``.
        rpc_layer: the protocol prefix of master URLs.

    Raises:
        TypeError: ``cluster_spec`` is not a ClusterSpec or ``master`` is not a string.
    """

    def __init__(self, cluster_spec: ClusterSpec, master: str = "", task_type: str | None = None,
                 task_id: int | None = None, environment: str = "",
                 num_accelerators: dict[str, int] | None = None, rpc_layer: str | None = None) -> None:
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError(
                f"cluster_spec must be a ClusterSpec, got {type(cluster_spec).__name__} "
                f"{cluster_spec!r}."
            )
        if not isinstance(master, str):
            raise TypeError(f"master must be a string, got {type(master).__name__} {master!r}.")
        self._cluster_spec = cluster_spec
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        """The ClusterSpec given to the constructor."""
        return self._cluster_spec

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """The address of the named task if both ``task_type`` and ``task_id`` are given, else
        the ``master`` given to the constructor; prefixed with the rpc layer if there is one."""
        if task_type is not None and task_id is not None:
            address = master_address(self._cluster_spec, task_type, task_id)
        else:
            address = self._master
        return format_master_url(address, rpc_layer or self._rpc_layer)

    @property
    def environment(self) -> str:
        return self._environment

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: object = None) -> dict[str, int]:
        """The ``num_accelerators`` given to the constructor (``{}`` if None); arguments unused."""
        del task_type, task_id, config_proto
        return {} if self._num_accelerators is None else self._num_accelerators
