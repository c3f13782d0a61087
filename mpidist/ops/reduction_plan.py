"""ReductionPlan: how one replica's values reach the wire, decided once per strategy layout.

A strategy builds its plan once (``StrategyExtended.reduction_plan``, cached: the layout of
replicas, workers and devices never changes after construction) and every reduction of a
replica's values goes through it: ``ReplicaContext.all_reduce``, the cross-replica
``batch_reduce_to`` of one replica per worker, and the optimizers' packed gradient sum. The
plan decides eligibility itself, per call, and never declines: a value the direct path does
not take goes the general way inside the plan, so no caller tests a hook's result.

Two plans exist: the general one (``mpidist.strategies.reduction_plans.GeneralPlan``: the
replicas' values meet in a ``merge_call`` and the strategy's cross-device ops reduce them) and
one host replica per MPI rank (``mpidist.ops.collective_all_reduce.HostReplicaPlan``: the
replica's host arrays go straight to the communicator).
"""

from collections.abc import Sequence
from typing import Any, Protocol

from mpidist.comm.options import CommunicationOptions
from mpidist.kernels.layout import FusionLayout
from mpidist.ops.destinations import Destinations
from mpidist.types import Array, ReduceOp

__all__ = ["ReductionPlan"]


class ReductionPlan(Protocol):
    """The one entry a strategy's reductions of one replica's values go through."""

    packs_arena: bool
    """Whether ``all_reduce_packed`` applies: one host replica per worker, so an optimizer may
    sum its packed gradient arena in place (a constant of the layout)."""

    def all_reduce(self, reduce_op: ReduceOp, arrays: list[Any],
                   options: CommunicationOptions | None = None) -> list[Any]:
        """``arrays`` (this replica's flat list of leaves, checked by the caller) reduced over
        every replica of the job, one result per leaf. Replica context; collective."""
        ...

    def batch_reduce(self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Destinations]],
                     options: CommunicationOptions | None) -> list[Any]:
        """``(value, destinations)`` pairs (checked) reduced, one result per pair.
        Cross-replica context; collective."""
        ...

    def all_reduce_packed(self, flat: Array, layout: FusionLayout) -> None:
        """Sum ``flat`` (this replica's tensors packed as ``layout`` says) over every replica,
        in place. Only where ``packs_arena``."""
        ...
