"""ClusterSpec: the tasks of a cluster, grouped into named jobs (TF's ``tf.train.ClusterSpec``).

A job is a list of ``"host:port"`` addresses (task i at position i) or a sparse dict
``{task_index: address}``. Differences from TF: ``None`` is accepted as the empty cluster, and
``jobs`` is sorted, so two ranks that build the same cluster list its jobs in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, cast

from mpidist.core.signatures import accepts

__all__ = ["ClusterSpec", "normalize_cluster_spec"]

JobTasks: TypeAlias = "Sequence[str] | Mapping[int | str, str]"
"""One job's tasks as given: addresses in task order, or ``{task_index: address}`` (JSON's
string keys such as ``"0"`` included)."""

ClusterLike: TypeAlias = "ClusterSpec | Mapping[str, JobTasks] | None"
"""What the multi-worker rules accept as a cluster: a ClusterSpec, a dict of jobs, or None."""

ClusterDict: TypeAlias = "dict[str, list[str] | dict[int, str]]"
"""``ClusterSpec.as_dict()``: each job a list of addresses, or ``{index: address}`` when sparse."""


def _job_tasks(job_name: str, tasks: object) -> dict[int, str]:
    """``{index: address}`` for one job, type-checked."""
    items: list[tuple[int, Any]]
    if isinstance(tasks, (list, tuple)):
        items = list(enumerate(tasks))
    elif isinstance(tasks, dict):
        items = []
        for key, address in tasks.items():
            # JSON (TF_CONFIG) turns integer keys into strings: accept "0" as 0, as TF does.
            try:
                index = int(key)
            except (TypeError, ValueError):
                index = -1
            if isinstance(key, (bool, float)) or index < 0:
                raise TypeError(
                    f"Task index {key!r} of job {job_name!r} is not a non-negative integer."
                )
            items.append((index, address))
    else:
        raise TypeError(
            f"The tasks for job {job_name!r} must be a list or a dictionary from integers to "
            f"strings, got {type(tasks).__name__} {tasks!r}."
        )
    for index, address in items:
        if not isinstance(address, str):
            raise TypeError(
                f"Task address {address!r} (job {job_name!r}, task {index}) must be a string "
                "such as 'host:2222'."
            )
    return dict(items)


class ClusterSpec:
    """The set of tasks taking part in a distributed computation.

    Example::

        ClusterSpec({"worker": ["w0:2222", "w1:2222"], "ps": {1: "ps1:2222"}})

    Args:
        cluster: a dict from job names to lists of addresses or to dicts ``{index: address}``;
            another ClusterSpec (copied); or ``None`` / ``{}`` for the empty cluster.

    Raises:
        TypeError: ``cluster``, a job name, a job's tasks or an address has the wrong type.
    """

    def __init__(self, cluster: ClusterLike = None) -> None:
        if cluster is None:
            cluster = {}
        if isinstance(cluster, ClusterSpec):
            self._cluster: dict[str, dict[int, str]] = {
                job: dict(tasks) for job, tasks in cluster._cluster.items()}
            return
        if not isinstance(cluster, dict):
            raise TypeError(
                "`cluster` must be a dictionary mapping job names to lists of network addresses "
                f"(or another ClusterSpec), got {type(cluster).__name__} {cluster!r}."
            )
        self._cluster = {}
        for job_name, tasks in cluster.items():
            if not isinstance(job_name, str):
                raise TypeError(f"Job name {job_name!r} must be a string.")
            self._cluster[job_name] = _job_tasks(job_name, tasks)

    def __bool__(self) -> bool:
        return bool(self._cluster)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            try:
                other = ClusterSpec(other)
            except TypeError:
                return False
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        return self._cluster == other._cluster

    __hash__ = None  # type: ignore[assignment]  # equal to dicts, which are unhashable

    def __repr__(self) -> str:
        items = self.as_dict()
        return "ClusterSpec({" + ", ".join(f"{job!r}: {items[job]!r}" for job in self.jobs) + "})"

    @property
    def jobs(self) -> list[str]:
        """The job names, sorted."""
        return sorted(self._cluster)

    def as_dict(self) -> ClusterDict:
        """``{job: tasks}``: a list where the task indices are 0..n-1, else ``{index: address}``.

        An empty job maps to ``{}``, as in TF.
        """
        result: ClusterDict = {}
        for job in self.jobs:
            indices = self.task_indices(job)
            if not indices:
                result[job] = {}
            elif indices[-1] + 1 == len(indices):
                result[job] = cast("list[str]", self.job_tasks(job))  # no gaps: no None
            else:
                result[job] = {i: self._cluster[job][i] for i in indices}
        return result

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._cluster[job_name]
        except (KeyError, TypeError):
            raise ValueError(f"No such job in cluster: {job_name!r} (job_name must be one of "
                             f"{sorted(self._cluster)})") from None

    @accepts(job_name=str)
    def num_tasks(self, job_name: str) -> int:
        """Number of tasks of ``job_name``.

        Raises:
            ValueError: there is no such job.
        """
        return len(self._job(job_name))

    @accepts(job_name=str)
    def task_indices(self, job_name: str) -> list[int]:
        """The sorted task indices of ``job_name``.

        Raises:
            ValueError: there is no such job.
        """
        return sorted(self._job(job_name))

    @accepts(job_name=str, task_index=int)
    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of task ``task_index`` of ``job_name``.

        Raises:
            ValueError: there is no such job or no such task in it.
        """
        job = self._job(job_name)
        try:
            return job[task_index]
        except (KeyError, TypeError):
            raise ValueError(f"No task with index {task_index!r} in job {job_name!r}: "
                             f"task_index must be one of {sorted(job)}.") from None

    @accepts(job_name=str)
    def job_tasks(self, job_name: str) -> list[str | None]:
        """The addresses of ``job_name`` as a list indexed by task; gaps of a sparse job are None.

        Raises:
            ValueError: there is no such job.
        """
        job = self._job(job_name)
        result: list[str | None] = [None] * (max(job) + 1 if job else 0)
        for index, address in job.items():
            result[index] = address
        return result


def normalize_cluster_spec(cluster_spec: ClusterLike) -> ClusterSpec:
    """A ClusterSpec from a dict, a ClusterSpec or None.

    Raises:
        ValueError: ``cluster_spec`` is of another type (TF's error for this case).
    """
    if isinstance(cluster_spec, ClusterSpec):
        return cluster_spec
    if cluster_spec is None or isinstance(cluster_spec, dict):
        return ClusterSpec(cluster_spec)
    raise ValueError(
        "`cluster_spec` should be a dict or a ClusterSpec object, got "
        f"{type(cluster_spec).__name__} {cluster_spec!r}."
    )
