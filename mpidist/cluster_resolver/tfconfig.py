"""TFConfigClusterResolver: the cluster described by the ``TF_CONFIG`` environment variable.

``TF_CONFIG`` is a JSON object such as::

    {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]},
     "task": {"type": "worker", "index": 1},
     "rpc_layer": "grpc"}

It is re-read on every access, so changes made after the resolver was built are seen.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

from mpidist.cluster_resolver.base import ClusterResolver, format_master_url, master_address
from mpidist.cluster_resolver.cluster_spec import ClusterSpec

__all__ = ["TFConfigClusterResolver", "TF_CONFIG_EXAMPLE"]

TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
)


def _bad_tf_config(raw: str, why: str) -> ValueError:
    return ValueError(
        f"The TF_CONFIG environment variable {why}: {raw!r}. It must be a JSON object, e.g. "
        f"TF_CONFIG='{TF_CONFIG_EXAMPLE}'"
    )


def load_tf_config() -> dict[str, Any]:
    """``$TF_CONFIG`` parsed; ``{}`` when it is unset or empty.

    Raises:
        ValueError: it is not valid JSON, or not a JSON object.
    """
    raw = os.environ.get("TF_CONFIG", "")
    # An empty value is how shells "unset" a variable for one command: treat it as absent.
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _bad_tf_config(raw, f"is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _bad_tf_config(raw, f"is a JSON {type(config).__name__}, not an object")
    return config


def _task_section() -> dict[str, Any]:
    task = load_tf_config().get("task", {})
    if not isinstance(task, dict):
        raise ValueError(
            f"TF_CONFIG's 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}, "
            f"got {task!r}."
        )
    return task


class TFConfigClusterResolver(ClusterResolver):
    """Reads the cluster, this task and the rpc layer from ``$TF_CONFIG`` on every access.

    - ``cluster_spec()`` ← ``cluster`` (the empty ClusterSpec when absent);
    - ``task_type`` / ``task_id`` ← ``task.type`` / ``int(task.index)`` unless overridden;
    - ``rpc_layer`` ← ``rpc_layer`` unless overridden;
    - ``master()`` ← ``session_master`` if present; ``""`` when the cluster has at most one task;
      else ``"<rpc_layer>://<address of the task>"``.

    Args:
        task_type: overrides ``task.type``.
        task_id: overrides ``task.index``.
        rpc_layer: overrides ``rpc_layer``.
        environment: returned by ``environment`` (``""`` when None).
    """

    def __init__(self, task_type: str | None = None, task_id: int | None = None,
                 rpc_layer: str | None = None, environment: str | None = None) -> None:
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    @property
    def task_type(self) -> str | None:
        if self._task_type is not None:
            return str(self._task_type)
        task = _task_section()
        return str(task["type"]) if "type" in task else None

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        if self._task_id is not None:
            return int(self._task_id)
        task = _task_section()
        if "index" not in task:
            return None
        try:
            return int(task["index"])
        except (TypeError, ValueError):
            raise ValueError(
                f"TF_CONFIG's task.index must be an integer, got {task['index']!r}."
            ) from None

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        if self._rpc_layer is not None:
            return self._rpc_layer
        return load_tf_config().get("rpc_layer")

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        return "" if self._environment is None else self._environment

    def cluster_spec(self) -> ClusterSpec:
        """The ``cluster`` of ``$TF_CONFIG`` as a ClusterSpec (empty when absent)."""
        return ClusterSpec(load_tf_config().get("cluster") or {})

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """The master address (only meaningful for TF1-style sessions).

        Args:
            task_type: defaults to ``self.task_type``.
            task_id: defaults to ``self.task_id``.
            rpc_layer: defaults to ``self.rpc_layer``.

        Raises:
            ValueError: the cluster has several tasks but no task is named, or the named task
                is not in the cluster.
        """
        config = load_tf_config()
        if config.get("session_master") is not None:
            return cast(str, config["session_master"])
        cluster_spec = self.cluster_spec()
        if sum(cluster_spec.num_tasks(job) for job in cluster_spec.jobs) <= 1:
            return ""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            raise ValueError(
                "master() needs a task: TF_CONFIG has no 'task' section with 'type' and 'index' "
                "and none was given as task_type/task_id."
            )
        rpc_layer = self.rpc_layer if rpc_layer is None else rpc_layer
        return format_master_url(master_address(cluster_spec, task_type, task_id), rpc_layer)
