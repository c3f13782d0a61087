"""What the default strategy and OneDeviceStrategy share: with one replica every reduction and
broadcast is the identity and every distributed value is just its one component."""

from mpidist.core import nest, state
from mpidist.strategies.strategy import StrategyExtended
from mpidist.values.containers import ValueContext

__all__ = ["SingleReplicaExtended"]


class SingleReplicaExtended(StrategyExtended):
    """StrategyExtended for exactly one replica, placed on ``self._device`` (None = host)."""

    _device = None

    def _reduce_to(self, reduce_op, value, destinations, options):
        return value

    def _batch_reduce_to(self, reduce_op, pairs, options):
        return [value for value, _ in pairs]

    def _update(self, var, fn, args, kwargs, group):
        with state.device_scope(self._device):
            result = fn(var, *args, **kwargs)
        return result if group else nest.map_structure(lambda x: (x,), result)

    def _local_results(self, value):
        return (value,)

    def _gather(self, value, axis):
        return value

    def _distribute_values_from_function(self, value_fn):
        return value_fn(ValueContext())
