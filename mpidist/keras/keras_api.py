"""The parts of Keras 3 that mpidist's distribution of Keras models plugs into, named here once.

Keras has no public hook for a data-parallel step across processes over a user's own
communicator, so mpidist wraps a few methods of Keras's JAX trainer (installed by
``mpidist.keras.install``) and calls a few of its helpers. Every one of them is imported here, so
a Keras upgrade that moves one fails in this file, at import, with the name of what moved.
Tested with Keras 3.10 to 3.15 (pyproject pins the range).
"""

from __future__ import annotations

from typing import Any

import keras
from keras.src.backend import StatelessScope
from keras.src.backend.common.variables import Variable as KerasVariable
from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight
from keras.src.trainers.trainer import Trainer

__all__ = ["KerasVariable", "StatelessScope", "Trainer", "backend_name", "call_takes_training",
           "initial_epoch",
           "jax_trainer_class", "model_class", "set_initial_epoch", "unpack_x_y_sample_weight",
           "update_metrics_variables"]


def backend_name() -> str:
    """The backend this process's Keras runs on (``KERAS_BACKEND``, read when Keras was
    imported)."""
    return str(keras.backend.backend())


def jax_trainer_class() -> Any:
    """Keras's JAX trainer: the base of every Keras model on the JAX backend."""
    from keras.src.backend.jax.trainer import JAXTrainer  # noqa: PLC0415 - imports JAX
    return JAXTrainer


def model_class() -> Any:
    """``keras.Model``, where ``save`` and ``save_weights`` are defined."""
    return keras.Model


def update_metrics_variables(model: Any, metrics_variables: Any, loss: Any, x: Any, y: Any,
                             y_pred: Any, sample_weight: Any) -> Any:
    """Keras's own stateless update of the loss tracker and the compiled metrics, as its
    ``train_step`` does it: ``(logs, new metrics variables)``."""
    return model._update_metrics_variables(metrics_variables, loss, x, y, y_pred, sample_weight)


def call_takes_training(model: Any) -> bool:
    """Whether the model's ``call`` has a ``training`` argument."""
    return bool(model._call_has_training_arg)


def initial_epoch(model: Any) -> int | None:
    """The epoch ``fit`` starts from when a callback (BackupAndRestore) has set it."""
    epoch: int | None = model._initial_epoch
    return epoch


def set_initial_epoch(model: Any, epoch: int | None) -> None:
    model._initial_epoch = epoch
