"""What the workers agree on when a distributed dataset is created.

Four things, in one tiny all-reduce (nine int64, MAX) so that creating a distributed dataset
costs one collective, as the seed broadcast alone did before:

* the shuffle seed: the chief's random seed, for shuffles the user left unseeded;
* whether every worker will run the same number of steps. The caller claims a step count
  where it can prove one cheaply (AUTO/DATA over an in-memory source: its cardinality), else
  nothing. Only when every worker claims the same count can the per-step end-of-data agreement
  be skipped. Workers that claim different counts (each rank read its own file, say) fall back
  to the per-step agreement, as TensorFlow's multi-worker iterators always run it: every rank
  gets the right batches and stops at the same step (spec 7.1 / 7.5), and a warning says what
  DATA sharding of different datasets means;
* for DATA sharding, which keeps each worker's share of every global batch of its own pipeline,
  that the workers build the same sequence: a digest of the explicit shuffle seeds and of a
  sample of an in-memory source. A shuffle seeded with the rank, or each rank's own slice of
  the data, would lose some rows and repeat others without a word; it gets the warning above
  (TF's DATA sharding gives the same answer, silently);
* that FILE sharding splits the same list on every worker: a digest of the file names (or
  source elements) in the order they are split, without their directories (a node may read
  its own copy of the files). Each worker reads every W-th of its own list,
  so lists that differ (a rank whose glob missed the newest file, Horovod's habit of globbing
  each rank's own files) would silently lose or repeat data: that is an error on every rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import warnings
from typing import TYPE_CHECKING

import numpy as np

from mpidist.core.user_calls import user_call
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence
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
          split: Sequence[str] | None = None, split_by: str = "FILE",
          order: Sequence[str] | None = None, **fields: Hashable) -> Agreement:
    """The seed and the step agreement for a distributed dataset made by ``api``.

    Args:
        workers: the InputWorkers.
        api: the public call, for collective labels and messages.
        steps: the number of steps this worker will run, where it is proven (a cardinality,
            INFINITE_CARDINALITY included), else None.
        rows: the source's element count behind ``steps`` (to tell workers whose datasets
            differ even where their step counts agree), or None.
        split: what FILE sharding splits among the workers, in order (file names), which
            must be the same on every worker; None where nothing is split or it is unknown.
        split_by: the auto-shard policy in effect, for the message.
        order: what decides the order and content of the elements a worker sharding by
            DATA splits (``dataset.order_units``), which should be the same on every worker;
            None where nothing is split by DATA.
        fields: the user's arguments that every worker must agree on (the collective's
            fingerprint checks them).
    """
    seed = int(np.frombuffer(os.urandom(8), dtype=np.uint64)[0] >> np.uint64(1))
    if not workers.multi_worker:
        return Agreement(seed, steps is not None, steps)
    mine = [_UNPROVEN if steps is None else int(steps),
            _UNPROVEN if rows is None or steps is None else int(rows),
            _UNPROVEN if split is None else _digest(split),
            _UNPROVEN if order is None else _digest(order)]
    buf = np.array([seed if workers.worker_index == 0 else 0,
                    mine[0], -mine[0], mine[1], -mine[1], mine[2], -mine[2], mine[3], -mine[3]],
                   dtype=np.int64)
    with user_call(api, **fields):
        # multi_worker: comm is set
        workers.comm.all_reduce(buf, "max", timeout=workers.timeout_seconds)  # type: ignore[union-attr]
        seed = int(buf[0])
        lo_steps, hi_steps, lo_rows, hi_rows = -buf[2], buf[1], -buf[4], buf[3]
        if -buf[6] != buf[5]:  # every worker sees the same, so every worker raises
            _raise_differing_splits(workers, api, split, split_by)
        proven = lo_steps != _UNPROVEN
        orders_differ = bool(-buf[8] != buf[7])
        if orders_differ or (proven and (lo_steps != hi_steps or lo_rows != hi_rows)):
            # Every worker sees the same totals, so every worker makes this call.
            table = workers.comm.all_gather(np.array([mine[:2]], dtype=np.int64),  # type: ignore[union-attr]
                                            timeout=workers.timeout_seconds)
            if workers.worker_index == 0:
                warnings.warn(_differing_datasets(api, table, orders_differ), UserWarning,
                              stacklevel=_user_stacklevel())
    if not proven:
        return Agreement(seed, False)
    # The job runs until the longest worker ends; one infinite worker makes it infinite (-1).
    return Agreement(seed, lo_steps == hi_steps, -1 if lo_steps == -1 else int(hi_steps))


def _digest(split: Sequence[str]) -> int:
    """63 bits of a hash of the names in order, without their directories (each node may read
    its own copy of the files, from a directory of its own): nonnegative, above the
    _UNPROVEN sentinel."""
    names = "\0".join(os.path.basename(name) for name in split)
    h = hashlib.blake2b(names.encode(errors="surrogateescape"), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1


_SUMMARY_BYTES = 512  # each worker's line in the error: count, first and last names


def _raise_differing_splits(workers: InputWorkers, api: str, split: Sequence[str] | None,
                            split_by: str) -> None:
    line = "no list known before reading" if split is None else _summary(split)
    mine = np.zeros((1, _SUMMARY_BYTES), dtype=np.uint8)
    raw = line.encode(errors="replace")[:_SUMMARY_BYTES]
    mine[0, :len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    table = workers.comm.all_gather(mine, timeout=workers.timeout_seconds)  # type: ignore[union-attr]
    lines = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in table]
    per_rank = "; ".join(f"worker {w}: {text}" for w, text in enumerate(lines))
    W = workers.num_workers  # noqa: N806 - the docs' W
    raise InvalidArgumentError(
        f"{api}: the workers list different files for {split_by} auto-sharding, which splits "
        f"one list among the {W} workers (worker w reads names w, w+{W}, ...), so rows would "
        f"be lost or read twice: {per_rank}. Every worker must list the same files in the same "
        "order (list every file, not this rank's; let all files exist before the job starts). "
        "If each worker reads its own files on purpose, set options.experimental_distribute."
        "auto_shard_policy = AutoShardPolicy.OFF (dataset.with_options(options)), or use "
        "strategy.distribute_datasets_from_function.")


def _summary(split: Sequence[str]) -> str:
    n = len(split)
    if n == 0:
        return "0 files"
    names = split[0] if n == 1 else f"{split[0]} ... {split[-1]}"
    head = f"{n} file(s): {names}"
    if len(head.encode(errors="replace")) <= _SUMMARY_BYTES:
        return head
    return f"{n} file(s), digest {_digest(split):016x}"


def _differing_datasets(api: str, table: np.ndarray, orders_differ: bool) -> str:
    per_rank = "; ".join(f"rank {r}: {_count(s)} step(s) from {_count(n)} source element(s)"
                         for r, (s, n) in enumerate(table.tolist()))
    order = (" and give their elements in a different order or with different content (a "
             "shuffle seeded differently on each worker, e.g. seed=rank, or each worker's own "
             "slice of the data: use one seed everywhere, or none, and give every worker all "
             "the data)") if orders_differ else ""
    return (
        f"{api}: the workers' datasets differ ({per_rank}){order}, but the auto-shard policy is "
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
    if steps == _UNPROVEN:
        return "an unknown number of"
    return "infinitely many" if steps == -1 else str(steps)
