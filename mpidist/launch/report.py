"""The report a guard prints when the rank it started dies: who, where, how, and in which
collective. Pure text; the guard gathers the facts."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpidist.comm.rank_state import RankState

__all__ = ["death_report", "later_death_note", "exit_code_of", "describe_status"]

# Why a signal usually arrives, for the signals a training job dies of.
_SIGNAL_HINTS: dict[int, str] = {
    signal.SIGKILL: "often the kernel's OOM killer; check `dmesg`/Slurm's memory accounting",
    signal.SIGSEGV: "a crash in native code (a C extension, the MPI library, CUDA); run with "
                    "`python -X faulthandler` to see the Python stack at the crash",
    signal.SIGBUS: "a bad memory access, often a full /dev/shm or a truncated memory-mapped file",
    signal.SIGABRT: "abort() in native code: a failed assertion or a fatal MPI/CUDA error; the "
                    "library's message, if any, is above",
    signal.SIGFPE: "an arithmetic fault in native code",
    signal.SIGILL: "an illegal instruction: a binary built for another CPU",
    signal.SIGTERM: "sent by someone else: `kill`, `scancel`, a time limit or a pre-emption",
    signal.SIGINT: "an interrupt (Ctrl-C)",
    signal.SIGHUP: "its terminal or session went away",
}
PYTHON_ERROR_STATUS = 1  # an uncaught exception, and mpidist's abort hook (MPI_Abort(1))


def exit_code_of(returncode: int) -> int:
    """The shell's exit code for a ``subprocess`` returncode: the code, or 128 + signal."""
    return returncode if returncode >= 0 else 128 - returncode


def describe_status(returncode: int) -> str:
    """``exited with status 3`` or ``was killed by SIGKILL (signal 9): <hint>``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    hint = _SIGNAL_HINTS.get(number)
    text = f"was killed by {name} (signal {number})"
    return f"{text}: {hint}" if hint else text


def _collective(state: RankState | None) -> tuple[str, str] | None:
    """``(the last collective, how the rank left it)`` as phrases; None without a file."""
    if state is None:
        return None
    if state.entered == 0:
        return "none", "it had entered no mpidist collective yet"
    label = state.label
    # The description may already name the public call (CollectiveCall.describe does).
    where = f" in {label}" if label and label.split(" > ")[0] not in state.description else ""
    text = f"#{state.entered} {state.description or state.operation}{where}"
    if state.inside:
        return text, "it died inside it (the other ranks wait for it there)"
    return text, "it had finished it and died between collectives"


def death_report(returncode: int, state: RankState | None, rank: int | None, size: int | None,
                 host: str, pid: int, command: Sequence[str]) -> str:
    """Lines (a str) to print for a rank whose program ended with ``returncode`` (nonzero).

    ``state`` is the RankState from the rank-state file (None when the program made no
    mpidist communicator); ``rank``/``size`` may be None when no launcher said.
    """
    who = "the program" if rank is None else \
        f"rank {rank}" + ("" if size is None else f" of {size}")
    where = f"{who} (pid {pid} on {host})"
    last = _collective(state)
    code = exit_code_of(returncode)
    if returncode == PYTHON_ERROR_STATUS:
        # Python's uncaught exception or mpidist's abort hook: the traceback is already above.
        after = f"; last collective {last[0]}" if last else ""
        return f"mpidist: {where} exited with status 1 (an error; its message is above){after}.\n"
    lines = [f"mpidist: {where} {describe_status(returncode)}.",
             f"mpidist:   last collective: {last[0]}: {last[1]}." if last else
             "mpidist:   last collective: unknown (the program made no mpidist communicator).",
             f"mpidist:   command: {shlex.join(command)}",
             f"mpidist:   exit code given to the launcher: {code}."]
    return "\n".join(lines) + "\n"


def later_death_note(returncode: int, rank: int | None, host: str, pid: int,
                     first: tuple[int | None, int | None]) -> str:
    """One line for a rank that died after ``first`` = ``(rank, code)`` had: most likely it
    lost its peer, and the first report says why."""
    who = "the program" if rank is None else f"rank {rank}"
    first_rank = "another rank" if first[0] is None else f"rank {first[0]}"
    return (f"mpidist: {who} (pid {pid} on {host}) {describe_status(returncode).split(':')[0]} "
            f"after {first_rank} had died; the report for {first_rank} above says why.\n")
