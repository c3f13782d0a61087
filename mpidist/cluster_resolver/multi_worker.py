"""The rules MultiWorkerMirroredStrategy applies to a cluster (TF's ``multi_worker_util``).

Jobs are ``chief`` (at most one task), ``worker``, ``evaluator`` (at most one task, outside the
training cluster) and ``ps``. The chief counts as the first worker: ``id_in_cluster`` numbers the
chief 0 and worker i ``i + len(chief)``. Every function accepts a ClusterSpec or a plain dict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpidist.cluster_resolver.cluster_spec import normalize_cluster_spec

if TYPE_CHECKING:
    from mpidist.cluster_resolver.cluster_spec import ClusterLike

__all__ = [
    "ALLOWED_TASK_TYPES",
    "validate_cluster_spec",
    "task_count",
    "id_in_cluster",
    "is_chief",
    "num_workers",
    "collective_leader",
]

ALLOWED_TASK_TYPES = ("chief", "worker", "evaluator", "ps")


def task_count(cluster_spec: ClusterLike, task_type: str) -> int:
    """Number of tasks of ``task_type``, 0 when the job is absent."""
    cluster_spec = normalize_cluster_spec(cluster_spec)
    return cluster_spec.num_tasks(task_type) if task_type in cluster_spec.jobs else 0


def validate_cluster_spec(cluster_spec: ClusterLike, task_type: str | None,
                          task_id: int | None) -> None:
    """Check ``cluster_spec`` and this task's place in it; an empty cluster always passes.

    Args:
        cluster_spec: ClusterSpec or dict.
        task_type: this task's job name.
        task_id: this task's index in its job.

    Raises:
        ValueError: a job name outside chief/worker/evaluator/ps; more than one chief or
            evaluator; ``task_type``/``task_id`` missing, unknown or out of range.
    """
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if not cluster_spec:
        return
    if task_type is None or task_id is None:
        raise ValueError(
            "When `cluster_spec` is given, you must also specify `task_type` and `task_id`."
        )
    if any(job not in ALLOWED_TASK_TYPES for job in cluster_spec.jobs):
        raise ValueError(
            f"Disallowed task type found in cluster spec. Allowed types are {ALLOWED_TASK_TYPES} "
            f"and the cluster spec is {cluster_spec!r}."
        )
    if task_type not in ALLOWED_TASK_TYPES:
        raise ValueError(
            f"Unrecognized task_type: {task_type!r}, valid task types are: {ALLOWED_TASK_TYPES}"
        )
    # The evaluator may run outside the training cluster, so it need not be listed.
    if task_type not in cluster_spec.jobs and task_type != "evaluator":
        raise ValueError(f"`task_type` {task_type!r} not found in cluster_spec.")
    if task_count(cluster_spec, "chief") > 1:
        raise ValueError("There must be at most one 'chief' job.")
    if task_count(cluster_spec, "evaluator") > 1:
        raise ValueError("There must be at most one 'evaluator' job.")
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
        raise ValueError(f"`task_id` must be a non-negative integer, got {task_id!r}.")
    if task_type in cluster_spec.jobs and task_id >= task_count(cluster_spec, task_type):
        raise ValueError(f"The `task_id` {task_id} exceeds the maximum id of {task_type}.")


def id_in_cluster(cluster_spec: ClusterLike, task_type: str | None,
                  task_id: int) -> int:
    """This task's worker number: chief 0, worker i ``i + len(chief)``, evaluator i ``i``.

    Raises:
        ValueError: the cluster is invalid, or ``task_type`` is ``ps`` (which has no id).
    """
    validate_cluster_spec(cluster_spec, task_type, task_id)
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return task_id + task_count(cluster_spec, "chief")
    if task_type == "evaluator":
        return task_id
    raise ValueError(f"There is no id for task_type {task_type!r}")


def is_chief(cluster_spec: ClusterLike, task_type: str | None, task_id: int | None) -> bool:
    """True for the chief and the evaluator, and for worker 0 when there is no chief job.

    An empty cluster (one local worker) is its own chief.
    """
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if not cluster_spec:
        return True
    validate_cluster_spec(cluster_spec, task_type, task_id)
    if task_type in ("chief", "evaluator"):
        return True
    return "chief" not in cluster_spec.jobs and task_type == "worker" and task_id == 0


def num_workers(cluster_spec: ClusterLike, task_type: str | None) -> int:
    """Workers that train together: ``len(chief) + len(worker)``; for the evaluator, its own count.

    An empty cluster has one worker; an evaluator outside the cluster counts itself.

    Raises:
        ValueError: the cluster is invalid, or ``task_type`` is ``ps``.
    """
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if not cluster_spec:
        return 1
    validate_cluster_spec(cluster_spec, task_type, 0)
    if task_type == "evaluator":
        return task_count(cluster_spec, "evaluator") or 1
    if task_type not in ("chief", "worker"):
        raise ValueError(f"Unexpected `task_type` {task_type!r}")
    return task_count(cluster_spec, "chief") + task_count(cluster_spec, "worker")


def collective_leader(cluster_spec: ClusterLike) -> str:
    """The device prefix of the task that leads collectives.

    ``/job:chief/replica:0/task:0`` when there is a chief, else ``/job:worker/replica:0/task:0``;
    ``""`` for an empty cluster or one with neither job.
    """
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if "chief" in cluster_spec.jobs:
        return "/job:chief/replica:0/task:0"
    if "worker" in cluster_spec.jobs:
        return "/job:worker/replica:0/task:0"
    return ""
