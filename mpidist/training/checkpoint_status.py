"""What ``Checkpoint.restore`` returns: the status of a restore, kept up to date as deferred
values go into variables created after it (``deferred_restore``).

Every method is a restore point: it first assigns pending values to the variables that have
appeared since, then checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from mpidist.training.deferred_restore import PendingRestore

__all__ = ["CheckpointLoadStatus", "InitializationOnlyStatus", "SAVE_COUNTER_KEY"]

SAVE_COUNTER_KEY = "save_counter"


def _listing(keys: Iterable[str], limit: int = 10) -> str:
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


class CheckpointLoadStatus:
    """What ``Checkpoint.restore`` matched, live: checks for the caller to make.

    ``restored``: the keys assigned so far (at ``restore()`` and since, into variables created
    later); ``unused``: values in the file that no variable has taken yet (they go into
    variables created later at their keys, e.g. a fresh optimizer's slots); ``unmatched``:
    variables reachable now that the file has no value for (they keep their values).
    """

    def __init__(self, record: PendingRestore,
                 walk: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        self._record = record
        self._walk = walk

    @property
    def path(self) -> str:
        return self._record.path

    @property
    def restored(self) -> tuple[str, ...]:
        return tuple(self._record.restored)

    @property
    def unused(self) -> tuple[str, ...]:
        return tuple(self._record.pending)

    @property
    def unmatched(self) -> tuple[str, ...]:
        saved = self._record.saved_keys
        return tuple(key for key, _ in self._walk() if key not in saved)

    def run_restore_ops(self, session: object = None) -> None:
        """Assign the values still pending to the variables that have their keys now (TF's
        name; in TF eager mode assignment already did it). Call it after attaching objects
        created after ``restore()`` if you use them before the next restore point."""
        if session is not None:
            raise TypeError(f"run_restore_ops takes no session (there are no graphs here), got "
                            f"{session!r}; call run_restore_ops().")
        self._record.apply()

    def _problems(self, pending: bool = True, unmatched: bool = True) -> list[str]:
        self._record.apply()
        problems: list[str] = []
        if pending and self._record.pending:
            problems.append(
                "values in the checkpoint that no variable has taken yet: "
                f"{_listing(self._record.pending)} (they go into the variables created later "
                "at these keys: create them, e.g. build the optimizer's slots with "
                "optimizer.build(variables) or one apply_gradients)")
        if self._record.conflicts:
            problems.append("values that did not fit the variables created for them: "
                            + "; ".join(self._record.conflicts.values()))
        missing = self.unmatched if unmatched else ()
        if missing:
            problems.append(f"variables the checkpoint has no value for (they keep their "
                            f"values): {_listing(missing)}")
        return problems

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Raise AssertionError unless every saved value has gone into a variable and every
        reachable variable got a value. Returns self."""
        problems = self._problems()
        if problems:
            raise AssertionError(
                f"Checkpoint {self.path!r} did not match the objects exactly: "
                + "; ".join(problems) + ". Call assert_existing_objects_matched() or "
                "expect_partial() instead where a partial restore is intended."
            )
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Raise AssertionError if a reachable variable got no value, or did not fit the value
        saved for it (values waiting for variables not created yet are fine). Returns self."""
        problems = self._problems(pending=False)
        if problems:
            raise AssertionError(
                f"Checkpoint {self.path!r} does not match the existing objects: "
                + "; ".join(problems) + ". Pass the objects that were saved, with the same "
                "names and shapes."
            )
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Raise AssertionError if nothing but the save counter was restored. Returns self."""
        self._record.apply()
        if not any(k != SAVE_COUNTER_KEY for k in self._record.restored):
            raise AssertionError(
                f"Nothing but the save counter was restored from {self.path!r}: no tracked "
                "variable has a key in the checkpoint (compare the keys you pass to Checkpoint "
                "with the checkpoint's keys)."
            )
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Mark a partial restore as intended (TF silences warnings); returns self. Values
        still pending keep waiting for their variables, as in TF."""
        self._record.apply()
        return self

    def __repr__(self) -> str:
        return (f"<CheckpointLoadStatus {self.path!r}: {len(self._record.restored)} restored, "
                f"{len(self._record.pending)} pending>")


class InitializationOnlyStatus:
    """The status of ``restore(None)``: nothing was restored, and every assertion says so."""

    path: str | None = None
    restored: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()

    def assert_consumed(self) -> NoReturn:
        raise AssertionError(
            "No checkpoint specified (save_path=None); nothing is being restored. Pass a "
            "checkpoint's path, e.g. mpidist.train.latest_checkpoint(directory), and check "
            "for None before asserting.")

    assert_existing_objects_matched = assert_nontrivial_match = assert_consumed

    def run_restore_ops(self, session: object = None) -> None:
        return None

    def expect_partial(self) -> InitializationOnlyStatus:
        return self
