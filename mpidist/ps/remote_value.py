"""``RemoteValue`` and ``PerWorkerValues``: what ``ClusterCoordinator.schedule`` returns, and
values that have one component per worker (TF ``coordinator/values.py``)."""

import enum
import threading
from collections.abc import Callable
from typing import Any

from mpidist.config import get_config
from mpidist.core.waiting import wait_until
from mpidist.errors import CancelledError

__all__ = ["RemoteValue", "RemoteValueStatus", "PerWorkerValues", "CANCELLED_MESSAGE",
           "result_timeout"]


def result_timeout() -> float:
    """How long the chief waits for scheduled functions without any of them finishing
    (``join``, ``fetch``): ``MPIDIST_WAIT_TIMEOUT``, or longer when a function may run longer
    (``MPIDIST_PS_CLOSURE_TIMEOUT``, plus the heartbeats that report it)."""
    config = get_config()
    return max(config.wait_timeout, config.ps_closure_timeout + 3 * config.ps_heartbeat_seconds)

CANCELLED_MESSAGE = "The corresponding function is cancelled. Please reschedule the function."


class RemoteValueStatus(enum.Enum):
    NOT_READY = "NOT_READY"
    ABORTED = "ABORTED"   # its worker failed; the closure runs again elsewhere
    READY = "READY"


class RemoteValue:
    """The future result of a scheduled function. ``fetch()`` blocks until the function ran
    and returns its value as NumPy / Python values, or raises its error."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._status = RemoteValueStatus.NOT_READY
        self._value: Any = None
        self._error: BaseException | None = None
        self.resource_id = 0  # set when the value is a per-worker resource kept on its worker
        self.progress: Callable[[], object] | None = None  # closures finished (the coordinator's)

    @property
    def status(self) -> RemoteValueStatus:
        return self._status

    def set_value(self, value: Any) -> None:
        with self._cond:
            self._value, self._error = value, None
            self._status = RemoteValueStatus.READY
            self._cond.notify_all()

    def set_error(self, error: BaseException) -> None:
        with self._cond:
            self._value, self._error = None, error
            self._status = RemoteValueStatus.READY
            self._cond.notify_all()

    def cancel(self) -> None:
        self.set_error(CancelledError(CANCELLED_MESSAGE))

    def abort(self) -> None:
        with self._cond:
            self._status = RemoteValueStatus.ABORTED

    def reset(self) -> None:
        """Back to NOT_READY: the closure is queued again (a rebuilt per-worker resource)."""
        with self._cond:
            self._status = RemoteValueStatus.NOT_READY
            self._value = self._error = None

    def fetch(self) -> Any:
        """Wait for the result; return it, or raise the function's error."""
        with self._cond:
            wait_until(lambda: self._status is RemoteValueStatus.READY,
                       "the result of a scheduled function", "the workers", pause=self._cond.wait,
                       progress=self.progress, timeout=result_timeout(),
                       setting="MPIDIST_WAIT_TIMEOUT (or MPIDIST_PS_CLOSURE_TIMEOUT)")
            if self._error is not None:
                raise self._error
            return self._value

    def get(self) -> Any:
        """The same as ``fetch`` (there are no tensors to keep on the device here)."""
        return self.fetch()

    def __repr__(self) -> str:
        return f"<mpidist RemoteValue status={self._status.value}>"


class PerWorkerValues:
    """One value per worker, e.g. the iterators of ``iter(per_worker_dataset)``; passed to
    ``schedule``, each worker receives its own component."""

    def __init__(self, values: Any) -> None:
        values = tuple(values)
        if not all(isinstance(v, RemoteValue) for v in values):
            raise AssertionError("`PerWorkerValues` should only take `RemoteValue`s.")
        self._values: tuple[RemoteValue, ...] = values

    @property
    def values(self) -> tuple[RemoteValue, ...]:
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"PerWorkerValues({len(self._values)} workers)"
