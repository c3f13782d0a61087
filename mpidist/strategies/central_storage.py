"""CentralStorageStrategy: replicas on the compute devices, variables once on one device.

One process, no MPI. Compute runs as MirroredStrategy's does (one thread per compute device,
input split the same way, reductions through ReductionToOneDevice), but a variable is not
mirrored: it lives once, on the parameter device, and every replica reads that one copy
(without a copy on CPU devices, which share host memory). With several compute devices each
variable is an AggregatingVariable, so an update made inside ``strategy.run`` is combined
across the replicas by the variable's aggregation and applied once.
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
from mpidist.core.signatures import accepts
from mpidist.data.distributed import InputWorkers
from mpidist.ops.reduction_to_one_device import ReductionToOneDevice
from mpidist.strategies.mirrored import MirroredExtended
from mpidist.strategies.strategy import Strategy
from mpidist.types import VariableAggregation, VariableSynchronization
from mpidist.values.aggregating import AggregatingVariable, single_value
from mpidist.values.containers import DistributedValues, PerReplica
from mpidist.values.variables import (
    Shape,
    Variable,
    as_aggregation,
    as_synchronization,
    initial_array,
)

__all__ = ["CentralStorageExtended", "CentralStorageStrategy"]


def _check_device_list(devices: object) -> list[DeviceSpec]:
    if isinstance(devices, (str, DeviceSpec)):
        devices = [devices]
    if not isinstance(devices, (list, tuple)):
        raise TypeError(
            "CentralStorageStrategy compute_devices must be a list of device strings such as "
            f"['/cpu:0', '/cpu:1'], got {type(devices).__name__} {devices!r}."
        )
    if not devices:
        raise ValueError(
            "CentralStorageStrategy needs at least one compute device, e.g. "
            "compute_devices=['/cpu:0'].")
    specs = [parse_device(d) for d in devices]
    for i, spec in enumerate(specs):
        if spec in specs[:i]:
            raise ValueError(
                f"CentralStorageStrategy got the compute device {devices[i]!r} twice; list each "
                "device once.")
    return specs


def _check_gpu_exists(given: object, spec: DeviceSpec) -> None:
    if spec.is_gpu and spec.device_index >= num_gpus():
        raise ValueError(
            f"CentralStorageStrategy got {given!r} but this process sees {num_gpus()} GPU(s); "
            "check CUDA_VISIBLE_DEVICES or pass an existing device such as '/cpu:0'."
        )


def _compute_devices(compute_devices: object) -> list[DeviceSpec]:
    if compute_devices is None:  # every GPU, else the CPU
        return [DeviceSpec("GPU", i) for i in range(num_gpus())] or [DeviceSpec("CPU", 0)]
    specs = _check_device_list(compute_devices)
    for spec in specs:
        _check_gpu_exists(str(spec), spec)
    return specs


def _parameter_device(parameter_device: object, compute: Sequence[DeviceSpec]) -> DeviceSpec:
    if parameter_device is None:
        # TF's rule: with exactly one GPU everything goes on it (its first compute device).
        return compute[0] if num_gpus() == 1 else DeviceSpec("CPU", 0)
    if not isinstance(parameter_device, (str, DeviceSpec)):
        raise TypeError(
            "CentralStorageStrategy parameter_device must be a device string such as '/cpu:0', "
            f"got {type(parameter_device).__name__} {parameter_device!r}."
        )
    spec = parse_device(parameter_device)
    _check_gpu_exists(parameter_device, spec)
    return spec


class CentralStorageStrategy(Strategy):
    """Synchronous training with variables on one device and compute replicated on others.

    Args:
        compute_devices: The devices replicas run on (``"/gpu:0"``, ``"/cpu:1"`` ...): every
            visible GPU when None, else ``["/cpu:0"]``. Several ``/cpu:N`` entries give N
            virtual CPU devices. ``num_replicas_in_sync`` is their number.
        parameter_device: Where the variables live: the GPU when the process sees exactly one
            (the first compute device), else ``"/cpu:0"``, when None.

    With several compute devices every variable (``ON_READ`` ones too: synchronization changes
    nothing when there is one copy) is an ``AggregatingVariable``: inside ``strategy.run`` an
    update needs an aggregation (``SUM``, ``MEAN`` or ``ONLY_FIRST_REPLICA``) and is applied
    once, after combining the replicas' values. With one compute device it is a plain Variable.
    """

    def __init__(self, compute_devices: Sequence[str | DeviceSpec] | str | None = None,
                 parameter_device: str | DeviceSpec | None = None) -> None:
        compute = _compute_devices(compute_devices)
        parameters = _parameter_device(parameter_device, compute)
        cap_replica_threads(compute, get_config().cpu_threads)  # BLAS threads per CPU replica
        super().__init__(CentralStorageExtended(self, compute, parameters))
        self._init_args = (compute_devices, parameter_device)

    def __deepcopy__(self, memo: dict[int, Any]) -> "CentralStorageStrategy":
        return CentralStorageStrategy(*self._init_args)


class CentralStorageExtended(MirroredExtended):
    """The StrategyExtended of CentralStorageStrategy: MirroredStrategy's replicas and input,
    reductions onto the parameter device, and one copy of each variable there."""

    def __init__(self, container_strategy: Strategy, compute_devices: Sequence[DeviceSpec],
                 parameter_device: DeviceSpec) -> None:
        super().__init__(container_strategy, compute_devices,
                         ReductionToOneDevice(reduce_to_device=parameter_device))
        self._parameter_device = parameter_device

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The one device variables live on, as a 1-tuple."""
        return (str(self._parameter_device),)

    @accepts()
    def non_slot_devices(self, var_list: Sequence[Variable]) -> tuple[str, ...] | Variable:
        """Where state that is no variable's slot goes: by the variable first in name order,
        as TF's parameter-server strategies say (every variable is on the parameter device)."""
        return min(var_list, key=lambda v: v.name) if var_list else self.parameter_devices

    def _input_workers(self) -> InputWorkers:
        # PER_REPLICA pipelines are MirroredStrategy's alone, as in TF.
        return dataclasses.replace(super()._input_workers(), per_replica_allowed=False)

    # -- variables ------------------------------------------------------------------------
    # MirroredExtended promises mirrored variables; here the strategy's kind is one copy.
    def create_variable(  # type: ignore[override]
            self, initial_value: Any = None, trainable: bool | None = None,
            name: str | None = None, dtype: npt.DTypeLike | None = None,
            synchronization: VariableSynchronization | int = VariableSynchronization.AUTO,
            aggregation: VariableAggregation | str = VariableAggregation.NONE,
            shape: Shape | None = None, device: str | DeviceSpec | None = None,
    ) -> Variable:
        """One Variable on the parameter device: wrapped in an AggregatingVariable with
        several compute devices, plain with one. ``device`` is ignored (the parameter device
        holds every variable). In replica context every replica asks and replica 0's
        arguments create it, once."""
        mode = state.current_mode()
        if mode.replica_context is not None and len(self._device_specs) > 1:
            def create(strategy: Strategy, initial: Any) -> Variable:
                first = initial.values[0] if isinstance(initial, PerReplica) else initial
                return self.create_variable(first, trainable, name, dtype, synchronization,
                                            aggregation, shape)

            return cast(Variable, mode.replica_context.merge_call(create, args=(initial_value,)))
        synchronization = as_synchronization(synchronization)  # checked; one copy needs none
        aggregation = as_aggregation(aggregation)
        with state.device_scope(self._parameter_device):
            initial = initial_array(initial_value, dtype, shape)
        strategy = self._container_strategy()
        if len(self._device_specs) == 1:
            return Variable.plain(initial, trainable=trainable, name=name,
                                  synchronization=synchronization, aggregation=aggregation,
                                  device=self._parameter_device, distribute_strategy=strategy)
        copy = Variable.plain(initial, trainable=trainable, name=name,
                              synchronization=synchronization, aggregation=aggregation,
                              device=self._parameter_device)
        return AggregatingVariable(strategy, copy, aggregation)

    # -- updates --------------------------------------------------------------------------
    def _update(self, var: Any, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any], group: bool) -> Any:
        """``fn(the one copy, *args, **kwargs)``, once. AggregatingVariables, ``var`` and any
        in the arguments (an optimizer's slots), are given as the copies they wrap; a
        distributed argument must hold one value (the optimizer's all-reduced gradients do):
        ``single_value`` takes it."""
        target = var.get() if isinstance(var, AggregatingVariable) else var
        if not isinstance(target, Variable) or isinstance(target, DistributedValues):
            raise ValueError(f"You can not update `var` {var!r}. It must be a Variable.")
        written = [var] if target is not var else []
        name = target.name

        def one_copy(x: Any) -> Any:
            if isinstance(x, AggregatingVariable):
                written.append(x)
                return x.get()
            return single_value(x, name)

        args = tuple(map(one_copy, args) if not any(map(nest.is_nested, args))
                     else nest.map_structure(one_copy, args))
        if kwargs:
            kwargs = nest.map_structure(one_copy, kwargs)
        device = self._parameter_device
        try:
            with state.device_scope(device):
                if device.is_gpu:
                    with device_context(device):
                        result = fn(target, *args, **kwargs)
                else:
                    result = fn(target, *args, **kwargs)
        finally:
            for wrapper in written:
                wrapper.invalidate_reads()  # fn wrote the copy directly
        return result if group else nest.map_structure(lambda x: (x,), result)
