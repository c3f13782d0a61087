"""MultiWorkerMirroredStrategy: synchronous replicas on every MPI rank (worker).

Each rank is a worker whose local devices are its replicas (MirroredStrategy inside the
rank); values cross ranks through CollectiveAllReduce over the world communicator. The
numbers are those of a MirroredStrategy with the same total replicas.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from mpidist.backend import as_array, cupy_backend, num_gpus
from mpidist.backend.threads import cap_cpu_threads
from mpidist.cluster_resolver import ClusterResolver, MPIClusterResolver
from mpidist.cluster_resolver.base import configuration_facts
from mpidist.cluster_resolver.multi_worker import (
    id_in_cluster,
    is_chief,
    num_workers,
    validate_cluster_spec,
)
from mpidist.comm.communicator import Communicator, world_communicator
from mpidist.comm.config_agreement import agree
from mpidist.config import get_config
from mpidist.comm.nccl import RankNcclGroup, nccl_module
from mpidist.comm.nccl_choice import choose_nccl, gpu_identity, rank_facts
from mpidist.comm.options import CommunicationImplementation, CommunicationOptions
from mpidist.core.devices import DeviceSpec, parse_device
from mpidist.core.user_calls import user_call
from mpidist.data.distributed import InputWorkers
from mpidist.logs import get_logger
from mpidist.ops.collective_all_reduce import CollectiveAllReduce
from mpidist.ops.destinations import Destinations
from mpidist.ops.reduction_plan import ReductionPlan
from mpidist.strategies.mirrored import MirroredExtended
from mpidist.strategies.reduction_plans import GeneralPlan
from mpidist.strategies.strategy import Strategy
from mpidist.types import Array, ReduceOp
from mpidist.values.containers import DistributedValues, Mirrored, PerReplica

__all__ = ["MultiWorkerMirroredStrategy"]

log = get_logger("mpidist.strategies")


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous data parallelism across MPI ranks (``tf.distribute.MultiWorkerMirroredStrategy``).

    Launch the same program on every rank (``mpiexec -n N python train.py`` or ``srun``).
    Rank 0 is the chief. Creating the strategy is collective: every rank must create it.

    Args:
        cluster_resolver: Who this worker is and which devices it drives. The default,
            ``MPIClusterResolver()``, takes the ranks of MPI_COMM_WORLD as workers and gives
            each one GPU chosen by its node-local rank (or one CPU device without GPUs). A
            TFConfigClusterResolver or SlurmClusterResolver is checked against the MPI rank.
        communication_options: ``mpidist.experimental.CommunicationOptions``: pack size,
            timeout and implementation for every collective; per-call options merge onto them.
    """

    def __init__(self, cluster_resolver: ClusterResolver | None = None,
                 communication_options: CommunicationOptions | None = None) -> None:
        if communication_options is None:
            communication_options = CommunicationOptions()
        if not isinstance(communication_options, CommunicationOptions):
            raise ValueError(
                "communication_options must be an instance of "
                "mpidist.experimental.CommunicationOptions"
            )
        if cluster_resolver is None:
            cluster_resolver = MPIClusterResolver()
        if not isinstance(cluster_resolver, ClusterResolver):
            raise ValueError(
                "cluster_resolver must be an instance of mpidist.cluster_resolver.ClusterResolver"
            )
        with user_call("MultiWorkerMirroredStrategy()"):  # collective: every rank creates it
            extended = _MultiWorkerExtended(self, cluster_resolver, communication_options)
        super().__init__(extended)
        self._init_args = (cluster_resolver, communication_options)

    def __deepcopy__(self, memo: dict[int, Any]) -> "MultiWorkerMirroredStrategy":
        return MultiWorkerMirroredStrategy(*self._init_args)


def _worker_identity(resolver: ClusterResolver, comm: Communicator
                     ) -> tuple[str, int, int, bool]:
    """``(task_type, task_id, worker_id, is_chief)`` of this rank, checked against MPI."""
    spec = resolver.cluster_spec()
    if not spec:
        return "worker", comm.rank, comm.rank, comm.rank == 0
    task_type, task_id = resolver.task_type, resolver.task_id
    validate_cluster_spec(spec, task_type, task_id)
    assert task_type is not None and task_id is not None  # refused by validate_cluster_spec
    worker_id = id_in_cluster(spec, task_type, task_id)
    workers = num_workers(spec, task_type)
    if workers != comm.size or worker_id != comm.rank:
        raise ValueError(
            f"The cluster resolver makes this process {task_type}:{task_id} (worker {worker_id} "
            f"of {workers}) but it is MPI rank {comm.rank} of {comm.size}. mpidist's workers are "
            "the MPI ranks: give the resolver one task per rank in rank order (or use the "
            "default MPIClusterResolver)."
        )
    return task_type, task_id, worker_id, is_chief(spec, task_type, task_id)


def _local_devices(resolver: ClusterResolver, comm: Communicator, task_type: str, task_id: int
                   ) -> list[DeviceSpec]:
    if isinstance(resolver, MPIClusterResolver):
        specs = [parse_device(d) for d in resolver.local_devices()]
    else:
        gpus = int(resolver.num_accelerators().get("GPU", 0))
        gpus = min(gpus, num_gpus()) if gpus else 0
        specs = [DeviceSpec("GPU", i) for i in range(gpus)] or [DeviceSpec("CPU", 0)]
    return [s.with_task(task_type, task_id) for s in specs]


class _MultiWorkerExtended(MirroredExtended):
    _cross_device_ops: CollectiveAllReduce  # the one __init__ gives MirroredExtended

    def __init__(self, container_strategy: Strategy, resolver: ClusterResolver,
                 options: CommunicationOptions) -> None:
        comm = world_communicator()
        task_type, task_id, worker_id, chief = _worker_identity(resolver, comm)
        devices = _local_devices(resolver, comm, task_type, task_id)
        cpu = sum(d.is_cpu for d in devices)  # a rank's CPU replicas share its cores too
        threads = cap_cpu_threads(comm.local_size, get_config().cpu_threads, cpu_replicas=cpu)
        # One gather serves the agreement, the replica counts and the NCCL decision (what each
        # node has, not settings: they may differ by rank, and every rank decides from all).
        everyone = agree("MultiWorkerMirroredStrategy()", _facts_to_agree(resolver, options),
                         comm, fix=_AGREEMENT_FIX,
                         local={"replicas": len(devices), **_nccl_facts(comm, devices, options)})
        use_nccl, why = choose_nccl("MultiWorkerMirroredStrategy()", options.implementation,
                                    everyone)
        if not use_nccl and options.implementation is not CommunicationImplementation.RING \
                and all(facts["gpu replicas"] for facts in everyone) and comm.size > 1:
            log.info("MultiWorkerMirroredStrategy: GPU values cross ranks through MPI, not "
                     "NCCL: %s.", why)
        counts = [facts["replicas"] for facts in everyone]
        self._comm = comm
        self._num_workers = comm.size
        self._is_chief = chief
        self._global_replicas: int = sum(counts)
        self._offset: int = sum(counts[:worker_id])
        self._same_replicas_everywhere = len(set(counts)) == 1
        self._communication_options = options
        nccl = RankNcclGroup(comm, devices[0].device_index) if use_nccl else None
        ops = CollectiveAllReduce(comm, self._global_replicas, options, nccl)
        super().__init__(container_strategy, devices, ops)
        self._cluster_resolver = resolver
        self._task_type, self._task_id = task_type, task_id
        log.info("MultiWorkerMirroredStrategy: worker %d of %d (%s:%s%s), %d local replica(s) "
                 "on %s, %d in sync; NCCL across ranks %s; BLAS threads per rank %s",
                 worker_id, comm.size, task_type, task_id, ", chief" if chief else "",
                 len(devices), ", ".join(str(d) for d in devices), self._global_replicas,
                 "on" if nccl is not None else "off", threads if threads else "unchanged")

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._global_replicas

    def _replica_id_offset(self) -> int:
        return self._offset

    # -- communication across workers -----------------------------------------------------
    @property
    def communicator(self) -> Communicator:
        """The world Communicator: every rank of the job, one worker each."""
        return self._comm

    @property
    def communication_options(self) -> CommunicationOptions:
        """The CommunicationOptions given to the strategy (defaults where none were)."""
        return self._communication_options

    # -- roles ----------------------------------------------------------------------------
    @property
    def should_checkpoint(self) -> bool:
        return self._is_chief

    @property
    def should_save_summary(self) -> bool:
        return self._is_chief

    @property
    def experimental_between_graph(self) -> bool:
        return True

    # -- input ----------------------------------------------------------------------------
    def _input_workers(self) -> InputWorkers:
        """Every rank is a worker reading its share; the world communicator agrees end of data
        and shuffle seeds."""
        return InputWorkers(devices=self._device_specs, num_workers=self._num_workers,
                            worker_index=self._comm.rank, num_replicas_in_sync=self._global_replicas,
                            comm=self._comm,
                            timeout_seconds=self._communication_options.timeout_seconds,
                            uniform=self._same_replicas_everywhere)

    # -- values from one worker -----------------------------------------------------------
    def _reduce_to(self, reduce_op: ReduceOp, value: Any, destinations: Destinations,
                   options: CommunicationOptions | None) -> Any:
        if self._num_workers > 1 and not isinstance(value, DistributedValues):
            return self._reduce_worker_value(reduce_op, value, destinations, options)
        return super()._reduce_to(reduce_op, value, destinations, options)

    def _reduce_worker_value(self, reduce_op: ReduceOp, value: Any, destinations: Destinations,
                             options: CommunicationOptions | None) -> Array | Mirrored:
        """A plain value is this worker's own (as in TF): SUM adds the workers' values, MEAN
        averages them. (TF divides by the replica count instead, which is the same with one
        replica per worker and wrong with more.)"""
        summed = self._cross_device_ops.reduce(ReduceOp.SUM, PerReplica([as_array(value)]),
                                               destinations, options)
        if reduce_op is ReduceOp.SUM:
            return summed
        if isinstance(summed, Mirrored):
            return Mirrored([v / self._num_workers for v in summed.values], summed.devices)
        return summed / self._num_workers

    def _batch_reduce_to(self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Destinations]],
                         options: CommunicationOptions | None) -> list[Any]:
        return self.reduction_plan().batch_reduce(reduce_op, pairs, options)

    def _choose_reduction_plan(self) -> ReductionPlan:
        """One replica per rank and several ranks: the replica's host values go straight to
        the communicator (``HostReplicaPlan``); else, and for what that path does not take,
        the general plan. The optimizers' packed arena applies to one CPU replica."""
        general = GeneralPlan(self, self._general_batch_reduce_to)
        if self._num_workers > 1 and len(self._device_specs) == 1:
            return self._cross_device_ops.host_replica_plan(
                general, packs_arena=self._device_specs[0].is_cpu)
        return general

    def _general_batch_reduce_to(self, reduce_op: ReduceOp,
                                 pairs: Sequence[tuple[Any, Destinations]],
                                 options: CommunicationOptions | None) -> list[Any]:
        if self._num_workers > 1 and len(self._device_specs) == 1:
            # One replica per rank: strategy.run (and a replica's all_reduce) hands over bare
            # arrays, and each is that replica's value; wrapped, it travels packed where it can.
            devices, ndarray, wrap = self._device_specs, np.ndarray, PerReplica.unchecked
            pairs = [(v if isinstance(v, DistributedValues)
                      else wrap((v if type(v) is ndarray else as_array(v),), devices), d)
                     for v, d in pairs]
        return super()._batch_reduce_to(reduce_op, pairs, options)

    def _gather(self, value: Any, axis: int) -> Any:
        if self._num_workers > 1 and not isinstance(value, DistributedValues):
            value = PerReplica([as_array(value)], self._device_specs[:1])
        return super()._gather(value, axis)

    def first_replica_value(self, value: Any) -> Any:
        """Replica 0 of the whole job lives on the chief: every worker takes its value. (TF
        takes each worker's own first replica, so the workers' copies drift apart.)"""
        return self._from_chief(super().first_replica_value(value))

    def _initial_value_for_workers(self, initial: Array) -> Array:
        """Every worker starts from the chief's value, whatever its own initializer drew."""
        with user_call("Variable creation"):  # collective: every rank creates each variable
            return self._from_chief(initial)

    def _from_chief(self, value: Any) -> Any:
        """A copy of the chief's ``value`` on every worker (``value`` itself with one worker)."""
        if self._num_workers == 1:
            return value
        buf = value.copy() if cupy_backend.is_cupy_array(value) else np.array(value, copy=True)
        return self._comm.broadcast(buf, root=0,
                                    timeout=self._communication_options.timeout_seconds)


def _nccl_facts(comm: Communicator, devices: Sequence[DeviceSpec],
                options: CommunicationOptions) -> dict[str, Any]:
    """This rank's part of the NCCL decision (``comm.nccl_choice``): GPU replicas, whether NCCL
    loads, and the GPU an NCCL communicator would drive (the first replica's). Nothing is
    probed where NCCL cannot be chosen."""
    all_gpu = all(d.is_gpu for d in devices)
    if comm.size == 1 or not all_gpu or \
            options.implementation is CommunicationImplementation.RING:
        return rank_facts(all_gpu, False, None)
    loads = nccl_module() is not None
    identity = gpu_identity(devices[0].device_index, comm.hosts[comm.rank]) if loads else None
    return rank_facts(all_gpu, loads, identity)


_AGREEMENT_FIX = (
    "Every rank must build MultiWorkerMirroredStrategy with the same cluster resolver settings "
    "and CommunicationOptions (and, for NCCL, GPUs and NCCL on every rank, or "
    "CommunicationImplementation.RING): read them from one place, not per rank.")


def _facts_to_agree(resolver: ClusterResolver, options: CommunicationOptions
                    ) -> dict[str, Any]:
    """What every worker must share: the cluster, the resolver's settings and the
    communication options (their collectives must match). The NCCL decision is not a setting
    to compare: every rank makes it from the same gathered facts (``choose_nccl``)."""
    facts = configuration_facts(resolver)
    facts["communication_options"] = (options.implementation.name, options.bytes_per_pack,
                                       options.timeout_seconds)
    return facts
