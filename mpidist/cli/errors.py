"""How the ``mpidist`` command fails when every rank of a job runs it.

Usage errors (exit status 2) come before MPI starts and are the same on every rank: only the
first rank, as the launcher numbered it, prints them. A command error (exit status 1) is
printed by each rank that saw it, the line naming that rank: MPI's numbering once MPI runs,
the launcher's before.
"""

import argparse
import sys
from typing import NoReturn

from mpidist.launcher_env import announced_rank, launcher_rank

__all__ = ["CommandError", "CommandParser", "rank_before_mpi", "where", "print_error"]


class CommandError(RuntimeError):
    """A failure the command reports on the ranks that saw it (exit status 1)."""

    def __init__(self, message: str, report: bool = True):
        super().__init__(message)
        self.report = report


def rank_before_mpi() -> int:
    """This process's rank as the launcher gave it; 0 for a process started alone."""
    return launcher_rank() or 0


class CommandParser(argparse.ArgumentParser):
    """argparse, but under a launcher only the first rank prints usage errors (exit 2)."""

    def error(self, message: str) -> NoReturn:
        if rank_before_mpi() == 0:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def where() -> str:
    """``rank R of N on HOST`` once MPI runs; before, the rank the launcher gave this process."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        from mpidist.comm.mpi import rank_label  # noqa: PLC0415

        return rank_label()
    announced = announced_rank()
    if announced is not None:
        return f"rank {announced.value} ({announced.variable}; before MPI started)"
    return "rank 0 (no launcher; before MPI started)"


def print_error(message: str) -> None:
    """``mpidist: error on <where>: <message>`` on stderr, at once."""
    sys.stderr.write(f"mpidist: error on {where()}: {message}\n")
    sys.stderr.flush()
