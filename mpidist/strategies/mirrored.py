"""MirroredStrategy: synchronous replicas on the devices of one process.

With several local devices each replica runs on its own thread (see replica_threads); with
one device ``run`` calls the function directly. Variables created in scope get one copy per
device and follow TF's ON_WRITE / ON_READ aggregation rules.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy.typing as npt

from mpidist.backend import device_context, num_gpus
from mpidist.backend.threads import cap_replica_threads
from mpidist.config import get_config
from mpidist.core import nest, state
from mpidist.core.devices import DeviceSpec, parse_device
from mpidist.comm.nccl import nccl_module
from mpidist.comm.options import CommunicationOptions
from mpidist.data.distributed import InputWorkers
from mpidist.ops.in_process_all_reduce import HierarchicalCopyAllReduce, NcclAllReduce
from mpidist.ops.cross_device_ops import (
    CrossDeviceOps,
    as_per_replica,
    reduce_non_distributed_value,
)
from mpidist.ops.destinations import Destinations
from mpidist.ops.reduction_to_one_device import ReductionToOneDevice
from mpidist.strategies.one_local_replica import PLAIN_TYPES, call_one_replica, is_plain
from mpidist.strategies.replica_context import ReplicaContext
from mpidist.strategies.replica_threads import ReplicaRunner
from mpidist.strategies.strategy import Strategy, StrategyExtended
from mpidist.types import Array, ReduceOp, VariableAggregation, VariableSynchronization
from mpidist.values.containers import DistributedValues, Mirrored, PerReplica
from mpidist.values.distributed_variables import MirroredVariable, SyncOnReadVariable
from mpidist.values.regroup import regroup, select_replica
from mpidist.values.variables import (
    Shape,
    Variable,
    as_aggregation,
    as_synchronization,
    initial_array,
)

__all__ = ["MirroredExtended", "MirroredStrategy", "select_cross_device_ops"]


def _default_devices() -> list[DeviceSpec]:
    gpus = num_gpus()
    if gpus:
        return [DeviceSpec("GPU", i) for i in range(gpus)]
    return [DeviceSpec("CPU", 0)]


def select_cross_device_ops(devices: Sequence[DeviceSpec]) -> CrossDeviceOps:
    """The default CrossDeviceOps for ``devices``: NCCL between GPUs where NCCL loads, else
    hierarchical copies between GPUs; ReductionToOneDevice when any device is a CPU."""
    if devices and all(d.is_gpu for d in devices):
        if len(devices) > 1 and nccl_module() is not None:
            return NcclAllReduce()
        return HierarchicalCopyAllReduce()
    return ReductionToOneDevice()


def _check_devices(devices: object) -> list[DeviceSpec]:
    if isinstance(devices, str):
        devices = [devices]
    if not isinstance(devices, (list, tuple)):
        raise TypeError(
            f"MirroredStrategy devices must be a list of device strings such as "
            f"['/cpu:0', '/cpu:1'], got {type(devices).__name__} {devices!r}."
        )
    devices = list(devices)
    if not devices:
        raise ValueError("MirroredStrategy needs at least one device, e.g. devices=['/cpu:0'].")
    specs = [parse_device(d) for d in devices]
    seen = set()
    for given, spec in zip(devices, specs):
        if spec in seen:
            raise ValueError(f"MirroredStrategy got the device {given!r} twice; list each device once.")
        seen.add(spec)
    gpu_indices = [s.device_index for s in specs if s.is_gpu]
    if gpu_indices:
        visible = num_gpus()
        missing = [i for i in gpu_indices if i >= visible]
        if missing:
            raise ValueError(
                f"MirroredStrategy got GPU device(s) {missing} but this process sees {visible} GPU(s); "
                "check CUDA_VISIBLE_DEVICES or pass existing devices."
            )
    return specs


class MirroredStrategy(Strategy):
    """Synchronous training on several devices of one machine (one replica per device).

    Args:
        devices: Device strings (``"/gpu:0"``, ``"/cpu:1"`` ...); all visible GPUs when None,
            else ``"/cpu:0"``. Several ``/cpu:N`` entries give N virtual CPU devices.
        cross_device_ops: The CrossDeviceOps that combines values across devices. When None:
            NcclAllReduce on GPUs where NCCL loads, else HierarchicalCopyAllReduce on GPUs, and
            ReductionToOneDevice when any device is a CPU (see ``select_cross_device_ops``).
    """

    def __init__(self, devices: Sequence[str | DeviceSpec] | str | None = None,
                 cross_device_ops: CrossDeviceOps | None = None) -> None:
        specs = _default_devices() if devices is None else _check_devices(devices)
        cap_replica_threads(specs, get_config().cpu_threads)  # BLAS threads per CPU replica
        if cross_device_ops is None:
            cross_device_ops = select_cross_device_ops(specs)
        if not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(
                "cross_device_ops must be a mpidist.CrossDeviceOps instance such as "
                f"mpidist.ReductionToOneDevice(), got {cross_device_ops!r}."
            )
        super().__init__(MirroredExtended(self, specs, cross_device_ops))
        self._init_args = (devices, cross_device_ops)

    def __deepcopy__(self, memo: dict[int, Any]) -> "MirroredStrategy":
        return MirroredStrategy(*self._init_args)


class MirroredExtended(StrategyExtended):
    """The StrategyExtended of MirroredStrategy (and, below MultiWorkerMirroredStrategy's, of
    every worker): one replica per local device, values combined by a CrossDeviceOps."""

    def __init__(self, container_strategy: Strategy, devices: Sequence[DeviceSpec],
                 cross_device_ops: CrossDeviceOps) -> None:
        super().__init__(container_strategy, devices)
        self._cross_device_ops = cross_device_ops
        self._runner = ReplicaRunner(container_strategy, self._device_specs, self._make_replica_context)

    def _input_workers(self) -> InputWorkers:
        return dataclasses.replace(super()._input_workers(), per_replica_allowed=True)

    def _make_replica_context(self, index: int) -> ReplicaContext:
        # ids are global; components are indexed locally
        return ReplicaContext.for_replica(self._container_strategy(),
                                          index + self._replica_id_offset(), index)

    # -- run ------------------------------------------------------------------------------
    def _check_distributed_args(self, args: Any, kwargs: Any) -> None:
        n = len(self._device_specs)
        for leaf in nest.flatten((args, kwargs)):
            if isinstance(leaf, DistributedValues) and len(leaf.values) != n:
                raise ValueError(
                    f"A {type(leaf).__name__} with {len(leaf.values)} components was passed to a "
                    f"strategy with {n} local replicas; make one component per replica."
                )

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> Any:
        if len(self._device_specs) == 1:
            return self._call_one_replica(fn, args, kwargs)
        plain = is_plain(args, kwargs)
        if not plain:
            self._check_distributed_args(args, kwargs)
        results = self._runner.run(fn, args, kwargs, plain)
        return regroup(tuple(results), PerReplica, self._device_specs)

    def _call_one_replica(self, fn: Callable[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
        plain = is_plain(args, kwargs)
        if not plain:
            self._check_distributed_args(args, kwargs)
        result = call_one_replica(self._make_replica_context(0), self._device_specs[0], fn,
                                  args, kwargs, plain)
        kind = type(result)
        if kind in PLAIN_TYPES:  # nothing to regroup
            return result
        # A flat list or tuple of plain values (the usual step output) regroups to itself.
        if (kind is list or kind is tuple) and all(type(v) in PLAIN_TYPES for v in result):
            return list(result) if kind is list else result
        return regroup((result,), PerReplica, self._device_specs)

    # -- reductions -----------------------------------------------------------------------
    def _reduce_to(self, reduce_op: ReduceOp, value: Any, destinations: Destinations,
                   options: CommunicationOptions | None) -> Any:
        if isinstance(value, DistributedValues) and len(value.values) != len(self._device_specs):
            self._check_distributed_args((value,), {})  # raises: one component per replica
        if isinstance(value, SyncOnReadVariable):
            value = as_per_replica(value)
        if isinstance(value, (Mirrored, MirroredVariable)):
            if reduce_op is ReduceOp.MEAN:
                return value
            raise AssertionError(
                f"Cannot reduce a {type(value).__name__} with SUM: its components are copies of one "
                "value, so the sum would count it once per replica. Use MEAN, or multiply by "
                "strategy.num_replicas_in_sync."
            )
        if not isinstance(value, DistributedValues):
            return reduce_non_distributed_value(reduce_op, value, destinations, self._num_replicas_in_sync)
        return self._cross_device_ops.reduce(reduce_op, value, destinations, options)

    def _batch_reduce_to(self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Destinations]],
                         options: CommunicationOptions | None) -> list[Any]:
        converted = []
        n = len(self._device_specs)
        for v, d in pairs:
            if isinstance(v, DistributedValues) and len(v.values) != n:
                self._check_distributed_args((v,), {})  # raises: one component per replica
            if type(v) is not PerReplica:  # the common case first: one cheap check per value
                if not isinstance(v, DistributedValues) or isinstance(v, (Mirrored, MirroredVariable)):
                    return [self._reduce_to(reduce_op, v, d, options) for v, d in pairs]
                if isinstance(v, SyncOnReadVariable):
                    v = as_per_replica(v)
            converted.append((v, d))
        return self._cross_device_ops.batch_reduce(reduce_op, converted, options)

    def _broadcast_to(self, tensor: Any, destinations: Destinations) -> Array | Mirrored:
        return self._cross_device_ops.broadcast(tensor, destinations)

    def _gather(self, value: Any, axis: int) -> Any:
        if isinstance(value, SyncOnReadVariable):
            value = as_per_replica(value)
        if not isinstance(value, DistributedValues):
            return value
        device = state.current_device() or self._host_device()
        return self._cross_device_ops._gather(value, device, axis)

    def all_gather_leaves(self, per_leaf: list[Any], axis: int,
                          options: CommunicationOptions | None = None) -> list[Any]:
        return [self._cross_device_ops._gather(v, v, axis, options) for v in per_leaf]

    # -- updates --------------------------------------------------------------------------
    def _update(self, var: Any, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any], group: bool) -> Any:
        if not isinstance(var, DistributedValues):
            result = fn(var, *args, **kwargs)
            return result if group else nest.map_structure(lambda x: (x,), result)
        results = []
        for i, (component, device) in enumerate(zip(var.values, var.devices or self._device_specs)):
            with state.device_scope(device), device_context(device):
                results.append(fn(component, *select_replica(i, args), **select_replica(i, kwargs)))
        regrouped = regroup(tuple(results), Mirrored, var.devices)
        if group:
            return regrouped
        return nest.map_structure(self._local_results, regrouped)

    # -- variables ------------------------------------------------------------------------
    def create_variable(
            self, initial_value: Any = None, trainable: bool | None = None,
            name: str | None = None, dtype: npt.DTypeLike | None = None,
            synchronization: VariableSynchronization | int = VariableSynchronization.AUTO,
            aggregation: VariableAggregation | str = VariableAggregation.NONE,
            shape: Shape | None = None, device: str | DeviceSpec | None = None,
    ) -> MirroredVariable | SyncOnReadVariable:
        """A MirroredVariable (ON_WRITE, the default) or SyncOnReadVariable (ON_READ) with one
        component per local device (or per device of the variable in ``colocate_vars_with``),
        all starting from the same value. In replica context every replica asks and replica
        0's arguments create it, once."""
        mode = state.current_mode()
        if mode.replica_context is not None and len(self._device_specs) > 1:
            # Every replica asks; the variable is created once, from replica 0's arguments.
            def create(strategy: Strategy, initial: Any) -> MirroredVariable | SyncOnReadVariable:
                first = initial.values[0] if isinstance(initial, PerReplica) else initial
                return self.create_variable(first, trainable, name, dtype, synchronization,
                                            aggregation, shape)

            return cast(MirroredVariable | SyncOnReadVariable,
                        mode.replica_context.merge_call(create, args=(initial_value,)))
        synchronization = as_synchronization(synchronization)
        aggregation = as_aggregation(aggregation)
        base = name if name is not None else "Variable"
        if synchronization is VariableSynchronization.NONE:
            raise ValueError(
                "`NONE` variable synchronization mode is not supported with mpidist.Strategy. "
                f"Please change the `synchronization` for variable: {base}"
            )
        if synchronization is VariableSynchronization.AUTO:
            synchronization = VariableSynchronization.ON_WRITE
        with state.device_scope(self._device_specs[0]):
            initial = initial_array(initial_value, dtype, shape)
        initial = self._initial_value_for_workers(initial)
        if aggregation is VariableAggregation.MEAN and initial.dtype.kind not in "fc":
            raise ValueError(
                "creating distributed mpidist.Variable with aggregation=MEAN and a non-floating dtype "
                f"({initial.dtype}) is not supported, please use a different aggregation or dtype"
            )
        if trainable is None:
            trainable = synchronization is not VariableSynchronization.ON_READ
        colocate_with = state.colocation()
        devices = colocate_with.devices if isinstance(colocate_with, DistributedValues) and \
            colocate_with.devices else self._device_specs
        components = []
        for i, device in enumerate(devices):
            components.append(Variable.plain(
                initial, trainable=trainable, name=base if i == 0 else f"{base}/replica_{i}",
                synchronization=synchronization, aggregation=aggregation, device=device))
        cls = SyncOnReadVariable if synchronization is VariableSynchronization.ON_READ else MirroredVariable
        return cls(self._container_strategy(), components, aggregation)

    def _initial_value_for_workers(self, initial: Array) -> Array:
        """The value every copy starts from; one process has nothing to agree on."""
        return initial

    def read_var(self, v: Any) -> Any:
        if isinstance(v, Variable):
            with self._container_strategy().scope():
                return v.value()
        return v
