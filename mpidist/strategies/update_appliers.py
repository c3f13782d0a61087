"""Where an optimizer's updates run: the applier a strategy declares.

An optimizer knows its rule (``mpidist.ops.update_rules``: slots, hyperparameters, formula)
and its state (slots, ``iterations``, the learning rate); the strategy knows where variables
live. ``StrategyExtended.update_applier`` names the applier that joins the two, so the
optimizer asks one declared attribute instead of testing the strategy's type:

- ``ReplicaUpdates`` (the default): synchronous replicas. The optimizer sums the replicas'
  gradients and updates every copy, with one fused kernel over its arenas where the layout
  allows (``training/fused_apply.py``), else per variable under ``merge_call``.
- ``ps.updates.ParameterServerUpdates``: each worker sends its gradients to the parameter
  servers, which run the rule's fused kernel where the variables live.

An applier drives the optimizer through ``OptimizerUpdates`` (what every optimizer offers its
applier); it keeps no state of its own, so one instance serves every strategy of its kind.
"""

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from mpidist.ops.update_rules import UpdateRule

__all__ = ["OptimizerUpdates", "UpdateApplier", "ReplicaUpdates", "REPLICA_UPDATES"]


class OptimizerUpdates(Protocol):
    """What an optimizer offers the applier of its strategy (``Optimizer.updates``)."""

    @property
    def rule(self) -> UpdateRule | None:
        """The optimizer's update rule; None for a subclass with its own per-variable step."""

    @property
    def iterations(self) -> Any:
        """The optimizer's update counter (a variable)."""

    def apply_in_replicas(self, strategy: Any, grads_and_vars: Any, name: str | None,
                          aggregate: bool) -> Any:
        """The synchronous path: sum over replicas, then update every copy."""

    def apply_mean(self, strategy: Any, grads_and_vars: Any, totals: Any,
                   in_replicas: bool) -> Any:
        """``Optimizer.apply_mean_gradients``: sum the gradients and ``totals`` over the
        replicas, apply the gradients divided by the summed example count; ``in_replicas``:
        the replicas' own fused path may carry it out. Returns the summed totals."""

    def check(self, strategy: Any, grads_and_vars: Any, name: str | None
              ) -> tuple[list[Any], tuple[Any, ...]]:
        """The checked ``(gradients, variables)`` of the pairs (errors name the bad pair)."""

    def require_slots(self, variables: Sequence[Any], why: str) -> None:
        """RuntimeError naming the variables without slots, where the rule has slots."""

    def build(self, variables: Sequence[Any]) -> None:
        """Create the slots of ``variables`` that have none."""

    def clip(self, grads: list[Any]) -> list[Any]:
        """The gradients clipped as the optimizer was asked to."""

    def count_step(self) -> int:
        """``iterations += 1``; the new count (the number of this update)."""

    def learning_rate(self, step: int) -> float:
        """The learning rate after ``step`` completed updates."""

    def slots_of(self, variable: Any) -> tuple[Any, ...]:
        """The slot variables of ``variable``, in the rule's order."""

    def update_variable(self, variable: Any, gradient: Any, slots: tuple[Any, ...], lr: float,
                        step: int) -> None:
        """One variable's update by the optimizer's per-variable step (read, compute, write)."""


class UpdateApplier:
    """How a strategy applies an optimizer's updates (``StrategyExtended.update_applier``)."""

    def apply_gradients(self, updates: OptimizerUpdates, strategy: Any, grads_and_vars: Any,
                        name: str | None, aggregate: bool) -> Any:
        """Apply one update of ``grads_and_vars`` under ``strategy`` (the current one); returns
        the optimizer's ``iterations``."""
        raise NotImplementedError

    def apply_mean_gradients(self, updates: OptimizerUpdates, strategy: Any,
                             grads_and_vars: Any, totals: Any) -> Any:
        """``Optimizer.apply_mean_gradients`` under ``strategy``: one all-reduce of the totals
        and the gradients, then this applier's ``apply_gradients`` of the means (no second
        aggregation). Returns the summed totals."""
        return updates.apply_mean(strategy, grads_and_vars, totals, in_replicas=False)

    def slot_scope(self, extended: Any, variable: Any) -> contextlib.AbstractContextManager[Any]:
        """Where ``variable``'s slots are created (inside its strategy's scope)."""
        return contextlib.nullcontext()

    def shards(self, variable: Any) -> tuple[Any, ...] | None:
        """The parts of a variable split across devices or servers, each with slots of its
        own; None for a variable that is updated whole."""
        return None

    def join_shards(self, variable: Any, parts: Sequence[Any], name: str) -> Any:
        """One slot of a sharded ``variable`` as a whole, from its shards' ``parts`` (what a
        checkpoint saves, so it restores under any sharding)."""
        raise TypeError(f"{type(self).__name__} does not shard variables; got {variable!r}.")


class ReplicaUpdates(UpdateApplier):
    """Synchronous replicas: the optimizer's own fused or per-variable replica path."""

    def apply_gradients(self, updates: OptimizerUpdates, strategy: Any, grads_and_vars: Any,
                        name: str | None, aggregate: bool) -> Any:
        return updates.apply_in_replicas(strategy, grads_and_vars, name, aggregate)

    def apply_mean_gradients(self, updates: OptimizerUpdates, strategy: Any,
                             grads_and_vars: Any, totals: Any) -> Any:
        return updates.apply_mean(strategy, grads_and_vars, totals, in_replicas=True)


REPLICA_UPDATES = ReplicaUpdates()
