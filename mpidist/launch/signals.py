"""Passing a process's signals on to the child it runs (the guard's program, ``mpidist run``'s
launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

__all__ = ["FORWARDED_SIGNALS", "forward_signals", "stop_forwarding"]

# Ctrl-C, kill/scancel, a lost terminal, and Slurm's time-limit signal (--signal=USR1@...).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                     signal.SIGUSR2)


def forward_signals(child: subprocess.Popen[bytes]) -> list[int]:
    """Pass FORWARDED_SIGNALS on to ``child`` (a Popen); returns the list of the signals
    received so far, filled in as they come."""
    received: list[int] = []

    def forward(number: int, frame: FrameType | None) -> None:
        received.append(number)
        if number == signal.SIGINT and _terminal_sent_to_group():
            return  # Ctrl-C on a terminal reached the child directly: do not send it twice
        try:
            child.send_signal(number)
        except ProcessLookupError:
            pass  # it has just ended

    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)
    return received


def stop_forwarding() -> None:
    """The child has ended: ignore FORWARDED_SIGNALS from now on.

    Not merely "forward to nobody": while it shuts down, CPython puts every signal that has a
    Python handler back to its default action, and the default of USR1, USR2, TERM and HUP ends
    the process. Slurm's time-limit USR1 arriving then would end a process whose child had
    finished (exit 0) with the signal instead, and the batch script would requeue a finished
    job. ``SIG_IGN`` is kept through the shutdown.
    """
    for number in FORWARDED_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def _terminal_sent_to_group() -> bool:
    """True when this process runs in the foreground of a terminal, whose Ctrl-C reaches the
    whole process group, the child included."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
