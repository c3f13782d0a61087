"""ReductionToOneDevice: gather every component on one device, reduce there, broadcast back."""

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from mpidist.backend import as_array, copy_to_device, device_context, device_of
from mpidist.comm.options import CommunicationOptions
from mpidist.core.devices import DeviceSpec, parse_device
from mpidist.core.signatures import accepts
from mpidist.kernels import FusionLayout, pack, reduce_n, reduce_pack
from mpidist.ops.cross_device_ops import CrossDeviceOps, Pairs, as_per_replica, check_same_shapes
from mpidist.ops.destinations import Destinations, resolve_devices, simple_broadcast
from mpidist.ops.fusion_state import BucketItems, FusionState, bucket_values
from mpidist.types import Array, ReduceOp
from mpidist.values.containers import DistributedValues, Mirrored

__all__ = ["ReductionToOneDevice", "WorkerStage", "local_reducer", "unpack_to"]


class WorkerStage(Protocol):
    """What follows the local reduce when the replicas span several workers: the owner of a
    ``local_reducer`` (``CollectiveAllReduce``) supplies it; alone, the local result is final."""

    def local_divisor(self, reduce_op: ReduceOp, num_local: int) -> int | None:
        """What the local reduce divides by (MEAN); None for no division."""
        ...

    def across_workers(self, reduced: Array, reduce_op: ReduceOp,
                       options: CommunicationOptions | None,
                       layout: FusionLayout | None = None) -> Array:
        """Combine this worker's locally reduced buffer with the other workers'."""
        ...

    def reduce_one(self, reduce_op: ReduceOp, value: DistributedValues,
                   destinations: Destinations, options: CommunicationOptions | None
                   ) -> Array | Mirrored:
        """One pair of a batch that is not fused (the owner's ``reduce_implementation``)."""
        ...


def local_reducer(stage: WorkerStage, fusion: FusionState) -> "ReductionToOneDevice":
    """A ReductionToOneDevice that reduces this worker's replicas and hands the result to
    ``stage``, sharing the owner's recycled buffers ``fusion``."""
    reducer = ReductionToOneDevice()
    reducer._stage = stage
    reducer._fusion = fusion
    return reducer


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce on one device, then copy the result to every destination.

    ``batch_reduce`` packs the tensors of one dtype into one fusion buffer per replica and
    reduces those in a single fused pass (TF loops over the pairs instead); the numbers are the
    same as reducing each pair.

    Args:
        reduce_to_device: Device string to reduce on; the first destination device when None.
        accumulation_fn: ``fn(list_of_arrays) -> array`` combining the components (an N-way
            sum when None). MEAN divides its result by the number of components. A custom
            function sees each tensor separately, so batches are not fused.
    """

    @accepts()
    def __init__(self, reduce_to_device: str | DeviceSpec | None = None,
                 accumulation_fn: Callable[[list[Array]], Array] | None = None) -> None:
        self.reduce_to_device = parse_device(reduce_to_device) if reduce_to_device is not None else None
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise TypeError(f"accumulation_fn must be callable, got {accumulation_fn!r}.")
        self.accumulation_fn = accumulation_fn
        self._fusion = FusionState()
        self._stage: WorkerStage | None = None  # local_reducer's; None: this worker alone

    def _reduce_device(self, per_replica_value: DistributedValues, destinations: Destinations
                       ) -> DeviceSpec:
        if self.reduce_to_device is not None:
            return self.reduce_to_device
        devices = resolve_devices(destinations) or resolve_devices(per_replica_value)
        return devices[0]

    def reduce_implementation(self, reduce_op: ReduceOp, per_replica_value: DistributedValues,
                              destinations: Destinations, options: CommunicationOptions | None
                              ) -> Array | Mirrored:
        value = as_per_replica(per_replica_value)
        device = self._reduce_device(value, destinations)
        target = device if device.is_gpu else None
        arrays = [as_array(v, target) for v in value.values]
        check_same_shapes("reduce", arrays)
        n = len(arrays)
        with device_context(target):
            if self.accumulation_fn is not None:
                reduced = self.accumulation_fn(list(arrays))
                if reduce_op is ReduceOp.MEAN:
                    reduced = reduced / n
            else:
                if len({a.dtype for a in arrays}) > 1:
                    arrays = _common_dtype(arrays)
                reduced = reduce_n(arrays, divisor=self._local_divisor(reduce_op, n))
            fresh = all(reduced is not a for a in arrays)
            if fresh and self._stage is not None:
                reduced = self._stage.across_workers(reduced, reduce_op, options)
        return simple_broadcast(reduced, destinations, reuse=fresh)

    def _local_divisor(self, reduce_op: ReduceOp, num_local: int) -> int | None:
        """What the local reduce divides by: the local count for MEAN where this worker's
        replicas are all of them, else what the worker stage says."""
        if self._stage is not None:
            return self._stage.local_divisor(reduce_op, num_local)
        return num_local if reduce_op is ReduceOp.MEAN else None

    def _across_workers(self, reduced: Array, reduce_op: ReduceOp,
                        options: CommunicationOptions | None,
                        layout: FusionLayout | None = None) -> Array:
        if self._stage is None:
            return reduced
        return self._stage.across_workers(reduced, reduce_op, options, layout)

    def _reduce_one(self, reduce_op: ReduceOp, value: DistributedValues,
                    destinations: Destinations, options: CommunicationOptions | None
                    ) -> Array | Mirrored:
        if self._stage is None:
            return self.reduce_implementation(reduce_op, value, destinations, options)
        return self._stage.reduce_one(reduce_op, value, destinations, options)

    def batch_reduce_implementation(self, reduce_op: ReduceOp, value_destination_pairs: Pairs,
                                    options: CommunicationOptions | None
                                    ) -> list[Array | Mirrored]:
        pairs = value_destination_pairs
        if self.accumulation_fn is not None or len(pairs) < 2:
            return [self._reduce_one(reduce_op, v, d, options) for v, d in pairs]
        values = [as_per_replica(v) for v, _ in pairs]
        buckets, rest = bucket_values(values, [d for _, d in pairs])
        results: list[Array | Mirrored] = [None] * len(pairs)
        for i in rest:
            results[i] = self._reduce_one(reduce_op, values[i], pairs[i][1], options)
        for (dtype, sources, _), items in buckets.items():
            if len(items) == 1:
                i = items[0][0]
                results[i] = self._reduce_one(reduce_op, values[i], pairs[i][1], options)
                continue
            destinations = pairs[items[0][0]][1]
            device = self._reduce_device(values[items[0][0]], destinations)
            self._reduce_bucket(reduce_op, items, sources, device, destinations, dtype, results,
                                options)
        return results

    def _reduce_bucket(self, reduce_op: ReduceOp, items: BucketItems,
                       sources: tuple[DeviceSpec, ...], device: DeviceSpec,
                       destinations: Destinations, dtype: np.dtype,
                       results: list[Array | Mirrored],
                       options: CommunicationOptions | None = None) -> None:
        """Pack each replica's tensors, reduce the packs in one pass, unpack per destination."""
        layout = self._fusion.layout(items)
        divisor = self._local_divisor(reduce_op, len(sources))
        on_host = not device.is_gpu and not any(s.is_gpu for s in sources)
        direct = dtype.kind == "f" and dtype.itemsize >= 4 or dtype.kind == "i" and divisor is None
        if on_host and direct:
            # Host replicas share memory: reduce each tensor straight into the result buffer.
            with self._fusion.lock:
                reduced = reduce_pack([arrays for _, arrays in items], layout, divisor,
                                      out=self._fusion.host_result(layout.total, dtype))
                reduced = self._across_workers(reduced, reduce_op, options, layout)
                unpack_to(reduced, layout, items, destinations, results, self._fusion)
            return
        reduced = self._pack_and_reduce(items, sources, device, dtype, layout, divisor)
        reduced = self._across_workers(reduced, reduce_op, options, layout)
        unpack_to(reduced, layout, items, destinations, results)

    def _pack_and_reduce(self, items: BucketItems, sources: tuple[DeviceSpec, ...],
                         device: DeviceSpec, dtype: np.dtype, layout: FusionLayout,
                         divisor: int | None) -> Array:
        """Pack each replica's tensors on its device, bring the packs together, reduce."""
        with self._fusion.lock:
            flats = []
            for r, source in enumerate(sources):
                tensors = [arrays[r] for _, arrays in items]
                with device_context(source if source.is_gpu else None):
                    buf = self._fusion.pool.get(tensors[0], layout.total, dtype, slot=r)
                    pack(tensors, out=buf, layout=layout)
                if device_of(buf) != (device if device.is_gpu else None):
                    buf = copy_to_device(buf, device if device.is_gpu else None)
                flats.append(buf)
            with device_context(device if device.is_gpu else None):
                return reduce_n(flats, divisor=divisor)


def unpack_to(reduced: Array, layout: FusionLayout, items: Sequence[tuple[int, object]],
              destinations: Destinations, results: list[Array | Mirrored],
              fusion: FusionState | None = None) -> None:
    """Place the reduced pack ``reduced`` on ``destinations`` and store each item's tensor
    (views of it) in ``results``; recycled host copies from ``fusion`` where given."""
    if fusion is not None and all(d.is_cpu for d in resolve_devices(destinations)):
        placed = _host_copies(reduced, destinations, fusion)
    else:
        placed = simple_broadcast(reduced, destinations, reuse=True)
    if not isinstance(placed, Mirrored):
        for (i, _), view in zip(items, layout.views(placed)):
            results[i] = view
        return
    per_device = [layout.views(flat) for flat in placed.values]
    for k, (i, _) in enumerate(items):
        results[i] = Mirrored([views[k] for views in per_device], placed.devices)


def _host_copies(reduced: np.ndarray, destinations: Destinations, fusion: FusionState
                 ) -> np.ndarray | Mirrored:
    """``reduced`` for the first CPU destination, a recycled copy for each further one."""
    devices = resolve_devices(destinations)
    if len(devices) == 1:
        return reduced
    copies = [reduced]
    for _ in devices[1:]:
        copy = fusion.host_result(reduced.size, reduced.dtype)
        np.copyto(copy, reduced)
        copies.append(copy)
    return Mirrored(copies, devices)


def _common_dtype(arrays: list[Array]) -> list[Array]:
    """Replicas that disagree in dtype are summed in their common type, as NumPy would."""
    dtype = np.result_type(*[a.dtype for a in arrays])
    return [a.astype(dtype, copy=False) for a in arrays]
