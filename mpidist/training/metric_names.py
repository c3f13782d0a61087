"""Metrics given by name, as Keras' ``compile(metrics=[...])`` takes them (``"accuracy"``,
``"mse"``, ``"mae"``, ``"sparse_categorical_accuracy"``, ...), and the two regression metrics
those names need (``MeanSquaredError``, ``MeanAbsoluteError``: Keras' names)."""

from __future__ import annotations

from typing import Any

from mpidist.backend import array_module, as_array
from mpidist.training.losses import match_label_shapes
from mpidist.training.keras_parts import SummedKerasMetric, is_keras_metric
from mpidist.training.metrics import Accuracy, Mean, Metric, SparseCategoricalAccuracy
from mpidist.types import Array

__all__ = ["MeanSquaredError", "MeanAbsoluteError", "metric_from", "METRIC_NAMES"]


class _MeanError(Mean):
    """The (weighted) mean over examples of a per-example error averaged over the last axis
    (Keras: ``mean(error, axis=-1)``); labels and predictions may differ by a trailing 1."""

    # Keras' signature for a metric of labels and predictions, over Mean's of values.
    def update_state(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> None:
        t, p = as_array(y_true), as_array(y_pred)
        t, p = match_label_shapes(t, p, f"Metric {self.name!r}")
        xp = array_module(p)
        error = self._error(xp, xp.asarray(t, dtype=p.dtype if p.dtype.kind == "f" else None)
                            - p)
        if error.ndim > 1:
            error = error.mean(axis=-1)
        super().update_state(error, sample_weight=sample_weight)

    def _error(self, xp: Any, diff: Array) -> Array:
        raise NotImplementedError


class MeanSquaredError(_MeanError):
    def __init__(self, name: str = "mean_squared_error", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)

    def _error(self, xp: Any, diff: Array) -> Array:
        return diff * diff


class MeanAbsoluteError(_MeanError):
    def __init__(self, name: str = "mean_absolute_error", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)

    def _error(self, xp: Any, diff: Array) -> Array:
        return xp.abs(diff)


# Keras' string identifiers (keras.metrics.get). "accuracy" / "acc": Keras picks binary,
# categorical or sparse accuracy from the loss; with no loss object here it is equality
# (Accuracy), and class scores against integer labels need "sparse_categorical_accuracy".
METRIC_NAMES = {
    "accuracy": Accuracy, "acc": Accuracy,
    "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError,
    "mae": MeanAbsoluteError, "mean_absolute_error": MeanAbsoluteError,
}


def metric_from(metric: Metric | str | Any, where: str) -> Metric:
    """A metric object for ``metric`` (an object or a name from ``METRIC_NAMES``); call it
    in the strategy's scope (a new metric creates its variables there)."""
    if isinstance(metric, Metric):
        return metric
    if is_keras_metric(metric):
        return SummedKerasMetric(metric)  # Keras's own metric, summed across replicas
    if isinstance(metric, str):
        cls = METRIC_NAMES.get(metric.lower())
        if cls is None:
            raise ValueError(
                f"{where}: unknown metric name {metric!r}; the known names are "
                f"{sorted(METRIC_NAMES)} (or pass an mpidist.metrics object).")
        return cls(name=metric)  # Keras logs it under the name given
    if isinstance(metric, type) and issubclass(metric, Metric):
        raise TypeError(f"{where}: metrics got the class {metric.__name__}; pass an instance, "
                        f"{metric.__name__}(), or a name such as 'accuracy'.")
    raise TypeError(f"{where}: metrics got {type(metric).__name__} {metric!r}; pass "
                    "mpidist.metrics objects, Keras metrics (keras.metrics.AUC()), or names such "
                    "as 'accuracy', 'mse', 'mae'.")
