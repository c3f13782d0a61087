"""Tracebacks that show the user's frames: a failed collective is raised from deep inside
mpidist (25 frames of strategies, ops and the communicator), but what the user needs is the
line of their program and the public call it made.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType

__all__ = ["format_user_traceback", "user_location", "innermost_frame"]

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../mpidist
_STDLIB = tuple(os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib"))


def _library_roots() -> tuple[str, ...]:
    roots = [_PACKAGE_ROOT]
    kernels = sys.modules.get("mpidist.kernels")  # the top-level kernels/ folder, when in use
    path = getattr(kernels, "__file__", None)
    if path:
        roots.append(os.path.dirname(os.path.abspath(path)))
    return tuple(root + os.sep for root in roots)


def _is_internal(filename: str, roots: tuple[str, ...]) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(roots) or os.path.realpath(path).startswith(_STDLIB)


def _trim(exc_report: traceback.TracebackException | None, roots: tuple[str, ...],
          seen: set[int]) -> int:
    """Keep the user's frames and, after each, the first frame it called into (the public
    call); count the rest."""
    if exc_report is None or id(exc_report) in seen:
        return 0
    seen.add(id(exc_report))
    kept, hidden, previous_user = [], 0, False
    for frame in exc_report.stack:
        internal = _is_internal(frame.filename, roots)
        if not internal or previous_user:
            kept.append(frame)
        else:
            hidden += 1
        previous_user = not internal
    if kept:  # a failure entirely inside mpidist (a thread of its own) keeps its whole stack
        exc_report.stack = traceback.StackSummary.from_list(kept)
    else:
        hidden = 0
    return (hidden + _trim(exc_report.__cause__, roots, seen)
            + _trim(exc_report.__context__, roots, seen))


def format_user_traceback(exc_type: type[BaseException], exc: BaseException,
                          tb: TracebackType | None, full: bool = False) -> str:
    """The traceback as text: the user's frames only unless ``full``, with a closing note of
    how many frames inside mpidist were left out and how to see them."""
    report = traceback.TracebackException(exc_type, exc, tb)
    hidden = 0 if full else _trim(report, _library_roots(), set())
    text = "".join(report.format())
    if hidden:
        text += (f"({hidden} frames inside mpidist not shown; set MPIDIST_FULL_TRACEBACKS=1 to "
                 "see them)\n")
    return text


def user_location(frame: FrameType | None) -> str | None:
    """``file:line in function`` of the innermost frame outside mpidist (and the standard
    library) on the stack ending at ``frame``; None where there is none."""
    roots = _library_roots()
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code.co_filename, roots):
            return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return None


def innermost_frame(tb: TracebackType | None) -> FrameType | None:
    """The frame where the exception of traceback ``tb`` was raised."""
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    return frame
