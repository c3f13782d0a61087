"""The applier of ParameterServerStrategy: optimizer updates run where the variables live.

Asynchronous training: each worker applies its own gradients, one fused update request per
variable (or shard), no all-reduce. ``iterations`` is incremented atomically on its server; the
step number it returns drives the rule's coefficients (Adam's bias correction) and the
learning-rate schedule. The server runs the rule named in the request with its fused kernel
(``ops/update_rules.py``); an optimizer with its own per-variable step reads, computes and
writes instead.
"""

import contextlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.ps.variables import PSVariable
from mpidist.strategies.update_appliers import OptimizerUpdates, UpdateApplier

__all__ = ["ParameterServerUpdates", "PARAMETER_SERVER_UPDATES"]


def _shard_pairs(pairs: Any) -> list[tuple[Any, Any]]:
    """(gradient, variable) pairs with each ShardedVariable's gradient split by its shards'
    rows (a sparse IndexedSlices gradient is made dense first)."""
    out: list[tuple[Any, Any]] = []
    for grad, var in pairs:
        if not isinstance(var, ShardedVariable) or grad is None:
            out.append((grad, var))
            continue
        dense = np.asarray(grad)  # IndexedSlices.__array__ gives the dense gradient
        if dense.shape != tuple(var.shape):
            raise ValueError(f"apply_gradients: gradient of shape {dense.shape} for ShardedVariable "
                             f"{var.name!r} of shape {tuple(var.shape)}.")
        bounds = np.cumsum(var.shard_rows)[:-1]
        out.extend(zip(np.split(dense, bounds), var.variables))
    return out


class ParameterServerUpdates(UpdateApplier):
    """Updates sent to the parameter servers (see the module docstring)."""

    def apply_gradients(self, updates: OptimizerUpdates, strategy: Any, grads_and_vars: Any,
                        name: str | None, aggregate: bool) -> Any:
        if hasattr(grads_and_vars, "__next__"):
            grads_and_vars = list(grads_and_vars)  # zip(...), a generator: read twice below
        grads, checked = updates.check(strategy, _shard_pairs(grads_and_vars), name)
        updates.require_slots(checked, "Under ParameterServerStrategy slots live on the "
                              "parameter servers and are created on the coordinator: call "
                              "optimizer.build(variables) inside `with strategy.scope():` "
                              "before scheduling the step.")
        updates.build([v for _, v in grads_and_vars])  # registers variables without slots (SGD)
        grads = updates.clip(grads)
        step = updates.count_step()
        lr = updates.learning_rate(step - 1)
        rule = updates.rule
        coefficients = None if rule is None else rule.coefficients(lr, step)
        for grad, var in zip(grads, checked):
            slots = updates.slots_of(var)
            if rule is None or coefficients is None:  # the optimizer's own step
                updates.update_variable(var, grad, slots, lr, step)  # read, compute, write
            else:
                var.apply_optimizer_update(rule.name, grad, coefficients, slots)
        return updates.iterations

    def slot_scope(self, extended: Any, variable: Any) -> contextlib.AbstractContextManager[Any]:
        """A slot lives on its variable's server (the fused update reads both there)."""
        if isinstance(variable, PSVariable):
            return cast(contextlib.AbstractContextManager[Any], extended.colocate_vars_with(variable))
        return contextlib.nullcontext()

    def shards(self, variable: Any) -> tuple[Any, ...] | None:
        return tuple(variable.variables) if isinstance(variable, ShardedVariable) else None

    def join_shards(self, variable: Any, parts: Sequence[Any], name: str) -> Any:
        return ShardedVariable(list(parts), name=name)


PARAMETER_SERVER_UPDATES = ParameterServerUpdates()
