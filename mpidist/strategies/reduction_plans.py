"""The general reduction plan (``mpidist.ops.reduction_plan``): the replicas' values meet in a
``merge_call`` and the strategy's cross-device ops reduce them. Every strategy's plan unless
its layout has a direct path (``StrategyExtended._choose_reduction_plan``)."""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mpidist.comm.options import CommunicationOptions
from mpidist.kernels.layout import FusionLayout
from mpidist.ops.destinations import Destinations
from mpidist.strategies.context import get_replica_context
from mpidist.strategies.replica_context import Contribution, per_leaf
from mpidist.types import Array, ReduceOp
from mpidist.values.containers import PerReplica

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy, StrategyExtended

__all__ = ["GeneralPlan"]

BatchReduce = Callable[[ReduceOp, Sequence[tuple[Any, Destinations]],
                        CommunicationOptions | None], list[Any]]


class GeneralPlan:
    """Reduce through a ``merge_call`` (replica context) or ``batch_reduce`` (cross-replica
    context): what works for every layout, device and dtype."""

    __slots__ = ("_extended", "_batch_reduce")

    packs_arena = False

    def __init__(self, extended: "StrategyExtended", batch_reduce: BatchReduce) -> None:
        self._extended = extended
        self._batch_reduce = batch_reduce

    def all_reduce(self, reduce_op: ReduceOp, arrays: list[Any],
                   options: CommunicationOptions | None = None) -> list[Any]:
        def merge_fn(strategy: "Strategy", boxes: PerReplica | Contribution) -> list[Any]:
            return strategy.extended.all_reduce_leaves(reduce_op, per_leaf(boxes), options)

        ctx = get_replica_context()
        assert ctx is not None  # ReplicaContext.all_reduce has required it
        reduced: list[Any] = ctx.merge_call(merge_fn, args=(Contribution(arrays),))
        return reduced

    def batch_reduce(self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Destinations]],
                     options: CommunicationOptions | None) -> list[Any]:
        return self._batch_reduce(reduce_op, pairs, options)

    def all_reduce_packed(self, flat: Array, layout: FusionLayout) -> None:
        raise NotImplementedError(
            f"{type(self._extended).__name__}'s layout has no packed arena path "
            "(packs_arena is False): reduce through ReplicaContext.all_reduce.")
