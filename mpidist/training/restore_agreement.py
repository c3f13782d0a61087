"""Ranks agree on what they restore: the same checkpoint, with the same content.

Under a strategy across ranks every replica must start from the same values. A restore that
some ranks make and others skip, or that reads per-rank directories (another path, or the
same name with other content), would leave the replicas silently different: each rank's
model starts from its own numbers while their gradients are still averaged. So a restore
under such a strategy is collective: the ranks gather ``(path, content digest)`` (or the
error their read raised) and any difference is the same InvalidArgumentError on every rank,
naming which rank has what (``mpidist.comm.config_agreement``). The digest costs nothing: it
hashes the manifest's per-key SHA-256 sums, which the read has just checked against the bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from mpidist.comm.config_agreement import agree

if TYPE_CHECKING:
    from mpidist.comm.communicator import Communicator
    from mpidist.strategies.strategy import Strategy

__all__ = ["agree_on_restore", "content_digest", "restore_communicator"]

_FIX = ("Every rank must restore the same checkpoint: call restore on every rank, with one "
        "path on storage all ranks share (the chief's directory: only it writes), not a "
        "directory per rank.")


def content_digest(manifest: Mapping[str, Any]) -> str:
    """A short hex digest of a checkpoint's content (its keys, dtypes, shapes and the
    SHA-256 of each array, from the manifest)."""
    entries = sorted((e["key"], e["dtype"], list(e["shape"]), e["sha256"])
                     for e in manifest["entries"])
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


def restore_communicator(strategies: Iterable[Strategy]
                         ) -> tuple[Communicator | None, float | None]:
    """``(communicator, timeout)`` of the first strategy across several ranks, else
    ``(None, None)``: only then must ranks agree."""
    for strategy in strategies:
        comm = strategy.extended.communicator
        if comm is not None and comm.size > 1:
            options = strategy.extended.communication_options
            return comm, None if options is None else options.timeout_seconds
    return None, None


def agree_on_restore(call: str, strategies: Iterable[Strategy], path: str | os.PathLike[str] | None,
                     manifest: Mapping[str, Any] | None = None,
                     error: BaseException | None = None) -> None:
    """Raise InvalidArgumentError on every rank unless all ranks restore ``path`` (None for
    nothing) with the same content (``manifest``), or all failed to read it alike (``error``).
    Nothing to do without a strategy across ranks."""
    comm, timeout = restore_communicator(strategies)
    if comm is None:
        return
    facts: dict[str, Any] = {"path": None if path is None else os.path.abspath(os.fspath(path))}
    if error is not None:
        facts["content"] = f"unreadable ({type(error).__name__})"
    elif manifest is not None:
        facts["content"] = f"digest {content_digest(manifest)}"
    agree(call, facts, comm, fix=_FIX, timeout=timeout)
