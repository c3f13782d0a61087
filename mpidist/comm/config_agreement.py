"""Ranks agree on a configuration: one check for every object that all ranks must build alike.

A strategy, a parameter-server layout or a checkpoint restore is built from settings that
each rank reads for itself (its resolver, its arguments, its files). Where the ranks read
different values, each would go on with its own: collectives that never match (a hang), or
replicas that silently diverge. ``agree`` gathers every rank's facts (a small dict) and,
where any fact differs, raises the same ``InvalidArgumentError`` on every rank, naming each
fact that differs and which ranks have which value. The gather is bounded by the
construction deadline (``MPIDIST_CONSTRUCTION_TIMEOUT``): a rank that never arrives is a
DeadlineExceededError naming it.

Two ways to gather: over the Communicator of a collective strategy (``agree(..., comm)``,
whose guard also names missing ranks and refuses a different collective), or over a private
duplicate of MPI_COMM_WORLD made for the occasion (``agree_across_world``), for jobs that run
no collective communicator (parameter servers).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.comm.arrival import private_duplicate
from mpidist.comm.gather import all_gather_bytes
from mpidist.comm.mpi import mpi_module
from mpidist.comm.roll_call import describe_ranks
from mpidist.core.waiting import WaitKind, deadline_seconds, wait_until
from mpidist.errors import DeadlineExceededError, InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.comm.communicator import Communicator

__all__ = ["agree", "agree_across_world", "check_agreement", "differences"]

Facts = Mapping[str, Any]
_ABSENT = "<not set>"


def differences(everyone: list[Facts]) -> list[str]:
    """One line per fact whose value differs between ranks (``everyone[r]`` is rank r's
    facts): ``"cluster_spec: rank 0 has {...}; rank 1 has {...}"``. Values compare by
    ``repr`` (facts are plain data: numbers, strings, tuples, dicts)."""
    keys: list[str] = []
    for facts in everyone:
        keys.extend(k for k in facts if k not in keys)
    lines = []
    for key in keys:
        groups: dict[str, list[int]] = {}
        for rank, facts in enumerate(everyone):
            groups.setdefault(repr(facts[key]) if key in facts else _ABSENT, []).append(rank)
        if len(groups) > 1:
            parts = [f"{describe_ranks(ranks)} {'has' if len(ranks) == 1 else 'have'} {value}"
                     for value, ranks in groups.items()]
            lines.append(f"{key}: " + "; ".join(parts))
    return lines


def check_agreement(what: str, everyone: list[Facts], fix: str = "") -> None:
    """Raise InvalidArgumentError when the ranks' facts differ (the same error on every rank,
    since every rank holds the same ``everyone``)."""
    lines = differences(everyone)
    if lines:
        raise InvalidArgumentError(
            f"{what}: the {len(everyone)} ranks must agree on its configuration, and they "
            "differ:\n  " + "\n  ".join(lines) +
            f"\n{fix or 'Give every rank the same arguments and environment.'}")


def agree(what: str, facts: Facts, comm: Communicator, fix: str = "",
          local: Facts | None = None, timeout: float | None = None) -> list[dict[str, Any]]:
    """Every rank's ``facts`` (rank order), gathered over ``comm`` under the construction
    deadline; InvalidArgumentError on every rank where they differ (see ``check_agreement``).
    ``local`` travels in the same gather without being compared (values that may differ by
    rank); each returned dict holds a rank's facts and its ``local`` values.
    """
    mine = {**facts, **(local or {})}
    if comm.size == 1:
        return [mine]
    timeout = deadline_seconds(WaitKind.CONSTRUCTION) if timeout is None else timeout
    try:
        everyone = comm.all_gather_object(mine, timeout=timeout)
    except DeadlineExceededError as err:
        raise DeadlineExceededError(
            f"{what}: the ranks did not all arrive to agree on its configuration within "
            f"{timeout:g} s ({WaitKind.CONSTRUCTION[1]}): every rank must build it. {err}"
        ) from None
    gathered_only = set(local or ())  # the same names on every rank, so all decide alike
    check_agreement(what, [{k: v for k, v in f.items() if k not in gathered_only}
                           for f in everyone], fix)
    return everyone


def agree_across_world(what: str, facts: Facts, fix: str = "") -> list[dict[str, Any]]:
    """``agree`` for a job without a collective Communicator: over a private duplicate of
    MPI_COMM_WORLD, made once every rank arrived (bounded, naming the ranks that never come)
    and freed afterwards."""
    mpi = mpi_module()
    if mpi.COMM_WORLD.Get_size() == 1:
        return [dict(facts)]
    comm = private_duplicate(mpi.COMM_WORLD, what)
    size = comm.Get_size()
    try:
        payload = np.frombuffer(pickle.dumps(dict(facts)), dtype=np.uint8)
        wait = _bounded_wait(f"{what}: its configuration", size)
        parts = all_gather_bytes(comm, payload, wait)  # type: ignore[arg-type]  # a Waiter's call
        everyone = [pickle.loads(part.tobytes()) for part in parts]
    finally:
        comm.Free()
    check_agreement(what, everyone, fix)
    return everyone


def _bounded_wait(what: str, size: int) -> Callable[[Any, str], None]:
    """A ``wait(request, step)`` for ``all_gather_bytes``, under the construction deadline."""
    def wait(request: Any, step: str) -> None:
        wait_until(request.Test, f"the {step} of {what}", f"the {size} ranks of the job",
                   kind=WaitKind.CONSTRUCTION)
    return wait
