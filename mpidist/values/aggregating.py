"""AggregatingVariable: one shared copy of a variable, updated once per step by all replicas.

Under CentralStorageStrategy (and on a ParameterServerStrategy worker with several local
replicas) a variable has ONE copy, on the parameter device or a parameter server, that every
replica reads. An update made inside ``strategy.run`` would otherwise land once per replica,
so the wrapper ``merge_call``s instead: the replicas' values are combined by the variable's
aggregation (SUM, MEAN, ONLY_FIRST_REPLICA) and the result is applied once. With
``aggregation=NONE`` there is no rule to combine them by, which is TF's ValueError. Updates in
cross-replica context apply once, directly. The counterpart of TF's
``ps_values.AggregatingVariable``: ``get()`` is the wrapped variable.
"""

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from mpidist.backend import array_module, as_array, device_of
from mpidist.core import state
from mpidist.core.devices import DeviceSpec
from mpidist.core.user_calls import user_call
from mpidist.types import Array, ReduceOp, VariableAggregation
from mpidist.values.containers import DistributedValues
from mpidist.values.protocols import StrategyProtocol
from mpidist.values.variable_base import VariableBase
from mpidist.values.variables import Casting, Variable

__all__ = ["AggregatingVariable", "single_value"]

_AGGREGATION_ERROR = (
    "You must specify an aggregation method to update a AggregatingVariable in Replica Context. "
    "You can do so by passing an explicit value for argument `aggregation` to "
    "mpidist.Variable(..).e.g. `mpidist.Variable(..., "
    "aggregation=mpidist.VariableAggregation.SUM)``mpidist.VariableAggregation` lists the "
    "possible aggregation methods.This is required because AggregatingVariable should always be "
    "kept in sync. When updating them or assigning to them in a replica context, we "
    "automatically try to aggregate the values before updating the variable. For this "
    "aggregation, we need to know the aggregation method. Another alternative is to not try to "
    "update such AggregatingVariable in replica context, but in cross replica context. You can "
    "enter cross replica context by calling `mpidist.get_replica_context().merge_call(merge_fn, "
    "..)`.Inside `merge_fn`, you can then update the AggregatingVariable using "
    "`mpidist.StrategyExtended.update()`."
)


def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` hold the same values (NaNs in the same places count as equal)."""
    if a is b:
        return True
    if array_module(a) is not array_module(b):
        a, b = as_array(a), as_array(b)
    xp = array_module(a)
    a, b = xp.asarray(a), xp.asarray(b)
    if a.shape != b.shape:
        return False
    if bool((a == b).all()):  # the common case, in one C pass
        return True
    return a.dtype.kind in "fc" and bool(xp.array_equal(a, b, equal_nan=True))


def single_value(value: Any, variable_name: str) -> Any:
    """``value`` as the one value an update applied once takes: a PerReplica or Mirrored gives
    its first component when all its components are equal (the all-reduced gradients an
    optimizer hands over); other values pass unchanged; variables (distributed ones too) pass
    unchanged. ValueError, before anything is written, when the components differ: one copy
    cannot take several values, so they must be reduced first."""
    if not isinstance(value, DistributedValues) or isinstance(value, Variable):
        return value
    first = value.values[0]
    for i, other in enumerate(value.values[1:], start=1):
        if not _same(first, other):
            raise ValueError(
                f"You cannot update variable {variable_name!r} with a {type(value).__name__} "
                f"whose components differ (replica 0 and replica {i}) when the variable has a "
                "single copy (CentralStorageStrategy / ParameterServerStrategy): it is updated "
                "once. Reduce the values first (strategy.extended.reduce_to(...)) or pass a "
                "single value."
            )
    return first


class AggregatingVariable(Variable):
    """Wraps ``variable`` (the one copy) so that replica-context updates are aggregated.

    Args:
        strategy: The strategy that created it (``distribute_strategy``).
        variable: The wrapped plain ``mpidist.Variable`` (or a parameter-server variable).
        aggregation: How replica-context updates are combined: a VariableAggregation.

    Reads anywhere give the one copy's value: zero-copy on a CPU replica (all CPU devices
    share host memory); on a replica whose device does not hold the copy (a GPU replica), a
    copy on that device, made once per ``run`` and remade after every write.
    """

    def __init__(self, strategy: StrategyProtocol, variable: Variable,
                 aggregation: VariableAggregation | str) -> None:
        if not isinstance(variable, Variable) or isinstance(variable, DistributedValues):
            raise TypeError(
                "AggregatingVariable wraps one plain mpidist.Variable (the single copy), got "
                f"{type(variable).__name__} {variable!r}."
            )
        self._v = variable
        # The identity is the wrapped variable's, with this wrapper's aggregation and strategy;
        # Variable.__init__ is not called: the value lives in the wrapped variable.
        VariableBase.__init__(self, like=variable, aggregation=aggregation,
                              distribute_strategy=strategy)
        # Copies on replica devices that lack the value: device -> (run's context, version, copy)
        self._version = 0
        self._read_copies: dict[DeviceSpec | None, tuple[Callable[[], Any], int, Array]] = {}

    def get(self) -> Variable:
        """The wrapped variable: the one copy (TF's ``AggregatingVariable.get()``)."""
        return self._v

    # -- reads ------------------------------------------------------------------------------
    def current_array(self) -> Any:
        arr = self._v.current_array()
        mode = state.current_mode()
        ctx = mode.replica_context
        if ctx is None or mode.is_default:
            return arr
        device = state.current_device()
        wanted = device if device is not None and device.is_gpu else None
        home = device_of(arr)  # None: host memory, which every CPU device reads
        if home is None and wanted is None or home is not None and wanted is not None \
                and home.device_index == wanted.device_index:
            return arr  # the replica's device holds the copy
        return self._read_copy(arr, wanted, ctx)

    def _lends(self, arr: Any) -> bool:
        return self._v._lends(arr)  # a per-run read copy on another device is not lent

    def _read_copy(self, arr: Any, device: DeviceSpec | None, ctx: Any) -> Array:
        """``arr`` on ``device``, copied once per run (``ctx``) and per write (``_version``).
        A copy living in a shared buffer (an optimizer's arena) is written in place by fused
        kernels that no write here sees, so it is copied at every read instead."""
        if self._v.storage_adopted:
            return as_array(arr, device)
        entry = self._read_copies.get(device)
        if entry is not None and entry[0]() is ctx and entry[1] == self._version:
            return entry[2]
        copy = as_array(arr, device)
        self._read_copies[device] = (weakref.ref(ctx), self._version, copy)
        return copy

    def invalidate_reads(self) -> None:
        """Forget the copies made for replica devices: the value changed under them (a
        strategy's ``update`` wrote the wrapped variable directly)."""
        self._version += 1
        if self._read_copies:
            self._read_copies.clear()

    # -- storage: the wrapped variable's -----------------------------------------------------
    @property
    def storage(self) -> Array:
        return self._v.storage

    @property
    def storage_adopted(self) -> bool:
        return self._v.storage_adopted

    def adopt_storage(self, view: Array) -> None:
        self._v.adopt_storage(view)
        self.invalidate_reads()

    # -- writes -----------------------------------------------------------------------------
    def prepare_assignment(self, value: Any, casting: Casting = "same_kind") -> Array:
        return self._v.prepare_assignment(value, casting)

    def write_prepared(self, kind: str, arr: Array) -> None:
        self._v.write_prepared(kind, arr)
        self.invalidate_reads()

    def _write(self, kind: str, value: Any) -> None:
        """Apply ``value`` once to the wrapped variable, through its public update methods
        (a parameter-server variable sends them as requests)."""
        v = self._v
        try:
            if kind == "assign":
                v.assign(value, read_value=False)
            elif kind == "assign_add":
                v.assign_add(value, read_value=False)
            else:
                v.assign_sub(value, read_value=False)
        finally:
            self.invalidate_reads()

    def _update(self, kind: str, value: Any, read_value: bool) -> Any:
        mode = state.current_mode()
        ctx = None if mode.is_default else mode.replica_context
        if ctx is None:  # cross-replica context, or no strategy: one update, directly
            self._write(kind, single_value(value, self.name))
            return self.value() if read_value else None
        if mode.strategy is not self._distribute_strategy:
            raise RuntimeError(
                f"Mixing different mpidist.Strategy objects: {mode.strategy} is not "
                f"{self._distribute_strategy}; variable {self.name!r} belongs to the latter, "
                "update it inside that strategy's run."
            )
        if self._aggregation is VariableAggregation.NONE:
            raise ValueError(_AGGREGATION_ERROR)
        if isinstance(value, DistributedValues):
            raise TypeError(
                "Cannot use DistributedValues to update variables in replica context: inside "
                "strategy.run pass the replica's own value (an array or number)."
            )
        with user_call(f"AggregatingVariable.{kind}", aggregation=self._aggregation.name):
            ctx.merge_call(self._merge_update, args=(kind, value))
        return self.value() if read_value else None

    # -- sparse updates (rows along axis 0) --------------------------------------------------
    def write_scatter(self, kind: str, rows: np.ndarray, values: Array) -> None:
        self._v.write_scatter(kind, rows, values)
        self.invalidate_reads()

    def _scatter(self, kind: str, sparse_delta: Any) -> Variable:
        mode = state.current_mode()
        ctx = None if mode.is_default else mode.replica_context
        if ctx is None:  # cross-replica context, or no strategy: once, directly
            return super()._scatter(kind, sparse_delta)
        if self._aggregation is VariableAggregation.NONE:
            raise ValueError(_AGGREGATION_ERROR)
        if kind == "scatter_update" and self._aggregation in (VariableAggregation.SUM,
                                                               VariableAggregation.MEAN):
            raise NotImplementedError(
                "scatter_update of an AggregatingVariable in replica context is only supported "
                f"with `ONLY_FIRST_REPLICA` aggregation, got: {self._aggregation}. Use "
                "scatter_add / scatter_sub, or update it in cross-replica context.")
        rows, values = self.prepare_scatter(sparse_delta, kind)  # checked before the merge
        with user_call(f"AggregatingVariable.{kind}", aggregation=self._aggregation.name):
            ctx.merge_call(self._merge_scatter, args=(kind, rows, values))
        return self

    def _merge_scatter(self, strategy: StrategyProtocol, kind: str, rows: Any, values: Any
                       ) -> None:
        """Cross-replica: apply the replicas' row updates once each (SUM), scaled by 1/N
        (MEAN), or replica 0's alone (ONLY_FIRST_REPLICA)."""
        if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            first = strategy.extended.first_replica_value
            self.write_scatter(kind, first(rows), first(values))
            return
        n = strategy.num_replicas_in_sync
        # A value that is one object on every replica was contributed by each of them.
        per_rows = rows.values if isinstance(rows, DistributedValues) else (rows,) * n
        per_values = values.values if isinstance(values, DistributedValues) else (values,) * n
        for r, v in zip(per_rows, per_values):
            if self._aggregation is VariableAggregation.MEAN:
                v = v / n
            self.write_scatter(kind, r, v)

    def _merge_update(self, strategy: StrategyProtocol, kind: str, value: Any) -> None:
        """Cross-replica: combine the replicas' values by the aggregation, apply once."""
        extended = strategy.extended
        if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            combined = extended.first_replica_value(value)
        else:
            op = ReduceOp.from_variable_aggregation(self._aggregation)
            combined = extended.reduce_to(op, value, self)
        self._write(kind, combined)
