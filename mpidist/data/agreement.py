"""What the workers agree on when a distributed dataset is created.

Two things, in one tiny all-reduce (five int64, MAX) so that creating a distributed dataset
costs one collective, as the seed broadcast alone did before:

* the shuffle seed: the chief's random seed, for shuffles the user left unseeded;
* whether every worker will run the same number of steps. The caller claims a step count
  where it can prove one cheaply (AUTO/DATA over an in-memory source: its cardinality), else
  nothing. Only when every worker claims the same count can the per-step end-of-data agreement
  be skipped. Workers that claim different counts (each rank read its own file, say) fall back
  to the per-step agreement, as TensorFlow's multi-worker iterators always run it: every rank
  gets the right batches and stops at the same step (spec 7.1 / 7.5), and a warning says what
  DATA sharding of different datasets means.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import TYPE_CHECKING

import numpy as np

from mpidist.core.user_calls import user_call

if TYPE_CHECKING:
    from collections.abc import Hashable
    from types import FrameType

    from mpidist.data.distributed import InputWorkers

__all__ = ["Agreement", "agree"]

_UNPROVEN = -3  # below INFINITE (-1) and UNKNOWN (-2) cardinality: "no claim"


@dataclasses.dataclass(frozen=True)
class Agreement:
    seed: int
    same_steps: bool  # every worker proved the same number of steps
    steps: int | None = None  # the job's number of steps where every worker proved its own, else None


def agree(workers: InputWorkers, api: str, steps: int | None = None, rows: int | None = None,
          **fields: Hashable) -> Agreement:
    """The seed and the step agreement for a distributed dataset made by ``api``.

    Args:
        workers: the InputWorkers.
        api: the public call, for collective labels and messages.
        steps: the number of steps this worker will run, where it is proven (a cardinality,
            INFINITE_CARDINALITY included), else None.
        rows: the source's element count behind ``steps`` (to tell workers whose datasets
            differ even where their step counts agree), or None.
        fields: the user's arguments that every worker must agree on (the collective's
            fingerprint checks them).
    """
    seed = int(np.frombuffer(os.urandom(8), dtype=np.uint64)[0] >> np.uint64(1))
    if not workers.multi_worker:
        return Agreement(seed, steps is not None, steps)
    mine = [_UNPROVEN if steps is None else int(steps),
            _UNPROVEN if rows is None or steps is None else int(rows)]
    buf = np.array([seed if workers.worker_index == 0 else 0,
                    mine[0], -mine[0], mine[1], -mine[1]], dtype=np.int64)
    with user_call(api, **fields):
        # multi_worker: comm is set
        workers.comm.all_reduce(buf, "max", timeout=workers.timeout_seconds)  # type: ignore[union-attr]
        seed = int(buf[0])
        lo_steps, hi_steps, lo_rows, hi_rows = -buf[2], buf[1], -buf[4], buf[3]
        proven = lo_steps != _UNPROVEN
        if proven and (lo_steps != hi_steps or lo_rows != hi_rows):
            # Every worker sees the same totals, so every worker makes this call.
            table = workers.comm.all_gather(np.array([mine], dtype=np.int64),  # type: ignore[union-attr]
                                            timeout=workers.timeout_seconds)
            if workers.worker_index == 0:
                warnings.warn(_differing_datasets(api, table), UserWarning,
                              stacklevel=_user_stacklevel())
    if not proven:
        return Agreement(seed, False)
    # The job runs until the longest worker ends; one infinite worker makes it infinite (-1).
    return Agreement(seed, lo_steps == hi_steps, -1 if lo_steps == -1 else int(hi_steps))


def _differing_datasets(api: str, table: np.ndarray) -> str:
    per_rank = "; ".join(f"rank {r}: {_count(s)} step(s) from {n} source element(s)"
                         for r, (s, n) in enumerate(table.tolist()))
    return (
        f"{api}: the workers' datasets differ ({per_rank}), but the auto-shard policy is "
        "AUTO/DATA, which expects the same dataset on every worker and keeps each worker's "
        "share of every global batch, so each worker uses only part of its own data. Every "
        "worker stops at the same step (a worker out of data gets empty batches until all are). "
        "If each worker reads its own data, set options.experimental_distribute."
        "auto_shard_policy = AutoShardPolicy.OFF (dataset.with_options(options)), or use "
        "strategy.distribute_datasets_from_function.")


def _user_stacklevel() -> int:
    """The stacklevel, for a warning issued in the caller, of the first frame outside mpidist:
    the warning then points at the user's line."""
    frame: FrameType | None
    level, frame = 2, sys._getframe(2)  # frame 2 (agree's caller) is stacklevel 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mpidist."):
        level, frame = level + 1, frame.f_back
    return level


def _count(steps: int) -> str:
    return "infinitely many" if steps == -1 else str(steps)
