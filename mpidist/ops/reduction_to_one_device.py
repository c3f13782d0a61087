"""ReductionToOneDevice: gather every component on one device, reduce there, broadcast back."""

from mpidist.backend import array_module, as_array
from mpidist.core.devices import parse_device
from mpidist.kernels import reduce_n
from mpidist.ops.cross_device_ops import CrossDeviceOps, as_per_replica, check_same_shapes
from mpidist.ops.destinations import resolve_devices, simple_broadcast
from mpidist.types import ReduceOp

__all__ = ["ReductionToOneDevice"]


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce on one device, then copy the result to every destination.

    Args:
        reduce_to_device: Device string to reduce on; the first destination device when None.
        accumulation_fn: ``fn(list_of_arrays) -> array`` combining the components (an N-way
            sum when None). MEAN divides its result by the number of components.
    """

    def __init__(self, reduce_to_device=None, accumulation_fn=None):
        self.reduce_to_device = parse_device(reduce_to_device) if reduce_to_device is not None else None
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise TypeError(f"accumulation_fn must be callable, got {accumulation_fn!r}.")
        self.accumulation_fn = accumulation_fn

    def _reduce_device(self, per_replica_value, destinations):
        if self.reduce_to_device is not None:
            return self.reduce_to_device
        devices = resolve_devices(destinations) or resolve_devices(per_replica_value)
        return devices[0]

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        value = as_per_replica(per_replica_value)
        device = self._reduce_device(value, destinations)
        target = device if device.is_gpu else None
        arrays = [as_array(v, target) for v in value.values]
        check_same_shapes("reduce", arrays)
        n = len(arrays)
        if self.accumulation_fn is not None:
            reduced = self.accumulation_fn(list(arrays))
            if reduce_op is ReduceOp.MEAN:
                reduced = reduced / n
        else:
            reduced = reduce_n(arrays, divisor=n if reduce_op is ReduceOp.MEAN else None,
                               xp=array_module(arrays[0]))
        fresh = all(reduced is not a for a in arrays)
        return simple_broadcast(reduced, destinations, reuse=fresh)
