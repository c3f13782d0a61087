"""Passing a process's signals on to the child it runs (the guard's program, ``mpidist run``'s
launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

__all__ = ["FORWARDED_SIGNALS", "forward_signals"]

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


def _terminal_sent_to_group() -> bool:
    """True when this process runs in the foreground of a terminal, whose Ctrl-C reaches the
    whole process group, the child included."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
