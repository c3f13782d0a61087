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

``Faults`` is the one seam between the production loops and injected faults: a loop holds
``faults: Faults | None`` (``TaskRuntime.faults``; None when nothing is injected, so each named
point costs one ``is not None`` test) and calls it at three named points: ``ps_request`` (a ps
is about to serve a request), ``worker_work`` (a worker got a closure) and ``closure_done`` (a
worker finished one). What a fault does (hang, die, preempt) is written here, with the loops'
small public hooks (``Hangable``, ``Preemptable``), not inside the loops.
"""

import ctypes
import dataclasses
import os
import signal
import time
from typing import NoReturn, Protocol

from mpidist.config import get_config
from mpidist.errors import UnavailableError
from mpidist.logs import get_logger
from mpidist.ps.serialization import dumps_error
from mpidist.ps.wire import Outcome

__all__ = ["Faults", "Fault", "Hangable", "Preemptable", "die"]

log = get_logger("mpidist.ps")


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


class Hangable(Protocol):
    """What a ps or worker loop offers an injected hang."""

    @property
    def where(self) -> str: ...

    def wait_for_shutdown(self, what: str) -> None:
        """Answer nothing (no heartbeats either, for a worker) until the chief's SHUTDOWN,
        which is obeyed; ChiefGoneError when the chief is gone."""


class Preemptable(Hangable, Protocol):
    """What a worker loop offers an injected preemption."""

    def forget(self) -> None:
        """Drop cached functions and per-worker resources, as a restarted process has none."""


class Faults:
    """The parsed faults, and the named points where the ps and worker loops meet them."""

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

    def or_none(self) -> "Faults | None":
        """This seam, or None when it injects nothing (the loops then skip every point)."""
        return self if self.faults else None

    # -- the named points --------------------------------------------------------------------
    def ps_request(self, server: Hangable, task_id: int, requests_served: int) -> bool:
        """Before ps ``task_id`` serves its next request: a due ``die`` ends the process here;
        a due ``hang`` stops its answers until the chief's SHUTDOWN, then True (the loop
        returns, as at SHUTDOWN)."""
        if self._due("ps", task_id, requests_served) is None:
            return False
        self._hang(server)
        return True

    def worker_work(self, worker: Hangable, task_id: int, closures_done: int) -> bool:
        """When worker ``task_id`` gets a closure: as ``ps_request`` (a hung worker also stops
        its heartbeats, so the chief's failure detector must notice)."""
        if self._due("worker", task_id, closures_done) is None:
            return False
        self._hang(worker)
        return True

    def closure_done(self, worker: Preemptable, closure_id: int, attempt: int
                     ) -> tuple[Outcome, bytes] | None:
        """After a worker ran closure ``closure_id``: None (report its own outcome), or the
        outcome to report instead: a ``preempt`` drops the worker's caches, pauses and fails
        the closure as a preempted worker would (its body already ran); an ``exit`` ends the
        process here (``os._exit(3)``)."""
        fault = self._for_closure(closure_id, attempt)
        if fault is None:
            return None
        where = worker.where
        if fault.action == "exit":
            log.warning("%s: injected fault: exiting during closure %d", where, closure_id)
            os._exit(3)
        log.warning("%s: injected fault: preempted during closure %d", where, closure_id)
        worker.forget()
        time.sleep(fault.seconds)
        error = UnavailableError(f"{where} was preempted while running closure {closure_id} "
                                 "(injected by MPIDIST_PS_FAULTS)")
        return Outcome.PREEMPTED, dumps_error(error, where)

    # -- how ---------------------------------------------------------------------------------
    @staticmethod
    def _hang(task: Hangable) -> None:
        log.warning("%s: injected fault: hanging", task.where)
        task.wait_for_shutdown("the chief's SHUTDOWN (an injected hang)")

    def _for_closure(self, closure_id: int, attempt: int) -> Fault | None:
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
