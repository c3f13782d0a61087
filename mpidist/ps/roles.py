"""Which MPI rank plays which part in a parameter-server job (ps-design.md §1).

One rule everywhere, TF's SlurmClusterResolver's: the jobs in sorted name order on consecutive
ranks, so rank 0 is the chief (the coordinator), ranks 1..P the ps tasks, the rest the workers::

    mpiexec -n 6 (2 ps)   rank  0      1     2     3         4         5
                          task  chief  ps:0  ps:1  worker:0  worker:1  worker:2

``resolve_roles`` checks a cluster resolver against that rule and the MPI world with TF's
messages; everything here is pure (no MPI), so it is tested with any world size.
"""

import dataclasses
from collections.abc import Sequence

from mpidist.cluster_resolver.base import ClusterResolver
from mpidist.cluster_resolver.cluster_spec import ClusterSpec, normalize_cluster_spec
from mpidist.cluster_resolver.mpi import PS_JOB_ORDER, describe_job_counts, world_size_mismatch

__all__ = ["ClusterRoles", "resolve_roles", "check_worker_devices", "compute_devices",
           "PS_JOB_ORDER"]

_FIX_NO_CHIEF = (
    "Add one chief task (TF_CONFIG: \"chief\": [\"host:port\"]; "
    "SlurmClusterResolver(jobs={\"chief\": 1, \"ps\": P, \"worker\": W})) or use "
    "MPIClusterResolver(num_ps=P)."
)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _rank_span(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {ranks[0]}-{ranks[-1]}"


@dataclasses.dataclass(frozen=True)
class ClusterRoles:
    """The roles of the ranks of a parameter-server job, and this rank's.

    Attributes:
        rank: this process's rank in MPI_COMM_WORLD.
        task_type: this rank's job: ``"chief"``, ``"ps"`` or ``"worker"``.
        task_id: this rank's index in its job.
        chief_rank: the coordinator's rank (0).
        ps_ranks: the rank of ps task k at position k.
        worker_ranks: the rank of worker task i at position i.

    Build it with ``ClusterRoles.from_counts`` or ``resolve_roles``.

    Raises:
        ValueError: the fields disagree (this rank is not ``task_type:task_id``).
    """

    rank: int
    task_type: str
    task_id: int
    chief_rank: int
    ps_ranks: tuple[int, ...]
    worker_ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.task_of(self.rank) != (self.task_type, self.task_id):
            raise ValueError(
                f"ClusterRoles: rank {self.rank} is {self.task_of(self.rank)}, not "
                f"({self.task_type!r}, {self.task_id})."
            )

    @classmethod
    def from_counts(cls, num_ps: int, num_workers: int, rank: int) -> "ClusterRoles":
        """The roles of a job with one chief, ``num_ps`` ps and ``num_workers`` workers, as
        seen from ``rank``.

        Raises:
            ValueError: a count < 1, or ``rank`` outside the ``1 + num_ps + num_workers`` ranks.
        """
        if not _is_index(num_ps) or num_ps < 1:
            raise ValueError(f"There must be at least one ps, got num_ps={num_ps!r}.")
        if not _is_index(num_workers) or num_workers < 1:
            raise ValueError(f"There must be at least one worker, got num_workers={num_workers!r}.")
        size = 1 + num_ps + num_workers
        if not _is_index(rank) or rank >= size:
            raise ValueError(
                f"Rank {rank!r} is outside the {size} ranks of a job with 1 chief, {num_ps} ps "
                f"and {num_workers} workers."
            )
        ps_ranks = tuple(range(1, 1 + num_ps))
        worker_ranks = tuple(range(1 + num_ps, size))
        if rank == 0:
            task: tuple[str, int] = ("chief", 0)
        elif rank <= num_ps:
            task = ("ps", rank - 1)
        else:
            task = ("worker", rank - 1 - num_ps)
        return cls(rank, task[0], task[1], 0, ps_ranks, worker_ranks)

    @property
    def num_ps(self) -> int:
        return len(self.ps_ranks)

    @property
    def num_workers(self) -> int:
        return len(self.worker_ranks)

    @property
    def world_size(self) -> int:
        return 1 + self.num_ps + self.num_workers

    @property
    def is_chief(self) -> bool:
        return self.task_type == "chief"

    @property
    def is_ps(self) -> bool:
        return self.task_type == "ps"

    @property
    def is_worker(self) -> bool:
        return self.task_type == "worker"

    def ranks_of(self, task_type: str) -> tuple[int, ...]:
        """The ranks of job ``task_type``, task i at position i.

        Raises:
            ValueError: ``task_type`` is not chief, ps or worker.
        """
        if task_type == "chief":
            return (self.chief_rank,)
        if task_type == "ps":
            return self.ps_ranks
        if task_type == "worker":
            return self.worker_ranks
        raise ValueError(
            f"Unknown task_type {task_type!r}: a parameter-server job has {PS_JOB_ORDER}."
        )

    def rank_of(self, task_type: str, task_id: int) -> int:
        """The rank of ``task_type:task_id``, e.g. ``rank_of("ps", 0)`` is 1.

        Raises:
            ValueError: there is no such task.
        """
        ranks = self.ranks_of(task_type)
        if not _is_index(task_id) or task_id >= len(ranks):
            raise ValueError(
                f"No task with index {task_id!r} in job {task_type!r}: it has {len(ranks)} "
                f"task{'s' if len(ranks) != 1 else ''}."
            )
        return ranks[task_id]

    def task_of(self, rank: int) -> tuple[str, int]:
        """``(task_type, task_id)`` of ``rank``, e.g. ``task_of(1)`` is ``("ps", 0)``.

        Raises:
            ValueError: ``rank`` is not a rank of the job.
        """
        if _is_index(rank):
            if rank == self.chief_rank:
                return "chief", 0
            if rank in self.ps_ranks:
                return "ps", self.ps_ranks.index(rank)
            if rank in self.worker_ranks:
                return "worker", self.worker_ranks.index(rank)
        raise ValueError(f"Rank {rank!r} is not one of the {self.world_size} ranks of the job.")

    def device_name(self, task_type: str, task_id: int, device: str = "CPU:0") -> str:
        """TF's name of a device of a task: ``device_name("ps", 0)`` is
        ``"/job:ps/replica:0/task:0/device:CPU:0"``.

        Raises:
            ValueError: there is no such task.
        """
        self.rank_of(task_type, task_id)
        return f"{self.task_prefix(task_type, task_id)}/device:{device}"

    def task_prefix(self, task_type: str, task_id: int) -> str:
        """``"/job:<type>/replica:0/task:<id>"`` (unchecked)."""
        return f"/job:{task_type}/replica:0/task:{task_id}"

    def task_name(self, rank: int) -> str:
        """TF's name of the task of ``rank``: ``task_name(1)`` is ``"/job:ps/replica:0/task:0"``.

        Raises:
            ValueError: ``rank`` is not a rank of the job.
        """
        return self.task_prefix(*self.task_of(rank))

    def describe(self, rank: int | None = None) -> str:
        """``"/job:ps/replica:0/task:0 (rank 1)"`` for ``rank`` (this rank by default), as
        error messages name a task.

        Raises:
            ValueError: ``rank`` is not a rank of the job.
        """
        rank = self.rank if rank is None else rank
        task_type, task_id = self.task_of(rank)
        return f"{self.task_prefix(task_type, task_id)} (rank {rank})"

    def layout(self) -> str:
        """``"chief rank 0, ps ranks 1-2, worker ranks 3-4"``."""
        return ", ".join(f"{job} {_rank_span(self.ranks_of(job))}" for job in PS_JOB_ORDER)


def _check_world(world_size: int, world_rank: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}.")
    if not _is_index(world_rank) or world_rank >= world_size:
        raise ValueError(
            f"world_rank must be an integer in [0, {world_size}), got {world_rank!r}."
        )


def _evaluator_error(spec: ClusterSpec) -> ValueError:
    return ValueError(
        "A ParameterServerStrategy job has no 'evaluator' task: every task of its cluster is "
        "an MPI rank that serves the chief, and in TF an evaluator listed there that never "
        "starts a server hangs the coordinator (tensorflow/tensorflow#46169). Run side-car "
        "evaluation as its own job (its own mpiexec, reading the chief's checkpoints) and "
        f"remove 'evaluator' from the cluster spec {spec!r}."
    )


def _cluster_counts(spec: ClusterSpec) -> dict[str, int]:
    """``{job: tasks}`` of a parameter-server cluster, checked with TF's messages."""
    if not spec:
        raise ValueError(
            "Cluster spec must be non-empty in `mpidist.cluster_resolver.ClusterResolver`."
        )
    if "evaluator" in spec.jobs:
        raise _evaluator_error(spec)
    if any(job not in PS_JOB_ORDER for job in spec.jobs):
        raise ValueError(
            f"Disallowed task type found in cluster spec. Allowed types are {PS_JOB_ORDER} "
            f"and the cluster spec is {spec!r}."
        )
    counts = {job: spec.num_tasks(job) for job in spec.jobs}
    if counts.get("chief", 0) > 1:
        raise ValueError("There must be at most one 'chief' job.")
    if counts.get("ps", 0) < 1:
        raise ValueError("There must be at least one ps.")
    if counts.get("worker", 0) < 1:
        raise ValueError("There must be at least one worker.")
    if counts.get("chief", 0) < 1:
        # TF's coordinator may run outside the cluster; in mpidist it is MPI rank 0.
        raise ValueError(
            "A ParameterServerStrategy job needs one 'chief' task, the coordinator (MPI rank "
            f"0), but the cluster spec has none: {spec!r}. {_FIX_NO_CHIEF}"
        )
    for job in spec.jobs:
        indices = spec.task_indices(job)
        if indices != list(range(len(indices))):
            raise ValueError(
                f"Job {job!r} has the task indices {indices}, but the tasks of a "
                f"parameter-server job are the ranks in order: give job {job!r} the tasks "
                f"0..{len(indices) - 1}."
            )
    return counts


def _resolver_task(resolver: ClusterResolver, counts: dict[str, int]) -> tuple[str, int] | None:
    """The resolver's ``(task_type, task_id)``, checked; None when it names no task."""
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "") and task_id is None:
        return None  # e.g. a TF_CONFIG without "task": the rank decides (mpidist extension)
    if task_type in (None, "") or task_id is None:
        raise ValueError(
            f"The cluster resolver names task_type={task_type!r} but task_id={task_id!r}: give "
            "both, or neither (then the task follows from the MPI rank)."
        )
    if task_type == "evaluator":
        raise ValueError(
            "This process is an 'evaluator', which a ParameterServerStrategy job does not "
            "have: run side-car evaluation as its own job (its own mpiexec)."
        )
    if task_type not in PS_JOB_ORDER:
        raise ValueError(
            f"Unrecognized task_type: {task_type!r}, valid task types are: {PS_JOB_ORDER}"
        )
    if not _is_index(task_id):
        raise ValueError(f"`task_id` must be a non-negative integer, got {task_id!r}.")
    if task_id >= counts[task_type]:
        raise ValueError(f"The `task_id` {task_id} exceeds the maximum id of {task_type}.")
    return task_type, task_id


def resolve_roles(cluster_resolver: ClusterResolver, world_size: int,
                  world_rank: int) -> ClusterRoles:
    """The roles of a parameter-server job whose cluster ``cluster_resolver`` describes, on a
    world of ``world_size`` MPI ranks, as seen from rank ``world_rank``.

    The cluster must have one chief, at least one ps and at least one worker, one task per
    rank; the resolver's task must be this rank's place in the order chief, ps, worker. A
    resolver that names no task (a ``TF_CONFIG`` without ``"task"``, as every rank of one
    ``mpiexec`` sees the same environment) gets the rank's task.

    Raises:
        ValueError: TF's errors: ``"Cluster spec must be non-empty in
            `mpidist.cluster_resolver.ClusterResolver`."``, ``"There must be at least one
            ps."``, ``"There must be at least one worker."``, ``"There must be at most one
            'chief' job."``, ``"Disallowed task type found in cluster spec. ..."``; and
            mpidist's: an evaluator, no chief, sparse task indices, a task count other than
            ``world_size``, a resolver task that is not this rank's.
    """
    if not isinstance(cluster_resolver, ClusterResolver):
        raise ValueError(
            "cluster_resolver must be an instance of mpidist.cluster_resolver.ClusterResolver, "
            f"got {type(cluster_resolver).__name__} {cluster_resolver!r}."
        )
    _check_world(world_size, world_rank)
    spec = normalize_cluster_spec(cluster_resolver.cluster_spec())
    counts = _cluster_counts(spec)
    task = _resolver_task(cluster_resolver, counts)
    if sum(counts.values()) != world_size:
        raise world_size_mismatch(counts, world_size)
    roles = ClusterRoles.from_counts(counts["ps"], counts["worker"], world_rank)
    if task is not None and task != (roles.task_type, roles.task_id):
        raise ValueError(
            f"The cluster resolver makes this process {task[0]}:{task[1]} but it is MPI rank "
            f"{world_rank} of {world_size}, which is {roles.task_type}:{roles.task_id} in a "
            f"parameter-server job of {describe_job_counts(counts)} ({roles.layout()}). Give "
            "rank r the r-th task of the order chief, ps, worker, or name no task (a TF_CONFIG "
            "without \"task\") to take the rank's."
        )
    return roles


def compute_devices(num_gpus: int) -> tuple[str, ...]:
    """A worker's replica devices: ``("/device:GPU:0", ...)`` for ``num_gpus`` > 0, else
    ``("/device:CPU:0",)`` (TF's ``worker_devices``)."""
    if num_gpus > 0:
        return tuple(f"/device:GPU:{i}" for i in range(num_gpus))
    return ("/device:CPU:0",)


def check_worker_devices(counts: Sequence[int]) -> int:
    """The replicas per worker from each worker's GPU count (worker i at position i): that
    count when all agree, 1 when it is 0 (one CPU replica).

    Stricter than TF, which skips workers without GPUs when it compares: here 0 GPUs on one
    worker and 2 on another is a mismatch too.

    Raises:
        ValueError: ``"Mismatched number of GPUs per worker"`` (with the counts) when they
            differ; no workers; a count that is not an integer >= 0.
    """
    counts = list(counts)
    if not counts:
        raise ValueError("There must be at least one worker.")
    for i, count in enumerate(counts):
        if not _is_index(count):
            raise ValueError(f"Worker {i} reports {count!r} GPUs; expected an integer >= 0.")
    if len(set(counts)) > 1:
        listed = ", ".join(f"worker {i}: {count}" for i, count in enumerate(counts))
        raise ValueError(
            f"Mismatched number of GPUs per worker ({listed}). Give every worker rank the same "
            "number of GPUs (MPIClusterResolver(local_devices=...), CUDA_VISIBLE_DEVICES or "
            "Slurm's --gpus-per-task), or none."
        )
    return counts[0] or 1
