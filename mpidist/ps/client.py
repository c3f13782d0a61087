"""The requesting side of the parameter-server protocol: what a chief or worker rank uses to
read and update variables that live on ps ranks.

Each requesting thread has its own reply tag, so replica threads never take each other's
replies. A request that waits for its reply is bounded by ``MPIDIST_PS_TIMEOUT``: a server that
does not answer becomes a PSUnavailableError (an UnavailableError) naming the task and rank
and carrying them, never a hang. Posted
updates (no reply) are fenced once per server touched, which also returns any error they met.
"""

import itertools
import threading
import time
from typing import Any

import numpy as np

from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError, UnavailableError
from mpidist.ps.failures import PSUnavailableError
from mpidist.ps.roles import ClusterRoles
from mpidist.ps.serialization import loads_error
from mpidist.ps.transport import DATA, Transport
from mpidist.ps.wire import REQUEST_TAG, Op, Status, decode_reply, encode_request

__all__ = ["PSClient", "current_client", "use_client"]

_FIRST_REPLY_TAG = 100
_tag_counter = itertools.count(_FIRST_REPLY_TAG)
_thread_tags = threading.local()

_current = threading.local()
_process_client: "PSClient | None" = None


def _reply_tag() -> int:
    tag = getattr(_thread_tags, "tag", None)
    if tag is None:
        tag = _thread_tags.tag = next(_tag_counter)
    return tag


def current_client() -> "PSClient":
    """The client of the rank (or, in an in-process cluster, the simulated rank) running here."""
    client = getattr(_current, "client", None) or _process_client
    if client is None:
        raise RuntimeError(
            "A parameter-server variable was used in a process that is not part of a "
            "ParameterServerStrategy job: create the strategy first (docs/ps.md).")
    return client


def use_client(client: "PSClient", process_wide: bool = False) -> None:
    """Make ``client`` the one this thread (or, with ``process_wide``, every thread) uses."""
    global _process_client
    if process_wide:
        _process_client = client
    _current.client = client


class PSClient:
    """Requests from this rank to the parameter servers of the job."""

    def __init__(self, transport: Transport, roles: ClusterRoles,
                 timeout: float | None = None) -> None:
        self.transport = transport
        self.roles = roles
        self.timeout = get_config().ps_timeout if timeout is None else timeout
        self.proxies: dict[int, Any] = {}   # var_id -> the variable object of this rank
        self.strategy: Any = None           # this rank's ParameterServerStrategy
        # The closure running on this worker (0: none), numbered by the worker loop:
        # variables remember what their updates returned within one closure only.
        self.closure = 0
        self._posted = threading.local()    # per thread: ps ranks with posted, unfenced ops
        self._servers_shut_down = False
        self._server_names: dict[int, str] = {}  # ps rank -> how a wait's report names it

    # -- requests -----------------------------------------------------------------------------
    def send(self, ps_rank: int, op: int, var_id: int, params: tuple[Any, ...] = (), ids: Any = None,
             data: Any = None, extra: int = 0, reply: bool = True) -> int:
        """Send one request; returns the reply tag to wait on (0 when posted)."""
        if self._servers_shut_down:  # no answer can come: fail now rather than at the deadline
            raise UnavailableError(
                f"The parameter servers of this job were shut down ({self.roles.describe()} "
                "stopped them): their variables can no longer be read or updated.")
        tag = _reply_tag() if reply else 0
        first, second = encode_request(op, var_id, tag, params, ids, data, extra)
        transport = self.transport
        transport.send(DATA, ps_rank, REQUEST_TAG, first)
        if second is not None:
            transport.send(DATA, ps_rank, REQUEST_TAG, second)
        if not reply:
            posted = getattr(self._posted, "ranks", None)
            if posted is None:
                posted = self._posted.ranks = set()
            posted.add(ps_rank)
        return tag

    def reply(self, ps_rank: int, tag: int, dtype: Any = np.uint8, shape: Any = None,
              what: str = "request") -> np.ndarray | None:
        """The reply to a request sent with ``send``: an array of ``dtype`` and ``shape`` (None
        for an empty reply); the server's error, rebuilt, when the operation failed. Waits at
        most ``MPIDIST_PS_TIMEOUT`` (header and payload together); past it UnavailableError."""
        transport = self.transport
        on = self._server_names.get(ps_rank) or self._server_name(ps_rank)
        start = time.monotonic()
        try:
            _, _, buffer = transport.recv(DATA, ps_rank, tag, f"the reply to {what}", on,
                                          self.timeout, "MPIDIST_PS_TIMEOUT")
            answer = decode_reply(buffer)
            nbytes, data = answer.nbytes, answer.data
            if data is None and nbytes:
                data = np.empty(nbytes, np.uint8)  # the caller's new array (not zeroed first)
                left = max(self.timeout - (time.monotonic() - start), 1e-3)
                transport.recv_into(DATA, ps_rank, tag, data, f"the payload of the reply to {what}",
                                    on, left, "MPIDIST_PS_TIMEOUT")
        except DeadlineExceededError as err:
            raise self.unavailable(ps_rank, what, str(err)) from None
        if answer.status is Status.ERROR:
            raise loads_error(bytes(data))
        if not nbytes:
            return None
        out = np.frombuffer(data, dtype)
        return out.reshape(shape) if shape is not None else out

    def _server_name(self, ps_rank: int) -> str:
        name = self._server_names[ps_rank] = f"parameter server {self.roles.describe(ps_rank)}"
        return name

    def request(self, ps_rank: int, op: int, var_id: int, params: tuple[Any, ...] = (), ids: Any = None,
                data: Any = None, extra: int = 0, dtype: Any = np.uint8, shape: Any = None,
                what: str = "request") -> np.ndarray | None:
        tag = self.send(ps_rank, op, var_id, params, ids, data, extra)
        return self.reply(ps_rank, tag, dtype, shape, what)

    def unavailable(self, ps_rank: int, what: str, report: str = "") -> PSUnavailableError:
        return PSUnavailableError(
            f"parameter server {self.roles.describe(ps_rank)} did not answer within "
            f"{self.timeout:g} s ({what}). A parameter server that fails cannot be replaced: "
            "restart the job and restore the latest checkpoint (docs/ps.md, 'Failures'); "
            "MPIDIST_PS_TIMEOUT sets the limit." + (f" [{report}]" if report else ""),
            ps_rank=ps_rank, task=self.roles.task_name(ps_rank))

    def fence(self) -> None:
        """Wait until every update this thread posted has been applied; raises the first error
        one of them met."""
        posted = getattr(self._posted, "ranks", None)
        if not posted:
            return
        ranks = sorted(posted)
        posted.clear()
        tags = [(rank, self.send(rank, Op.FENCE, 0)) for rank in ranks]
        errors = []
        for rank, tag in tags:
            try:
                self.reply(rank, tag, what="fence of posted updates")
            except Exception as exc:  # noqa: BLE001 - every server is fenced before raising
                errors.append(exc)
        if errors:
            raise errors[0]

    def shutdown_servers(self, finalize: bool = True) -> None:
        """Stop every parameter server (once); later requests fail at once. ``finalize``
        False: a rank of the job is lost, so the servers leave without MPI_Finalize (which
        would wait for it)."""
        if self._servers_shut_down:
            return
        for rank in self.roles.ps_ranks:
            self.send(rank, Op.SHUTDOWN, 0, reply=False, extra=int(not finalize))
        self._servers_shut_down = True
        posted = getattr(self._posted, "ranks", None)
        if posted:
            posted.clear()
