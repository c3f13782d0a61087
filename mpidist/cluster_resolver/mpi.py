"""MPIClusterResolver: the ranks of MPI_COMM_WORLD are the tasks of the cluster.

By default every rank is a worker (the default of MultiWorkerMirroredStrategy). With ``num_ps``
or ``jobs`` the ranks form a parameter-server job by TF's Slurm rule, jobs in sorted name order
on consecutive ranks: rank 0 the chief, ranks 1..P the ps tasks, the rest the workers.

Once MPI is running it is the truth: rank, size, node-local rank and hosts come from the
communicator (``Split_type(COMM_TYPE_SHARED)`` and the processor names), not from launcher
variables, so the resolver works the same under mpiexec, mpirun and srun.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from mpidist.backend import num_gpus
from mpidist.cluster_resolver.base import ClusterResolver, format_master_url, master_address
from mpidist.cluster_resolver.cluster_spec import ClusterSpec
from mpidist.comm.arrival import private_duplicate
from mpidist.comm.communicator import world_communicator
from mpidist.comm.mpi import install_abort_on_exception, mpi_module
from mpidist.comm.topology import Topology
from mpidist.core.devices import parse_device
from mpidist.logs import get_logger

if TYPE_CHECKING:
    from mpidist.comm.communicator import Communicator

__all__ = [
    "MPIClusterResolver",
    "PS_JOB_ORDER",
    "host_addresses",
    "ps_jobs_requested",
    "ps_job_counts",
    "fit_ps_jobs",
    "ps_cluster_spec",
    "task_at_rank",
    "describe_job_counts",
    "world_size_mismatch",
]

log = get_logger("mpidist.cluster_resolver")

ALL_GPUS = "all_gpus"

# TF's job order for a parameter-server cluster (sorted names, as SlurmClusterResolver cuts its
# task list): the chief first, then the ps tasks, then the workers, on consecutive ranks.
PS_JOB_ORDER = ("chief", "ps", "worker")

_JOBS_EXAMPLE = "jobs={'chief': 1, 'ps': 2, 'worker': 3}"


def host_addresses(hosts: Iterable[str], port_base: int = 8888) -> list[str]:
    """``"host:port"`` for each rank's host, in rank order; ports count up per host."""
    per_host: dict[str, int] = {}
    addresses = []
    for host in hosts:
        k = per_host.get(host, 0)
        per_host[host] = k + 1
        addresses.append(f"{host}:{port_base + k}")
    return addresses


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def ps_jobs_requested(num_ps: int | None = None, jobs: dict[str, int] | None = None
                      ) -> dict[str, int] | None:
    """The job counts asked for by ``num_ps`` or ``jobs``, checked; None when neither is given.

    The worker count may be missing (it is the rest of the ranks); the chief count defaults to 1.

    Raises:
        TypeError: ``num_ps`` is not an int, ``jobs`` not a dict, or a count not an int.
        ValueError: both are given; ``num_ps`` < 1; a job other than chief, ps and worker; a
            chief count other than 1; no ps; a worker count < 1.
    """
    if num_ps is None and jobs is None:
        return None
    if num_ps is not None and jobs is not None:
        raise ValueError(
            f"Give num_ps or jobs, not both (got num_ps={num_ps!r}, jobs={jobs!r}): e.g. "
            f"num_ps=2, or {_JOBS_EXAMPLE}."
        )
    if num_ps is not None:
        if not _is_count(num_ps):
            raise TypeError(
                f"num_ps must be an integer >= 1 (the number of parameter-server ranks), got "
                f"{type(num_ps).__name__} {num_ps!r}."
            )
        if num_ps < 1:
            raise ValueError(f"There must be at least one ps: num_ps={num_ps!r}; give num_ps >= 1.")
        return {"chief": 1, "ps": num_ps}
    if not isinstance(jobs, dict):
        raise TypeError(
            f"jobs must be a dict {{job name: number of tasks}} such as {_JOBS_EXAMPLE}, got "
            f"{type(jobs).__name__} {jobs!r}."
        )
    for name, count in jobs.items():
        if name not in PS_JOB_ORDER:
            raise ValueError(
                f"Unknown job {name!r} in jobs={jobs!r}: a parameter-server job has the jobs "
                f"{PS_JOB_ORDER} (run side-car evaluation as its own job)."
            )
        if not _is_count(count) or count < 0:
            raise TypeError(f"jobs[{name!r}] must be an integer >= 0, got {count!r}.")
    counts = {"chief": 1, **jobs}
    if counts["chief"] != 1:
        raise ValueError(
            f"jobs['chief'] must be 1, got {counts['chief']!r}: rank 0 is the one chief, the "
            "coordinator of the job."
        )
    if counts.get("ps", 0) < 1:
        raise ValueError(f"There must be at least one ps: jobs={jobs!r}; e.g. {_JOBS_EXAMPLE}.")
    if "worker" in counts and counts["worker"] < 1:
        raise ValueError(f"There must be at least one worker: jobs={jobs!r}; e.g. {_JOBS_EXAMPLE}.")
    return {job: counts[job] for job in PS_JOB_ORDER if job in counts}


def describe_job_counts(counts: Mapping[str, int]) -> str:
    """``"5 tasks (chief 1, ps 2, worker 2)"`` for ``{"chief": 1, "ps": 2, "worker": 2}``."""
    total = sum(counts.values())
    parts = ", ".join(f"{job} {counts[job]}" for job in sorted(counts))
    return f"{total} task{'s' if total != 1 else ''} ({parts})"


def world_size_mismatch(counts: Mapping[str, int], world_size: int) -> ValueError:
    """The ValueError for a cluster of ``counts`` tasks launched on ``world_size`` ranks."""
    total = sum(counts.values())
    return ValueError(
        f"The cluster has {describe_job_counts(counts)} but MPI_COMM_WORLD has {world_size} "
        f"rank{'s' if world_size != 1 else ''}: launch with mpiexec -n {total} or change the "
        f"cluster to {world_size} task{'s' if world_size != 1 else ''}."
    )


def ps_job_counts(world_size: int, num_ps: int | None = None, jobs: dict[str, int] | None = None
                  ) -> dict[str, int]:
    """``{"chief": 1, "ps": P, "worker": W}`` for a parameter-server job on ``world_size`` ranks.

    ``W`` defaults to the ranks left after the chief and the ps tasks.

    Raises:
        TypeError, ValueError: as ``ps_jobs_requested`` and ``fit_ps_jobs``; also when neither
            argument is given.
    """
    requested = ps_jobs_requested(num_ps, jobs)
    if requested is None:
        raise ValueError(f"Give num_ps or jobs for a parameter-server job, e.g. num_ps=1 or "
                         f"{_JOBS_EXAMPLE}.")
    return fit_ps_jobs(requested, world_size)


def fit_ps_jobs(requested: Mapping[str, int], world_size: int) -> dict[str, int]:
    """``requested`` (from ``ps_jobs_requested``) with the workers filled in and checked
    against ``world_size``.

    Raises:
        ValueError: no rank is left for a worker, or the counts do not add up to
            ``world_size``.
    """
    counts = dict(requested)
    if "worker" not in counts:
        rest = world_size - counts["chief"] - counts["ps"]
        if rest < 1:
            raise ValueError(
                f"There must be at least one worker: MPI_COMM_WORLD has {world_size} "
                f"rank{'s' if world_size != 1 else ''}, taken by the chief and {counts['ps']} ps. "
                f"Launch with mpiexec -n {counts['chief'] + counts['ps'] + 1} or more, or use "
                "fewer ps."
            )
        counts["worker"] = rest
    if sum(counts.values()) != world_size:
        raise world_size_mismatch(counts, world_size)
    return counts


def ps_cluster_spec(hosts: Sequence[str], counts: Mapping[str, int], port_base: int = 8888
                    ) -> ClusterSpec:
    """The ClusterSpec of a parameter-server job: the ranks' addresses (``host_addresses``), in
    rank order, cut into ``counts`` jobs in ``PS_JOB_ORDER``.

    Example: hosts ``["a", "a", "b"]``, counts ``{"chief": 1, "ps": 1, "worker": 1}`` →
    ``{"chief": ["a:8888"], "ps": ["a:8889"], "worker": ["b:8888"]}``.

    Raises:
        ValueError: the counts do not add up to the number of hosts (one per rank).
    """
    if sum(counts.values()) != len(hosts):
        raise world_size_mismatch(counts, len(hosts))
    addresses = host_addresses(hosts, port_base)
    cluster: dict[str, list[str]] = {}
    start = 0
    for job in sorted(counts):
        cluster[job] = addresses[start:start + counts[job]]
        start += counts[job]
    return ClusterSpec(cluster)


def task_at_rank(counts: Mapping[str, int], rank: int) -> tuple[str, int]:
    """``(task_type, task_id)`` of ``rank`` when jobs in sorted name order take consecutive ranks.

    Raises:
        ValueError: ``rank`` is outside the ``sum(counts)`` tasks.
    """
    start = 0
    for job in sorted(counts):
        if start <= rank < start + counts[job]:
            return job, rank - start
        start += counts[job]
    raise ValueError(f"Rank {rank!r} is outside the cluster of {describe_job_counts(counts)}.")


_topology: list[Topology] = []


def world_topology() -> Topology:
    """Who is where in MPI_COMM_WORLD (made once per process, collectively)."""
    if not _topology:
        mpi = mpi_module()
        # On a private duplicate made once every rank arrived: a rank that never builds the
        # resolver ends the others' wait with a report instead of a hang.
        world = private_duplicate(mpi.COMM_WORLD, "an MPIClusterResolver (its topology)")
        _topology.append(Topology(mpi, world))
        if mpi.COMM_WORLD.Get_size() > 1:  # an error on one rank ends the job, as with MWMS
            install_abort_on_exception()
    return _topology[0]


class MPIClusterResolver(ClusterResolver):
    """The tasks are the MPI ranks.

    By default every rank is a worker and rank 0, worker 0, the chief (there is no chief job).
    With ``num_ps`` or ``jobs`` the ranks form a parameter-server job: rank 0 is the chief,
    ranks 1..P the ps tasks and the rest the workers (``cluster_spec()`` has the jobs
    ``chief``, ``ps`` and ``worker``; ``task_type``/``task_id`` follow from the rank)::

        mpiexec -n 6, num_ps=2   rank  0      1     2     3         4         5
                                 task  chief  ps:0  ps:1  worker:0  worker:1  worker:2

    Creating the resolver starts MPI (collectively, on every rank).

    Args:
        local_devices: This worker's replica devices. None (the default): one GPU per rank,
            ``/gpu:<node-local rank % visible GPUs>``, when GPUs are visible, else ``/cpu:0``.
            ``"all_gpus"``: every visible GPU is a replica of this rank. A list of device
            strings (e.g. ``["/cpu:0", "/cpu:1"]`` for two CPU replicas per rank) is used as given.
        port_base: First port of the nominal addresses in ``cluster_spec()`` (MPI does not use
            them; they keep TF-style tools that print a cluster working).
        rpc_layer: Protocol named by ``master()``, None for none.
        num_ps: The number of parameter-server ranks (an int >= 1): a parameter-server job
            with one chief, ``num_ps`` ps tasks and the other ranks as workers.
        jobs: ``{"chief": 1, "ps": P, "worker": W}`` instead of ``num_ps``; ``"worker"`` may be
            left out (the rest of the ranks) and ``"chief"`` too (it is 1).

    Raises:
        TypeError, ValueError: a bad ``local_devices``, ``num_ps`` or ``jobs``, or job counts
            that do not fit the ranks of MPI_COMM_WORLD (see ``ps_job_counts``).
    """

    def __init__(self, local_devices: str | Iterable[str] | None = None, port_base: int = 8888,
                 rpc_layer: str | None = None, num_ps: int | None = None,
                 jobs: dict[str, int] | None = None) -> None:
        if local_devices is not None and local_devices != ALL_GPUS:
            if isinstance(local_devices, str):
                local_devices = [local_devices]
            local_devices = [str(parse_device(d)) for d in local_devices]
            if not local_devices:
                raise ValueError("local_devices must name at least one device, e.g. ['/cpu:0'].")
        # Checked before MPI starts, so a typo costs no MPI initialisation.
        requested = ps_jobs_requested(num_ps, jobs)
        self._requested: list[str] | str | None = local_devices
        self._port_base = int(port_base)
        self._rpc_layer = rpc_layer
        self._comm: Communicator | Topology
        self._jobs: dict[str, int] | None
        self._task_type: str
        self._task_id: int
        if requested is None:
            self._comm = world_communicator()
            self._jobs = None
            self._task_type, self._task_id = "worker", self._comm.rank
        else:
            # A parameter-server job runs no collectives after its start: it needs who is where,
            # not the collective machinery (whose exit meeting would wait for a dead worker).
            self._comm = world_topology()
            self._jobs = fit_ps_jobs(requested, self._comm.size)
            self._task_type, self._task_id = task_at_rank(self._jobs, self._comm.rank)

    @property
    def communicator(self) -> Communicator:
        """mpidist's Communicator over MPI_COMM_WORLD (a parameter-server layout has none:
        its ranks exchange point-to-point messages only)."""
        if self._jobs is not None:
            raise ValueError(
                "This MPIClusterResolver describes a parameter-server job (num_ps / jobs): use it "
                "with ParameterServerStrategy; MultiWorkerMirroredStrategy takes "
                "MPIClusterResolver() without num_ps or jobs.")
        return cast("Communicator", self._comm)  # a Topology only with jobs, refused above

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its node."""
        return self._comm.local_rank

    @property
    def local_size(self) -> int:
        return self._comm.local_size

    @property
    def num_nodes(self) -> int:
        return self._comm.num_nodes

    @property
    def jobs(self) -> dict[str, int] | None:
        """``{"chief": 1, "ps": P, "worker": W}`` of a parameter-server job, else None."""
        return None if self._jobs is None else dict(self._jobs)

    @property
    def requested_local_devices(self) -> list[str] | str | None:
        """The ``local_devices`` argument as given (device strings, or ``"all_gpus"``), None
        when it was not given (a strategy that cannot honour it refuses it by this)."""
        requested = self._requested
        return list(requested) if isinstance(requested, list) else requested

    def cluster_spec(self) -> ClusterSpec:
        """``{"worker": ["host:port", ...]}`` in rank order (ports count up per node); with
        ``num_ps``/``jobs``, the same addresses cut into ``chief``, ``ps`` and ``worker``."""
        if self._jobs is not None:
            return ps_cluster_spec(self._comm.hosts, self._jobs, self._port_base)
        return ClusterSpec({"worker": host_addresses(self._comm.hosts, self._port_base)})

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """``"<rpc_layer>://host:port"`` of the named task (this one by default); ``""`` for a
        one-rank job when no task is named."""
        if self._comm.size <= 1 and task_type is None:
            return ""
        task_type = self._task_type if task_type is None else task_type
        task_id = self._task_id if task_id is None else task_id
        address = master_address(self.cluster_spec(), task_type, task_id)
        return format_master_url(address, rpc_layer or self._rpc_layer)

    def _settings_to_agree(self) -> dict[str, Any]:
        # What was asked for, not what this node has (ranks may see different GPU counts). A
        # list agrees on its kinds of device, not their indices: `/gpu:<local rank>` is usual.
        requested = self._requested
        if isinstance(requested, list):
            requested = "[" + ", ".join(f"/{parse_device(d).device_type.lower()}:?"
                                        for d in requested) + "]"
        return {"local_devices": requested,
                "jobs": None if self._jobs is None else dict(self._jobs)}

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: object = None) -> dict[str, int]:
        gpus = sum(1 for d in self.local_devices() if parse_device(d).is_gpu)
        return {"GPU": gpus} if gpus else {}

    def local_devices(self) -> list[str]:
        """This worker's replica devices as device strings (see ``local_devices`` above)."""
        if self._requested is not None and self._requested != ALL_GPUS:
            return list(self._requested)
        visible = num_gpus()
        if visible == 0:
            return ["/cpu:0"]
        if self._requested == ALL_GPUS:
            return [f"/gpu:{i}" for i in range(visible)]
        narrowed = visible == 1 and os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() != ""
        if self._comm.local_size > visible and not narrowed:
            # (With one visible GPU named in CUDA_VISIBLE_DEVICES each rank was most likely given
            # its own by the launcher, e.g. Slurm's --gpus-per-task; `mpidist info` checks.)
            log.warning(
                "%d ranks on this node share %d visible GPU(s): ranks will share GPUs. Start one "
                "rank per GPU, or pass MPIClusterResolver(local_devices=...).",
                self._comm.local_size, visible)
        return [f"/gpu:{self._comm.local_rank % visible}"]

