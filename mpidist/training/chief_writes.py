"""Who writes files under a strategy across ranks, and the agreement on how the write went.

TensorFlow's rule: only the chief (``strategy.extended.should_checkpoint``) writes. Every rank
still takes part: the ranks meet before the write (a save called on some ranks only fails on
every rank, nothing written) and after it, in one small all-gather that reports each rank's
outcome, so no rank returns before the file is complete and a failure on the writer is an
error on every rank. Checkpoints, CheckpointManager's state and BackupAndRestore's claim on
its directory all go through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy

__all__ = ["ChiefWrites"]

_STATUS_BYTES = 1024  # one rank's report in the end-of-write agreement: flag + message


class ChiefWrites:
    """Who writes, and the end-of-save agreement across ranks.

    Only a worker whose strategies all say ``should_checkpoint`` writes. With a multi-worker
    strategy every rank then reports success or failure in one small all-gather on the
    strategy's communicator, which doubles as the barrier: no rank returns before the writer
    has finished, and a failure on the writer raises on every rank.
    """

    def __init__(self, strategies: Iterable[Strategy]) -> None:
        strategies = list(strategies)
        self.should_write = all(s.extended.should_checkpoint for s in strategies)
        self._comm = None
        self._timeout = None
        for s in strategies:
            comm = s.extended.communicator
            if comm is not None:
                self._comm = comm
                options = s.extended.communication_options
                self._timeout = None if options is None else options.timeout_seconds
                break

    def begin(self) -> None:
        """Meet every rank before anything is written: a save that only some ranks call (e.g.
        ``if rank == 0: checkpoint.save(path)``) fails here, on every rank, with the mismatch
        error naming the call, and no file is written."""
        if self._comm is not None and self._comm.size > 1:
            self._comm.barrier(timeout=self._timeout)

    def run(self, what: str, action: Callable[[], object],
            fix: str = "Fix the cause there (disk space, permissions, path) and save again.",
            relay: bool = False) -> None:
        """Run ``action`` where this worker writes; then agree with every rank on the outcome:
        a failure there is raised on every rank (elsewhere as a RuntimeError quoting it, then
        ``fix``; with ``relay``, a RuntimeError with the writer's message itself, which says
        the fix already)."""
        error = None
        if self.should_write:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - reported to every rank, re-raised below
                error = exc
        if self._comm is not None and self._comm.size > 1:
            report = np.zeros((1, _STATUS_BYTES), dtype=np.uint8)
            if error is not None:
                text = f"{type(error).__name__}: {error}".encode("utf-8", "replace")
                report[0, 0] = 1
                report[0, 1:1 + min(len(text), _STATUS_BYTES - 1)] = \
                    np.frombuffer(text[:_STATUS_BYTES - 1], dtype=np.uint8)
            reports = self._comm.all_gather(report, timeout=self._timeout)
            failed = [(rank, bytes(row[1:]).rstrip(b"\0").decode("utf-8", "replace"))
                      for rank, row in enumerate(reports) if row[0]]
            if error is None and failed:
                rank, message = failed[0]
                if relay:  # the writer's own words: "<Type>: <message>"
                    raise RuntimeError(f"{message.split(': ', 1)[-1]} (reported by rank {rank}, "
                                       "the worker that writes)")
                raise RuntimeError(f"{what} failed on rank {rank}: {message}. {fix}".rstrip())
        if error is not None:
            raise error
