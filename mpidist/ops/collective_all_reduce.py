"""CollectiveAllReduce: reduce across the devices of every worker (MPI rank).

Hierarchical: each worker first reduces its own replicas in-process with the fused kernels
(its local reducer is a ReductionToOneDevice), then one all-reduce per pack crosses the workers
(MPI, or the node's shared memory for large buffers), and the result is copied to the local
destinations. ``batch_reduce`` packs every tensor of one dtype into a persistent buffer and
sends it in packs of ``bytes_per_pack``; MEAN divides by the global replica count once, after
the sum, as TF's collective ops do.
"""

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from mpidist.backend import as_array, on_device_of
from mpidist.comm.communicator import Communicator
from mpidist.comm.nccl import RankNcclGroup, nccl_can_reduce
from mpidist.comm.options import CommunicationImplementation, CommunicationOptions
from mpidist.kernels.layout import FusionLayout, group_by_size
from mpidist.ops.cross_device_ops import CrossDeviceOps, Pairs, as_per_replica
from mpidist.ops.destinations import (
    Destinations,
    resolve_devices,
    simple_broadcast,
    validate_destinations,
)
from mpidist.ops.fusion_state import FusionState
from mpidist.ops.reduction_plan import ReductionPlan
from mpidist.ops.reduction_to_one_device import local_reducer, unpack_to
from mpidist.types import Array, ReduceOp
from mpidist.values.containers import DistributedValues, Mirrored, PerReplica

__all__ = ["CollectiveAllReduce", "HostReplicaPlan", "DEFAULT_BYTES_PER_PACK"]

# bytes_per_pack=0 means "let mpidist choose": packs this large keep per-collective overhead
# negligible while bounding the buffer a single MPI call moves (DDP uses 25 MiB buckets).
DEFAULT_BYTES_PER_PACK = 32 * 1024 * 1024


class CollectiveAllReduce(CrossDeviceOps):
    """All-reduce across workers through a Communicator.

    It has a local reducer (a ``ReductionToOneDevice`` sharing its buffers) for this worker's
    replicas, and is that reducer's worker stage: the cross-worker sum after the local one.

    Args:
        communicator: The ``mpidist.comm.Communicator`` of the workers.
        num_replicas_in_sync: Replicas over all workers (MEAN divides by it).
        options: The strategy's CommunicationOptions; per-call options are merged onto them.
        nccl_group: An NCCL communicator across ranks (``comm.nccl.RankNcclGroup``) used for
            GPU buffers when the implementation is NCCL, else None.
    """

    spans_workers = True  # workers always talk, even when this worker has one replica

    def __init__(self, communicator: Communicator, num_replicas_in_sync: int,
                 options: CommunicationOptions | None = None,
                 nccl_group: RankNcclGroup | None = None) -> None:
        self._fusion = FusionState()
        self._local = local_reducer(self, self._fusion)
        self._comm = communicator
        self._group_size = int(num_replicas_in_sync)
        self._options = options if options is not None else CommunicationOptions()
        self._nccl = nccl_group
        self._range_cache: dict[tuple[FusionLayout, int, int], list[tuple[int, int]]] = {}

    @property
    def nccl_across_ranks(self) -> bool:
        """Whether GPU values cross ranks through NCCL (else through the communicator)."""
        return self._nccl is not None

    def reduce_implementation(self, reduce_op: ReduceOp, per_replica_value: DistributedValues,
                              destinations: Destinations, options: CommunicationOptions | None
                              ) -> Array | Mirrored:
        value = as_per_replica(per_replica_value)
        if len(value.values) == 1 and isinstance(value.values[0], np.ndarray) \
                and _direct(value.values[0].dtype) and _on_host(destinations):
            out = self._reduce_host_array(reduce_op, value.values[0], options)
            return simple_broadcast(out, destinations, reuse=True)
        return self._local.reduce_implementation(reduce_op, value, destinations, options)

    def _reduce_host_array(self, reduce_op: ReduceOp, send: np.ndarray,
                           options: CommunicationOptions | None) -> np.ndarray:
        """One host replica's array of a dtype MPI reduces alone (``_direct``): MPI reads the
        replica's array and writes a recycled result buffer, with no local copy in between."""
        if not send.flags.c_contiguous:  # (ascontiguousarray would also make 0-d 1-d)
            send = np.ascontiguousarray(send)
        out = self._fusion.host_result(send.size, send.dtype).reshape(send.shape)
        self._comm.all_reduce(out, "sum", timeout=self._merged(options).timeout_seconds,
                              send=send)
        out = self._mean(out, reduce_op)
        # Integer MEAN of a 0-d array divides into a NumPy scalar: hand back an array.
        return out if type(out) is np.ndarray else np.asarray(out)

    def host_replica_plan(self, general: ReductionPlan, packs_arena: bool
                          ) -> "HostReplicaPlan":
        """The reduction plan of one replica per worker over this communicator; values the
        direct host path does not take go to ``general``."""
        return HostReplicaPlan(self, self._fusion, general, packs_arena)

    def batch_reduce_implementation(self, reduce_op: ReduceOp, value_destination_pairs: Pairs,
                                    options: CommunicationOptions | None
                                    ) -> list[Array | Mirrored]:
        pairs = value_destination_pairs
        arrays = _single_host_replicas(pairs)
        if arrays is None:
            return self._local.batch_reduce_implementation(reduce_op, pairs, options)
        return self._batch_reduce_host_arrays(reduce_op, arrays, pairs[0][1], options)

    def _batch_reduce_host_arrays(self, reduce_op: ReduceOp, arrays: Sequence[np.ndarray],
                                  destinations: Destinations,
                                  options: CommunicationOptions | None
                                  ) -> list[Array | Mirrored]:
        # The one-replica-per-rank layout: each tensor is packed once (one concatenate) into a
        # recycled buffer that MPI reduces in place; results are views into it.
        dtype = arrays[0].dtype
        layout = self._fusion.layout_of(tuple(map(_shape, arrays)))
        with self._fusion.lock:
            flat = self._fusion.host_result(layout.total, dtype)
            # axis=None flattens each input in C order inside NumPy: no view per tensor.
            np.concatenate(arrays, axis=None, out=flat)
            flat = self._across_workers(flat, reduce_op, options, layout)
            if type(destinations) is np.ndarray:  # the one host destination: views of flat
                views: list[Array | Mirrored] = layout.views(flat)  # no cast() call per step
                return views
            results: list[Array | Mirrored] = [None] * len(arrays)
            items = [(i, None) for i in range(len(arrays))]
            unpack_to(flat, layout, items, destinations, results, self._fusion)
        return results

    def _ranges(self, layout: FusionLayout, itemsize: int, bytes_per_pack: int
                ) -> list[tuple[int, int]]:
        """``_pack_ranges``, cached: a model sends the same layouts every step."""
        key = (layout, itemsize, bytes_per_pack)
        ranges = self._range_cache.get(key)
        if ranges is None:
            if len(self._range_cache) > 256:
                self._range_cache.clear()
            ranges = self._range_cache[key] = _pack_ranges(layout, itemsize, bytes_per_pack)
        return ranges

    def _mean(self, reduced: Array, reduce_op: ReduceOp) -> Array:
        if reduce_op is not ReduceOp.MEAN:
            return reduced
        if reduced.dtype.kind == "f":
            reduced /= reduced.dtype.type(self._group_size)
            return reduced
        return reduced / self._group_size  # integer MEAN is true division, float64

    # -- the local reducer's worker stage (reduction_to_one_device.WorkerStage) -----------
    def local_divisor(self, reduce_op: ReduceOp, num_local: int) -> int | None:
        """None: the global count divides once, after the cross-worker sum."""
        return None

    def across_workers(self, reduced: Array, reduce_op: ReduceOp,
                       options: CommunicationOptions | None,
                       layout: FusionLayout | None = None) -> Array:
        """This worker's locally reduced buffer summed with every other worker's (MEAN
        divided by the global replica count), in place where it can."""
        return self._across_workers(reduced, reduce_op, options, layout)

    def reduce_one(self, reduce_op: ReduceOp, value: DistributedValues,
                   destinations: Destinations, options: CommunicationOptions | None
                   ) -> Array | Mirrored:
        """A pair of a batch the local reducer does not fuse: ``reduce_implementation``."""
        return self.reduce_implementation(reduce_op, value, destinations, options)

    def _merged(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """The strategy's options with the per-call ones merged on (no copy when none)."""
        return self._options if options is None else self._options.merge(options)

    def _across_workers(self, reduced: Array, reduce_op: ReduceOp,
                        options: CommunicationOptions | None,
                        layout: FusionLayout | None = None) -> Array:
        if type(reduced) is np.ndarray:
            return self._across_workers_here(reduced, reduce_op, options, layout)
        # A device buffer: its collectives, stream waits and MEAN run on its own GPU, whatever
        # the calling thread's current device.
        with on_device_of(reduced):
            return self._across_workers_here(reduced, reduce_op, options, layout)

    def _across_workers_here(self, reduced: Array, reduce_op: ReduceOp,
                             options: CommunicationOptions | None,
                             layout: FusionLayout | None) -> Array:
        opts = self._merged(options)
        flat = reduced.reshape(-1)
        if layout is None or len(layout) == 1:
            self._all_reduce(flat, opts)
        else:
            ranges = self._ranges(layout, flat.itemsize, opts.bytes_per_pack)
            if isinstance(flat, np.ndarray):  # one fingerprint agreement for all the packs
                self._comm.all_reduce_packs(flat, ranges, "sum", timeout=opts.timeout_seconds)
            else:
                for lo, hi in ranges:
                    self._all_reduce(flat[lo:hi], opts)
        return self._mean(reduced, reduce_op)

    def _all_reduce(self, buf: Array, opts: CommunicationOptions) -> None:
        # A dtype NCCL has no type for (16-bit integers) goes over MPI: the same choice on
        # every rank, since every rank reduces the same dtype here.
        if self._nccl is not None and opts.implementation is not CommunicationImplementation.RING \
                and not isinstance(buf, np.ndarray) and nccl_can_reduce(buf.dtype):
            self._nccl.all_reduce_sum(buf, timeout=opts.timeout_seconds)
            return
        self._comm.all_reduce(buf, "sum", timeout=opts.timeout_seconds)

    def broadcast_implementation(self, tensor: Any, destinations: Destinations
                                 ) -> Array | Mirrored:
        return simple_broadcast(tensor, destinations)  # every worker already holds its value

    def _gather(self, per_replica_value: Any, destinations: Destinations, axis: int,
                options: CommunicationOptions | None = None) -> Array | Mirrored:
        """Concatenate along ``axis`` the components of every replica of every worker."""
        local, ax = self._concat_local(per_replica_value, axis)
        host = np.moveaxis(as_array(local), ax, 0)  # all_gather makes it contiguous
        gathered = self._comm.all_gather(host, timeout=self._merged(options).timeout_seconds)
        return simple_broadcast(np.moveaxis(gathered, 0, ax), destinations, reuse=True)


class HostReplicaPlan:
    """The reduction plan of one replica per worker (``mpidist.ops.reduction_plan``): this
    replica's host arrays go straight to the communicator; anything else (device arrays,
    dtypes MPI does not reduce here, mixed destinations) goes to the ``general`` plan.

    ``all_reduce`` of one array reaches MPI in 5 calls (this method, ``Communicator.all_reduce``,
    its data phase, the watchdog's ``blocking``, the call it wraps): keep it inline."""

    __slots__ = ("_ops", "_fusion", "_general", "packs_arena")

    def __init__(self, ops: CollectiveAllReduce, fusion: FusionState, general: ReductionPlan,
                 packs_arena: bool) -> None:
        self._ops = ops
        self._fusion = fusion  # ops's recycled result buffers
        self._general = general
        self.packs_arena = packs_arena

    def all_reduce(self, reduce_op: ReduceOp, arrays: list[Any],
                   options: CommunicationOptions | None = None) -> list[Any]:
        """``arrays`` reduced over every worker as new arrays (the inputs are left as they
        are). A lone array is one all-reduce; several of one packable dtype travel packed, as
        ``batch_reduce`` sends them, under one fingerprint agreement; one dtype after another,
        in order of first appearance. MEAN divides once, by the global replica count."""
        ops = self._ops
        if len(arrays) == 1:  # the common case first, inline (see the class's note)
            send = arrays[0]
            if type(send) is np.ndarray and _direct(send.dtype):
                if not send.flags.c_contiguous:
                    send = np.ascontiguousarray(send)
                out = self._fusion.host_result(send.size, send.dtype).reshape(send.shape)
                opts = ops._options if options is None else ops._merged(options)
                ops._comm.all_reduce(out, "sum", timeout=opts.timeout_seconds, send=send)
                if reduce_op is ReduceOp.MEAN:
                    out = ops._mean(out, reduce_op)
                    if type(out) is not np.ndarray:  # integer MEAN of a 0-d array: a scalar
                        out = np.asarray(out)
                return [out]
            return self._general.all_reduce(reduce_op, arrays, options)
        groups = _host_groups(arrays)
        if groups is None:
            return self._general.all_reduce(reduce_op, arrays, options)
        if len(groups) == 1:
            return ops._batch_reduce_host_arrays(reduce_op, arrays, arrays[0], options)
        results: list[Any] = [None] * len(arrays)
        for indices in groups:
            group = [arrays[i] for i in indices]
            if len(group) == 1:
                reduced: list[Any] = [ops._reduce_host_array(reduce_op, group[0], options)]
            else:  # any host array names the one CPU destination results are unpacked to
                reduced = ops._batch_reduce_host_arrays(reduce_op, group, group[0], options)
            for i, r in zip(indices, reduced):
                results[i] = r
        return results

    def batch_reduce(self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Destinations]],
                     options: CommunicationOptions | None) -> list[Any]:
        """Pairs whose values are host arrays of one packable dtype, bare or as one-component
        PerReplica values, sharing one CPU destination, reduced packed in a single pass; any
        other batch through the general plan."""
        arrays = _host_batch(pairs)
        if arrays is None:
            return self._general.batch_reduce(reduce_op, pairs, options)
        return self._ops._batch_reduce_host_arrays(reduce_op, arrays, pairs[0][1], options)

    def all_reduce_packed(self, flat: Array, layout: FusionLayout) -> None:
        """Sum ``flat``, this worker's one replica's tensors packed end to end as ``layout``
        says, over every worker, in place: one collective per pack of ``bytes_per_pack``, the
        packs ``batch_reduce`` sends for the same tensors (so the sums are the same bits)."""
        self._ops._across_workers(flat, ReduceOp.SUM, None, layout)


_PACKABLE = frozenset(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))
_NDARRAY = {np.ndarray}
_dtype, _shape = attrgetter("dtype"), attrgetter("shape")


def _direct(dtype: np.dtype) -> bool:
    """Whether one host array of ``dtype`` can be all-reduced on its own by MPI."""
    return dtype.kind in "fiu" and dtype.itemsize >= 2


def _on_host(destinations: Destinations) -> bool:
    return all(d.is_cpu for d in resolve_devices(destinations))


def _host_groups(arrays: list[Any]) -> list[list[int]] | None:
    """The direct host path's eligibility for several arrays: their indices grouped by dtype
    (in order of first appearance) when all are host ndarrays, a lone array of its dtype of
    one MPI reduces alone and a group of a packable dtype; else None (the general path)."""
    if set(map(type, arrays)) != _NDARRAY:
        return [] if not arrays else None
    dtypes = set(map(_dtype, arrays))
    if len(dtypes) == 1:  # the common batch: one dtype, one group, in order
        (dtype,) = dtypes
        return [list(range(len(arrays)))] if _takes(dtype, len(arrays)) else None
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    if not all(_takes(dtype, len(indices)) for dtype, indices in by_dtype.items()):
        return None
    return list(by_dtype.values())


def _takes(dtype: np.dtype, count: int) -> bool:
    """Whether the direct host path reduces ``count`` arrays of ``dtype`` as one group: a lone
    array of a dtype MPI reduces alone, several of a packable dtype."""
    return _direct(dtype) if count == 1 else dtype in _PACKABLE


def _packable(arrays: list[Any]) -> bool:
    """Whether ``arrays`` are at least two host ndarrays of one packable dtype."""
    if len(arrays) < 2:
        return False
    dtype = getattr(arrays[0], "dtype", None)
    if dtype not in _PACKABLE:  # (np.dtype(None) is float64: never compare a dtype with None)
        return False
    ndarray = np.ndarray
    return all(type(a) is ndarray and (a.dtype is dtype or a.dtype == dtype) for a in arrays)


def _host_batch(pairs: Sequence[tuple[Any, Destinations]]) -> list[Any] | None:
    """The arrays of a batch whose values are host arrays of one packable dtype (bare, or a
    PerReplica of one component) sharing one CPU destination object; None for any other."""
    destinations = pairs[0][1] if pairs else None
    arrays = []
    for value, dest in pairs:
        if dest is not destinations:
            return None
        if type(value) is not np.ndarray:
            if type(value) is not PerReplica or len(value.values) != 1:
                return None
            value = value.values[0]
        arrays.append(value)
    if not _packable(arrays):
        return None
    validate_destinations(destinations)
    return arrays if _on_host(destinations) else None


def _single_host_replicas(pairs: Pairs) -> list[Any] | None:
    """The arrays of a checked batch (every value distributed) whose values each have one host
    replica of one packable dtype and share one CPU destination object; None for any other."""
    if len(pairs) < 2 or any(len(v.values) != 1 for v, _ in pairs):
        return None
    return _host_batch([(v.values[0], d) for v, d in pairs])


def _pack_ranges(layout: FusionLayout, itemsize: int, bytes_per_pack: int
                 ) -> list[tuple[int, int]]:
    """Element ranges of the flat buffer, one per pack.

    TF groups the tensors in reverse order (last layer first) with ``group_by_size``; a group
    of consecutive tensors in that order is a contiguous range of the flat buffer.
    """
    limit = bytes_per_pack or DEFAULT_BYTES_PER_PACK
    sizes = list(layout.sizes)[::-1]
    groups = group_by_size([s * itemsize for s in sizes], limit)
    ranges = []
    end = layout.total
    for group in groups:
        count = sum(sizes[i] for i in group)
        ranges.append((end - count, end))
        end -= count
    return ranges
