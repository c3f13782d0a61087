"""The one line a rank prints when it is stopped, in place of a traceback per rank.

Ctrl-C sends SIGINT to every rank (the terminal's process group, or the launcher passing it
on), and each printed a KeyboardInterrupt traceback through mpidist's frames; SIGTERM (kill,
scancel, a time limit, a preemption) ended a rank without a word under a plain ``mpiexec``.
Now each rank writes one line: how it was stopped, where the program was, and what survives
(the latest save of each kind and how to resume from it, ``mpidist.core.saves``). A stop is
not a failure: no MPI_Abort, and the process still ends as the signal ends it (exit by SIGINT
or SIGTERM), so launchers and guards see what they saw before.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from mpidist.comm.user_traceback import innermost_frame, user_location
from mpidist.core.saves import saves_summary

__all__ = ["stop_line", "report_interrupt", "install_term_report"]

INTERRUPTED = "interrupted by Ctrl-C (SIGINT)"
TERMINATED = "stopped by SIGTERM (kill, scancel, a time limit or a preemption)"


def stop_line(label: str, how: str, frame: FrameType | None) -> str:
    """``[mpidist <label>] <how> at <file:line in fn>; <what was saved>.``"""
    where = user_location(frame)
    return f"[mpidist {label}] {how}{f' at {where}' if where else ''}; {saves_summary()}."


def _write(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")  # one write: lines of ranks sharing a pipe stay whole
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: nothing to tell


def report_interrupt(label: str, tb: TracebackType | None) -> None:
    """For an uncaught KeyboardInterrupt: the line instead of the traceback (Python still ends
    the process by SIGINT afterwards)."""
    _write(stop_line(label, INTERRUPTED, innermost_frame(tb)))


def install_term_report(label: Callable[[], str],
                        leaving: Callable[[], None] = lambda: None) -> None:
    """From the main thread: SIGTERM calls ``leaving()`` (the peers learn this rank ends with
    a report), prints the line, then ends the process by SIGTERM. Left alone where the
    program handles SIGTERM itself."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum: int, frame: FrameType | None) -> None:
        leaving()
        _write(stop_line(label(), TERMINATED, frame))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action: parents see SIGTERM

    signal.signal(signal.SIGTERM, on_term)
