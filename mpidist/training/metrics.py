"""Streaming metrics on SyncOnRead variables: ``Mean``, ``Sum``, ``Accuracy``,
``SparseCategoricalAccuracy`` (the Keras metrics of the same names).

A metric keeps running totals in state variables created with ``synchronization=ON_READ,
aggregation=SUM`` in the strategy current at construction. Inside ``strategy.run`` each replica
adds to its own copy with no communication; ``result()`` sums the copies over every replica of
every worker (one collective under MultiWorkerMirroredStrategy) and computes the value on the
host. Created outside any scope, the state is plain Variables and nothing is distributed.
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpidist.backend import array_module, as_array
from mpidist.backend.traced import untraced
from mpidist.core import state
from mpidist.core.messages import short_repr
from mpidist.core.signatures import DType, accepts
from mpidist.core.user_calls import user_call
from mpidist.training.losses import match_label_shapes
from mpidist.types import ReduceOp, VariableAggregation, VariableSynchronization
from mpidist.values.containers import DistributedValues
from mpidist.values.distributed_variables import is_distributed_variable
from mpidist.values.variables import Variable

if TYPE_CHECKING:
    from mpidist.core.state import Mode

__all__ = ["Accuracy", "Mean", "Metric", "SparseCategoricalAccuracy", "Sum"]


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _in_replica_context(mode: Mode) -> bool:
    """Whether ``mode`` is a replica context of a real (non-default) strategy."""
    return mode.replica_context is not None and not mode.is_default


def _components(var: Any) -> tuple[Variable, ...]:
    return var.values if is_distributed_variable(var) else (var,)


def _raw(x: Any) -> Any:
    """A NumPy or CuPy array for ``x`` (Variables read as arrays: a distributed one as the
    current replica's copy, or its aggregate in cross-replica context)."""
    if isinstance(x, Variable):
        x = x.current_array()
    return x


def _as_arrays(*values: Any) -> tuple[Any, list[Any]]:
    """The non-None ``values`` as arrays of one module (CuPy if any of them is CuPy)."""
    raw = [_raw(v) for v in values]
    xp = np
    for v in raw:
        if v is not None and array_module(v) is not np:
            xp = array_module(v)
            break
    converted: list[Any] = []
    for v in raw:
        if isinstance(v, DistributedValues):
            raise TypeError(
                f"A metric got a {type(v).__name__}: call update_state inside strategy.run, where "
                "each replica passes its own arrays."
            )
        if v is None:
            converted.append(None)
        elif xp is np:
            converted.append(np.asarray(as_array(v)))
        else:
            converted.append(xp.asarray(v))
    return xp, converted



def _check_input(metric: Metric, what: str, given: Any, arr: Any, kinds: str = "biuf",
                 required: bool = False) -> None:
    """TypeError unless ``arr`` (converted from ``given``) has a dtype kind in ``kinds``."""
    if arr is None and required or arr is not None and arr.dtype.kind not in kinds:
        raise TypeError(
            f"Metric {metric._name!r}: {what} must hold real numbers, got {short_repr(given)} "
            f"(dtype {getattr(arr, 'dtype', None)}); pass a numeric array."
        )


def _check_class_labels(metric: Metric, xp: Any, labels: Any, classes: int) -> None:
    """ValueError unless ``labels`` are class indices in ``[0, classes)``: a fraction or an
    index out of range (1-based labels, say) never equals a predicted class, a silently low
    accuracy."""
    if not labels.size:
        return
    low, high = float(xp.min(labels)), float(xp.max(labels))
    fractional = labels.dtype.kind == "f" and bool(xp.any(labels != xp.round(labels)))
    if fractional or low < 0 or high >= classes:
        raise ValueError(
            f"Metric {metric._name!r}: y_true must hold class indices in [0, {classes}) for "
            f"y_pred's {classes} classes, got "
            + ("fractional values" if fractional else f"values from {low:g} to {high:g}")
            + "; pass integer labels 0..C-1 (subtract 1 from 1-based labels; use Accuracy "
            "for other comparisons).")


def _squeeze_last(x: Any) -> Any:
    return x.reshape(x.shape[:-1])


class Metric:
    """Base class of the metrics: named state variables, accumulated per replica, read summed.

    Args:
        name: The metric's name (default: the class name in snake_case).
        dtype: NumPy dtype of the state and of ``result()`` (default float64: counts stay exact
            up to 2**53).

    Where to call what:
        * ``update_state(...)`` inside ``strategy.run`` adds to the running replica's copy only
          (no communication). In cross-replica context (inside ``strategy.scope()``, outside
          ``run``) or where no strategy is active, it adds to this worker's first copy once.
        * ``result()`` returns the value over everything every replica of every worker has
          accumulated, as a NumPy scalar of the metric's dtype. Under MultiWorkerMirroredStrategy
          it is a collective: every rank must call it. Inside ``strategy.run`` it is a sync
          point (a ``merge_call``, as in tf.keras): every replica must call it, and each gets
          the same global value.
        * ``reset_state()`` zeroes every copy, without communication. Call it outside
          ``strategy.run`` (it raises RuntimeError inside).

    Subclasses create their state with ``add_weight`` in ``__init__`` and implement
    ``_update_deltas(*args, **kwargs)`` (validate the inputs, return ``{state name: amount to
    add}``) and ``_result_from(totals)`` (the value from ``{state name: summed host array}``).
    """

    @accepts(dtype=DType | None)  # name: the body's message (the mistakes corpus asserts it)
    def __init__(self, name: Any = None, dtype: Any = None) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"A metric's name must be a string, got {name!r}.")
        self._name = name if name is not None else _snake_case(type(self).__name__)
        self._dtype = np.dtype(dtype if dtype is not None else np.float64)
        if self._dtype.kind not in "iuf":
            raise TypeError(
                f"Metric {self._name!r} needs a numeric dtype for its state, got "
                f"{self._dtype}; use e.g. dtype=np.float64.")
        self._state: dict[str, Variable] = {}

    # -- identity ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def variables(self) -> list[Variable]:
        """The state variables, in creation order."""
        return list(self._state.values())

    def _checkpoint_dependencies(self) -> dict[str, Variable]:
        """``{state name: variable}``: what a checkpoint saves for this metric."""
        return dict(self._state)

    def __repr__(self) -> str:
        return f"<mpidist.metrics.{type(self).__name__} name={self._name!r} dtype={self._dtype}>"

    # -- state ---------------------------------------------------------------------------
    @accepts(name=str, dtype=DType | None)
    def add_weight(self, name: Any, shape: Any = (), dtype: Any = None) -> Variable:
        """Create a state variable of zeros (ON_READ, SUM, not trainable) in the current
        strategy. Under MultiWorkerMirroredStrategy this is collective: every rank creates
        the same metrics in the same order."""
        if name in self._state:
            raise ValueError(f"Metric {self._name!r} already has a state variable named {name!r}.")
        dtype = np.dtype(dtype if dtype is not None else self._dtype)
        var = Variable(np.zeros(shape, dtype=dtype), name=name, dtype=dtype, trainable=False,
                       synchronization=VariableSynchronization.ON_READ,
                       aggregation=VariableAggregation.SUM)
        self._state[name] = var
        return var

    def _check_context(self, mode: Mode, what: str) -> None:
        """Raise unless the state variables can be used in ``mode``."""
        for var in self._state.values():
            owner = var.distribute_strategy
            if _in_replica_context(mode):
                if not mode.strategy.extended.variable_created_in_scope(var):
                    raise RuntimeError(
                        f"Metric {self._name!r} cannot {what} inside strategy.run of "
                        f"{mode.strategy}: its variables were created "
                        + ("outside any strategy scope" if owner is None else f"in {owner}'s scope")
                        + ". Create the metric inside `with strategy.scope():` of the strategy "
                          "that runs it."
                    )
            elif is_distributed_variable(var) and not mode.is_default \
                    and mode.strategy is not owner:
                raise RuntimeError(
                    f"Mixing different mpidist.Strategy objects: metric {self._name!r} was "
                    f"created in {owner}'s scope, not {mode.strategy}'s; use it in its own "
                    "strategy's scope."
                )

    # -- the public API --------------------------------------------------------------------
    def update_state(self, *args: Any, **kwargs: Any) -> None:
        """Accumulate a batch. Inputs are checked before anything is written: on a ValueError
        the state is unchanged."""
        mode = state.current_mode()
        self._check_context(mode, "update_state")
        # Inside value_and_grad a metric may be fed traced values: it reads their values.
        what = f"Metric {self._name!r}.update_state"
        args = [untraced(a, what) for a in args]  # type: ignore[assignment]  # unpacked below
        kwargs = {k: untraced(v, what) for k, v in kwargs.items()}
        deltas = self._update_deltas(*args, **kwargs)
        replica = _in_replica_context(mode)
        writes: list[tuple[Variable, Any]] = []
        for name, delta in deltas.items():
            var = self._state[name]
            target = var if replica else _components(var)[0]
            delta = as_array(delta) if array_module(delta) is np else delta
            writes.append((target, delta.astype(var.dtype, copy=False)))
        for target, delta in writes:
            # In replica context a SyncOnRead variable writes the replica's own copy.
            target.assign_add(delta, read_value=False)

    def result(self) -> Any:
        """The metric over all replicas of all workers, a NumPy scalar (see the class doc for
        where it may be called). Collective under MultiWorkerMirroredStrategy: call it on
        every rank."""
        with user_call(f"{type(self).__name__}.result"):
            return self._result_from(self._read_totals())

    def reset_state(self) -> None:
        """Zero every copy of every state variable (no communication)."""
        mode = state.current_mode()
        if _in_replica_context(mode):
            raise RuntimeError(
                f"Metric {self._name!r}: reset_state() must be called in cross-replica context "
                "(outside strategy.run), where it zeroes every replica's copy at once."
            )
        self._check_context(mode, "reset_state")
        for var in self._state.values():
            zeros = np.zeros(var.shape, dtype=var.dtype)  # moved to each copy's device
            for component in _components(var):
                component.assign(zeros, read_value=False)

    def reset_states(self) -> None:
        """Alias of ``reset_state`` (the tf.keras 2 name)."""
        self.reset_state()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``update_state(*args, **kwargs)``, then ``result()``."""
        self.update_state(*args, **kwargs)
        return self.result()

    # -- reading ---------------------------------------------------------------------------
    def _read_totals(self) -> dict[str, Any]:
        mode = state.current_mode()
        self._check_context(mode, "compute result()")
        if _in_replica_context(mode) and any(
                is_distributed_variable(v) for v in self._state.values()):
            return cast(dict[str, Any],
                        mode.replica_context.merge_call(lambda strategy: self._read_totals_cross()))
        return self._read_totals_cross()

    def _read_totals_cross(self) -> dict[str, Any]:
        """``{state name: host array}`` summed over every replica (one batched reduction)."""
        names = list(self._state)
        variables = [self._state[n] for n in names]
        if not any(is_distributed_variable(v) for v in variables):
            return {n: np.array(as_array(v.current_array()), copy=True) for n, v in zip(names, variables)}
        strategy = variables[0].distribute_strategy
        with strategy.scope():
            reduced = strategy.extended.batch_reduce_to(
                ReduceOp.SUM, [(v, "/cpu:0") for v in variables])
            local = [strategy.experimental_local_results(r)[0] for r in reduced]
        return {n: np.array(as_array(r), copy=True) for n, r in zip(names, local)}

    # -- subclass hooks --------------------------------------------------------------------
    def _update_deltas(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement _update_deltas.")

    def _result_from(self, totals: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _result_from.")

    # -- helpers for subclasses ------------------------------------------------------------
    def _weights_for(self, xp: Any, sample_weight: Any, values: Any) -> Any:
        """``sample_weight`` broadcast to ``values``' shape, Keras style: a trailing size-1
        dimension beyond ``values``' rank is dropped, then the weight's dimensions align with
        the leading dimensions of ``values`` (per-sample weights)."""
        w = xp.asarray(sample_weight, dtype=self._dtype)
        given = tuple(w.shape)
        if w.ndim == values.ndim + 1 and w.shape[-1] == 1:
            w = _squeeze_last(w)
        ok = w.ndim <= values.ndim and all(
            dw in (1, dv) for dw, dv in zip(w.shape, values.shape[:w.ndim]))
        if not ok:
            raise ValueError(
                f"Metric {self._name!r}: sample_weight of shape {given} cannot be broadcast to "
                f"the values' shape {tuple(values.shape)}: give one weight per sample (shape "
                f"{tuple(values.shape[:1])}), one per value, or a scalar."
            )
        w = w.reshape(tuple(w.shape) + (1,) * (values.ndim - w.ndim))
        return xp.broadcast_to(w, values.shape)


class Sum(Metric):
    """The running total of ``values`` (times ``sample_weight``, broadcast to the values).

    ``result()`` = sum over every value passed to ``update_state`` on every replica."""

    def __init__(self, name: str = "sum", dtype: Any = np.float64) -> None:
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_weight("total")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        super().update_state(values, sample_weight=sample_weight)

    def _update_deltas(self, values: Any, sample_weight: Any = None) -> dict[str, Any]:
        xp, (arr, w) = _as_arrays(values, sample_weight)
        _check_input(self, "values", values, arr, required=True)
        _check_input(self, "sample_weight", sample_weight, w)
        values = arr.astype(self._dtype, copy=False)
        if w is not None:
            values = values * self._weights_for(xp, w, values)
        return {"total": xp.sum(values, dtype=self._dtype)}

    def _result_from(self, totals: dict[str, Any]) -> Any:
        return self._dtype.type(totals["total"])


class Mean(Metric):
    """The (weighted) mean of ``values``: ``total / count``, where ``total`` sums the values
    (times ``sample_weight``) and ``count`` is the number of values, or the sum of the weights
    broadcast to the values. 0.0 while ``count`` is 0 (Keras' divide_no_nan)."""

    def __init__(self, name: str = "mean", dtype: Any = np.float64) -> None:
        super().__init__(name=name, dtype=dtype)
        if self._dtype.kind != "f":
            raise ValueError(f"Metric {self._name!r} needs a floating dtype, got {self._dtype}.")
        self.total = self.add_weight("total")
        self.count = self.add_weight("count")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        super().update_state(values, sample_weight=sample_weight)

    def _update_deltas(self, values: Any, sample_weight: Any = None) -> dict[str, Any]:
        xp, (arr, w) = _as_arrays(values, sample_weight)
        _check_input(self, "values", values, arr, required=True)
        _check_input(self, "sample_weight", sample_weight, w)
        return self._mean_deltas(xp, arr, w)

    def _mean_deltas(self, xp: Any, values: Any, w: Any) -> dict[str, Any]:
        values = values.astype(self._dtype, copy=False)
        if w is None:
            return {"total": xp.sum(values, dtype=self._dtype),
                    "count": xp.asarray(values.size, dtype=self._dtype)}
        w = self._weights_for(xp, w, values)
        return {"total": xp.sum(values * w, dtype=self._dtype),
                "count": xp.sum(w, dtype=self._dtype)}

    def _result_from(self, totals: dict[str, Any]) -> Any:
        total, count = totals["total"], totals["count"]
        if count == 0:
            return self._dtype.type(0)
        return self._dtype.type(total / count)


class Accuracy(Mean):
    """How often ``y_pred`` equals ``y_true``: the (weighted) mean of ``y_true == y_pred``,
    element by element. The shapes must match (a trailing size-1 dimension on one side only is
    dropped, as in Keras)."""

    def __init__(self, name: str = "accuracy", dtype: Any = np.float64) -> None:
        super().__init__(name=name, dtype=dtype)

    # Keras' signature for labels and predictions, over Mean's of values.
    def update_state(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> None:
        Metric.update_state(self, y_true, y_pred, sample_weight=sample_weight)

    def _update_deltas(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                       sample_weight: Any = None) -> dict[str, Any]:
        given = (y_true, y_pred)
        xp, (y_true, y_pred, w) = _as_arrays(y_true, y_pred, sample_weight)
        _check_input(self, "y_true", given[0], y_true, "biufSU", required=True)
        _check_input(self, "y_pred", given[1], y_pred, "biufSU", required=True)
        _check_input(self, "sample_weight", sample_weight, w)
        t, p = match_label_shapes(y_true, y_pred, f"Metric {self._name!r}")
        if p.dtype.kind == "f" and t.dtype.kind in "biu" and p.size \
                and bool(xp.any(p != xp.round(p))):
            warnings.warn(
                f"Metric {self._name!r}: Accuracy compares y_pred with the integer labels "
                "y_true for equality, and y_pred holds fractions (probabilities or scores?), "
                "which never equal a label; pass predicted labels (e.g. "
                "(probabilities > 0.5).astype(int), or argmax over classes), or use "
                "SparseCategoricalAccuracy for class scores.", RuntimeWarning, stacklevel=4)
        return self._mean_deltas(xp, t == p, w)


class SparseCategoricalAccuracy(Mean):
    """How often the integer label ``y_true`` is the top-scoring class of ``y_pred``: the
    (weighted) mean of ``y_true == argmax(y_pred, axis=-1)``. ``y_pred`` has shape
    ``[N, ..., C]``; ``y_true`` has shape ``[N, ...]`` or ``[N, ..., 1]``. Ties go to the lowest
    class index (``argmax``)."""

    def __init__(self, name: str = "sparse_categorical_accuracy", dtype: Any = np.float64) -> None:
        super().__init__(name=name, dtype=dtype)

    # Keras' signature for labels and predictions, over Mean's of values.
    def update_state(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> None:
        Metric.update_state(self, y_true, y_pred, sample_weight=sample_weight)

    def _update_deltas(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                       sample_weight: Any = None) -> dict[str, Any]:
        given = (y_true, y_pred)
        xp, (y_true, y_pred, w) = _as_arrays(y_true, y_pred, sample_weight)
        _check_input(self, "y_true (integer class labels)", given[0], y_true, "iuf", required=True)
        _check_input(self, "y_pred (class scores)", given[1], y_pred, "iuf", required=True)
        _check_input(self, "sample_weight", sample_weight, w)
        if y_pred.ndim == 0 or y_pred.shape[-1] == 0 or y_true.ndim > y_pred.ndim:
            raise ValueError(
                f"Metric {self._name!r}: y_true of shape {tuple(y_true.shape)} and y_pred of "
                f"shape {tuple(y_pred.shape)} are not compatible: y_pred must be scores of shape "
                "[N, ..., C] (C > 0) and y_true integer labels of shape [N, ...] or [N, ..., 1]."
            )
        # the labels against the predicted classes, by the losses' and metrics' one rule
        predicted = xp.argmax(y_pred, axis=-1)
        t, predicted = match_label_shapes(
            y_true, predicted, f"Metric {self._name!r}", y_pred.shape,
            f" (y_pred's predicted classes, its argmax over the last axis, have shape "
            f"{tuple(predicted.shape)})")
        _check_class_labels(self, xp, t, y_pred.shape[-1])
        return self._mean_deltas(xp, t == predicted, w)
