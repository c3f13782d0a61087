"""What the fusing CrossDeviceOps share: sorting a batch into buckets that can travel in one
fusion buffer, and the persistent per-instance state (buffer pool, cached layouts, a lock).

A bucket holds the tensors of one dtype whose replicas sit on the same devices and go to the
same destinations; each bucket is packed, reduced and unpacked as one flat buffer.
"""

import sys
import threading
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

from mpidist.backend import as_array, is_array
from mpidist.core.devices import DeviceSpec
from mpidist.kernels import KERNEL_DTYPES, BufferPool, FusionLayout
from mpidist.ops.destinations import Destinations, resolve_devices
from mpidist.types import Array
from mpidist.values.containers import DistributedValues

__all__ = ["component_arrays", "bucket_values", "FusionState", "BucketKey", "BucketItems",
           "Shapes"]

BucketKey: TypeAlias = tuple[np.dtype, tuple[DeviceSpec, ...], tuple[DeviceSpec, ...] | None]
"""What the tensors of one bucket share: dtype, source devices, destination devices (None
when bucketing by source only)."""

BucketItems: TypeAlias = list[tuple[int, list[Array]]]
"""The tensors of one bucket, in batch order: ``(index in the batch, component arrays)``."""

Shapes: TypeAlias = tuple[tuple[int, ...], ...]
"""The shapes of the tensors laid end to end in one fusion buffer."""


def component_arrays(value: DistributedValues) -> list[Array]:
    """The arrays of a PerReplica's components (scalars become 0-d arrays)."""
    return [v if type(v) is np.ndarray or is_array(v) else as_array(v) for v in value.values]


def bucket_values(values: Sequence[DistributedValues],
                  destinations: Sequence[Destinations] | None = None
                  ) -> tuple[dict[BucketKey, BucketItems], list[int]]:
    """Sort ``values`` into fusable buckets.

    Args:
        values: PerReplica values.
        destinations: One destinations object per value, or None to bucket by source only.

    Returns:
        ``(buckets, rest)``: ``buckets`` maps ``(dtype, source devices, destination devices)``
        to a list of ``(index, arrays)``; ``rest`` lists the indices that cannot be fused (a
        dtype without a kernel, or replicas that disagree in shape or dtype: the per-value path
        reports those).
    """
    buckets: dict[BucketKey, BucketItems] = {}
    rest: list[int] = []
    # id(destinations) -> devices: a batch usually repeats one destination object
    resolved: dict[int, tuple[DeviceSpec, ...]] = {}
    for i, value in enumerate(values):
        arrays = component_arrays(value)
        first = arrays[0]
        dtype, shape = first.dtype, first.shape
        if dtype not in KERNEL_DTYPES or len(arrays) > 1 and any(
                a.shape != shape or a.dtype != dtype for a in arrays[1:]):
            rest.append(i)
            continue
        sources = resolve_devices(value)
        if destinations is None:
            dest = None
        elif destinations[i] is value:
            dest = sources
        else:
            dest = resolved.get(id(destinations[i]))
            if dest is None:
                dest = resolved[id(destinations[i])] = resolve_devices(destinations[i])
        key = (dtype, sources, dest)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = []
        bucket.append((i, arrays))
    return buckets, rest


class FusionState:
    """Per-instance fusion buffers and layouts; ``lock`` guards the buffers while in use."""

    def __init__(self) -> None:
        self.pool = BufferPool()
        self.lock = threading.Lock()
        self._layouts: dict[Shapes, FusionLayout] = {}
        self._results: dict[tuple[np.dtype, int], list[np.ndarray]] = {}

    def host_result(self, length: int, dtype: np.dtype) -> np.ndarray:
        """A host flat buffer for results handed to the caller.

        Results are views into it, so it is only reused once the caller has dropped every one
        of them (CPython's reference count says so); a fresh buffer otherwise. Reusing warm
        memory spares the page faults of a new allocation, which cost more than the reduce
        itself for batches of a few hundred KiB.
        """
        key = (dtype, length)
        cached = self._results.setdefault(key, [])
        for buf in cached:
            # references: the list, the loop variable, getrefcount's argument
            if sys.getrefcount(buf) <= 3:
                return buf
        buf = np.empty(length, dtype)
        if len(cached) < 4:
            cached.append(buf)
        return buf

    def layout(self, items: BucketItems) -> FusionLayout:
        """The cached FusionLayout of a bucket's tensors (their replica-0 shapes)."""
        return self.layout_of(tuple(arrays[0].shape for _, arrays in items))

    def layout_of(self, shapes: Shapes) -> FusionLayout:
        """The cached FusionLayout of a tuple of shapes."""
        layout = self._layouts.get(shapes)
        if layout is None:
            if len(self._layouts) > 256:  # a model has a few fixed layouts; bound the cache anyway
                self._layouts.clear()
            layout = self._layouts[shapes] = FusionLayout(shapes)
        return layout
