"""What the strategies with one replica in the job share (the default strategy,
OneDeviceStrategy, ParameterServerStrategy's coordinator): every reduction and broadcast is the
identity, every distributed value is just its one component, and ``run`` calls the function once
on the calling thread."""

from collections.abc import Callable, Sequence
from typing import Any

from mpidist.comm.options import CommunicationOptions
from mpidist.core import nest, state
from mpidist.core.devices import DeviceSpec
from mpidist.ops.destinations import Destinations
from mpidist.strategies.one_local_replica import call_one_replica
from mpidist.strategies.replica_context import ReplicaContext
from mpidist.strategies.strategy import StrategyExtended
from mpidist.types import ReduceOp
from mpidist.values.containers import ValueContext

__all__ = ["SingleReplicaExtended"]


class SingleReplicaExtended(StrategyExtended):
    """StrategyExtended for exactly one replica, placed on ``self._device`` (None = host)."""

    _device: DeviceSpec | None = None

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> Any:
        # A new context per run, as TF makes one: a context kept from an earlier run is stale.
        ctx = ReplicaContext.for_replica(self._container_strategy(), 0, 0)
        return call_one_replica(ctx, self._device, fn, args, kwargs)

    def _broadcast_to(self, tensor: Any, destinations: Destinations) -> Any:
        return tensor  # one replica: it has the value already

    def _reduce_to(self, reduce_op: ReduceOp, value: Any, destinations: Destinations,
                   options: CommunicationOptions | None) -> Any:
        return value

    def _batch_reduce_to(self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Destinations]],
                         options: CommunicationOptions | None) -> list[Any]:
        return [value for value, _ in pairs]

    def _update(self, var: Any, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any], group: bool) -> Any:
        with state.device_scope(self._device):
            result = fn(var, *args, **kwargs)
        return result if group else nest.map_structure(lambda x: (x,), result)

    def _local_results(self, value: Any) -> tuple[Any, ...]:
        return (value,)

    def _gather(self, value: Any, axis: int) -> Any:
        return value

    def _distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Any:
        return value_fn(ValueContext())
