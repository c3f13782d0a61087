"""Callbacks for ``mpidist.fit``: the hooks, plus checkpointing and backup-and-restore.

Every rank runs every callback (a checkpoint save is collective: SyncOnRead values are
all-reduced), and only the chief writes files or prints.
"""

from __future__ import annotations

import os
import shutil
import string
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Protocol, cast

import numpy as np

from mpidist.core.saves import forget_save, record_save
from mpidist.core.signatures import NonNegative, accepts
from mpidist.training.backup_owner import claim, release
from mpidist.training.checkpoint import Checkpoint, CheckpointManager
from mpidist.training.chief_writes import ChiefWrites
from mpidist.values.variables import Variable

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy

__all__ = ["Callback", "ModelCheckpoint", "BackupAndRestore", "History", "ModelVariables",
           "check_callbacks"]


def check_callbacks(callbacks: Iterable[Callback]) -> None:
    """ValueError naming two of ``callbacks`` that manage the same directory (each one's
    ``managed_directory``), or one inside a BackupAndRestore's directory, which is deleted
    when training ends: their files would overwrite, prune or delete each other's. ``fit``
    calls it before any callback starts."""
    owners: list[tuple[Any, str]] = []  # (a callback with a managed_directory, its real path)
    for cb in callbacks:
        directory = getattr(cb, "managed_directory", None)
        if directory is None:
            continue
        here = os.path.realpath(directory)
        for other, there in owners:
            same = here == there
            common = os.path.commonpath([here, there])
            outer = other if common == there else cb if common == here else None
            if same or isinstance(outer, BackupAndRestore):
                raise ValueError(
                    f"fit: callbacks {_described(other)} and {_described(cb)} both manage "
                    + (f"the directory {directory!r}" if same else
                       f"{directory!r} and {other.managed_directory!r}, one inside the other "
                       f"(BackupAndRestore deletes its directory when training ends)")
                    + ": their checkpoints would overwrite and delete each other's. Give each "
                    "its own directory (e.g. 'run/checkpoints' and 'run/backup').")
        owners.append((cb, here))


class _TrainingLoop(Protocol):
    """What BackupAndRestore reads and sets of the loop ``fit`` attaches (fit's own loop)."""

    metrics: list[Any]
    epoch: int
    global_step: int

    def epoch_totals(self) -> tuple[float, float]: ...

    def resume_at(self, epoch: int, step: int, loss_sum: float, count: float) -> None: ...


def _described(cb: Any) -> str:
    return f"{type(cb).__name__}({cb.managed_directory!r})"


class Callback:
    """Base class: override the hooks you need. ``self.model``, ``self.optimizer``,
    ``self.strategy`` and ``self.params`` (epochs, steps) are set before training starts.
    As in Keras, ``on_batch_begin`` / ``on_batch_end`` (Keras 2's names) are called by the
    default ``on_train_batch_begin`` / ``on_train_batch_end``."""

    # Set by fit (set_context) before training starts.
    model: Any = None
    optimizer: Any = None
    strategy: Any = None
    params: Any = None

    def set_context(self, model: Any, optimizer: Any, strategy: Strategy,
                    params: dict[str, Any]) -> None:
        self.model, self.optimizer, self.strategy, self.params = model, optimizer, strategy, params

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        pass

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        pass

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        pass

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.on_batch_begin(batch, logs)  # Keras 2's name, still honoured by Keras 3

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.on_batch_end(batch, logs)

    def on_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras 2's name for ``on_train_batch_begin``: override either (not both)."""

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras 2's name for ``on_train_batch_end``: override either (not both)."""


class History(Callback):
    """Collects each epoch's logs: ``history.history["loss"]`` is the loss per epoch."""

    def __init__(self) -> None:
        self.history: dict[str, list[Any]] = {}
        self.epoch: list[int] = []

    @accepts(logs=Mapping | None)  # fit's dict of metric values
    def on_epoch_end(self, epoch: Any, logs: Mapping[str, Any] | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)


class ModelVariables:
    """A user model seen by a Checkpoint: its ``trainable_variables`` and, when it has them,
    its other ``variables``, by position."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def _checkpoint_dependencies(self) -> dict[str, dict[str, Any]]:
        trainable = list(self._model.trainable_variables)
        deps = {"trainable": {str(i): v for i, v in enumerate(trainable)}}
        others = [v for v in getattr(self._model, "variables", ()) if all(v is not t for t in trainable)]
        if others:
            deps["other"] = {str(i): v for i, v in enumerate(others)}
        return deps


class _Group:
    """Several trackables (e.g. the metrics) as one, by position."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._items = list(items)

    def _checkpoint_dependencies(self) -> dict[str, Any]:
        return {str(i): item for i, item in enumerate(self._items)}


def _save_freq(value: Any) -> str | int:
    if value == "epoch":
        return cast(str, value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"save_freq must be 'epoch' or a positive number of steps, got {value!r}.")
    return value


class ModelCheckpoint(Callback):
    """Save the model's variables and the optimizer state every epoch (or every ``save_freq``
    steps) into ``directory``, keeping the last ``max_to_keep``.

    A path with Keras's format fields (``"ckpt/weights.{epoch:02d}"``, ``"{epoch}-{loss:.3f}"``)
    is Keras's ``filepath`` instead: each save writes one checkpoint at the path formatted with
    ``epoch`` (counted from 1), ``batch`` (with a step ``save_freq``) and the logs, and every one
    is kept, as Keras keeps them (``max_to_keep`` does not apply). Restore one with
    ``mpidist.train.Checkpoint(...).restore(path)``."""

    @accepts(directory=str | os.PathLike, max_to_keep=int | None)
    def __init__(self, directory: str | os.PathLike[str], save_freq: Any = "epoch",
                 max_to_keep: int | None = 5) -> None:
        self.directory = os.fspath(directory)
        self.save_freq: Any = _save_freq(save_freq)  # "epoch" or a positive int
        self.max_to_keep = max_to_keep
        self.manager: CheckpointManager = None  # type: ignore[assignment]  # on_train_begin sets it
        self._checkpoint: Checkpoint = None  # type: ignore[assignment]  # on_train_begin sets it
        self._pattern = _has_format_fields(self.directory)
        self._steps = 0
        self._epoch = 0

    @property
    def managed_directory(self) -> str:
        """The directory this callback writes and prunes (``check_callbacks``)."""
        if self._pattern:
            return os.path.dirname(self.directory.split("{", 1)[0]) or os.curdir
        return self.directory

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._checkpoint = Checkpoint(model=ModelVariables(self.model), optimizer=self.optimizer)
        if not self._pattern:
            self.manager = CheckpointManager(self._checkpoint, self.directory,
                                             max_to_keep=self.max_to_keep)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps += 1
        if self.save_freq != "epoch" and self._steps % self.save_freq == 0:
            self._save(self._epoch, batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.save_freq == "epoch":
            self._save(epoch, None, logs)

    def _save(self, epoch: int, batch: int | None, logs: dict[str, Any] | None) -> None:
        if not self._pattern:
            self.manager.save()
            return
        fields = {k: float(v) for k, v in (logs or {}).items()}
        fields.update(epoch=epoch + 1, **({} if batch is None else {"batch": batch}))
        try:
            path = self.directory.format(**fields)
        except (KeyError, IndexError, ValueError) as err:
            raise KeyError(
                f"ModelCheckpoint: cannot format the path {self.directory!r} with "
                f"{sorted(fields)} ({type(err).__name__}: {err}); use fields among those "
                "(the epoch, the batch with a step save_freq, the logs' names).") from None
        self._checkpoint.write(path)


def _has_format_fields(path: str) -> bool:
    """Whether ``path`` has a ``str.format`` field such as ``{epoch:02d}``."""
    return any(field is not None for _, field, _, _ in string.Formatter().parse(path))


class BackupAndRestore(Callback):
    """Back up the whole training state so a killed job resumes where it stopped.

    The directory has one live owner: while ``fit`` runs, the writing worker holds a lock on
    ``backup_dir/owner.lock`` and records its Slurm job, host and pid in ``owner.json``. Another
    live run with the same directory fails at ``fit``'s start on every rank, naming the
    owner; a requeue of the same Slurm job, or any run after the owner died, takes it over.
    Backups are published atomically and a kill at any moment leaves the last one loadable;
    where the newest backup is damaged, the newest complete one is restored with a warning.

    Every epoch (or every ``save_freq`` steps) the model's variables, the optimizer (slots and
    ``iterations``), the metrics and the position in training are saved to ``backup_dir``.
    When ``fit`` starts and a backup exists, all of it is restored and training continues from
    the step after the backup, reading the same batches in the same order, so the final weights
    are those of an uninterrupted run, bit for bit (shuffles must be seeded). The backup is
    deleted when training ends, unless ``delete_checkpoint=False``.
    """

    @accepts(backup_dir=str | os.PathLike, delete_checkpoint=bool)
    def __init__(self, backup_dir: str | os.PathLike[str], save_freq: Any = "epoch",
                 delete_checkpoint: bool = True) -> None:
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq: Any = _save_freq(save_freq)  # "epoch" or a positive int
        self.delete_checkpoint = bool(delete_checkpoint)
        # set by on_train_begin (manager, _progress) and by fit (attach)
        self.manager: CheckpointManager = None  # type: ignore[assignment]
        self._progress: Variable = None  # type: ignore[assignment]
        self._loop: _TrainingLoop = None  # type: ignore[assignment]

    @property
    def managed_directory(self) -> str:
        """The directory this callback writes and deletes (``check_callbacks``)."""
        return self.backup_dir

    def attach(self, loop: _TrainingLoop) -> None:
        """Called by fit: the loop whose position (epoch, step, loss totals) is backed up."""
        self._loop = loop

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        # A plain host variable whatever the strategy: the position is the same everywhere.
        self._progress = Variable.plain(np.zeros(4, np.float64), trainable=False,
                                        name="fit_progress")
        checkpoint = Checkpoint(model=ModelVariables(self.model), optimizer=self.optimizer,
                                metrics=_Group(self._loop.metrics), progress=self._progress)
        # One live owner per directory: the writer claims it, every rank hears the outcome.
        ChiefWrites([self.strategy]).run(
            f"BackupAndRestore: claiming the backup directory {self.backup_dir!r}",
            lambda: claim(self.backup_dir), relay=True)
        self.manager = CheckpointManager(checkpoint, self.backup_dir, max_to_keep=1)
        restored = self.manager.restore_newest(
            prepare=lambda: self.optimizer.build(list(self.model.trainable_variables)))
        if restored is not None:
            restored[1].assert_consumed()
            epoch, step, loss_sum, count = np.asarray(self._progress.numpy(), np.float64)
            self._loop.resume_at(int(epoch), int(step), loss_sum, count)

    def _backup(self, epoch: int, step: int) -> None:
        loss_sum, count = self._loop.epoch_totals()
        self._progress.assign(np.array([epoch, step, loss_sum, count], np.float64))
        self.manager.save()
        forget_save("checkpoint", self.backup_dir)  # the record below says it better
        record_save("backup", self.backup_dir, f"step {self._loop.global_step} in {self.backup_dir}",
                    "run the same command again: BackupAndRestore resumes from it")

    @accepts(batch=Annotated[int, NonNegative()])
    def backup_now(self, batch: int) -> None:
        """Back up at the end of step ``batch`` of the current epoch, as the periodic backups
        do (call it from ``on_train_batch_end`` on every rank, e.g. when the job is told it
        will be preempted); a restart resumes after that step."""
        self._backup(self._loop.epoch, batch + 1)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.save_freq != "epoch" and self._loop.global_step % self.save_freq == 0:
            self.backup_now(batch)

    @accepts(epoch=Annotated[int, NonNegative()])
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.save_freq == "epoch":
            self._backup(epoch + 1, 0)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.delete_checkpoint and self.strategy.extended.should_checkpoint:  # the writer
            shutil.rmtree(self.backup_dir, ignore_errors=True)
        release(self.backup_dir)  # after the delete: no other run starts on half a directory
        if self.delete_checkpoint:
            _barrier(self.strategy)


def _barrier(strategy: Strategy) -> None:
    extended = strategy.extended
    comm = extended.communicator
    if comm is not None and comm.size > 1:
        # a strategy across ranks always has its CommunicationOptions
        comm.barrier(timeout=extended.communication_options.timeout_seconds)  # type: ignore[union-attr]
