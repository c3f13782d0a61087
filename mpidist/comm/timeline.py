"""``MPIDIST_TIMELINE=path``: every collective of every rank in one Chrome trace.

Each rank records, for every collective of its communicator: when it entered, when every rank
had arrived (the end of the fingerprint agreement: before that the rank was *waiting* for
the others), when it finished, and the bytes it moved. At exit each rank writes its events next
to ``path`` and rank 0 merges them into ``path``, a Chrome trace-event JSON that Perfetto
(ui.perfetto.dev) and chrome://tracing open: one process row per rank, a slice per collective
with a nested "wait" slice.

The rank that waits least in a collective arrived last: it is the straggler the others waited
for. Rank 0 prints one summary line saying which rank that was most often, and for how long
the others waited on it. With ``MPIDIST_CHECK_COLLECTIVES=0`` there is no agreement phase,
so a collective's whole duration counts as waiting.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

if TYPE_CHECKING:
    from mpidist.comm.collective_call import CollectiveCall

__all__ = ["Timeline", "summarize"]

_FLUSH_EVERY = 4096  # events kept in memory before a rank appends them to its part file

Event: TypeAlias = tuple[int, str, str, int, int, int, int] | list[Any]
"""One collective of one rank: ``(seq, operation, description, bytes, start, agreed, end)``,
times in microseconds (a list once read back from a part file)."""


def _nbytes(call: CollectiveCall) -> int:
    fields = dict(call.fields)
    dtype, shape = fields.get("dtype"), fields.get("shape")
    if dtype is None or shape is None:
        return 0
    return int(np.dtype(dtype).itemsize * math.prod(shape))


class Timeline:
    """One rank's recorder. At exit every rank calls ``flush()``, then (once all have) rank 0
    calls ``merge()``."""

    def __init__(self, path: str, rank: int, size: int, hosts: Sequence[str]) -> None:
        self.path = os.path.abspath(path)
        self.rank, self.size, self.hosts = rank, size, list(hosts)
        self.parts = self.path + ".parts"
        os.makedirs(self.parts, exist_ok=True)
        self._part = os.path.join(self.parts, f"rank-{rank}.jsonl")
        with open(self._part, "w"):
            pass  # a rerun with the same path starts this rank's part afresh
        self._events: list[Event] = []

    def record(self, seq: int, call: CollectiveCall, start_ns: int, agreed_ns: int,
               end_ns: int) -> None:
        self._events.append((seq, call.operation, call.describe(), _nbytes(call),
                             start_ns // 1000, agreed_ns // 1000, end_ns // 1000))
        if len(self._events) >= _FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Append the events still in memory to this rank's part file."""
        with open(self._part, "a") as fh:
            for event in self._events:
                fh.write(json.dumps(event) + "\n")
        self._events.clear()

    def merge(self) -> str:
        """Rank 0, after every rank flushed: write the trace and print the summary line."""
        summary = write_trace(self.path, self.parts, self.size, self.hosts)
        print(summary, file=sys.stderr, flush=True)
        return summary


def _read_parts(parts: str, size: int) -> dict[int, list[Event]]:
    per_rank: dict[int, list[Event]] = {}
    for rank in range(size):
        path = os.path.join(parts, f"rank-{rank}.jsonl")
        events = []
        if os.path.exists(path):
            with open(path) as fh:
                events = [json.loads(line) for line in fh if line.strip()]
        per_rank[rank] = events
    return per_rank


def summarize(per_rank: Mapping[int, Sequence[Event]]
              ) -> tuple[dict[int, int], dict[int, int], int]:
    """Per collective number, which rank waited least (arrived last) and how long the others
    waited for it: ``(counts per rank, waited-for µs per rank, collectives compared)``."""
    by_seq: dict[int, dict[int, int]] = {}
    for rank, events in per_rank.items():
        for seq, _, _, _, start, agreed, _ in events:
            by_seq.setdefault(seq, {})[rank] = agreed - start
    counts: dict[int, int] = {}
    waited_for: dict[int, int] = {}
    compared = 0
    for waits in by_seq.values():
        if len(waits) < 2:
            continue
        compared += 1
        last = min(waits, key=lambda r: (waits[r], r))
        counts[last] = counts.get(last, 0) + 1
        waited_for[last] = waited_for.get(last, 0) + sum(w - waits[last] for w in waits.values())
    return counts, waited_for, compared


def write_trace(path: str, parts: str, size: int, hosts: Sequence[str]) -> str:
    """Merge the ranks' parts into the Chrome trace at ``path``; returns the summary line."""
    per_rank = _read_parts(parts, size)
    starts = [e[4] for events in per_rank.values() for e in events]
    origin = min(starts) if starts else 0
    trace: list[dict[str, Any]] = []
    for rank, events in per_rank.items():
        trace.append({"name": "process_name", "ph": "M", "pid": rank,
                      "args": {"name": f"rank {rank} ({hosts[rank]})"}})
        trace.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                      "args": {"sort_index": rank}})
        for seq, operation, described, nbytes, start, agreed, end in events:
            args = {"seq": seq, "call": described, "bytes": nbytes, "wait_us": agreed - start}
            trace.append({"name": operation, "cat": "collective", "ph": "X", "pid": rank,
                          "tid": 0, "ts": start - origin, "dur": max(end - start, 0),
                          "args": args})
            if agreed > start:
                trace.append({"name": "wait", "cat": "wait", "ph": "X", "pid": rank, "tid": 0,
                              "ts": start - origin, "dur": agreed - start,
                              "args": {"seq": seq}})
    counts, waited_for, compared = summarize(per_rank)
    total = sum(len(events) for events in per_rank.values())
    if counts:
        straggler = max(counts, key=lambda r: (counts[r], waited_for[r]))
        verdict = (f"straggler: rank {straggler} ({hosts[straggler]}) arrived last in "
                   f"{counts[straggler]} of {compared} collectives; the others waited "
                   f"{waited_for[straggler] / 1000:.3f} ms for it in all")
    else:
        straggler, verdict = None, "no straggler (a single rank)"
    summary = f"mpidist timeline: {path}: {total} collective events on {size} rank(s); {verdict}"
    document = {"traceEvents": trace, "displayTimeUnit": "ms",
                "otherData": {"ranks": size, "hosts": hosts, "straggler": straggler,
                              "last_arrivals": {str(k): v for k, v in sorted(counts.items())},
                              "waited_for_us": {str(k): v for k, v in sorted(waited_for.items())},
                              "summary": summary}}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(document, fh)
    os.replace(tmp, path)
    shutil.rmtree(parts, ignore_errors=True)
    return summary
