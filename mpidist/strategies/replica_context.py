"""ReplicaContext: what the function given to ``strategy.run`` sees of its replica."""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np

from mpidist.backend import as_array
from mpidist.comm.options import CommunicationOptions
from mpidist.core import nest, state
from mpidist.core.user_calls import user_call
from mpidist.ops.cross_device_ops import check_reducible
from mpidist.strategies.context import require_replica_context
from mpidist.types import ReduceOp, as_reduce_op
from mpidist.values.containers import DistributedValues, PerReplica
from mpidist.values.distributed_variables import is_distributed_variable
from mpidist.values.regroup import contains_distributed, select_replica

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy

__all__ = ["ReplicaContext"]

_NDARRAY = frozenset((np.ndarray,))
_OP_NAMES = {op: op.value for op in ReduceOp}  # the labels' names, without Enum's descriptor

# The spellings a step passes every time, looked up without the Enum call (others convert).
class Contribution:
    """One replica's flattened argument to a collective; a distinct object per replica, so
    that regrouping never mistakes equal contributions for one shared value."""

    __slots__ = ("flat",)

    def __init__(self, flat: list[Any]) -> None:
        self.flat = flat


def per_leaf(boxes: PerReplica | Contribution) -> list[Any]:
    """Turn the regrouped contributions into one value per leaf: a PerReplica of the replicas'
    leaves (on the replicas' devices), or the leaf itself when this worker has one replica."""
    if not isinstance(boxes, PerReplica):
        return list(boxes.flat)
    contributions = boxes.values
    if len(contributions) == 1:
        return list(contributions[0].flat)
    return [PerReplica([c.flat[k] for c in contributions], boxes.devices)
            for k in range(len(contributions[0].flat))]


class ReplicaContext:
    """The context of one replica inside ``strategy.run``.

    Args:
        strategy: The strategy running the replica.
        replica_id_in_sync_group: This replica's id among all replicas in sync (an int).

    Attributes:
        local_replica_id: This replica's index among the calling worker's replicas, so the
            index of its component in a distributed value (an int; 0 with one local replica).
            A plain attribute: distributed variables read it on every access in a replica.
    """

    def __init__(self, strategy: "Strategy",
                 replica_id_in_sync_group: int | np.integer | np.ndarray | None) -> None:
        rid = replica_id_in_sync_group
        if isinstance(rid, np.ndarray) and rid.ndim == 0 and rid.dtype.kind in "iu":
            rid = int(rid)
        if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (int, np.integer))):
            raise ValueError(
                "replica_id_in_sync_group can only be an integer, a Tensor or None; got "
                f"{type(replica_id_in_sync_group).__name__} {replica_id_in_sync_group!r}."
            )
        self._strategy = strategy
        self._replica_id = None if rid is None else int(rid)
        self.local_replica_id = self._replica_id or 0
        self._coordinator: Any = None  # set by a multi-replica runner: it performs merge_calls
        self._mode: state.Mode | None = None  # made on first entry

    @classmethod
    def for_replica(cls, strategy: "Strategy", replica_id: int, local_replica_id: int) -> Self:
        """The context a strategy makes for one replica of a ``run``: ``replica_id`` among all
        replicas in sync, ``local_replica_id`` among this worker's (both ints it computed, so
        the user-facing validation of ``__init__`` is skipped on this per-step path)."""
        ctx = cls.__new__(cls)
        ctx._strategy = strategy
        ctx._replica_id = replica_id
        ctx.local_replica_id = local_replica_id
        ctx._coordinator = None
        ctx._mode = None
        return ctx

    def __enter__(self) -> Self:
        mode = self._mode
        if mode is None:
            mode = self._mode = state.Mode(
                self._strategy, None, self,
                is_default=self._strategy is not None and self._strategy.is_default)
        state.push_mode(mode)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        state.pop_mode(self._mode)
        return False

    @property
    def strategy(self) -> "Strategy":
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        return self._strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> np.int32 | int:
        """This replica's id, an int32 scalar array (the default replica context gives int 0)."""
        # A context made with replica_id_in_sync_group=None has no id: this raises, as TF's does.
        return np.int32(self._replica_id)  # type: ignore[arg-type]

    @property
    def devices(self) -> tuple[str, ...]:
        return (self._strategy.extended.worker_devices[self.local_replica_id],)

    def merge_call(self, merge_fn: Callable[..., Any], args: Sequence[Any] = (),
                   kwargs: dict[str, Any] | None = None) -> Any:
        """Run ``merge_fn(strategy, *args, **kwargs)`` once, in cross-replica context.

        Every replica must call it. Arguments that differ between replicas arrive as PerReplica
        values; the return value is handed back to each replica with distributed values
        replaced by that replica's component.
        """
        require_replica_context(self)
        if not callable(merge_fn):
            raise TypeError(
                f"merge_call: `merge_fn` must be a callable taking (strategy, *args, **kwargs), "
                f"got {type(merge_fn).__name__} {merge_fn!r}."
            )
        if not isinstance(args, (list, tuple)):
            raise ValueError(
                f"merge_call: positional args must be a list or tuple, got {type(args)}; "
                "e.g. args=(value,)."
            )
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, dict):
            raise ValueError(f"merge_call: kwargs must be a dict, got {type(kwargs)}.")
        if self._coordinator is not None:
            return self._coordinator.merge_call(self.local_replica_id, merge_fn, args, kwargs)
        return self._merge_call_here(merge_fn, args, kwargs)

    def _merge_call_here(self, merge_fn: Callable[..., Any], args: Sequence[Any],
                         kwargs: dict[str, Any]) -> Any:
        strategy = self._strategy
        mode = state.Mode(strategy, cross_replica=strategy.extended,
                          is_default=strategy.is_default)
        state.push_mode(mode)
        try:
            merged = merge_fn(strategy, *args, **kwargs)
        finally:
            state.pop_mode(mode)
        # The one local replica gets its component, as each thread does with several.
        return select_replica(0, merged) if contains_distributed(merged) else merged

    def _is_single_replica(self) -> bool:
        return self._strategy.num_replicas_in_sync == 1

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any,
                   options: CommunicationOptions | None = None) -> Any:
        """Reduce ``value`` (a nest of arrays) across all replicas; every replica gets the result.

        Integer MEAN gives float64, as true division does.

        Collective under MultiWorkerMirroredStrategy: every rank must call it, in the same order
        and with the same arguments (docs/multi_worker.md, "Collective calls").
        """
        reduce_op = as_reduce_op(reduce_op)
        require_replica_context(self)
        # The common values, one array or a flat list / tuple of them, skip the nest walk.
        kind: type | None = type(value)
        if kind is np.ndarray:
            leaves = [value]
        elif (kind is list or kind is tuple) and set(map(type, value)) <= _NDARRAY:
            leaves = list(value)
        else:
            kind = None
            leaves = nest.flatten(value)
        check_reducible("ReplicaContext.all_reduce", reduce_op, leaves)
        if self._is_single_replica():
            return value  # one replica in all: its value is the sum and the mean
        if kind is None:
            if any(isinstance(v, DistributedValues) and not is_distributed_variable(v)
                   for v in leaves):
                raise TypeError(
                    "ReplicaContext.all_reduce takes this replica's own values (arrays or "
                    "numbers), not a distributed value: inside strategy.run each replica "
                    "already holds its component; reduce a PerReplica with strategy.reduce "
                    "outside run."
                )
            leaves = [as_array(v) for v in leaves]
        if not leaves:
            return value
        with user_call("ReplicaContext.all_reduce", reduce_op=_OP_NAMES[reduce_op],
                       num_values=len(leaves)):
            # The strategy's plan (decided once per layout): one replica per worker goes
            # straight to the communicator, several meet in a merge_call.
            reduced = self._strategy.extended.reduction_plan().all_reduce(reduce_op, leaves,
                                                                          options)
        if kind is np.ndarray:
            return reduced[0]
        if kind is list:
            return reduced if type(reduced) is list else list(reduced)
        if kind is tuple:
            return tuple(reduced)
        return nest.pack_sequence_as(value, reduced)

    def all_gather(self, value: Any, axis: int, options: CommunicationOptions | None = None
                   ) -> Any:
        """Concatenate ``value`` (a nest of arrays) from all replicas along ``axis``, in replica
        order; sizes along ``axis`` may differ. Every replica gets the full result.
        Collective under MultiWorkerMirroredStrategy: every rank must call it, in the same order
        and with the same arguments (docs/multi_worker.md, "Collective calls").
        """
        require_replica_context(self)
        flat = [as_array(v) for v in nest.flatten(value)]
        for a in flat:
            if a.ndim == 0:
                raise ValueError(
                    "all_gather does not support scalars: give each replica a value with at least "
                    "one dimension (e.g. np.reshape(x, [1]))."
                )
        if self._is_single_replica():
            return value

        def merge_fn(strategy: "Strategy", boxes: PerReplica | Contribution) -> list[Any]:
            return strategy.extended.all_gather_leaves(per_leaf(boxes), axis, options)

        with user_call("ReplicaContext.all_gather", axis=axis, num_values=len(flat)):
            gathered = self.merge_call(merge_fn, args=(Contribution(flat),))
        return nest.pack_sequence_as(value, gathered)


class DefaultReplicaContext(ReplicaContext):
    """The replica context in effect where no strategy is active: replica 0 of 1."""

    @property
    def replica_id_in_sync_group(self) -> int:
        return 0
