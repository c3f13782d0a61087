"""Keras's metrics and callbacks in ``mpidist.fit``: Keras's own objects, distributed here.

* ``SummedKerasMetric`` holds a Keras metric (``keras.metrics.AUC()``, ``F1Score``, ...). Each
  replica's ``update_state`` computes, with the metric's stateless API, how much the batch adds
  to each of the metric's variables, and adds it to a SUM-aggregated ON_READ copy (an mpidist
  Metric state); ``result()`` sums those over every replica of every worker and lets the Keras
  metric compute its value from the totals, as TF sums metric variables.
* ``KerasCallbackHooks`` holds a Keras callback (EarlyStopping, ReduceLROnPlateau, CSVLogger,
  LearningRateScheduler, TerminateOnNaN, LambdaCallback, ...). It hands the callback a view of
  the model whose ``optimizer`` is the one given to ``fit`` and whose ``stop_training`` is the
  model's, and forwards every hook. A callback that writes files (CSVLogger, ModelCheckpoint,
  BackupAndRestore, TensorBoard) writes on the chief; other ranks run a copy writing into a
  temporary directory (``callbacks_for_rank``).

Keras is imported only when one of its objects is given.
"""

from __future__ import annotations

import copy
import inspect
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mpidist.training.callbacks import Callback
from mpidist.training.metrics import Metric

__all__ = ["KerasCallbackHooks", "KerasCallback", "SummedKerasMetric", "KerasMetric",
           "callbacks_for_rank", "is_keras_callback", "is_keras_metric", "remove_directory"]


@runtime_checkable
class KerasMetric(Protocol):
    """What ``fit``'s argument check accepts as a Keras metric."""

    def stateless_update_state(self, metric_variables: Any, *args: Any, **kwargs: Any
                               ) -> Any: ...

    def stateless_result(self, metric_variables: Any) -> Any: ...


@runtime_checkable
class KerasCallback(Protocol):
    """What ``fit``'s argument check accepts as a Keras callback."""

    def set_model(self, model: Any) -> None: ...

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None: ...


def _from_keras(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "keras" or any(
        cls.__module__.split(".")[0] == "keras" for cls in type(obj).__mro__[1:])


def is_keras_metric(obj: Any) -> bool:
    return _from_keras(obj) and hasattr(obj, "stateless_update_state")


def is_keras_callback(obj: Any) -> bool:
    return _from_keras(obj) and hasattr(obj, "set_model") and hasattr(obj, "on_epoch_end")


class SummedKerasMetric(Metric):
    """A Keras metric, summed across replicas and workers (see the module's docstring).
    Create it in the strategy's scope (``fit`` does, for the metrics it is given)."""

    def __init__(self, metric: Any) -> None:
        super().__init__(name=metric.name, dtype=np.float64)
        self._keras = metric
        metric.reset_state()
        self._initial = [np.asarray(v.value) for v in metric.variables]
        self._names = [f"{i}:{v.name}" for i, v in enumerate(metric.variables)]
        for name, value in zip(self._names, self._initial):
            self.add_weight(name, shape=value.shape)

    @property
    def keras_metric(self) -> Any:
        return self._keras

    def _update_deltas(self, y_true: Any, y_pred: Any, sample_weight: Any = None
                       ) -> dict[str, Any]:
        if len(self._keras.variables) != len(self._initial) or not self._initial:
            raise ValueError(
                f"Keras metric {self._keras.name!r} ({type(self._keras).__name__}) creates its "
                "state at its first update (its shape comes from the data), after fit has made "
                "the replicas' copies. Build it before fit: `metric.update_state(y, y_pred)` "
                "on one example batch, then `metric.reset_state()`.")
        new = self._keras.stateless_update_state(list(self._initial), y_true, y_pred,
                                                 sample_weight=sample_weight)
        return {name: np.asarray(n, dtype=np.float64) - start
                for name, n, start in zip(self._names, new, self._initial)}

    def _result_from(self, totals: dict[str, Any]) -> Any:
        values = [(start + totals[name]).astype(start.dtype)
                  for name, start in zip(self._names, self._initial)]
        return np.asarray(self._keras.stateless_result(values))


class _ModelView:
    """What a Keras callback sees as ``self.model``: the user's model, with the ``optimizer``
    given to ``fit`` and the model's ``stop_training``."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "optimizer", optimizer)

    @property
    def stop_training(self) -> bool:
        return bool(getattr(self._model, "stop_training", False))

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._model.stop_training = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "stop_training":
            object.__setattr__(self, name, value)  # the property
        else:
            setattr(self._model, name, value)


class KerasCallbackHooks(Callback):
    """A Keras callback in ``mpidist.fit`` (see the module's docstring)."""

    def __init__(self, callback: Any) -> None:
        self.keras_callback = callback

    def set_context(self, model: Any, optimizer: Any, strategy: Any,
                    params: dict[str, Any]) -> None:
        super().set_context(model, optimizer, strategy, params)
        self.keras_callback.set_model(_ModelView(model, optimizer))
        self.keras_callback.set_params(dict(params, verbose=0))

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.keras_callback.on_train_begin(logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.keras_callback.on_train_end(logs)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.keras_callback.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.keras_callback.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.keras_callback.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.keras_callback.on_train_batch_end(batch, logs)


# -- callbacks that write files ---------------------------------------------------------------
def _writers() -> dict[type, str]:
    """The file-writing Keras callbacks and the argument that names where they write."""
    import keras  # noqa: PLC0415 - only when Keras callbacks are given

    return {keras.callbacks.ModelCheckpoint: "filepath",
            keras.callbacks.BackupAndRestore: "backup_dir",
            keras.callbacks.CSVLogger: "filename",
            keras.callbacks.TensorBoard: "log_dir"}


def _redirected(callback: Any, argument: str, directory: str) -> Any:
    """A copy of ``callback`` that writes under ``directory``, rebuilt from its constructor's
    declared arguments (so the paths it derives in ``__init__`` follow), else copied."""
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, os.path.basename(str(getattr(callback, argument))) or "out")
    clone = copy.copy(callback)
    parameters = inspect.signature(type(callback).__init__).parameters
    arguments = {name: getattr(callback, name) for name in parameters
                 if name not in ("self", argument) and hasattr(callback, name)
                 and parameters[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
    try:
        type(callback).__init__(clone, **{argument: target}, **arguments)
    except (TypeError, ValueError):
        clone = copy.copy(callback)
        setattr(clone, argument, target)
    return clone


def callbacks_for_rank(callbacks: Sequence[Any] | None, is_chief: bool
                       ) -> tuple[list[Any], str | None]:
    """The callbacks this rank runs: on the chief the given ones; elsewhere copies of the
    file-writing Keras callbacks that write into a temporary directory (returned, to remove
    after training; None where nothing writes)."""
    callbacks = list(callbacks or [])
    if is_chief or not any(_from_keras(cb) for cb in callbacks):
        return callbacks, None
    writers = _writers()
    directory = None
    out = []
    for callback in callbacks:
        argument = next((a for cls, a in writers.items() if isinstance(callback, cls)), None)
        if argument is None:
            out.append(callback)
            continue
        if directory is None:
            directory = tempfile.mkdtemp(prefix="mpidist-worker-callbacks-")
        out.append(_redirected(callback, argument, os.path.join(directory, str(len(out)))))
    return out, directory


def remove_directory(directory: str | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
