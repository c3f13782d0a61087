"""Injected faults for parameter-server jobs (``MPIDIST_PS_FAULTS``, docs/ps.md).

MPI cannot survive the death of a rank under the usual launchers (ps-design.md §4.1), so the
failures the coordinator must handle are also produced on purpose, on the real code paths:

- ``closure:N:preempt`` / ``closure:N:preempt=S``: the worker that runs closure N (its first
  attempt) finishes the body, then fails it with an UnavailableError naming its task, drops its
  cached functions and resources as a restarted process would, and pauses S seconds (default 0.5).
- ``closure:N:exit``: the worker running closure N exits the process (``os._exit(3)``): the real
  death, survivable only where the launcher keeps the other ranks running.
- ``worker:I:after=K:hang``: worker task I stops answering and sending heartbeats after K
  closures (the coordinator's failure detector must notice).
- ``ps:I:after=K:hang``: ps task I stops answering after K requests (a PS failure: fatal, with a
  clear error, never a hang).
- ``ps:I:after=K:die=HOW`` / ``worker:I:after=K:die=HOW``: the task really dies after K requests
  (closures), by ``SIGKILL``, ``SIGSEGV`` (a real segmentation fault) or ``exit3``
  (``os._exit(3)``): nothing is caught, no mpidist code is told (the real-fault tests).

Several faults are separated by commas.
"""

import ctypes
import dataclasses
import os
import signal
from typing import NoReturn

from mpidist.config import get_config

__all__ = ["Faults", "Fault"]


@dataclasses.dataclass(frozen=True)
class Fault:
    target: str          # "closure", "worker" or "ps"
    index: int           # closure id or task index
    action: str          # "preempt", "exit", "hang" or "die"
    after: int = 0
    seconds: float = 0.5
    how: str = ""        # of "die": one of DEATHS


DEATHS = ("SIGKILL", "SIGSEGV", "exit3")


def die(how: str) -> NoReturn:
    """End this process as a real fault would: ``SIGKILL`` (the OOM killer), ``SIGSEGV`` (a
    read of address 0) or ``exit3`` (``os._exit(3)``, no handler runs)."""
    if how == "exit3":
        os._exit(3)
    if how == "SIGSEGV":
        ctypes.string_at(0)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError(f"survived {how}")


def _parse_one(text: str) -> Fault:
    parts = text.strip().split(":")
    usage = ("use closure:N:preempt[=S], closure:N:exit, worker:I:after=K:hang, "
             "ps:I:after=K:hang, or worker|ps:I:after=K:die=SIGKILL|SIGSEGV|exit3")
    try:
        target, index = parts[0], int(parts[1])
        options = parts[2:]
        after, seconds, action, how = 0, 0.5, None, ""
        for option in options:
            key, _, value = option.partition("=")
            if key == "after":
                after = int(value)
            elif key == "die" and value in DEATHS:
                action, how = key, value
            elif key in ("preempt", "exit", "hang"):
                action = key
                if value:
                    seconds = float(value)
            else:
                raise ValueError(option)
    except (IndexError, ValueError):
        raise ValueError(f"MPIDIST_PS_FAULTS: cannot read {text!r}; {usage}.") from None
    allowed = {"closure": ("preempt", "exit"), "worker": ("hang", "die"), "ps": ("hang", "die")}
    if target not in allowed or action not in allowed[target]:
        raise ValueError(f"MPIDIST_PS_FAULTS: cannot read {text!r}; {usage}.")
    return Fault(target, index, action, after, seconds, how)


class Faults:
    """The parsed faults, asked by the worker and server loops at the points they apply."""

    def __init__(self, faults: tuple[Fault, ...]) -> None:
        self.faults = faults
        self._fired: set[Fault] = set()

    @classmethod
    def none(cls) -> "Faults":
        return cls(())

    @classmethod
    def from_config(cls) -> "Faults":
        text = get_config().ps_faults
        return cls(tuple(_parse_one(t) for t in text.split(",") if t.strip()))

    def for_closure(self, closure_id: int, attempt: int) -> Fault | None:
        """The fault to inject into closure ``closure_id``'s first attempt, if any (once)."""
        if attempt != 0:
            return None
        for fault in self.faults:
            if fault.target == "closure" and fault.index == closure_id and fault not in self._fired:
                self._fired.add(fault)
                return fault
        return None

    def _due(self, target: str, task_id: int, count: int) -> Fault | None:
        for fault in self.faults:
            if fault.target == target and fault.index == task_id and count >= fault.after:
                if fault.action == "die":
                    die(fault.how)
                return fault
        return None

    def worker_hangs(self, task_id: int, closures_done: int) -> bool:
        """Whether worker ``task_id`` hangs now (a due ``die`` fault ends the process here)."""
        return self._due("worker", task_id, closures_done) is not None

    def ps_hangs(self, task_id: int, requests_served: int) -> bool:
        """Whether ps ``task_id`` hangs now (a due ``die`` fault ends the process here)."""
        return self._due("ps", task_id, requests_served) is not None
