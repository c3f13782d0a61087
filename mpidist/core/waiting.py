"""One bounded wait for every blocking call in mpidist.

Whatever mpidist blocks on (a collective's MPI requests, a parameter server's reply, a
coordinator's join, a replica thread parked at ``merge_call``, a thread's exit, a queue) it
waits through ``wait_until`` or one of the helpers built on it. Each wait has a finite deadline
(an explicit argument, else the ``Config`` setting for its kind; ``docs/semantics.md``,
"Deadlines") and a report: what was waited for, on whom, since when, and which setting to
raise. Past the deadline the wait raises ``DeadlineExceededError`` with that report (or hands
it to the caller's ``on_expiry``, which may add what only it knows, such as the ranks that
never arrived). A wait that has lasted ``MPIDIST_STALL_SECONDS`` logs the same report once,
so a long wait is visible before it fails.

A deadline can be raised, never turned off: there is no infinite wait in the library. A wait
that measures progress (``progress``: a counter that grows while the awaited work moves, like
closures finished) restarts its deadline on each change, so a long job that keeps moving is
not cut, and one that stops moving is.

``tests/unit/test_bounded_waits.py`` scans the package's source and fails on a blocking call
that does not go through this module (or carry ``# wait-ok: <reason>``).
"""

from __future__ import annotations

import math
import queue as queue_module
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError
from mpidist.logs import get_logger

__all__ = ["Wait", "WaitKind", "deadline_seconds", "get_item", "join_thread", "wait_event",
           "wait_until"]

log = get_logger("mpidist.waiting")
T = TypeVar("T")


class WaitKind:
    """The kinds of wait, each with its Config field and environment variable (the deadline
    a wait gets when its caller does not pass one)."""

    COLLECTIVE = ("collective_timeout", "MPIDIST_COLLECTIVE_TIMEOUT")
    LOCAL = ("wait_timeout", "MPIDIST_WAIT_TIMEOUT")
    CONSTRUCTION = ("construction_timeout", "MPIDIST_CONSTRUCTION_TIMEOUT")


def deadline_seconds(kind: tuple[str, str] = WaitKind.LOCAL) -> float:
    """The configured deadline, in seconds, of a wait of ``kind`` (a ``WaitKind``)."""
    return float(getattr(get_config(), kind[0]))


def check_timeout(timeout: float, name: str) -> float:
    """``timeout`` as a float, or ValueError: a deadline is a finite positive number."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"{name} must be a finite positive number of seconds, got {timeout!r}. mpidist "
            "never waits without a deadline: to wait longer, give a larger number.")
    return float(timeout)


class Wait:
    """One wait in progress: what it waits for, on whom, since when, until when.

    Args:
        what: What is awaited, e.g. ``"the reply to a read of 'w'"``; or a function that
            says it when the report is written (so a wait that ends soon builds no text).
        on: Who must act for the wait to end, e.g. ``"parameter server rank 1"``; or a
            function that says it when the report is written (who is still missing then).
        timeout: Seconds; None takes the deadline of ``kind`` from Config.
        kind: A ``WaitKind``: which setting gives the default deadline.
        setting: How a user raises this deadline, named in the report (default: the
            environment variable of ``kind``, or "the timeout argument" when given).
    """

    __slots__ = ("what", "on", "timeout", "setting", "started", "started_wall", "deadline")

    def __init__(self, what: str | Callable[[], str], on: str | Callable[[], str],
                 timeout: float | None = None,
                 kind: tuple[str, str] = WaitKind.LOCAL, setting: str | None = None) -> None:
        self.what = what
        self.on = on
        if timeout is None:
            self.timeout = deadline_seconds(kind)
            self.setting = setting or kind[1]
        else:
            self.timeout = check_timeout(timeout, "timeout")
            self.setting = setting or "the timeout argument"
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.deadline = self.started + self.timeout

    def restart(self, now: float) -> None:
        """Progress was made: the deadline counts again from ``now``."""
        self.deadline = now + self.timeout

    def report(self, now: float | None = None) -> str:
        """``waited N s for WHAT on WHOM since HH:MM:SS``."""
        now = time.monotonic() if now is None else now
        since = datetime.fromtimestamp(self.started_wall).strftime("%H:%M:%S")
        on = self.on if isinstance(self.on, str) else self.on()
        what = self.what if isinstance(self.what, str) else self.what()
        return f"waited {now - self.started:.1f} s for {what} on {on} (since {since})"

    def error(self, now: float | None = None) -> DeadlineExceededError:
        """The DeadlineExceededError of this wait past its deadline."""
        return DeadlineExceededError(
            f"Deadline exceeded: {self.report(now)}, without progress. If that is only slow, "
            f"raise the deadline with {self.setting} (now {self.timeout:g} s).")

    def expire(self, now: float) -> NoReturn:
        raise self.error(now)


def _sleep_backoff() -> Callable[[float], None]:
    """A pause that starts at 50 µs and doubles up to the caller's poll interval: a wait that
    ends soon costs little latency, one that lasts costs little CPU."""
    state = [50e-6]

    def pause(at_most: float) -> None:
        time.sleep(min(state[0], at_most))
        state[0] = min(state[0] * 2, at_most)

    return pause


def wait_until(ready: Callable[[], bool], what: str | Callable[[], str],
               on: str | Callable[[], str], *,
               timeout: float | None = None, kind: tuple[str, str] = WaitKind.LOCAL,
               setting: str | None = None, pause: Callable[[float], object] | None = None,
               poll: float = 0.05, spins: int = 1,
               progress: Callable[[], object] | None = None,
               on_expiry: Callable[[Wait, float], None] | None = None,
               on_stall: Callable[[Wait, float], None] | None = None) -> bool:
    """Return True once ``ready()`` is true; past the deadline raise DeadlineExceededError.

    Args:
        ready: Polled; the wait ends when it returns true.
        what, on, timeout, kind, setting: As for ``Wait``.
        pause: Blocks for at most its argument (seconds) between polls, e.g. a
            ``Condition.wait`` (called with its lock held) or ``Event.wait``; default a sleep
            that backs off from 50 µs to ``poll``.
        poll: The longest pause between polls, in seconds.
        spins: Polls between clock readings and pauses (for waits that spin on a cheap test).
        progress: Optional counter; each change restarts the deadline.
        on_expiry: Raises the caller's own error past the deadline (default: ``Wait.error``);
            if it returns instead, so does the wait, with False (a grace period that may end
            without its condition).
        on_stall: Called once after ``MPIDIST_STALL_SECONDS`` (default: a logged warning).
    """
    if ready():
        return True
    wait = Wait(what, on, timeout, kind, setting)
    pause = pause or _sleep_backoff()
    stall = get_config().stall_warning_seconds
    stall_at = None if stall is None or stall >= wait.timeout else wait.started + stall
    last = progress() if progress is not None else None
    while True:
        for _ in range(spins):
            if ready():
                return True
        now = time.monotonic()
        if progress is not None:
            current = progress()
            if current != last:
                last = current
                wait.restart(now)
        if now >= wait.deadline:
            (on_expiry or Wait.expire)(wait, now)
            return False
        if stall_at is not None and now >= stall_at:
            stall_at = None
            if on_stall is not None:
                on_stall(wait, now)
            else:
                log.warning("still waiting: %s (deadline %g s, %s)", wait.report(now),
                            wait.timeout, wait.setting)
        pause(max(0.0, min(poll, wait.deadline - now)))


def wait_event(event: threading.Event, what: str, on: str, **options: Any) -> None:
    """Wait until ``event`` is set (``wait_until``'s options apply)."""
    wait_until(event.is_set, what, on, pause=event.wait, **options)


def join_thread(thread: threading.Thread, what: str | None = None, **options: Any) -> None:
    """Wait until ``thread`` has ended (``wait_until``'s options apply)."""
    wait_until(lambda: not thread.is_alive(), what or f"thread {thread.name!r} to end",
               f"thread {thread.name!r}", pause=thread.join, **options)


def get_item(source: queue_module.Queue[T] | queue_module.SimpleQueue[T], what: str, on: str,
             **options: Any) -> T:
    """The next item of ``source``, waiting under a deadline (``wait_until``'s options apply)."""
    box: list[T] = []

    def ready() -> bool:
        try:
            box.append(source.get_nowait())
        except queue_module.Empty:
            return False
        return True

    def pause(at_most: float) -> None:
        try:
            box.append(source.get(timeout=at_most))  # wait-ok: one bounded pause of wait_until
        except queue_module.Empty:
            pass

    wait_until(lambda: bool(box) or ready(), what, on, pause=pause, **options)
    return box[0]
