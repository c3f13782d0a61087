"""Deferred restoration: checkpoint values that no variable took at ``restore()`` time wait for
their variables and go into them when those appear (TensorFlow's deferred restoration).

A ``Checkpoint.restore`` whose file holds values for variables that do not exist yet (the
slots of a fresh optimizer, a model attribute assigned later) keeps those values in a
``PendingRestore``. mpidist cannot see attribute assignments, so the checkpoint walks its
objects again at *restore points* and assigns every pending value whose key a variable now
has:

* when an optimizer registers new variables and creates their slots (``Optimizer.build``,
  also run by the first ``apply_gradients``): it calls ``restore_deferred()``, so slots get
  their saved values before any update reads them;
* when a method of the status that ``restore()`` returned is called
  (``run_restore_ops``, ``assert_*``, ``expect_partial``);
* at the start of ``Checkpoint.save`` / ``write``.

A value goes into the first variable found at its key and is then dropped; one that does not
fit (other shape or dtype) raises a ValueError naming the variable and both shapes, leaves
the variable as it was created, and is not tried again. A newer restore supersedes the
pending values of an older one over the same objects, so restoring many checkpoints in a loop
does not pile up values that nobody takes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["PendingRestore", "restore_deferred"]

_lock = threading.RLock()
_active: list[PendingRestore] = []  # records that still hold values, oldest first


def restore_deferred() -> None:
    """Assign the pending values of every active restore to the variables now reachable.

    Called where variables are created (the optimizer's slots). Costs nothing when no restore
    is pending. Raises ValueError for a value that does not fit its new variable.
    """
    if not _active:
        return
    with _lock:
        records = list(_active)
    errors: list[ValueError] = []
    for record in records:
        try:
            record.apply()
        except ValueError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def _shape_text(arr_shape: Iterable[int], dtype: Any) -> str:
    return f"shape {tuple(arr_shape)} dtype {dtype}"


class PendingRestore:
    """The values of one ``restore()`` that no variable has taken yet.

    Args:
        path: The checkpoint file.
        saved_keys: Every key in the file.
        pending: ``{key: host array}`` still waiting for a variable.
        restored: Keys assigned by ``restore()`` itself.
        walk: ``() -> [(key, variable)]``: the checkpoint's object graph as it is now.
        assign: ``(variable, array) -> None``: a cross-replica assign.
        roots: The checkpoint's top-level objects (a newer restore over all of them
            supersedes this one).
        taken: The variables ``restore()`` assigned (a variable takes one value only).
    """

    def __init__(self, path: str, saved_keys: Iterable[str], pending: Mapping[str, Any],
                 restored: Iterable[str], walk: Callable[[], Iterable[tuple[str, Any]]],
                 assign: Callable[[Any, Any], None], roots: Iterable[object],
                 taken: Iterable[object]) -> None:
        self.path = path
        self.saved_keys = frozenset(saved_keys)
        self.pending = dict(pending)
        self.restored = list(restored)
        self.conflicts: dict[str, str] = {}  # key -> what did not fit
        self._walk = walk
        self._assign = assign
        self._roots = frozenset(id(r) for r in roots)
        self._keep = list(roots)  # keeps the ids above meaningful while this record lives
        self._taken = {id(v): v for v in taken}
        self.active = False

    # -- the registry -------------------------------------------------------------------------
    def activate(self, previous: PendingRestore | None = None) -> None:
        """Start waiting for variables; drops ``previous`` (the same checkpoint's last restore)
        and any older record whose objects this restore covers."""
        with _lock:
            for record in list(_active):
                if record is previous or record._roots <= self._roots:
                    record._deactivate()
            if self.pending:
                self.active = True
                _active.append(self)

    def _deactivate(self) -> None:
        with _lock:
            self.active = False
            if self in _active:
                _active.remove(self)

    # -- restore points -----------------------------------------------------------------------
    def apply(self, pairs: Iterable[tuple[str, Any]] | None = None) -> None:
        """Assign pending values to the variables that have their keys now.

        ``pairs`` is the walk when the caller has it. Values that fit are assigned; then a
        ValueError names those that do not (their variables keep their values).
        """
        if not self.active:
            return
        if pairs is None:
            pairs = self._walk()
        fits: list[tuple[str, Any, Any]] = []
        misfits: list[tuple[str, Any, Any]] = []
        for key, var in pairs:
            arr = self.pending.get(key)
            if arr is None:
                continue
            if id(var) in self._taken:  # the same variable, met under a second key
                del self.pending[key]
                continue
            if arr.shape != tuple(var.shape) or arr.dtype != var.dtype:
                misfits.append((key, var, arr))
            else:
                fits.append((key, var, arr))
        for key, var, arr in fits:
            if id(var) in self._taken:
                continue
            self._assign(var, arr)
            self._taken[id(var)] = var
            self.restored.append(key)
            del self.pending[key]
        for key, var, arr in misfits:
            self.conflicts[key] = (
                f"{key!r}: saved {_shape_text(arr.shape, arr.dtype)}, variable {var.name!r} "
                f"created with {_shape_text(var.shape, var.dtype)}")
            del self.pending[key]
        if not self.pending:
            self._deactivate()
        if misfits:
            key, var, arr = misfits[0]
            more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
            raise ValueError(
                f"Cannot restore checkpoint key {key!r} from {self.path!r} into variable "
                f"{var.name!r}, created after restore(): the checkpoint holds "
                f"{_shape_text(arr.shape, arr.dtype)}, the new variable has "
                f"{_shape_text(var.shape, var.dtype)}{more}. The variable keeps the value it was "
                "created with; create it with the saved shape and dtype (the checkpoint comes "
                "from a different model), or restore a matching checkpoint."
            )
