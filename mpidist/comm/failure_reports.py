"""What a failed collective tells the user: the ranks that issued different collectives and
what they differ in (a mismatch), or the ranks that never arrived (a timeout or a stall).

Pure functions of what the ranks reported: the collective guard gathers the facts (every
rank's call on a mismatch, the progress board on a timeout) and these turn them into text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

from mpidist.comm.collective_call import Calls, CollectiveCall, Fields
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.comm.board import RankProgress
    from mpidist.comm.topology import Topology

__all__ = ["CallEntry", "mismatch_error", "differing_fields", "missing_ranks_report",
           "FROZEN_AFTER_SECONDS"]

CallEntry: TypeAlias = tuple[int, str, Fields, Calls]
"""One rank's collective as it reports it on a mismatch: ``(seq, operation, fields, calls)``."""


# -- ranks at different collectives ------------------------------------------------------------
def mismatch_error(rank: int, entries: Sequence[CallEntry]) -> InvalidArgumentError:
    """The error that rank ``rank`` raises when the ranks issued different collectives;
    ``entries`` holds every rank's CallEntry, in rank order."""
    groups: dict[CallEntry, list[int]] = {}
    for other, entry in enumerate(entries):
        groups.setdefault(entry, []).append(other)
    lines = [f"ranks {_ranks(r)} are at collective #{seq} "
             f"{CollectiveCall.from_parts(op, fields, calls).describe()}"
             for (seq, op, fields, calls), r in groups.items()]
    differing = differing_fields(list(groups))
    return InvalidArgumentError(
        f"Ranks issued different collectives (seen on rank {rank}): " + "; ".join(lines)
        + (f". They differ in: {', '.join(differing)}" if differing else "")
        + ". " + _collective_advice(list(groups))
    )


def differing_fields(entries: Sequence[CallEntry]) -> list[str]:
    """What differs between the groups ``(seq, op, fields, calls)``, in the user's terms first:
    the public calls and their arguments, then the collective's own fields."""
    names = []
    chains = {tuple(name for name, _ in e[3]) for e in entries}
    if len(chains) > 1:
        shown = {" > ".join(name for name, _ in e[3])
                 or ("the end of the program" if e[1] == "finalize" else "no public call")
                 for e in entries}
        names.append("the public call (" + " vs ".join(sorted(shown)) + ")")
    else:
        for depth, name in enumerate(next(iter(chains))):
            args = [dict(e[3][depth][1]) for e in entries]
            for key in sorted({k for a in args for k in a}):
                if len({repr(a.get(key)) for a in args}) > 1:
                    names.append(f"{name}'s argument {key}")
    if len({e[0] for e in entries}) > 1:
        names.append("sequence number")
    if len({e[1] for e in entries}) > 1:
        names.append("operation")
        return names  # different operations: their fields are not comparable
    keys = {k for e in entries for k, _ in e[2]}
    for key in sorted(keys):
        if len({dict(e[2]).get(key) for e in entries}) > 1:
            names.append(key)
    return names


def _collective_advice(entries: Sequence[CallEntry]) -> str:
    """The fix, naming the user's collective calls where the collectives came from them."""
    public = sorted({name for e in entries for name, _ in e[3][:1]})
    rule = ("Every rank must issue the same collectives in the same order, with the same "
            "shapes, dtypes and reduce ops (run the same program on every rank, and give every "
            "rank a batch at every step).")
    if not public:
        return rule
    which = " and ".join(public)
    verb = "is a collective call" if len(public) == 1 else "are collective calls"
    return (f"{which} {verb} under MultiWorkerMirroredStrategy: every rank must make it, in the "
            "same order, with the same arguments and the same shapes and dtypes (a call made on "
            "some ranks only, e.g. under `if rank == 0:`, leaves the others at a different "
            "collective; see 'Collective calls' in docs/multi_worker.md).")


# -- ranks that never arrived ------------------------------------------------------------------
# A heartbeat this much older than its period means the rank's process is not running: a pulse
# comes every PULSE_SECONDS even while the rank computes or waits.
FROZEN_AFTER_SECONDS = 3.0


def missing_ranks_report(known: Mapping[int, RankProgress], asked: bool, seq: int,
                         operation: str, topology: Topology) -> str:
    """The sentence naming the ranks that never arrived at collective ``seq`` (``operation``),
    from the progress board rows ``known`` (by rank). ``asked``: whether ranks of other nodes
    were asked for their rows (else only this node's rows are known)."""
    missing, details, frozen = [], [], []
    for rank in range(topology.size):
        progress = known.get(rank)
        host = topology.hosts[rank]
        if progress is not None and progress.silent > FROZEN_AFTER_SECONDS:
            frozen.append(rank)
            details.append(f"rank {rank} (pid {progress.pid} on {host}) has shown no sign of "
                           f"life for {progress.silent:.1f} s: its process is stopped (SIGSTOP, "
                           "Ctrl-Z, a debugger) or frozen")
        if progress is None and not asked and rank not in topology.node_ranks:
            details.append(f"rank {rank} (on {host}) is on another node, not "
                           "asked: the MPI thread level is below MULTIPLE")
        elif progress is None:
            missing.append(rank)
            details.append(f"rank {rank} (on {host}) is not waiting in any collective")
        elif progress.entered < seq:
            missing.append(rank)
            state = "finished it" if progress.completed >= progress.entered else "is still in it"
            last = (f"last entered collective #{progress.entered} ({progress.operation}) and "
                    f"{state}") if progress.entered else "has not entered any collective"
            details.append(f"rank {rank} {last}")
        elif progress.entered > seq:
            details.append(f"rank {rank} is already at collective #{progress.entered} "
                           f"({progress.operation})")
        elif progress.operation != operation:
            # Same number, another operation: only possible with the checks off.
            missing.append(rank)
            details.append(f"rank {rank} is at collective #{progress.entered} as "
                           f"{progress.operation}, not {operation}")
    if missing:
        return f"Ranks that never arrived: {_ranks(missing)} ({'; '.join(details)})."
    if frozen:
        return (f"Every rank entered it, and ranks {_ranks(frozen)} stopped responding inside it "
                f"({'; '.join(details)}).")
    extra = f" ({'; '.join(details)})" if details else ""
    return ("Every rank entered it, so a peer stopped responding inside the collective "
            f"(a crashed process or a network failure){extra}.")


def _ranks(ranks: Iterable[int]) -> str:
    return "[" + ", ".join(str(r) for r in ranks) + "]"
