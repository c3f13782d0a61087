"""Which rank died first: a directory shared by the guards of one ``mpidist run``.

The first guard whose program dies claims the directory (an exclusive create, atomic on a
local filesystem) and writes its rank and exit code there; it prints the full report, the
guards of ranks that die after it print one line that points to it, and ``mpidist run`` exits
with the first dead rank's code. The directory is local to the node that runs ``mpidist
run``: guards on other nodes, which cannot see it, each print their full report.
"""

from __future__ import annotations

import os

__all__ = ["claim_first_death", "first_death"]

_FIRST = "first-death"


def claim_first_death(directory: str | None, rank: int | None, code: int
                      ) -> tuple[int | None, int | None] | None:
    """``None`` when this rank is the first to die (or there is no usable directory), else the
    ``(rank, code)`` of the rank that died first."""
    if not directory or not os.path.isdir(directory):
        return None
    path = os.path.join(directory, _FIRST)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return first_death(directory) or (None, None)
    except OSError:
        return None
    try:
        os.write(fd, f"{'?' if rank is None else rank} {code}\n".encode())
    finally:
        os.close(fd)
    return None


def first_death(directory: str) -> tuple[int | None, int] | None:
    """``(rank, code)`` of the first rank that died, or None; rank is None when unknown."""
    try:
        with open(os.path.join(directory, _FIRST)) as f:
            rank, code = f.read().split()
    except (OSError, ValueError):
        return None
    return (int(rank) if rank.isdigit() else None), int(code)
