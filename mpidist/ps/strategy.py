"""``ParameterServerStrategy`` (TF's v2): variables on parameter-server ranks, steps scheduled
by the chief onto worker ranks with ``ClusterCoordinator`` (spec §9, docs/ps.md).

The same program runs on every rank. The chief (rank 0) is the coordinator: it creates the
variables and schedules closures. A ps or worker rank that constructs the strategy serves its
role there (``serving.run_task``, what ``mpidist.Server(...).join()`` runs too) until the chief
shuts the job down, then raises ``SystemExit(0)``; TF's idiom
``if task_type in ("worker", "ps"): mpidist.Server(...).join()`` works too.

The coordinator and ``mpidist.Server`` build on this module, never the reverse: the
ClusterCoordinator type is registered here by its module (``register_coordinator``).
"""

import functools
import itertools
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from mpidist.cluster_resolver.mpi import MPIClusterResolver
from mpidist.comm.exit_sequence import at_exit
from mpidist.comm.mpi import on_abort
from mpidist.config import get_config
from mpidist.core import state
from mpidist.core.devices import parse_device
from mpidist.data.options import InputContext
from mpidist.ps.client import current_client
from mpidist.ps.partitioners import prepare_initial_value, shard_initial_values, shard_rows
from mpidist.ps.runtime import ChiefPulse, TaskRuntime
from mpidist.ps.serving import await_workers, run_task, shutdown_job
from mpidist.ps.transport import MPITransport
from mpidist.ps.updates import PARAMETER_SERVER_UPDATES
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.ps.variables import PSVariable, VariableHandle
from mpidist.strategies.single_replica import SingleReplicaExtended
from mpidist.strategies.strategy import Strategy
from mpidist.types import VariableAggregation, VariableSynchronization
from mpidist.values.variables import Variable, as_aggregation, as_synchronization, initial_array

__all__ = ["ParameterServerStrategy", "ParameterServerExtended", "task_strategy",
           "DatasetsFromFunction", "refuse_local_devices", "register_coordinator"]

# ClusterCoordinator, which builds on this module: ``mpidist.ps.coordinator`` registers it when
# imported (``import mpidist`` does), so the chief's ``scope()`` can create it as TF's does.
_coordinator_type: list[Callable[["ParameterServerStrategy"], Any]] = []


def register_coordinator(coordinator_type: Callable[["ParameterServerStrategy"], Any]) -> None:
    """Tell the strategy how to create its ClusterCoordinator (called by its module)."""
    _coordinator_type[:] = [coordinator_type]


class DatasetsFromFunction:
    """What ``distribute_datasets_from_function`` returns under ParameterServerStrategy: the
    recipe, built on each worker by ``create_per_worker_dataset`` (TF's PSS builds it there too,
    with one input pipeline per worker and no synchronization between workers)."""

    def __init__(self, dataset_fn: Callable[[InputContext], Any], options: Any = None) -> None:
        self.dataset_fn = dataset_fn
        self.options = options

    def build(self) -> Any:
        return self.dataset_fn(InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                            num_replicas_in_sync=1))

    def __iter__(self) -> Any:
        raise TypeError(
            "Under ParameterServerStrategy a distributed dataset is built and iterated on the "
            "workers: pass it to coordinator.create_per_worker_dataset(...) and give "
            "iter(per_worker_dataset) to the scheduled function.")


def refuse_local_devices(resolver: Any) -> None:
    """ValueError when the resolver was given ``local_devices`` other than the one CPU: this
    strategy runs one replica per worker on its CPU (TF's several replicas per worker, with
    AggregatingVariables, are not implemented), and ignoring the argument would train with
    fewer replicas than asked, silently."""
    requested = getattr(resolver, "requested_local_devices", None)
    if requested is None or (isinstance(requested, list) and
                             [str(parse_device(d)) for d in requested] == [str(parse_device("/cpu:0"))]):
        return
    raise ValueError(
        f"ParameterServerStrategy runs one replica per worker, on its CPU; the cluster resolver "
        f"was given local_devices={requested!r}, which this strategy cannot honour (TF's "
        "several replicas per worker, with AggregatingVariable updates, are not implemented "
        "here). Remove local_devices (or pass ['/cpu:0']); for several replicas on one "
        "machine start more worker ranks (mpiexec -n), or use MultiWorkerMirroredStrategy.")


def task_strategy() -> "ParameterServerStrategy":
    """The ParameterServerStrategy of the rank running here (what a pickled strategy becomes
    on the rank that receives it)."""
    strategy = getattr(current_client(), "strategy", None)
    if strategy is None:
        raise RuntimeError("No ParameterServerStrategy was created on this rank.")
    return cast("ParameterServerStrategy", strategy)


class ParameterServerStrategy(Strategy):
    """Asynchronous training with parameter servers.

    Args:
        cluster_resolver: Says which rank is the chief, which are ps tasks and which are
            workers. None (mpidist's default; TF requires one): ``MPIClusterResolver(
            num_ps=MPIDIST_NUM_PS or 1)``: rank 0 chief, ranks 1..P ps, the rest workers.
        variable_partitioner: A callable ``(shape, dtype) -> [k, 1, ...]`` such as
            ``mpidist.experimental.partitioners.FixedShardsPartitioner(2)``: variables of rank
            >= 1 are split along axis 0 into a ShardedVariable whose shards are placed round-robin.
    """

    def __init__(self, cluster_resolver: Any = None, variable_partitioner: Any = None) -> None:
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError(f"variable_partitioner must be callable (shape, dtype) -> list, got "
                            f"{variable_partitioner!r}; e.g. mpidist.experimental.partitioners."
                            "FixedShardsPartitioner(2).")
        resolver = cluster_resolver if cluster_resolver is not None else \
            MPIClusterResolver(num_ps=get_config().num_ps)
        refuse_local_devices(resolver)  # before anything collective: every rank raises alike
        runtime = TaskRuntime.connect(resolver)
        self._build(runtime, variable_partitioner)
        if runtime.task_type != "chief":
            # A ps or worker rank serves here, as mpidist.Server(...).join() would, and the
            # program ends with the job: nothing after the constructor runs on this rank.
            run_task(runtime, self)
            raise SystemExit(0)
        self.extended.start_chief()

    def _build(self, runtime: TaskRuntime, variable_partitioner: Any) -> None:
        super().__init__(ParameterServerExtended(self, runtime, variable_partitioner))
        self._cluster_resolver = runtime.resolver
        runtime.client.strategy = self

    @classmethod
    def for_task(cls, runtime: TaskRuntime) -> "ParameterServerStrategy":
        """The strategy object of a worker rank (``Server.join`` builds it; no serving here)."""
        strategy = cls.__new__(cls)
        strategy._build(runtime, None)
        return strategy

    @property
    def cluster_resolver(self) -> Any:
        return self._cluster_resolver

    @property
    def extended(self) -> "ParameterServerExtended":
        return cast("ParameterServerExtended", super().extended)

    def scope(self) -> Any:
        """Enter the strategy's scope; on the chief this also creates the ClusterCoordinator
        (TF does the same)."""
        if self.extended.is_chief and self.extended.coordinator is None and _coordinator_type:
            _coordinator_type[0](self)
        return super().scope()

    def __reduce__(self) -> tuple[Callable[[], "ParameterServerStrategy"], tuple[()]]:
        # A closure that captures the strategy gets the strategy of the rank that runs it.
        return task_strategy, ()

    def __deepcopy__(self, memo: dict[int, Any]) -> "ParameterServerStrategy":
        return self


class ParameterServerExtended(SingleReplicaExtended):
    """One replica per worker, on the worker's CPU: ``run`` is ``call_one_replica``, as for
    OneDeviceStrategy, whose variable creation it does not inherit only to replace; variables
    are PSVariables (or ShardedVariables of them)."""

    update_applier = PARAMETER_SERVER_UPDATES  # optimizer updates run on the servers

    def __init__(self, container_strategy: Strategy, runtime: TaskRuntime,
                 variable_partitioner: Any) -> None:
        device = parse_device("/cpu:0")
        super().__init__(container_strategy, devices=(device,))
        self._device = device
        self._runtime = runtime
        self._partitioner = variable_partitioner
        self._ids = itertools.count(1)
        self._placed = 0  # round-robin placements so far (TF's _variable_count: not colocated ones)
        self.coordinator: Any = None
        self.in_dataset_fn = False

    # -- roles ------------------------------------------------------------------------------
    @property
    def runtime(self) -> TaskRuntime:
        return self._runtime

    @property
    def is_chief(self) -> bool:
        return self._runtime.task_type == "chief"

    @property
    def num_ps(self) -> int:
        return self._runtime.roles.num_ps

    @property
    def num_workers(self) -> int:
        return self._runtime.roles.num_workers

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        roles = self._runtime.roles
        return tuple(roles.device_name("ps", i) for i in range(roles.num_ps))

    @property
    def worker_devices(self) -> tuple[str, ...]:
        return ("/device:CPU:0",)

    @property
    def should_checkpoint(self) -> bool:
        return self.is_chief

    @property
    def should_save_summary(self) -> bool:
        return self.is_chief

    @property
    def experimental_between_graph(self) -> bool:
        return False

    @property
    def spans_ranks(self) -> bool:
        """The strategy works across the ranks of the job (TF's between_graph is False for
        it: one client), so the warning for a strategy that trains each rank alone does not
        apply."""
        return True

    def start_chief(self) -> None:
        """On the chief: wait until every worker reported in, and end the job at exit."""
        await_workers(self._runtime)
        self._runtime.pulse = ChiefPulse(self._runtime.transport, self._runtime.roles)
        if isinstance(self._runtime.transport, MPITransport):  # an in-process cluster stops itself
            strategy = cast(ParameterServerStrategy, self._container_strategy())
            at_exit("meet", functools.partial(shutdown_job, strategy))
            on_abort(self._runtime.note_stop)

    def _distribute_datasets_from_function(self, dataset_fn: Callable[[InputContext], Any],
                                           options: Any) -> DatasetsFromFunction:
        return DatasetsFromFunction(dataset_fn, options)

    def _experimental_distribute_dataset(self, dataset: Any, options: Any) -> DatasetsFromFunction:
        return DatasetsFromFunction(lambda _: dataset, options)

    # -- variables --------------------------------------------------------------------------
    def create_variable(self, initial_value: Any = None, trainable: bool | None = None,
                        name: str | None = None, dtype: Any = None,
                        synchronization: VariableSynchronization | int = VariableSynchronization.AUTO,
                        aggregation: VariableAggregation | str = VariableAggregation.NONE,
                        shape: Any = None, device: Any = None, **kwargs: Any) -> Any:
        """A PSVariable placed round-robin over the ps tasks, or a ShardedVariable when the
        partitioner splits it; made on the chief (the coordinator) only."""
        if kwargs:
            raise TypeError(f"Variable() got unexpected keyword arguments {sorted(kwargs)}.")
        if self.in_dataset_fn:
            raise ValueError("Creating variables in `dataset_fn` is not allowed.")
        if not self.is_chief:
            raise RuntimeError(
                f"A variable ({name or 'Variable'!r}) was created on {self._runtime.where} inside a "
                "scheduled function. With ParameterServerStrategy variables are created on the "
                "coordinator, in `with strategy.scope():`, before scheduling the functions that use "
                "them (optimizers: call optimizer.build(variables) there too).")
        synchronization = as_synchronization(synchronization)
        aggregation = as_aggregation(aggregation)
        name = "Variable" if name is None else name
        if not isinstance(name, str):
            raise TypeError(f"Variable name must be a string, got {name!r}.")
        if trainable is None:
            trainable = synchronization is not VariableSynchronization.ON_READ
        colocated = state.colocation()
        partitioner = self._partitioner if colocated is None else None
        if partitioner is not None:
            sharded = self._create_sharded(partitioner, initial_value, name, dtype, shape,
                                           bool(trainable), synchronization, aggregation)
            if sharded is not None:
                return sharded
        value = initial_array(initial_value, dtype, shape)
        ps_task = self._colocated_task(colocated)
        return self._create_on(ps_task, value, name, bool(trainable), synchronization, aggregation)

    def _colocated_task(self, colocated: Any) -> int | None:
        if colocated is None:
            return None
        if isinstance(colocated, PSVariable):
            return colocated.handle.ps_task
        if isinstance(colocated, ShardedVariable):
            return cast(PSVariable, colocated.variables[0]).handle.ps_task
        raise ValueError(f"colocate_vars_with needs a variable of this ParameterServerStrategy, got "
                         f"{colocated!r}.")

    def _create_sharded(self, partitioner: Any, initial_value: Any, name: str, dtype: Any,
                        shape: Any, trainable: bool, synchronization: VariableSynchronization,
                        aggregation: VariableAggregation) -> ShardedVariable | None:
        initial_value, full_shape, full_dtype = prepare_initial_value(initial_value, shape, dtype)
        rows = shard_rows(partitioner, full_shape, full_dtype)
        if not rows:
            return None
        values = shard_initial_values(initial_value, full_shape, full_dtype, rows)
        shards = [self._create_on(None, np.asarray(v, dtype=full_dtype), f"{name}/part_{i}",
                                  trainable, synchronization, aggregation)
                  for i, v in enumerate(values)]
        return ShardedVariable(shards, name=name)

    def _create_on(self, ps_task: int | None, value: np.ndarray, name: str, trainable: bool,
                   synchronization: VariableSynchronization, aggregation: VariableAggregation
                   ) -> PSVariable:
        roles = self._runtime.roles
        if ps_task is None:
            ps_task = self._placed % roles.num_ps
            self._placed += 1
        handle = VariableHandle(next(self._ids), roles.rank_of("ps", ps_task), ps_task, name,
                                tuple(value.shape), value.dtype.str, trainable,
                                synchronization.value, aggregation.value)
        return PSVariable.create(self._runtime.client, handle, value, self._container_strategy())

    def colocate_vars_with(self, colocate_with_variable: Any) -> state.colocation_scope:
        """Variables created in this scope go to ``colocate_with_variable``'s parameter server
        (a ShardedVariable's: its first shard's), unpartitioned."""
        if isinstance(colocate_with_variable, ShardedVariable):
            if not self.variable_created_in_scope(colocate_with_variable):
                raise ValueError(
                    "`colocate_vars_with` must only be passed a variable created in this "
                    f"mpidist.Strategy.scope(), not: {colocate_with_variable!r}")
            return state.colocation_scope(colocate_with_variable)
        return super().colocate_vars_with(colocate_with_variable)

    def variable_created_in_scope(self, v: object) -> bool:
        if isinstance(v, ShardedVariable):
            return all(self.variable_created_in_scope(s) for s in v.variables)
        return isinstance(v, PSVariable) and (
            v.distribute_strategy is self._container_strategy() or not self.is_chief)

    def read_var(self, v: Any) -> Any:
        return v.read_value() if isinstance(v, (Variable, ShardedVariable)) else v
