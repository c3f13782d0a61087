"""A parameter server: the variables of one ps task, and the loop that serves requests for them.

One thread applies requests one at a time, so every operation is atomic (no lost
``assign_add`` under concurrent workers, as TF's variable mutex guarantees); different parameter
servers run in parallel. Optimizer updates run here, next to the data, with the project's fused
kernels (TF places ``ResourceApplyAdam`` on the ps the same way). A request that fails sends
its error back when the requester waits for a reply; a posted one keeps its error for the
requester's next ``FENCE``, so nothing fails silently.

The loop serves for the job's lifetime, until the chief's SHUTDOWN; it ends sooner, with
ChiefGoneError, when the chief has been silent (no request, no heartbeat PING) for
``MPIDIST_PS_COORDINATOR_TIMEOUT`` seconds.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mpidist.config import get_config
from mpidist.core.waiting import wait_until
from mpidist.errors import DeadlineExceededError
from mpidist.kernels import optimizers as fused_kernels
from mpidist.logs import get_logger
from mpidist.ops.update_rules import AdamRule, MomentumRule, SGDRule, UpdateRule
from mpidist.ps import messages
from mpidist.ps.faults import Faults
from mpidist.ps.roles import ClusterRoles
from mpidist.ps.liveness import ChiefWatch
from mpidist.ps.serialization import dumps_error
from mpidist.ps.transport import ANY, DATA, Backoff, Transport
from mpidist.ps.wire import (REQUEST_TAG, Op, Request, Status, decode_request, encode_reply,
                             unpack_dtype)

__all__ = ["ParameterServer"]

log = get_logger("mpidist.ps")


class ParameterServer:
    """The store and service loop of one ps task (``serve()`` returns at the chief's SHUTDOWN)."""

    def __init__(self, transport: Transport, roles: ClusterRoles, faults: Faults | None = None
                 ) -> None:
        self._transport = transport
        self._roles = roles
        self._faults = faults  # the fault-injection seam; None: nothing is injected
        self._watch = ChiefWatch(roles, transport.gone)
        self._store: dict[int, np.ndarray] = {}
        self._posted_errors: dict[int, bytes] = {}  # requester rank -> first error since its fence
        self.requests_served = 0
        self._scratch = np.empty(0, np.uint8)
        self._sending: dict[int, list[Any]] = {}  # var_id -> sends still reading the variable
        self.finalize = True  # False when the chief's SHUTDOWN says a rank of the job is lost
        self._handlers: dict[int, Callable[[Request, Any], Any]] = {
            Op.CREATE: self._create, Op.READ: self._read, Op.ASSIGN: self._assign,
            Op.ASSIGN_ADD: self._assign, Op.ASSIGN_SUB: self._assign, Op.GATHER: self._gather,
            Op.SCATTER_ADD: self._scatter, Op.SCATTER_SUB: self._scatter,
            Op.SCATTER_UPDATE: self._scatter, Op.APPLY_SGD: self._apply_sgd,
            Op.APPLY_MOMENTUM: self._apply_momentum, Op.APPLY_ADAM: self._apply_adam,
            Op.STATS: self._stats, Op.DELETE: self._delete, Op.READ_MANY: self._read_many,
        }

    @property
    def where(self) -> str:
        return self._roles.describe(self._transport.rank)

    def serve(self) -> None:
        """Serve requests until the chief's SHUTDOWN (then return); ChiefGoneError when the
        chief has been silent past ``MPIDIST_PS_COORDINATOR_TIMEOUT``."""
        backoff = Backoff()
        transport = self._transport
        chief = self._roles.chief_rank
        watch = self._watch = ChiefWatch(self._roles, transport.gone)
        task_id = self._roles.task_of(transport.rank)[1]
        idle_checks = 0
        beating = threading.Event()
        threading.Thread(target=self._heartbeats, args=(beating,), daemon=True,
                         name=f"mpidist-ps-heartbeat-{task_id}").start()
        try:
            self._serve(transport, chief, watch, task_id, backoff, idle_checks)
        finally:
            beating.set()

    def _heartbeats(self, stop: threading.Event) -> None:
        """Tell the chief this server is alive, every ``MPIDIST_PS_HEARTBEAT_SECONDS`` (three
        missed make it a failed ps at once, instead of after a request's MPIDIST_PS_TIMEOUT). An
        injected hang keeps them: the process is alive, only its answers stop."""
        interval = get_config().ps_heartbeat_seconds
        while not stop.wait(interval):  # wait-ok: the heartbeat period, until serve() returns
            messages.send(self._transport, self._roles.chief_rank, messages.Heartbeat())

    def _serve(self, transport: Transport, chief: int, watch: ChiefWatch, task_id: int,
               backoff: Backoff, idle_checks: int) -> None:
        while True:  # the job's lifetime: it ends at SHUTDOWN, or when the chief is gone
            got = transport.try_recv(DATA, ANY, REQUEST_TAG)
            if got is None:
                idle_checks += 1
                if idle_checks & 63 == 0:  # the clock costs little, but not nothing
                    watch.check()
                backoff.pause()
                continue
            backoff.reset()
            source, _, buffer = got
            request = decode_request(buffer)
            if source == chief:
                watch.heard()
                if request.op == Op.PING:
                    continue
                if request.op == Op.SHUTDOWN:
                    self.finalize = not request.extra
                    log.debug("%s: shutdown after %d requests", self.where, self.requests_served)
                    return
            faults = self._faults
            if faults is not None and faults.ps_request(self, task_id, self.requests_served):
                return
            self._handle(source, request)

    def wait_for_shutdown(self, what: str) -> None:
        """Answer nothing (a wedged server) until the chief's SHUTDOWN, which is obeyed;
        ChiefGoneError when the chief is gone (an injected hang: ``faults``)."""
        watch = self._watch

        def shutdown() -> bool:
            got = self._transport.try_recv(DATA, self._roles.chief_rank, REQUEST_TAG)
            if got is None:
                return False
            watch.heard()
            request = decode_request(got[2])
            if request.op == Op.SHUTDOWN:
                self.finalize = not request.extra
                return True
            return False

        watch.until(shutdown, what)

    def _handle(self, source: int, request: Request) -> None:
        self.requests_served += 1
        data = request.data
        if data is None and request.nbytes:
            data = self._payload_buffer(request.nbytes)
            try:  # bounded: a requester that died mid-request must not wedge the server
                self._transport.recv_into(DATA, source, REQUEST_TAG, data,
                                          f"the payload of a request to {self.where}",
                                          self._roles.describe(source), get_config().ps_timeout,
                                          "MPIDIST_PS_TIMEOUT")
            except DeadlineExceededError as err:
                log.warning("%s", err)
                return
        if request.op == Op.FENCE:
            error = self._posted_errors.pop(source, None)
            self._reply(source, request, Status.ERROR if error else Status.OK, error)
            return
        try:
            handler = self._handlers.get(request.op)  # (IntEnum keys match plain ints)
            if handler is None:
                raise ValueError(f"unknown parameter-server operation {request.op}")
            result = handler(request, data)
        except Exception as exc:  # noqa: BLE001 - any failure goes back to the requester
            error = dumps_error(exc, self.where)
            if request.reply_tag:
                self._reply(source, request, Status.ERROR, error)
            else:
                self._posted_errors.setdefault(source, error)
            return
        if request.reply_tag:
            self._reply(source, request, Status.OK, result)

    def _payload_buffer(self, nbytes: int) -> np.ndarray:
        """A reused buffer for a large incoming payload (every operation consumes its payload
        before the next request: a fresh 4 MiB buffer per request costs its page faults)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch[:nbytes]

    def _reply(self, dest: int, request: Request, status: Status, data: Any) -> None:
        if not request.reply_tag:
            return
        first, second = encode_reply(status, data)
        self._transport.send(DATA, dest, request.reply_tag, first)
        if second is not None:
            handle = self._transport.send(DATA, dest, request.reply_tag, second)
            if handle is not None and request.var_id in self._store:
                # Sent from the variable itself, not a copy: it must not change until sent.
                self._sending.setdefault(request.var_id, []).append(handle)

    def _settle(self, var_id: int) -> None:
        """Wait until large replies sent from variable ``var_id`` have left it, before it is
        changed (bounded: a requester that died mid-reply cannot hold the server)."""
        handles = self._sending.pop(var_id, None)
        if not handles:
            return
        try:
            wait_until(lambda: all(self._transport.sent(h) for h in handles),
                       f"large replies sent from variable id {var_id} to leave it",
                       "their requesters", timeout=get_config().ps_timeout,
                       setting="MPIDIST_PS_TIMEOUT", pause=Backoff.for_reply().pause, poll=0.01)
        except DeadlineExceededError as err:  # a requester died mid-reply: go on without it
            log.warning("%s: %s", self.where, err)

    # -- operations ------------------------------------------------------------------------
    def _variable(self, var_id: int) -> np.ndarray:
        try:
            return self._store[var_id]
        except KeyError:
            raise KeyError(f"variable id {var_id} does not exist on {self.where}; it was never "
                           "created there (or was deleted).") from None

    def _as_values(self, var: np.ndarray, data: Any, rows: int | None = None) -> np.ndarray:
        shape = var.shape if rows is None else (rows, *var.shape[1:])
        return np.frombuffer(data, var.dtype).reshape(shape)

    def _create(self, request: Request, data: Any) -> None:
        if request.var_id in self._store:
            raise ValueError(f"variable id {request.var_id} already exists on {self.where}.")
        dtype = unpack_dtype(request.extra)
        self._store[request.var_id] = np.frombuffer(data, dtype).reshape(
            tuple(int(d) for d in request.ids)).copy()

    def _delete(self, request: Request, data: Any) -> None:
        self._settle(request.var_id)
        self._store.pop(request.var_id, None)

    def _read(self, request: Request, data: Any) -> np.ndarray:
        return self._variable(request.var_id)

    def _assign(self, request: Request, data: Any) -> np.ndarray:
        var = self._variable(request.var_id)
        self._settle(request.var_id)
        values = self._as_values(var, data)
        if request.op == Op.ASSIGN:
            np.copyto(var, values)
        elif request.op == Op.ASSIGN_ADD:
            np.add(var, values, out=var)
        else:
            np.subtract(var, values, out=var)
        return var

    def _read_many(self, request: Request, data: Any) -> bytes:
        """Several variables in one reply: one message instead of one per variable (the lever
        for models with many small variables, where each message costs ~10 µs of Python)."""
        return b"".join([self._variable(i).data for i in request.ids.tolist()])

    def _gather(self, request: Request, data: Any) -> np.ndarray:
        return np.ascontiguousarray(self._variable(request.var_id)[request.ids])

    def _scatter(self, request: Request, data: Any) -> np.ndarray:
        var = self._variable(request.var_id)
        self._settle(request.var_id)
        values = self._as_values(var, data, rows=len(request.ids))
        if request.op == Op.SCATTER_ADD:
            np.add.at(var, request.ids, values)
        elif request.op == Op.SCATTER_SUB:
            np.subtract.at(var, request.ids, values)
        else:
            var[request.ids] = values
        return var

    def _fused(self, request: Request, data: Any) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(flat variable, flat gradient, flat slots) for an optimizer op."""
        var = self._variable(request.var_id)
        if var.dtype not in fused_kernels.FUSED_DTYPES:
            raise TypeError(f"optimizer updates on a parameter server need float32 or float64 "
                            f"variables; variable id {request.var_id} is {var.dtype}.")
        slots = [self._variable(int(i)).reshape(-1) for i in request.ids if i >= 0]
        for var_id in (request.var_id, *(int(i) for i in request.ids)):
            self._settle(var_id)
        return var.reshape(-1), self._as_values(var, data).reshape(-1), slots

    def _apply_rule(self, rule: type[UpdateRule], request: Request, data: Any) -> None:
        """An optimizer update: ``rule``'s fused kernel (ops/update_rules.py) with the
        request's coefficients, cast to the variable's dtype."""
        w, g, slots = self._fused(request, data)
        rule.fused(w, g, slots, rule.cast(request.params, w.dtype))

    def _apply_sgd(self, request: Request, data: Any) -> None:
        self._apply_rule(SGDRule, request, data)

    def _apply_momentum(self, request: Request, data: Any) -> None:
        self._apply_rule(MomentumRule, request, data)

    def _apply_adam(self, request: Request, data: Any) -> None:
        self._apply_rule(AdamRule, request, data)

    def _stats(self, request: Request, data: Any) -> np.ndarray:
        """(variables, bytes held, requests served, CPU time of this process in ns) as int64:
        the last lets a benchmark check that an idle server does not burn a core."""
        held = sum(a.nbytes for a in self._store.values())
        return np.array([len(self._store), held, self.requests_served, time.process_time_ns()],
                        np.int64)
