"""CrossDeviceOps: the interface for reducing and broadcasting across the devices of a process.

Public methods validate and normalise their inputs, take TF's shortcuts, then call the
``*_implementation`` hooks that subclasses provide.
"""

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, TypeAlias

import numpy as np

from mpidist.backend import as_array, is_array
from mpidist.comm.options import CommunicationOptions
from mpidist.core.messages import short_repr
from mpidist.errors import InvalidArgumentError
from mpidist.ops.destinations import (
    Destinations,
    resolve_devices,
    simple_broadcast,
    validate_destinations,
)
from mpidist.types import Array, ReduceOp, as_reduce_op
from mpidist.values.containers import DistributedValues, Mirrored, PerReplica
from mpidist.values.distributed_variables import is_distributed_variable

__all__ = ["CrossDeviceOps", "reduce_non_distributed_value", "as_per_replica",
           "check_same_shapes", "check_value_destination_pair", "normalize_pairs",
           "check_reducible", "check_pairs_iterable", "Pairs"]

Pairs: TypeAlias = list[tuple[DistributedValues, Destinations]]
"""Checked ``(value, destinations)`` pairs of a batch, each value a distributed value
(``normalize_pairs``): what the ``batch_reduce_implementation`` hooks receive."""

# Dtype kinds SUM and MEAN are defined for: signed/unsigned integers, floats, complex.
# Booleans are refused: a fused sum of bools is a logical OR in some paths and a count in
# others, so either answer would surprise someone; strings and objects have no sum at all.
_REDUCIBLE_KINDS = frozenset("iufc")
_NDARRAY = {np.ndarray}
_dtype = attrgetter("dtype")


def _leaf_dtype(x: object) -> np.dtype | None:
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(x, (bool, np.bool_)):
        return np.dtype(bool)
    if isinstance(x, (int, float, complex)):
        return None  # Python numbers are fine; skip building an array for them
    return np.asarray(x, dtype=object if x is None else None).dtype


def check_reducible(method: str, reduce_op: ReduceOp, value: Any) -> None:
    """Raise TypeError unless every component of ``value`` has a numeric dtype.

    ``value`` is a distributed value, a variable, an array, a number, or a list of those (the
    leaves of a batch). Runs before any communication, so a bad value never half-reduces.
    """
    leaves = value if type(value) is list else (value,)
    # The common batch, host arrays: only its distinct dtypes need a look.
    if type(value) is list and set(map(type, value)) == _NDARRAY \
            and all(d.kind in _REDUCIBLE_KINDS for d in set(map(_dtype, value))):
        return
    for leaf in leaves:
        parts = leaf.values if isinstance(leaf, DistributedValues) else (leaf,)
        for part in parts:
            dtype = _leaf_dtype(part)
            if dtype is not None and dtype.kind not in _REDUCIBLE_KINDS:
                what = "None" if part is None else f"a value of dtype {dtype}"
                raise TypeError(
                    f"{method} cannot reduce {what} with {reduce_op}: only numbers (integer, "
                    "floating or complex dtypes) can be summed or averaged. Got "
                    f"{short_repr(part, 80)}. Cast it first, e.g. x.astype(np.int32) to count "
                    "booleans, or reduce a numeric encoding of it."
                )



def as_per_replica(value: Any) -> DistributedValues:
    """``value`` as a PerReplica of its components (variables give their arrays)."""
    if is_distributed_variable(value):
        return PerReplica([c.storage for c in value.values], value.devices)
    if isinstance(value, DistributedValues):
        return value
    return PerReplica([value])


def check_same_shapes(op_name: str, arrays: Sequence[Any]) -> None:
    shapes = [tuple(np.shape(a)) for a in arrays]
    for i, s in enumerate(shapes[1:], start=1):
        if s != shapes[0]:
            raise InvalidArgumentError(
                f"{op_name}: replica values must all have the same shape; replica 0 has shape "
                f"{shapes[0]} but replica {i} has shape {s}."
            )


def reduce_non_distributed_value(reduce_op: ReduceOp, value: Any, destinations: Destinations,
                                 num_replicas_in_sync: int) -> Any:
    """Reduce a value that is the same on every replica (TF's rules).

    All zeros stay zeros; MEAN returns the value; SUM over more than one replica is an error
    (the value would be counted once per replica); with one replica it is broadcast.
    """
    if isinstance(value, DistributedValues):
        raise ValueError("reduce_non_distributed_value got a DistributedValues; reduce it instead.")
    if reduce_op is ReduceOp.MEAN:
        return value
    if num_replicas_in_sync == 1:
        validate_destinations(destinations)
        return simple_broadcast(value, destinations)
    arr = as_array(value) if (is_array(value) or np.isscalar(value)) else None
    if arr is not None and arr.dtype.kind in "biufc" and not np.any(arr):
        return np.zeros(arr.shape, dtype=arr.dtype)
    raise ValueError(
        f"A non-DistributedValues value {value!r} cannot be reduced with the given reduce op "
        f"{reduce_op}: it is the same object on all {num_replicas_in_sync} replicas. Give each "
        "replica its own value (e.g. return it from strategy.run) or use ReduceOp.MEAN."
    )


class CrossDeviceOps:
    """Base class: how values on several devices are reduced and broadcast."""

    spans_workers = False
    """Whether the replicas include other workers' (MPI ranks'). Then a value with one local
    component is not reduced yet, and TF's one-component shortcuts of ``reduce`` and
    ``batch_reduce`` do not apply."""

    def reduce(self, reduce_op: ReduceOp | str, per_replica_value: Any,
               destinations: Destinations, options: CommunicationOptions | None = None
               ) -> Array | Mirrored:
        """Reduce ``per_replica_value`` to ``destinations``.

        Returns:
            An array when ``destinations`` is one device, else a Mirrored with one copy per device.
        """
        reduce_op = as_reduce_op(reduce_op)
        check_reducible("CrossDeviceOps.reduce", reduce_op, per_replica_value)
        validate_destinations(destinations)
        value = as_per_replica(per_replica_value)
        if len(value.values) == 1 and not self.spans_workers:
            dest = resolve_devices(destinations)
            src = resolve_devices(value)
            if len(dest) == 1 and dest == src:
                return simple_broadcast(value.values[0], destinations)
        return self.reduce_implementation(reduce_op, value, destinations, options)

    def batch_reduce(self, reduce_op: ReduceOp | str,
                     value_destination_pairs: Sequence[tuple[Any, Destinations]],
                     options: CommunicationOptions | None = None) -> list[Array | Mirrored]:
        """Reduce each ``(value, destinations)`` pair; returns one result per pair, in order."""
        reduce_op = as_reduce_op(reduce_op)
        pairs = normalize_pairs(value_destination_pairs)
        check_reducible("CrossDeviceOps.batch_reduce", reduce_op, [v for v, _ in pairs])
        if not self.spans_workers and all(len(v.values) == 1 and
                                          resolve_devices(v) == resolve_devices(d)
                                          for v, d in pairs):
            return [simple_broadcast(v.values[0], d) for v, d in pairs]
        return self.batch_reduce_implementation(reduce_op, pairs, options)

    def broadcast(self, tensor: Any, destinations: Destinations) -> Array | Mirrored:
        """Copy ``tensor`` to every device of ``destinations``."""
        validate_destinations(destinations)
        return self.broadcast_implementation(tensor, destinations)

    # -- hooks ----------------------------------------------------------------------------
    def reduce_implementation(self, reduce_op: ReduceOp, per_replica_value: DistributedValues,
                              destinations: Destinations, options: CommunicationOptions | None
                              ) -> Array | Mirrored:
        raise NotImplementedError(f"{type(self).__name__} must implement reduce_implementation.")

    def batch_reduce_implementation(self, reduce_op: ReduceOp, value_destination_pairs: Pairs,
                                    options: CommunicationOptions | None
                                    ) -> list[Array | Mirrored]:
        return [self.reduce_implementation(reduce_op, v, d, options) for v, d in value_destination_pairs]

    def broadcast_implementation(self, tensor: Any, destinations: Destinations
                                 ) -> Array | Mirrored:
        return simple_broadcast(tensor, destinations)

    def _gather(self, per_replica_value: Any, destinations: Destinations, axis: int,
                options: CommunicationOptions | None = None) -> Array | Mirrored:
        """Concatenate the components along ``axis`` and place the result on ``destinations``."""
        gathered, _ = self._concat_local(per_replica_value, axis)
        return simple_broadcast(gathered, destinations, reuse=True)

    @staticmethod
    def _concat_local(per_replica_value: Any, axis: int) -> tuple[np.ndarray, int]:
        """``(concatenation of the local components along axis, the axis made non-negative)``."""
        value = as_per_replica(per_replica_value)
        arrays = [as_array(v) for v in value.values]
        for i, a in enumerate(arrays):
            if a.ndim == 0:
                raise ValueError(
                    f"Cannot gather scalars: replica {i} has a rank-0 value; give each replica a "
                    "value with at least one dimension (e.g. np.reshape(x, [1]))."
                )
        rank = arrays[0].ndim
        if not -rank <= axis < rank:
            raise ValueError(f"gather axis {axis} is out of range for values of rank {rank}.")
        ax = axis % rank
        for i, a in enumerate(arrays[1:], start=1):
            if a.ndim != rank or any(a.shape[k] != arrays[0].shape[k] for k in range(rank) if k != ax):
                raise InvalidArgumentError(
                    f"gather: replica values may differ only along axis {axis}; replica 0 has shape "
                    f"{arrays[0].shape} but replica {i} has shape {a.shape}."
                )
        return np.concatenate(arrays, axis=ax), ax


def check_value_destination_pair(pair: object) -> None:
    """Raise ValueError unless ``pair`` is a ``(value, destinations)`` tuple."""
    if not isinstance(pair, tuple):
        raise ValueError(
            "Each element of `value_destination_pairs` should be a tuple (value, destinations); "
            f"got {type(pair).__name__} {pair!r}."
        )
    if len(pair) != 2:
        raise ValueError(
            "Each element of `value_destination_pairs` should be a tuple of size 2; got a tuple "
            f"of size {len(pair)}."
        )


def check_pairs_iterable(value_destination_pairs: object) -> None:
    """Raise TypeError unless ``value_destination_pairs`` is a list or tuple of pairs."""
    if not isinstance(value_destination_pairs, (list, tuple)):
        raise TypeError(
            "value_destination_pairs must be a list of (value, destinations) tuples, got "
            f"{type(value_destination_pairs).__name__} {short_repr(value_destination_pairs, 80)}; "
            "e.g. [(per_replica, '/cpu:0')]."
        )


def normalize_pairs(value_destination_pairs: Sequence[tuple[Any, Destinations]]) -> Pairs:
    """Checked pairs with each value as a PerReplica."""
    pairs = []
    checked = set()  # ids of destinations already validated: a batch repeats one object
    check_pairs_iterable(value_destination_pairs)
    for pair in value_destination_pairs:
        if type(pair) is not tuple or len(pair) != 2:
            check_value_destination_pair(pair)  # raises the error that says what is wrong
        value, destinations = pair
        if id(destinations) not in checked:
            validate_destinations(destinations)
            checked.add(id(destinations))
        pairs.append((value if type(value) is PerReplica else as_per_replica(value), destinations))
    return pairs
