"""Keras callbacks under a multi-worker strategy, as in TF multi-worker training.

* Callbacks that write files (ModelCheckpoint, BackupAndRestore, CSVLogger, TensorBoard) write
  on the chief; on every other rank ``fit`` runs a copy of each that writes into a temporary
  directory of that rank, removed when ``fit`` ends (``callbacks_for_rank``, shared with
  ``mpidist.fit``). The user's callback objects are not changed.
* ``AgreeAfterRestore`` runs after the user's callbacks at the start of training: it broadcasts
  the chief's weights, optimizer state and initial epoch to every rank. Every rank then starts
  from the same state, whether it is the initial one or what BackupAndRestore restored on the
  chief (so a backup directory only the chief can see still resumes every rank).
* Callbacks that decide (EarlyStopping, ReduceLROnPlateau) decide the same on every rank: the
  logs they read are global and identical everywhere. ``AgreeOnStop`` makes a stop that one
  rank alone asks for at an epoch's end (``model.stop_training = True`` from anything else) stop
  every rank after that epoch.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from mpidist.keras.keras_api import initial_epoch, set_initial_epoch

__all__ = ["AgreeAfterRestore", "AgreeOnStop", "broadcast_model_state"]


def broadcast_model_state(model: Any, communicator: Any) -> None:
    """Give every rank the chief's weights and optimizer variables: one broadcast per dtype."""
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        variables += list(optimizer.variables)
    by_dtype: dict[str, list[Any]] = {}
    for variable in variables:
        by_dtype.setdefault(np.dtype(variable.dtype).str, []).append(variable)
    for dtype, group in sorted(by_dtype.items()):
        values = [np.asarray(v.value) for v in group]
        flat = np.concatenate([a.reshape(-1) for a in values]).astype(dtype, copy=False)
        flat = np.ascontiguousarray(flat)
        communicator.broadcast(flat, root=0)
        at = 0
        for variable, value in zip(group, values):
            variable.assign(flat[at:at + value.size].reshape(value.shape))
            at += value.size


class AgreeAfterRestore(keras.callbacks.Callback):  # type: ignore[misc]
    """At the start of training, after the user's callbacks (BackupAndRestore among them):
    every rank takes the chief's state and initial epoch."""

    def __init__(self, communicator: Any) -> None:
        super().__init__()
        self._communicator = communicator

    def on_train_begin(self, logs: Any = None) -> None:
        broadcast_model_state(self.model, self._communicator)
        epoch = initial_epoch(self.model)
        agreed = np.array([-1 if epoch is None else epoch], dtype=np.int64)
        self._communicator.broadcast(agreed, root=0)
        set_initial_epoch(self.model, None if agreed[0] < 0 else int(agreed[0]))


class AgreeOnStop(keras.callbacks.Callback):  # type: ignore[misc]
    """At each epoch's end, after the user's callbacks: if any rank asked to stop
    (``model.stop_training``), every rank stops after this epoch (one small all-reduce)."""

    def __init__(self, communicator: Any) -> None:
        super().__init__()
        self._communicator = communicator

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        flag = np.array([1 if self.model.stop_training else 0], dtype=np.int32)
        out = np.empty_like(flag)
        self._communicator.all_reduce(out, op="max", send=flag)
        self.model.stop_training = bool(out[0])
