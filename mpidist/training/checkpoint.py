"""``mpidist.train.Checkpoint`` and ``CheckpointManager``: save and restore variables.

What is saved follows TensorFlow (spec section 4.5): one value per variable, whatever the
strategy. A MirroredVariable saves ``strategy.extended.read_var(var)`` (replica 0's copy), a
SyncOnReadVariable its cross-replica aggregate (SUM / MEAN / ONLY_FIRST_REPLICA), a plain
Variable its value. Restoring assigns the saved value in cross-replica context, so the same
file restores under any strategy and any number of replicas.

The file is a zip of ``.npy`` members (``numpy.load(path, allow_pickle=False)`` reads it): a
JSON manifest (format version, save counter, and per key the dtype, shape and SHA-256 of the
bytes) and one array per variable. Reading it never unpickles: headers are checked against the
manifest, only bool / integer / float / complex dtypes are accepted, every checksum is verified
before anything is assigned. Files are written atomically (temporary file in the same
directory, fsync, rename, fsync of the directory) and, under MultiWorkerMirroredStrategy, only
where ``strategy.extended.should_checkpoint`` is True; every rank must call ``save`` (reading
a SyncOnRead variable is a collective, and the ranks meet before and after writing), and
``save`` returns on every rank only once the file is complete. The public calls run under
``user_call`` labels, so a collective mismatch names ``Checkpoint.save``, not an all-gather.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mpidist.backend import as_array
from mpidist.core import state
from mpidist.core.durable import remove_file
from mpidist.core.saves import record_save
from mpidist.core.signatures import accepts
from mpidist.core.user_calls import user_call
from mpidist.errors import InvalidArgumentError
from mpidist.training.checkpoint_format import (
    STATE_FILENAME,
    State,
    latest_checkpoint,
    path_argument,
    read_checkpoint_file,
    read_state,
    write_checkpoint_file,
    write_state,
)
from mpidist.training.chief_writes import ChiefWrites
from mpidist.training.checkpoint_status import (
    SAVE_COUNTER_KEY,
    CheckpointLoadStatus,
    InitializationOnlyStatus,
)
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.training.deferred_restore import PendingRestore
from mpidist.training.restore_agreement import agree_on_restore
from mpidist.values.distributed_variables import is_distributed_variable
from mpidist.values.variables import Variable

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy

__all__ = ["Checkpoint", "CheckpointLoadStatus", "CheckpointManager", "Trackable",
           "latest_checkpoint"]


class Trackable(Protocol):
    """What a Checkpoint saves besides variables: any object with this method (a model's
    ``ModelVariables``, an optimizer, a metric, a user's own class). The method keeps
    TensorFlow's name, underscore included, so objects written for ``tf.train.Checkpoint``
    carry over; it is a protocol the user implements, not a private member."""

    def _checkpoint_dependencies(self) -> dict[str, Any]:
        """``{name: variable | trackable | dict / list / tuple of them}``: what to save under
        this object's key, each under ``key/name``."""


# -- Arguments ----------------------------------------------------------------------------------
def _no_options(options: Any, method: str) -> None:
    if options is not None:
        raise NotImplementedError(
            f"{method} takes no `options` (TensorFlow's CheckpointOptions have no meaning here); "
            "leave it None."
        )


def _require_cross_replica(method: str) -> None:
    mode = state.current_mode()
    if mode.replica_context is not None and not mode.is_default:
        raise RuntimeError(
            f"Checkpoint.{method} must be called in cross-replica context: call it outside the "
            "function given to strategy.run (e.g. after the step returns)."
        )


def _is_trackable(obj: Any) -> bool:
    return not isinstance(obj, type) and callable(getattr(obj, "_checkpoint_dependencies", None))


def _not_checkpointable(key: str, obj: Any) -> TypeError:
    return TypeError(
        f"Checkpoint cannot save {key!r}: it is a {type(obj).__name__}, neither an "
        "mpidist.Variable nor a trackable object. Pass variables (wrap arrays in "
        "mpidist.Variable), dicts / lists of them, or objects with a "
        "`_checkpoint_dependencies()` method returning {name: variable or trackable}."
    )


def _escape(name: object) -> str:
    """A path component: '/' and '%' are percent-encoded so that keys stay unambiguous."""
    return str(name).replace("%", "%25").replace("/", "%2F")


# -- The object graph ---------------------------------------------------------------------------
def _walk(items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``[(key, variable)]`` reachable from ``items`` (``(name, object)`` pairs), in order.

    A component of a distributed variable stands for the variable; a ShardedVariable is one
    variable (saved as one full-shape array, so any shard count restores it). The same
    variable may appear under several keys; two different variables under one key are an error.
    """
    found: list[tuple[str, Any]] = []
    owner: dict[str, Any] = {}

    def visit(key: str, obj: Any, ancestors: frozenset[int]) -> None:
        if isinstance(obj, (Variable, ShardedVariable)):
            container = obj.distributed_container if isinstance(obj, Variable) else None
            var = container if container is not None else obj
            previous = owner.get(key)
            if previous is None:
                owner[key] = var
                found.append((key, var))
            elif previous is not var:
                raise ValueError(
                    f"Two different variables ({previous.name!r} and {var.name!r}) have the "
                    f"checkpoint key {key!r}; give them different names in "
                    "_checkpoint_dependencies()."
                )
            return
        if obj is None:
            return  # an attribute not created yet: nothing to save
        if id(obj) in ancestors:
            return  # a cycle in the object graph
        if isinstance(obj, dict):
            children = [(_escape(k), v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            children = [(str(i), v) for i, v in enumerate(obj)]
        elif _is_trackable(obj):
            deps = obj._checkpoint_dependencies()
            if not isinstance(deps, dict):
                raise TypeError(
                    f"{type(obj).__name__}._checkpoint_dependencies() (at {key!r}) returned a "
                    f"{type(deps).__name__}; it must return a dict {{name: variable or trackable}}."
                )
            children = [(_escape(k), v) for k, v in deps.items()]
        else:
            raise _not_checkpointable(key, obj)
        inner = ancestors | {id(obj)}
        for name, child in children:
            visit(f"{key}/{name}", child, inner)

    for name, obj in items:
        visit(name, obj, frozenset())
    return found


def _strategies(variables: Iterable[Any]) -> list[Strategy]:
    """The non-default strategies of ``variables`` and the current one, without repeats."""
    found: list[Strategy] = []

    def add(strategy: Strategy | None) -> None:
        if strategy is not None and not strategy.is_default \
                and all(strategy is not s for s in found):
            found.append(strategy)

    for var in variables:
        add(var.distribute_strategy)
    mode = state.current_mode()
    if not mode.is_default:
        add(mode.strategy)
    return found


# -- Values -------------------------------------------------------------------------------------
def _read_for_save(key: str, var: Any) -> np.ndarray[Any, Any]:
    """The host array that ``var`` saves (spec 4.5), in its strategy's cross-replica context."""
    strategy = var.distribute_strategy
    try:
        if strategy is None or isinstance(var, ShardedVariable):  # its shards read themselves
            value = var.numpy()
        else:
            value = as_array(strategy.extended.read_var(var))
    except ValueError as exc:
        raise ValueError(
            f"Cannot save checkpoint key {key!r} (variable {var.name!r}): {exc}") from exc
    arr = np.asarray(value)
    if arr.dtype.kind not in "biufc":
        raise TypeError(
            f"Cannot save checkpoint key {key!r} (variable {var.name!r}) of dtype {arr.dtype}: "
            "checkpoints hold bool, integer, float and complex arrays only."
        )
    if arr.dtype != var.dtype:
        arr = arr.astype(var.dtype)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _cross_replica_scope(strategy: Strategy) -> contextlib.AbstractContextManager[Any]:
    if state.current_mode().cross_replica is strategy.extended:
        return contextlib.nullcontext()
    return strategy.scope()


def _assign(var: Any, value: Any) -> None:
    """Assign a restored value: every component of a Mirrored one, value / N per component of
    a SyncOnRead SUM one, the value for MEAN / ONLY_FIRST_REPLICA (cross-replica rules)."""
    strategy = var.distribute_strategy
    if strategy is None or not is_distributed_variable(var):
        var.assign(value, read_value=False)
        return
    with _cross_replica_scope(strategy):
        var.assign(value, read_value=False)


# -- Checkpoint ---------------------------------------------------------------------------------
class Checkpoint:
    """Groups variables and trackable objects to save and restore them (``tf.train.Checkpoint``).

    Args:
        root: Optional trackable whose dependencies become top-level keys.
        **kwargs: Each value is a Variable (plain, Mirrored, SyncOnRead), a ShardedVariable
            (saved as one full-shape array: restorable into any number of shards or into a
            plain Variable, and a plain Variable's value restores into it), a trackable object
            (one with ``_checkpoint_dependencies()`` returning ``{name: variable | trackable |
            dict / list / tuple of them}``), or a dict / list / tuple of those. Keys are slash
            paths: ``model/w``, ``optimizer/slots/0/m``.

    Under MultiWorkerMirroredStrategy ``save`` and ``write`` are collective: call them on
    every rank, in the same order; only the worker where ``should_checkpoint`` is True writes.
    ``restore`` is not collective. Values restored before their variables exist are applied
    when the variables are created (``deferred_restore``).
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        if root is not None and not _is_trackable(root):
            raise TypeError(
                f"Checkpoint(root=...) must be a trackable object (with a "
                f"`_checkpoint_dependencies()` method), got a {type(root).__name__}."
            )
        if SAVE_COUNTER_KEY in kwargs:
            raise ValueError(
                "`save_counter` is the checkpoint's own counter and cannot be a keyword of "
                "Checkpoint; name the object differently."
            )
        for name, obj in kwargs.items():
            if not (isinstance(obj, (Variable, ShardedVariable, dict, list, tuple))
                    or _is_trackable(obj)):
                raise _not_checkpointable(name, obj)
        self._root = root
        self._objects = dict(kwargs)
        # the last restore's PendingRestore (values waiting for variables)
        self._pending: PendingRestore | None = None
        self._save_counter = Variable.plain(np.int64(0), trainable=False, name=SAVE_COUNTER_KEY)

    def __getattr__(self, name: str) -> Any:
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"'Checkpoint' object has no attribute {name!r}")

    @property
    def save_counter(self) -> Variable:
        """An int64 Variable: how many times ``save`` has run (saved and restored with the rest)."""
        return self._save_counter

    def _items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = []
        if self._root is not None:
            deps = self._root._checkpoint_dependencies()
            if not isinstance(deps, dict):
                raise TypeError(
                    f"{type(self._root).__name__}._checkpoint_dependencies() returned a "
                    f"{type(deps).__name__}; it must return a dict."
                )
            items.extend((_escape(k), v) for k, v in deps.items())
        items.extend((_escape(k), v) for k, v in self._objects.items())
        items.append((SAVE_COUNTER_KEY, self._save_counter))
        return items

    # -- saving -------------------------------------------------------------------------------
    def save(self, file_prefix: str | os.PathLike[str], options: None = None) -> str:
        """Increment ``save_counter`` and write ``f"{file_prefix}-{save_counter}"``; record it
        as the latest checkpoint in the directory's state file. Returns the path.

        Collective under MultiWorkerMirroredStrategy: call it on every rank, with the same
        objects; only the chief writes (``strategy.extended.should_checkpoint``). Called on
        some ranks only, it raises the collective-mismatch error naming ``Checkpoint.save`` on
        every rank and writes nothing.
        """
        with user_call("Checkpoint.save"):
            _no_options(options, "Checkpoint.save")
            prefix = path_argument(file_prefix, "file_prefix")
            _require_cross_replica("save")
            before = int(self._save_counter.numpy())
            self._save_counter.assign(np.int64(before + 1), read_value=False)
            path = f"{prefix}-{before + 1}"
            try:
                self._write(path, record_state=True)
            except BaseException:
                self._save_counter.assign(np.int64(before), read_value=False)
                raise
            return path

    def write(self, file_prefix: str | os.PathLike[str], options: None = None) -> str:
        """Write the checkpoint to exactly ``file_prefix`` (no counter, no state file);
        returns the path.

        Collective under MultiWorkerMirroredStrategy: call it on every rank; only the chief
        writes.
        """
        with user_call("Checkpoint.write"):
            _no_options(options, "Checkpoint.write")
            path = path_argument(file_prefix, "file_prefix")
            _require_cross_replica("write")
            self._write(path, record_state=False)
            return path

    def _write(self, path: str, record_state: bool) -> ChiefWrites:
        """Read every value (collective for SyncOnRead ones), write where this worker should,
        agree with every rank; returns the ChiefWrites used."""
        if self._pending is not None:
            self._pending.apply()  # a restore point: a variable attached since takes its value
        pairs = _walk(self._items())
        coordination = ChiefWrites(_strategies(var for _, var in pairs))
        coordination.begin()
        values: dict[int, np.ndarray[Any, Any]] = {}
        entries: list[tuple[str, np.ndarray[Any, Any]]] = []
        for key, var in pairs:
            arr = values.get(id(var))
            if arr is None:
                arr = values[id(var)] = _read_for_save(key, var)
            entries.append((key, arr))
        counter = int(self._save_counter.numpy())

        def write() -> None:
            write_checkpoint_file(path, entries, counter)
            if record_state:
                directory = os.path.dirname(path) or os.curdir
                write_state(directory, path, [path], [time.time()])

        coordination.run(f"Writing checkpoint {path!r}", write)
        record_save("checkpoint", os.path.dirname(path) or os.curdir, path,
                    f"checkpoint.restore({path!r}) reads it")
        return coordination

    # -- restoring ----------------------------------------------------------------------------
    def restore(self, save_path: str | os.PathLike[str] | None, options: None = None
                ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restore every tracked variable that has a value in ``save_path`` (and the save
        counter). ``None`` restores nothing. Shapes and dtypes are checked for all keys before
        any variable is assigned. Returns a CheckpointLoadStatus.

        Values for variables that do not exist yet (a fresh optimizer's slots, an attribute
        assigned later) wait and go into those variables when they appear: at slot creation
        (``Optimizer.build`` or the first ``apply_gradients``), at a status method, or at the
        next ``save``. A newer restore replaces what an older one left waiting.

        Each rank reads the file itself. Under a strategy across ranks (MultiWorkerMirrored)
        it is collective: every rank must restore, and the ranks agree on the path and a digest
        of the content (an InvalidArgumentError on every rank names the difference;
        ``training/restore_agreement.py``).
        """
        with user_call("Checkpoint.restore"):
            _no_options(options, "Checkpoint.restore")
            if save_path is None:
                agree_on_restore("Checkpoint.restore", self._strategies(), None)
                return InitializationOnlyStatus()
            path = path_argument(save_path, "save_path")
            _require_cross_replica("restore")
            try:
                manifest, saved = read_checkpoint_file(path)
            except Exception as err:  # the ranks agree on failing alike, then it is raised
                agree_on_restore("Checkpoint.restore", self._strategies(), path, error=err)
                raise
            return self._restore_read(path, manifest, saved)

    def _restore_read(self, path: str, manifest: Mapping[str, Any],
                      saved: dict[str, np.ndarray[Any, Any]]) -> CheckpointLoadStatus:
        """Restore the content of ``path`` that ``read_checkpoint_file`` returned (the ranks
        agree on it first)."""
        agree_on_restore("Checkpoint.restore", self._strategies(), path, manifest)
        items = self._items()
        matched = []
        for key, var in _walk(items):
            if key in saved:
                matched.append((key, var, saved[key]))
        for key, var, arr in matched:
            if arr.shape != tuple(var.shape) or arr.dtype != var.dtype:
                raise ValueError(
                    f"Cannot restore checkpoint key {key!r} from {path!r} into variable "
                    f"{var.name!r}: the checkpoint holds shape {arr.shape} dtype "
                    f"{arr.dtype}, the variable has shape {tuple(var.shape)} dtype "
                    f"{var.dtype}. Nothing was restored; create the variable with the saved "
                    "shape and dtype, or restore a checkpoint of this model."
                )
        assigned = {}
        for _, var, arr in matched:
            if id(var) not in assigned:
                assigned[id(var)] = var
                _assign(var, arr)
        used = {key for key, _, _ in matched}
        _warn_if_nothing_matched(path, saved, used, items)
        roots = [obj for name, obj in items if name != SAVE_COUNTER_KEY]
        record = PendingRestore(
            path, saved, {k: a for k, a in saved.items() if k not in used},
            [k for k, _, _ in matched], walk=lambda: _walk(self._items()), assign=_assign,
            roots=roots, taken=assigned.values())
        record.activate(previous=self._pending)
        self._pending = record
        return CheckpointLoadStatus(record, lambda: _walk(self._items()))

    def _strategies(self) -> list[Strategy]:
        """The strategies of the tracked variables (for the restore agreement)."""
        return _strategies([var for _, var in _walk(self._items())])

    def read(self, save_path: str | os.PathLike[str] | None, options: None = None
             ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restore from a file written by ``write`` (the same as ``restore``; not a
        collective)."""
        with user_call("Checkpoint.read"):
            return self.restore(save_path, options)


def _warn_if_nothing_matched(path: str, saved: Mapping[str, Any], used: set[str],
                             items: Iterable[tuple[str, Any]]) -> None:
    """TF's warning for a restore that matches no key: the file has values and this
    checkpoint has variables, yet none of them share a key (the objects were passed under
    other names, or this is another model's checkpoint). The values still wait for variables
    created later at their keys; a checkpoint with no variables yet is that deferred case and
    is not warned about."""
    if any(k != SAVE_COUNTER_KEY for k in used):
        return
    unmatched = [k for k in saved if k != SAVE_COUNTER_KEY]
    tracked = [k for k, _ in _walk(items) if k != SAVE_COUNTER_KEY]
    if not unmatched or not tracked:
        return
    warnings.warn(
        f"Checkpoint.restore({path!r}) matched no key: the checkpoint holds "
        f"{_keys(unmatched)} and this Checkpoint's variables are at {_keys(tracked)}; only the "
        "save counter was restored. Pass the objects under the names they were saved with "
        "(Checkpoint(model=...) restores what Checkpoint(model=...) saved), or check the path.",
        RuntimeWarning, stacklevel=4)


def _keys(keys: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


# -- CheckpointManager --------------------------------------------------------------------------
def _checkpoint_number(value: Any) -> int:
    if isinstance(value, Variable):
        value = value.numpy()
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"checkpoint_number must be an integer, got {value!r}.")
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
        value = int(value)
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ValueError(
                f"checkpoint_number must be >= 0, got {int(value)}: it becomes the file name's "
                "suffix (ckpt-<n>); pass a step count such as optimizer.iterations.")
        return int(value)
    raise TypeError(
        f"checkpoint_number must be an integer or an integer Variable (e.g. the optimizer's "
        f"iterations), got {value!r}."
    )


class CheckpointManager:
    """Saves a Checkpoint as ``{directory}/{checkpoint_name}-{n}`` and keeps the newest
    ``max_to_keep`` (``tf.train.CheckpointManager``).

    Checkpoints listed in the directory's state file when the manager is created are managed
    too, so a restarted job goes on where it stopped (``restore_or_initialize`` restores the
    save counter, and numbering continues from it).

    Args:
        checkpoint: The ``Checkpoint`` to save and restore.
        directory: Where checkpoints and the state file ``checkpoint`` go.
        max_to_keep: Positive int: older checkpoints are deleted; None keeps all.
        checkpoint_name: File name prefix (default ``"ckpt"``).
        init_fn: Called by ``restore_or_initialize`` when there is no checkpoint.
    """

    def __init__(self, checkpoint: Checkpoint, directory: str | os.PathLike[str],
                 max_to_keep: int | None, keep_checkpoint_every_n_hours: None = None,
                 checkpoint_name: str = "ckpt", step_counter: None = None,
                 checkpoint_interval: None = None, init_fn: Callable[[], object] | None = None
                 ) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"CheckpointManager needs an mpidist.train.Checkpoint, got a "
                f"{type(checkpoint).__name__}: wrap your objects, Checkpoint(model=..., ...)."
            )
        directory = path_argument(directory, "directory")
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or
                                        not isinstance(max_to_keep, (int, np.integer))
                                        or max_to_keep <= 0):
            raise ValueError(
                f"Expected a positive integer or `None` for `max_to_keep`, got {max_to_keep!r}."
            )
        for name, value in (("keep_checkpoint_every_n_hours", keep_checkpoint_every_n_hours),
                            ("step_counter", step_counter),
                            ("checkpoint_interval", checkpoint_interval)):
            if value is not None:
                raise NotImplementedError(
                    f"CheckpointManager does not support {name}; leave it None and call save() "
                    "when a checkpoint is due."
                )
        if not isinstance(checkpoint_name, str) or not checkpoint_name \
                or os.sep in checkpoint_name or checkpoint_name == STATE_FILENAME:
            raise ValueError(
                f"checkpoint_name must be a non-empty file name without '{os.sep}' and other "
                f"than {STATE_FILENAME!r}, got {checkpoint_name!r}."
            )
        if init_fn is not None and not callable(init_fn):
            raise TypeError(f"init_fn must be callable or None, got {init_fn!r}.")
        self._checkpoint = checkpoint
        self._directory = directory
        self._max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self._prefix = os.path.join(directory, checkpoint_name)
        self._init_fn = init_fn
        self._name = checkpoint_name
        self._kept: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._latest: str | None = None  # path -> timestamp above, oldest first
        recovered = _read_state_or_scan(directory, checkpoint_name)
        for path, stamp in zip(recovered.paths, recovered.timestamps):
            self._kept[path] = stamp
        self._latest = recovered.latest

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def latest_checkpoint(self) -> str | None:
        """The path of the newest checkpoint, or None."""
        return self._latest

    @property
    def checkpoints(self) -> list[str]:
        """The kept checkpoints' paths, oldest first."""
        return list(self._kept)

    @accepts(check_interval=bool)
    def save(self, checkpoint_number: Any = None, check_interval: bool = True,
             options: Any = None) -> str:
        """Save a new checkpoint (numbered ``checkpoint_number``, else the incremented save
        counter), delete the oldest beyond ``max_to_keep`` and update the state file.
        Returns the path.

        Collective under MultiWorkerMirroredStrategy: call it on every rank; only the chief
        writes and deletes files. Called on some ranks only, it raises the collective-mismatch
        error naming ``CheckpointManager.save`` on every rank and writes nothing.
        """
        with user_call("CheckpointManager.save"):
            _no_options(options, "CheckpointManager.save")
            _require_cross_replica("save")
            number = None if checkpoint_number is None else _checkpoint_number(checkpoint_number)
            return self._save(number)

    def _save(self, number: int | None) -> str:
        counter = self._checkpoint.save_counter
        before = int(counter.numpy())
        counter.assign(np.int64(before + 1), read_value=False)
        path = f"{self._prefix}-{before + 1 if number is None else number}"
        kept = collections.OrderedDict(self._kept)
        kept.pop(path, None)
        kept[path] = time.time()
        doomed: list[str] = []
        while self._max_to_keep is not None and len(kept) > self._max_to_keep:
            doomed.append(kept.popitem(last=False)[0])

        def publish_then_sweep() -> None:
            # The state names the new checkpoint before any old one is deleted: a writer
            # killed between any two file operations leaves a state whose files all exist.
            write_state(self._directory, path, list(kept), list(kept.values()))
            for old in doomed:
                try:
                    remove_file(old)
                except OSError as exc:  # published already: the save itself succeeded
                    warnings.warn(
                        f"CheckpointManager.save: the old checkpoint {old!r} could not be "
                        f"deleted ({exc.strerror}); the state no longer lists it. Delete it by "
                        "hand.", RuntimeWarning, stacklevel=4)

        try:
            coordination = self._checkpoint._write(path, record_state=False)
            # After the first agreement every rank has finished any earlier restore, so
            # deleting an old checkpoint cannot pull a file from under a slower rank.
            coordination.run(f"Recording checkpoint {path!r} in {self._directory!r}",
                             publish_then_sweep)
        except BaseException:
            counter.assign(np.int64(before), read_value=False)
            raise
        self._kept, self._latest = kept, path
        return path

    def restore_or_initialize(self) -> str | None:
        """Restore the latest checkpoint and return its path; without one call ``init_fn``
        (if given) and return None.

        Where the latest checkpoint is missing or damaged, the newest complete one is restored
        instead, with a RuntimeWarning naming both (see ``restore_newest``).

        Collective under a strategy across ranks: the ranks agree on the latest checkpoint (or
        none) and on its content before restoring (call this on every rank).
        """
        with user_call("CheckpointManager.restore_or_initialize"):
            restored = self._restore_newest("CheckpointManager.restore_or_initialize")
            if restored is not None:
                return restored[0]
            if self._init_fn is not None:
                self._init_fn()
            return None

    def restore_newest(self, prepare: Callable[[], object] | None = None
                       ) -> tuple[str, CheckpointLoadStatus] | None:
        """Restore the newest complete checkpoint; ``(its path, the load status)``, or None
        when the directory holds none. ``prepare()``, if given, runs once a checkpoint has been
        read and checked, just before its values are assigned (e.g. to build an optimizer's
        slots so that they take theirs).

        The candidates, newest first: the state's latest, the other kept ones, then files
        named ``<checkpoint_name>-<n>`` that the state does not list (highest ``n`` first). A
        candidate that is missing or fails its checks is skipped with a RuntimeWarning naming
        it and why; if every candidate fails, InvalidArgumentError lists them all and nothing
        is restored. Collective under a strategy across ranks, like ``Checkpoint.restore``.
        """
        with user_call("CheckpointManager.restore_newest"):
            return self._restore_newest("CheckpointManager.restore_newest", prepare)

    def _restore_newest(self, call: str, prepare: Callable[[], object] | None = None
                        ) -> tuple[str, CheckpointLoadStatus] | None:
        agree_on_restore(call, self._checkpoint._strategies(), self._latest)  # all or none try
        skipped: list[tuple[str, str]] = []
        for path in self._candidates():
            try:
                manifest, saved = read_checkpoint_file(path)
            except (FileNotFoundError, InvalidArgumentError) as exc:
                skipped.append((path, _first_sentence(exc)))
                continue
            if skipped:
                warnings.warn(
                    f"CheckpointManager: restored {path!r}, the newest complete checkpoint in "
                    f"{self._directory!r}, because newer ones could not be: "
                    + "; ".join(f"{p!r}: {why}" for p, why in skipped) + ".",
                    RuntimeWarning, stacklevel=4)
            if prepare is not None:
                prepare()
            return path, self._checkpoint._restore_read(path, manifest, saved)
        if skipped:
            raise InvalidArgumentError(
                f"CheckpointManager: no checkpoint in {self._directory!r} can be restored: "
                + "; ".join(f"{p!r}: {why}" for p, why in skipped)
                + ". Nothing was restored. Restore from a copy of the directory, or delete it "
                "to start afresh.")
        return None

    def _candidates(self) -> Iterator[str]:
        """Newest first; the directory is listed only once every listed checkpoint failed."""
        listed = ([] if self._latest is None else [self._latest]) + [
            p for p in reversed(self._kept) if p != self._latest]
        yield from listed
        known = {os.path.abspath(p) for p in listed}
        for _, path in reversed(_numbered_files(self._directory, self._name)):
            if os.path.abspath(path) not in known:
                yield path


def _first_sentence(exc: BaseException) -> str:
    text = str(exc)
    return text.split(". ", 1)[0] if ". " in text else text


def _numbered_files(directory: str, name: str) -> list[tuple[int, str]]:
    """``[(n, path)]`` of the files ``<name>-<n>`` in ``directory``, lowest ``n`` first."""
    pattern = re.compile(re.escape(name) + r"-([0-9]+)")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in names
             if (m := pattern.fullmatch(n)) and os.path.isfile(os.path.join(directory, n))]
    return sorted(found)


def _read_state_or_scan(directory: str, name: str) -> State:
    """The directory's state file; where it is damaged, the numbered checkpoint files found
    there stand in (with a RuntimeWarning): the checkpoints themselves are intact."""
    try:
        found = read_state(directory)
    except InvalidArgumentError as exc:
        files = _numbered_files(directory, name)
        warnings.warn(f"CheckpointManager: {_first_sentence(exc)}; using the {len(files)} "
                      f"checkpoint files named {name}-<n> found in {directory!r} instead.",
                      RuntimeWarning, stacklevel=4)
        paths = [p for _, p in files]
        return State(paths[-1] if paths else None, paths,
                     [os.path.getmtime(p) for p in paths])
    return found if found is not None else State(None, [], [])
