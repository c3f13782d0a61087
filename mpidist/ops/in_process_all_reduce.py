"""All-reduce CrossDeviceOps between the GPUs of one process (``collective_all_reduce`` is the
one across processes): NcclAllReduce and
HierarchicalCopyAllReduce (TF's AllReduceCrossDeviceOps family).

A batch is split by dtype; per device the tensors are packed into one fusion buffer, cut into
``num_packs`` packs (TF's concat-and-split), each pack all-reduced (NCCL, or hierarchical copies
with the fused reduce kernel), and the results handed back as views of one fresh buffer per
device. ``num_packs=0`` all-reduces each tensor on its own. Values on CPU devices, or going to
other devices than they live on, take ReductionToOneDevice, as in TF.
"""

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from mpidist.backend import array_module, device_context, on_device_of
from mpidist.comm.nccl import local_group
from mpidist.comm.options import CommunicationOptions
from mpidist.core.devices import DeviceSpec
from mpidist.core.signatures import accepts
from mpidist.kernels import FusionLayout, pack, split_sizes
from mpidist.kernels.arrays import empty_like_family
from mpidist.ops.cross_device_ops import CrossDeviceOps, Pairs, as_per_replica
from mpidist.ops.destinations import Destinations, resolve_devices
from mpidist.ops.fusion_state import BucketItems, FusionState, bucket_values
from mpidist.ops.hierarchical_copy import hierarchical_copy_sum
from mpidist.ops.reduction_to_one_device import ReductionToOneDevice
from mpidist.types import Array, ReduceOp
from mpidist.values.containers import DistributedValues, Mirrored

__all__ = ["AllReduceCrossDeviceOps", "NcclAllReduce", "HierarchicalCopyAllReduce"]

_ALGORITHMS = {"nccl": "NCCL all-reduce", "hierarchical_copy": "HierarchicalCopy"}


class AllReduceCrossDeviceOps(CrossDeviceOps):
    """All-reduce between local GPUs with packing.

    Args:
        all_reduce_alg: ``"nccl"`` or ``"hierarchical_copy"``.
        num_packs: Packs per dtype per batch (>= 0; 0 means one all-reduce per tensor).
    """

    @accepts()
    def __init__(self, all_reduce_alg: str = "nccl", num_packs: int = 1) -> None:
        if all_reduce_alg not in _ALGORITHMS:
            raise ValueError(
                f"all_reduce_alg must be one of {sorted(_ALGORITHMS)}, got {all_reduce_alg!r}."
            )
        if isinstance(num_packs, bool) or not isinstance(num_packs, (int, np.integer)):
            raise ValueError(f"num_packs must be an int >= 0, got {num_packs!r}.")
        if num_packs < 0:
            raise ValueError(
                f"{_ALGORITHMS[all_reduce_alg]} requires num_packs >= 0, but {num_packs} is specified"
            )
        self._all_reduce_alg = all_reduce_alg
        self._num_packs = int(num_packs)
        self._fallback = ReductionToOneDevice()
        self._fusion = FusionState()
        self._warned_cpu = False

    @property
    def num_packs(self) -> int:
        return self._num_packs

    # -- routing --------------------------------------------------------------------------
    def _all_reducible(self, value: DistributedValues, destinations: Destinations) -> bool:
        devices = resolve_devices(value)
        return devices == resolve_devices(destinations) and all(d.is_gpu for d in devices)

    def _note_fallback(self, devices: Iterable[DeviceSpec]) -> None:
        if self._all_reduce_alg == "nccl" and not self._warned_cpu and any(d.is_cpu for d in devices):
            self._warned_cpu = True
            warnings.warn(
                "NcclAllReduce: NCCL runs between GPUs only and these values are on CPU devices; "
                "they are reduced with ReductionToOneDevice instead (as TF does).",
                RuntimeWarning, stacklevel=4)

    def reduce_implementation(self, reduce_op: ReduceOp, per_replica_value: DistributedValues,
                              destinations: Destinations, options: CommunicationOptions | None
                              ) -> Array | Mirrored:
        value = as_per_replica(per_replica_value)
        if self._all_reducible(value, destinations):
            return self._batch_all_reduce(reduce_op, [value])[0]
        self._note_fallback(resolve_devices(value) + resolve_devices(destinations))
        return self._fallback.reduce_implementation(reduce_op, value, destinations, options)

    def batch_reduce_implementation(self, reduce_op: ReduceOp, value_destination_pairs: Pairs,
                                    options: CommunicationOptions | None
                                    ) -> list[Array | Mirrored]:
        pairs = [(as_per_replica(v), d) for v, d in value_destination_pairs]
        if pairs and all(self._all_reducible(v, d) for v, d in pairs) and \
                len({resolve_devices(v) for v, _ in pairs}) == 1:
            return self._batch_all_reduce(reduce_op, [v for v, _ in pairs])
        devices = {d for v, dest in pairs for d in resolve_devices(v) + resolve_devices(dest)}
        self._note_fallback(tuple(devices))
        if all(not d.is_gpu for d in devices):
            return self._fallback.batch_reduce_implementation(reduce_op, pairs, options)
        return [self.reduce_implementation(reduce_op, v, d, options) for v, d in pairs]

    def _gather(self, per_replica_value: Any, destinations: Destinations, axis: int,
                options: CommunicationOptions | None = None) -> Array | Mirrored:
        return self._fallback._gather(per_replica_value, destinations, axis, options)

    # -- the all-reduce -------------------------------------------------------------------
    def _batch_all_reduce(self, reduce_op: ReduceOp, values: Sequence[DistributedValues]
                          ) -> list[Array | Mirrored]:
        """All-reduce PerReplica values whose components sit on the same GPUs, one per GPU."""
        devices = resolve_devices(values[0])
        buckets, rest = bucket_values(values)
        results: list[Array | Mirrored] = [None] * len(values)
        for i in rest:  # the fallback explains mismatched replicas, or reduces odd dtypes
            results[i] = self._fallback.reduce_implementation(reduce_op, values[i], values[i], None)
        for items in buckets.values():
            outs, layout = self._all_reduce_bucket(items, devices)
            if reduce_op is ReduceOp.MEAN:
                outs = [_mean(out, len(devices), device) for out, device in zip(outs, devices)]
            per_device = [layout.views(out) for out in outs]
            for k, (i, _) in enumerate(items):
                results[i] = Mirrored([views[k] for views in per_device], devices)
        return results

    def _all_reduce_bucket(self, items: BucketItems, devices: tuple[DeviceSpec, ...]
                           ) -> tuple[list[Array], FusionLayout]:
        """Every device's flat sum of the bucket's tensors, and their layout."""
        layout = self._fusion.layout(items)
        dtype = items[0][1][0].dtype
        with self._fusion.lock:
            outs, ranges, inputs = [], _pack_ranges(layout, self._num_packs), []
            for d, device in enumerate(devices):
                tensors = [arrays[d] for _, arrays in items]
                with device_context(device):
                    outs.append(empty_like_family(tensors[0], (layout.total,), dtype))
                    if self._num_packs:
                        buf = self._fusion.pool.get(tensors[0], layout.total, dtype, slot=d)
                        inputs.append(pack(tensors, out=buf, layout=layout))
                    else:
                        inputs.append(tensors)
            for p, (start, stop) in enumerate(ranges):
                if stop == start:
                    continue
                if self._num_packs:
                    sends = [flat[start:stop] for flat in inputs]
                else:
                    sends = [_flat_on_device(t[p]) for t in inputs]
                self._all_reduce_pack(p, sends, [out[start:stop] for out in outs], devices)
        return outs, layout

    def _all_reduce_pack(self, index: int, sends: list[Array], recvs: list[Array],
                         devices: tuple[DeviceSpec, ...]) -> None:
        if self._all_reduce_alg == "nccl":
            local_group([d.device_index for d in devices]).all_reduce_sum(sends, recvs)
            return
        sums = hierarchical_copy_sum(index, sends, devices)
        for recv, total, device in zip(recvs, sums, devices):
            with device_context(device):
                recv[...] = total


def _pack_ranges(layout: FusionLayout, num_packs: int) -> list[tuple[int, int]]:
    """(start, stop) element ranges of the packs: TF's split, or one range per tensor."""
    if num_packs == 0:
        return [(s, s + n) for s, n in zip(layout.starts, layout.sizes)]
    ranges, start = [], 0
    for size in split_sizes(layout.total, num_packs):
        ranges.append((start, start + size))
        start += size
    return ranges


def _flat_on_device(x: Array) -> Array:
    """``x`` as a 1-D contiguous array, any copy made on ``x``'s own GPU."""
    with on_device_of(x):
        return array_module(x).ascontiguousarray(x).reshape(-1)


def _mean(out: Array, n: int, device: DeviceSpec) -> Array:
    xp = array_module(out)
    with device_context(device):
        if out.dtype.kind in "iub":
            return xp.true_divide(out, n)
        xp.true_divide(out, n, out=out)
        return out


class NcclAllReduce(AllReduceCrossDeviceOps):
    """All-reduce with NCCL between the local GPUs (CuPy's binding; group calls).

    Args:
        num_packs: Packs per dtype per batch (>= 0; 0: one NCCL call per tensor).
    """

    @accepts()
    def __init__(self, num_packs: int = 1) -> None:
        super().__init__(all_reduce_alg="nccl", num_packs=num_packs)


class HierarchicalCopyAllReduce(AllReduceCrossDeviceOps):
    """All-reduce by hierarchical device-to-device copies (TF's DGX-1 scheme), summing with the
    fused reduce kernel. Correct for any number of devices (TF's drops one on odd counts).

    Args:
        num_packs: Packs per dtype per batch (>= 0; 0: each tensor on its own).
    """

    @accepts()
    def __init__(self, num_packs: int = 1) -> None:
        super().__init__(all_reduce_alg="hierarchical_copy", num_packs=num_packs)
