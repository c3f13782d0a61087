"""Variables with one copy per replica: MirroredVariable (ON_WRITE) and SyncOnReadVariable
(ON_READ), with TensorFlow's aggregation rules.

A distributed variable works out where it is used from the distribution context:
in replica context (inside ``strategy.run``) it is the replica's own copy; in cross-replica
context, or where no strategy is active, it stands for all copies together.
"""

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from mpidist.backend import as_array
from mpidist.core import state
from mpidist.core.devices import DeviceSpec
from mpidist.core.user_calls import user_call
from mpidist.types import Array, ReduceOp, VariableAggregation, VariableSynchronization
from mpidist.values.containers import DistributedValues, Mirrored, PerReplica
from mpidist.values.protocols import ReplicaContextProtocol, StrategyProtocol
from mpidist.values.regroup import select_local
from mpidist.values.variable_base import VariableBase
from mpidist.values.variables import Variable

__all__ = ["DistributedVariable", "MirroredVariable", "SyncOnReadVariable",
           "is_distributed_variable"]


def is_distributed_variable(value: object) -> bool:
    """Whether ``value`` is a MirroredVariable or SyncOnReadVariable (one component Variable
    per replica), as opposed to a plain Variable or any other value."""
    return isinstance(value, DistributedVariable)


class DistributedVariable(DistributedValues, Variable):
    """Base of MirroredVariable and SyncOnReadVariable: one component Variable per replica.

    It asks its strategy (``StrategyProtocol``: scope, reduce, the extended's reduce_to,
    broadcast_to and first_replica_value) and the current replica context
    (``ReplicaContextProtocol``: local_replica_id, merge_call) for what it cannot do alone.
    """

    _SYNCHRONIZATION: VariableSynchronization | None = None  # the kind's; None: the copies'

    def __init__(self, strategy: StrategyProtocol, components: Sequence[Variable],
                 aggregation: VariableAggregation) -> None:
        # Strategies give every component its device, so no device_spec here is None.
        devices = cast(list[DeviceSpec], [c.device_spec for c in components])
        DistributedValues.__init__(self, components, devices=devices)
        # The identity is the primary copy's, with the kind's synchronization and its own
        # aggregation and strategy; Variable.__init__ is not called: there is no local value.
        VariableBase.__init__(self, like=self._primary, synchronization=self._SYNCHRONIZATION,
                              aggregation=aggregation, distribute_strategy=strategy)
        for component in components:
            component.distributed_container = self

    # -- where are we? --------------------------------------------------------------------
    def _replica_context(self) -> ReplicaContextProtocol | None:
        """The current replica context of this variable's strategy, or None (cross-replica)."""
        mode = state.current_mode()
        strategy = self._distribute_strategy
        if mode.is_default:
            return None  # no strategy active: act as in this variable's strategy scope
        if mode.strategy is not strategy:
            raise RuntimeError(
                f"Mixing different mpidist.Strategy objects: {mode.strategy} is not {strategy}; "
                f"variable {self.name!r} belongs to the latter, use it inside that strategy's scope."
            )
        return cast("ReplicaContextProtocol | None", mode.replica_context)

    @contextlib.contextmanager
    def _own_scope(self) -> Iterator[None]:
        """Cross-replica context of this variable's strategy for the block."""
        mode = state.current_mode()
        if mode.strategy is self._distribute_strategy and mode.cross_replica is not None:
            yield
        else:
            with self._distribute_strategy.scope():
                yield

    def _validate_all(self, values: Sequence[Any]) -> list[Array]:
        """Prepared arrays for each component; raises before anything is written."""
        return [component.prepare_assignment(v) for component, v in zip(self._values, values)]

    def _per_component(self, value: Any) -> list[Any]:
        """``value`` split per component: DistributedValues componentwise, others repeated."""
        if isinstance(value, DistributedValues):
            if len(value.values) != len(self._values):
                raise ValueError(
                    f"Cannot update variable {self.name!r} ({len(self._values)} components) from a "
                    f"{type(value).__name__} with {len(value.values)} components."
                )
            return [select_local(i, value) for i in range(len(self._values))]
        return [value] * len(self._values)

    def _write_all(self, kind: str, arrays: Sequence[Array]) -> None:
        for component, arr in zip(self._values, arrays):
            component.write_prepared(kind, arr)

    def _mirrored_values(self) -> Mirrored:
        return Mirrored([c.value() for c in self._values], self._devices)

    def _lends(self, arr: Any) -> bool:
        # a replica's copy (or the primary) may be lent read-only; an aggregate is a new array
        return any(arr is c.storage for c in self._values)


class MirroredVariable(DistributedVariable):
    """Kept equal on every replica; updates in replica context are aggregated first.

    Aggregation in replica context: NONE updates only the replica's own copy (they can drift
    apart, as in TensorFlow 2.21); SUM / MEAN all-reduce the per-replica values;
    ONLY_FIRST_REPLICA applies replica 0's value everywhere.
    """

    _SYNCHRONIZATION = VariableSynchronization.ON_WRITE

    def current_array(self) -> Array:
        ctx = self._replica_context()
        if ctx is not None:
            return self._values[ctx.local_replica_id].storage
        return self._get_on_device_or_primary().storage

    def _update(self, kind: str, value: Any, read_value: bool) -> Any:
        ctx = self._replica_context()
        if ctx is None:
            return self._update_every_copy(kind, value, read_value)
        if isinstance(value, DistributedValues):
            raise TypeError(
                "Cannot use DistributedValues to update variables in replica context: inside "
                "strategy.run pass the replica's own value (an array or number)."
            )
        local = ctx.local_replica_id
        if self._aggregation is VariableAggregation.NONE:
            return self._values[local]._update(kind, value, read_value)
        # Aggregated across replicas (collective under MultiWorkerMirroredStrategy).
        with user_call(f"MirroredVariable.{kind}", aggregation=self._aggregation.name):
            return ctx.merge_call(self._merge_update, args=(kind, value, read_value))

    def _merge_update(self, strategy: StrategyProtocol, kind: str, value: Any, read_value: bool
                      ) -> Mirrored | None:
        extended = strategy.extended
        if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            reduced = extended.broadcast_to(extended.first_replica_value(value), self)
        else:
            op = ReduceOp.from_variable_aggregation(self._aggregation)
            reduced = extended.reduce_to(op, value, self)
        return self._update_every_copy(kind, reduced, read_value)

    def _update_every_copy(self, kind: str, value: Any, read_value: bool) -> Mirrored | None:
        """Apply ``value`` (plain: to every copy; distributed: copy by copy), all-or-nothing."""
        arrays = self._validate_all(self._per_component(value))
        self._write_all(kind, arrays)
        return self._mirrored_values() if read_value else None


class SyncOnReadVariable(DistributedVariable):
    """Each replica writes its own copy without communication; reading it in cross-replica
    context aggregates the copies (SUM, MEAN, or ONLY_FIRST_REPLICA's replica 0)."""

    _SYNCHRONIZATION = VariableSynchronization.ON_READ

    def _aggregated(self) -> Array:
        components = PerReplica([c.storage for c in self._values], self._devices)
        # Collective under MultiWorkerMirroredStrategy: name the read in mismatch errors.
        with user_call("reading a SyncOnReadVariable"):
            if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
                # Replica 0 of the whole job: under MultiWorkerMirroredStrategy the chief's
                # copy, so every worker reads (and checkpoints) the same value.
                return as_array(
                    self._distribute_strategy.extended.first_replica_value(components))
            op = ReduceOp.from_variable_aggregation(self._aggregation)
            with self._own_scope():
                return as_array(self._distribute_strategy.reduce(op, components, axis=None))

    def current_array(self) -> Array:
        ctx = self._replica_context()
        if ctx is not None:
            return self._values[ctx.local_replica_id].storage
        return self._aggregated()

    def _update(self, kind: str, value: Any, read_value: bool) -> Any:
        ctx = self._replica_context()
        if ctx is not None:
            return self._values[ctx.local_replica_id]._update(kind, value, read_value)
        if self._aggregation is VariableAggregation.SUM and kind != "assign":
            raise ValueError(
                f"SyncOnReadVariable does not support `{kind}` in cross-replica context when "
                "aggregation is set to `mpidist.VariableAggregation.SUM`: the change would be "
                "counted once per replica. Use `assign`, or update it inside strategy.run."
            )
        values = self._per_component(value)
        if self._aggregation is VariableAggregation.SUM:
            self._validate_all(values)  # a wrong value is named before the division below
            # Keep the sum: a SUM variable assigned x holds x / N on each of its N replicas.
            n = self._distribute_strategy.num_replicas_in_sync
            values = [
                np.asarray(as_array(v) / n).astype(self.dtype) if not isinstance(v, Variable)
                else np.asarray(v.numpy() / n).astype(self.dtype)
                for v in values
            ]
        arrays = self._validate_all(values)
        self._write_all(kind, arrays)
        return self.value() if read_value else None
