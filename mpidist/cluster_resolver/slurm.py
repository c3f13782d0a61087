"""SlurmClusterResolver: the cluster of a Slurm job step (``srun``), or of ``mpirun`` inside one.

Hosts are taken in sorted order; on each host task k listens on ``port_base + k`` and gets GPUs
``k*gpus_per_task .. (k+1)*gpus_per_task - 1``. The flat task list is cut into jobs in sorted
job-name order. This assumes Slurm's default block distribution: rank r must be the r-th task
of that list (``--distribution=cyclic`` breaks it, as in TF).
"""

from __future__ import annotations

import os
import subprocess

from mpidist.cluster_resolver.base import ClusterResolver, format_master_url, master_address
from mpidist.cluster_resolver.cluster_spec import ClusterSpec
from mpidist.cluster_resolver.hostlist import expand_hostlist, expand_tasks_per_node
from mpidist.launcher_env import (
    MPIRUN_TASK,
    mpirun_local_size,
    slurm_gpus_per_task,
    slurm_task_variables,
    step_nodelist,
    step_tasks_per_node,
)

__all__ = ["SlurmClusterResolver", "expand_hostlist", "expand_tasks_per_node", "get_num_gpus"]


def get_num_gpus() -> int:
    """GPUs on this node: the entries of ``CUDA_VISIBLE_DEVICES`` if set (``""`` → 0), else the
    ``GPU `` lines of ``nvidia-smi --list-gpus`` (0 when nvidia-smi is missing or fails)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
            if not entry.strip() or entry.strip().startswith("-"):
                break
            count += 1
        return count
    try:
        listing = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def _gpus_bound_by_slurm() -> int:
    """GPUs per task when Slurm bound them (``--gpus-per-task``): ``SLURM_GPUS_PER_TASK``, if
    this task sees exactly that many; else 0."""
    per_task = slurm_gpus_per_task()
    if per_task == 0:
        return 0
    return per_task if get_num_gpus() == per_task else 0


def _check_jobs(jobs: object) -> dict[str, int]:
    if not isinstance(jobs, dict):
        raise TypeError(f"jobs must be a dict {{job name: number of tasks}}, got {jobs!r}.")
    for name, count in jobs.items():
        good_count = isinstance(count, int) and not isinstance(count, bool) and count >= 0
        if not isinstance(name, str) or not good_count:
            raise TypeError(
                f"jobs must map job names to task counts >= 0, got {name!r}: {count!r}."
            )
    return dict(jobs)


class SlurmClusterResolver(ClusterResolver):
    """Builds the cluster from the Slurm step's environment.

    Reads ``SLURM_PROCID`` (this task's rank, required), ``SLURM_STEP_NUM_TASKS`` (when ``jobs``
    is None), ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE`` (when ``tasks_per_node``
    is None or an int), ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi`` (when ``gpus_per_node`` is
    None) and ``SLURM_LOCALID`` (``local_rank``). Use it under ``srun``: the batch script itself
    has no step variables.

    Departures from TF's resolver:

    - host lists keep zero padding (``n[01-02]`` is ``n01, n02``; TF makes ``n1, n2``) and may
      hold several bracket groups;
    - launched by Open MPI's ``mpirun`` (``OMPI_COMM_WORLD_RANK`` set), rank, size and local
      rank come from ``OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK``, and tasks per node from
      ``OMPI_COMM_WORLD_LOCAL_SIZE`` when set (the Slurm step then describes mpirun's daemons);
    - when Slurm bound GPUs to tasks (``SLURM_GPUS_PER_TASK`` set and the task sees exactly
      that many GPUs), each task has those GPUs and ``CUDA_VISIBLE_DEVICES`` is left as Slurm
      set it (TF divides the task's own GPUs among the node's tasks, which gives 0);
    - ``CUDA_VISIBLE_DEVICES=""`` counts 0 GPUs (TF: 1); with 0 GPUs per task every task gets
      none and ``CUDA_VISIBLE_DEVICES`` is left alone (TF fails in ``range()``);
    - ``task_type``/``task_id`` are known from construction on (TF: after ``cluster_spec()``),
      and ``master()`` does not set ``CUDA_VISIBLE_DEVICES``;
    - error texts say "than" and name the missing variable; a rank outside the step fails early.

    Args:
        jobs: ``{job name: number of tasks}``; default ``{"worker": <number of tasks>}``.
        port_base: the port of the first task on each host.
        gpus_per_node: default: counted as described above.
        gpus_per_task: default ``gpus_per_node // max(tasks per node)``.
        tasks_per_node: None (from Slurm), an int for every host, or ``{host: count}``.
        auto_set_gpu: ``cluster_spec()`` sets ``CUDA_VISIBLE_DEVICES`` to this task's GPUs.
        rpc_layer: the protocol prefix of ``master()``.

    Raises:
        RuntimeError: a required variable is missing; more GPUs per node requested than there
            are; the jobs' task counts do not add up to the step's tasks.
        ValueError: a variable is malformed (e.g. the host list).
    """

    def __init__(self, jobs: dict[str, int] | None = None, port_base: int = 8888,
                 gpus_per_node: int | None = None, gpus_per_task: int | None = None,
                 tasks_per_node: int | dict[str, int] | None = None, auto_set_gpu: bool = True,
                 rpc_layer: str | None = "grpc") -> None:
        self._task = slurm_task_variables()
        self._mpirun = self._task is MPIRUN_TASK
        self._rank = self._task.rank()
        self._jobs = _check_jobs({"worker": self._task.size()} if jobs is None else jobs)
        self._port_base = int(port_base)
        self._task_configuration = self._resolve_task_configuration(tasks_per_node)

        max_tasks_per_node = max(self._task_configuration.values(), default=0)
        num_tasks = sum(self._task_configuration.values())
        # Slurm may already have given each task its own GPUs (--gpus-per-task): then a task
        # sees only those, and dividing them among the node's tasks would give it none.
        self._bound_by_slurm = (gpus_per_node is None and gpus_per_task is None
                                and _gpus_bound_by_slurm())
        if self._bound_by_slurm:
            gpus_per_task = self._bound_by_slurm
            gpus_per_node = gpus_per_task * max_tasks_per_node
        if gpus_per_node is None:
            gpus_per_node = get_num_gpus()
        if gpus_per_task is None:
            gpus_per_task = gpus_per_node // max_tasks_per_node if max_tasks_per_node else 0
        self._gpus_per_node = int(gpus_per_node)
        self._gpus_per_task = int(gpus_per_task)
        self._auto_set_gpu = auto_set_gpu
        self._task_type = None
        self._task_id = None
        self._rpc_layer = rpc_layer

        if max_tasks_per_node * self._gpus_per_task > self._gpus_per_node:
            raise RuntimeError("Requested more GPUs per node than available.")
        requested = sum(self._jobs.values())
        if requested != num_tasks:
            raise RuntimeError(f"Requested {requested} tasks but only {num_tasks} were assigned.")
        if not 0 <= self._rank < num_tasks:
            raise RuntimeError(f"{self._task.rank_variable}={self._rank} is outside the "
                               f"{num_tasks} tasks of this step.")

    def _resolve_task_configuration(self, tasks_per_node: int | dict[str, int] | None
                                    ) -> dict[str, int]:
        """``{host: number of tasks}``."""
        if isinstance(tasks_per_node, dict):
            return {str(host): int(count) for host, count in tasks_per_node.items()}
        hosts = expand_hostlist(step_nodelist())
        if tasks_per_node is not None:
            return {host: int(tasks_per_node) for host in hosts}
        local_size = mpirun_local_size() if self._mpirun else None
        if local_size is not None:
            counts = [local_size] * len(hosts)
        else:
            counts = expand_tasks_per_node(step_tasks_per_node())
        if len(counts) != len(hosts):
            raise RuntimeError(
                f"SLURM_STEP_NODELIST names {len(hosts)} hosts but SLURM_STEP_TASKS_PER_NODE "
                f"gives task counts for {len(counts)}."
            )
        return dict(zip(hosts, counts))

    def _layout(self) -> list[tuple[str, str, int]]:
        """``(address, GPU list, index on its host)`` of every task, in rank order."""
        tasks = []
        gpt = self._gpus_per_task
        for host, count in sorted(self._task_configuration.items()):
            for k in range(count):
                gpus = ",".join(str(g) for g in range(k * gpt, (k + 1) * gpt))
                tasks.append((f"{host}:{self._port_base + k}", gpus, k))
        return tasks

    def _own_task(self) -> tuple[str, int] | tuple[None, None]:
        start = 0
        for job, count in sorted(self._jobs.items()):
            if start <= self._rank < start + count:
                return job, self._rank - start
            start += count
        return None, None  # not reached: the constructor checked the rank

    def _spec(self) -> ClusterSpec:
        addresses = [address for address, _, _ in self._layout()]
        cluster, start = {}, 0
        for job, count in sorted(self._jobs.items()):
            cluster[job] = addresses[start:start + count]
            start += count
        return ClusterSpec(cluster)

    def cluster_spec(self) -> ClusterSpec:
        """The cluster, rebuilt on every call; with ``auto_set_gpu`` also sets this task's
        ``CUDA_VISIBLE_DEVICES`` (before any GPU library initialises)."""
        spec = self._spec()
        if self._auto_set_gpu and self._gpus_per_task and not self._bound_by_slurm:
            os.environ["CUDA_VISIBLE_DEVICES"] = self._layout()[self._rank][1]
        return spec

    @property
    def task_type(self) -> str | None:
        """The job containing this rank (unless set)."""
        return self._own_task()[0] if self._task_type is None else self._task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """This rank's index in its job (unless set)."""
        return self._own_task()[1] if self._task_id is None else self._task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def local_rank(self) -> int:
        """This task's index on its node: ``SLURM_LOCALID`` (``OMPI_COMM_WORLD_LOCAL_RANK``
        under mpirun), else its position in the layout."""
        local_rank = self._task.local_rank()
        return self._layout()[self._rank][2] if local_rank is None else local_rank

    def get_task_info(self) -> tuple[str | None, int | None]:
        """``(task_type, task_id)``."""
        return self.task_type, self.task_id

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """``"<rpc_layer>://<address>"`` of the named task, this one by default."""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            return ""
        address = master_address(self._spec(), task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: object = None) -> dict[str, int]:
        """``{"GPU": gpus_per_task}``; arguments unused."""
        del task_type, task_id, config_proto
        return {"GPU": self._gpus_per_task}
