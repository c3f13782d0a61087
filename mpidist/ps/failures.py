"""The typed failures of a parameter-server job: raised where a failure is detected, recognised
by type (never by the text of a message) wherever it is handled.

``PSUnavailableError`` is a parameter server that is gone: a requester's reply that did not come
within ``MPIDIST_PS_TIMEOUT`` (``client``), or a ps whose heartbeats stopped (``dispatch``). It
carries the ps's rank and task, so the chief knows which rank the job lost even when the error
was raised on a worker and travelled back with a closure's result (it pickles with them).
"""

from mpidist.errors import UnavailableError

__all__ = ["PSUnavailableError"]


class PSUnavailableError(UnavailableError):
    """A parameter server failed: its variables are gone. Restart the job and restore the
    latest checkpoint (docs/ps.md, 'Failures'). TF's ``PSUnavailableError``, a subclass of
    ``UnavailableError``.

    Attributes:
        ps_rank: the MPI rank of the parameter server (None when unknown).
        task: its TF task name, e.g. ``"/job:ps/replica:0/task:0"`` (None when unknown).
    """

    def __init__(self, message: str, ps_rank: int | None = None, task: str | None = None) -> None:
        super().__init__(message)  # args stay (message,): str() is the message, as TF's
        self.ps_rank = ps_rank
        self.task = task


# Its public home, as tracebacks and pickles name it (mpidist.experimental.coordinator
# re-exports it from there): "mpidist.ps.coordinator.PSUnavailableError: ...".
PSUnavailableError.__module__ = "mpidist.ps.coordinator"
