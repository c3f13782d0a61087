"""What this process last saved, for the line it prints when it is stopped (Ctrl-C, SIGTERM):
a user who interrupts a run wants to know what survives and how to resume, not a traceback.

The writers record each save once it is complete (a checkpoint on disk, a backup published);
``saves_summary`` says what the latest of each kind and directory holds (the three newest),
how long ago, and how to resume.
"""

from __future__ import annotations

import dataclasses
import threading
import time

__all__ = ["record_save", "forget_save", "saves_summary"]


@dataclasses.dataclass(frozen=True)
class _Save:
    kind: str
    what: str
    resume: str
    at: float


_lock = threading.Lock()
_latest: dict[tuple[str, str], _Save] = {}  # by (kind, directory): the latest save of each


def record_save(kind: str, directory: str, what: str, resume: str) -> None:
    """Note a completed save of ``kind`` ("backup", "checkpoint") in ``directory``: ``what`` it
    holds (``step 40 in DIR``), and how to resume from it (``run the same command again``)."""
    with _lock:
        _latest[(kind, directory)] = _Save(kind, what, resume, time.monotonic())


def forget_save(kind: str, directory: str) -> None:
    """Drop the record of ``kind`` in ``directory`` (a backup's own checkpoint files, which
    the backup's record describes better)."""
    with _lock:
        _latest.pop((kind, directory), None)


def saves_summary() -> str:
    """``last save: <kind> <what>, <n> s ago (<resume>)`` for each kind, or that there is none."""
    with _lock:
        saves = sorted(_latest.values(), key=lambda save: -save.at)
    if not saves:
        return "nothing was saved by this run"
    now = time.monotonic()
    return "; ".join(f"last {save.kind}: {save.what}, {now - save.at:.0f} s ago "
                     f"({save.resume})" for save in saves[:3])
