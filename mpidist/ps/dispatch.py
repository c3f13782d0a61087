"""The chief's closure queue and its dispatcher thread (ps-design.md §3.3-3.4, §4.2).

One thread sends closures to free workers and collects their results and heartbeats; the
user's thread only queues closures and waits. Everything shared is guarded by one condition.
Every wait of the user's thread goes through ``mpidist.core.waiting``: ``join`` waits while
closures keep finishing (its deadline, ``max(MPIDIST_WAIT_TIMEOUT, MPIDIST_PS_CLOSURE_TIMEOUT)``,
restarts at each one), so a long job that moves is never cut and one that stops is reported.
``lost`` names the ranks the job lost (dead, silent or stuck workers; a failed ps): at the end
they decide how the job leaves (``serving.shutdown_job``).
"""

import collections
import dataclasses
import threading
import time
from typing import Any

from mpidist.config import get_config
from mpidist.core import nest
from mpidist.core.waiting import join_thread, wait_until
from mpidist.errors import DeadlineExceededError, UnavailableError
from mpidist.logs import get_logger
from mpidist.ps import messages
from mpidist.ps.client import use_client
from mpidist.ps.failures import PSUnavailableError
from mpidist.ps.liveness import announce, ignore_interrupts, loss_report
from mpidist.ps.remote_value import PerWorkerValues, RemoteValue, result_timeout
from mpidist.ps.runtime import TaskRuntime, stop_workers
from mpidist.ps.serialization import dumps_error, dumps_function, loads_error, loads_payload, \
    unpack_frames
from mpidist.ps.transport import ANY, CTRL, Backoff
from mpidist.ps.wire import Outcome, Tag
from mpidist.ps.worker import ResourceRef

__all__ = ["Closure", "Dispatcher"]

log = get_logger("mpidist.ps")

# How long the dispatcher keeps polling after a message: empty closures/s 4.2-4.3k with 0
# against 5.7-8.2k with 200 µs (2 workers, 2 cores shared with other jobs).
_SPIN_SECONDS = 200e-6


@dataclasses.dataclass(eq=False)
class Closure:
    closure_id: int
    function: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    remote_value: RemoteValue
    worker: int | None = None     # a per-worker resource closure runs on this worker task only
    is_dataset_fn: bool = False
    family: int = 0               # resource closures made together (one per worker) share it
    attempt: int = 0
    sent_generation: int = -1

    @property
    def resource_id(self) -> int:
        return self.closure_id if self.worker is not None else 0


@dataclasses.dataclass(eq=False)
class _Worker:
    task: int
    rank: int
    last_seen: float
    alive: bool = True
    generation: int = 0           # bumped each time the worker restarts (preemption)
    inflight: dict[int, Closure] = dataclasses.field(default_factory=dict)
    tagged: collections.deque[Closure] = dataclasses.field(default_factory=collections.deque)
    resources: list[Closure] = dataclasses.field(default_factory=list)
    sent_functions: set[int] = dataclasses.field(default_factory=set)


class Dispatcher:
    """The queue, the workers' state and the thread that moves closures between them."""

    def __init__(self, runtime: TaskRuntime, capacity: int) -> None:
        self._runtime = runtime
        self._capacity = capacity
        self._per_worker = get_config().ps_inflight_per_worker
        self._heartbeat_limit = 3 * get_config().ps_heartbeat_seconds
        self._last_check = time.monotonic()  # when this thread last judged the heartbeats
        roles = runtime.roles
        now = time.monotonic()
        self._workers = [_Worker(task, rank, now) for task, rank in enumerate(roles.worker_ranks)]
        self._ps_seen = {rank: now for rank in roles.ps_ranks}  # their heartbeats
        self._cond = threading.Condition()
        self._queue: collections.deque[Closure] = collections.deque()
        self._error: BaseException | None = None   # the first closure error, raised once
        self._fatal: BaseException | None = None   # raised by every later call
        self._failed_resources: set[int] = set()   # families of resource closures that failed
        self._stopping = False
        self._closed = False                       # shut down: nothing more can be scheduled
        self._finished = 0                         # closures finished (join's progress)
        self.lost: dict[int, str] = {}             # rank -> why the job lost it
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="mpidist-ps-dispatcher")
        self._thread.start()

    # -- the user's side ----------------------------------------------------------------------
    def put(self, closure: Closure) -> None:
        self._refuse_if_closed()
        dumps_function(closure.function)  # serialize now: a function that cannot travel fails here
        closure.remote_value.progress = self._progress
        with self._cond:
            self._raise_fatal()
            if len(self._queue) >= self._capacity:
                wait_until(lambda: len(self._queue) < self._capacity or self._closed,
                           f"room in the closure queue (it holds {self._capacity} closures)",
                           "the workers", pause=self._cond.wait, progress=self._progress,
                           timeout=self._join_timeout())
                self._refuse_if_closed()
            self._queue.append(closure)
            if self._error is not None:
                self._raise_error()

    def put_resource(self, closure: Closure) -> None:
        self._refuse_if_closed()
        dumps_function(closure.function)
        with self._cond:
            self._raise_fatal()
            assert closure.worker is not None  # a resource closure names its worker
            worker = self._workers[closure.worker]
            worker.resources.append(closure)
            if worker.alive:
                worker.tagged.append(closure)
            else:
                closure.remote_value.abort()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise RuntimeError(
                "ClusterCoordinator.schedule: the coordinator was shut down "
                "(coordinator.shutdown(), or the chief's program is ending), so its workers are "
                "stopped and the function would never run. Schedule every function before "
                "shutdown(); to train again, restart the job.")

    def _progress(self) -> int:
        return self._finished

    @staticmethod
    def _join_timeout() -> float:
        return result_timeout()

    def finish(self) -> None:
        """Wait until nothing is queued or running (or raise the first error). The deadline
        restarts each time a closure finishes."""
        with self._cond:
            wait_until(lambda: self._fatal is not None or self._error is not None or self._idle(),
                       f"the {len(self._queue) + self._inflight_count()} scheduled functions "
                       "queued or running to finish", self._on_whom(), pause=self._cond.wait,
                       progress=self._progress, timeout=self._join_timeout(),
                       setting="MPIDIST_WAIT_TIMEOUT (or MPIDIST_PS_CLOSURE_TIMEOUT)")
            self._raise_pending()

    def _on_whom(self) -> str:
        busy = [self._runtime.roles.describe(w.rank) for w in self._workers if w.inflight]
        return "workers " + ", ".join(busy) if busy else "the workers"

    def done(self) -> bool:
        with self._cond:
            self._raise_pending()
            return self._idle()

    def _raise_pending(self) -> None:
        """The fatal error, every time; else the first closure error, once (TF's rule)."""
        self._raise_fatal()
        if self._error is not None:
            self._raise_error()

    def _idle(self) -> bool:
        return not self._queue and not self._inflight_count() and not any(
            w.tagged for w in self._workers if w.alive)

    def _inflight_count(self) -> int:
        return sum(len(w.inflight) for w in self._workers)

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _raise_error(self) -> None:
        """TF's rule: wait for in-flight closures, cancel the queued ones, raise the first
        error once and clear it. Called with the condition held."""
        wait_until(lambda: not self._inflight_count() or self._fatal is not None,
                   "the functions already running to finish before the first error is raised",
                   self._on_whom(), pause=self._cond.wait, progress=self._progress,
                   timeout=self._join_timeout(),
                   setting="MPIDIST_WAIT_TIMEOUT (or MPIDIST_PS_CLOSURE_TIMEOUT)")
        while self._queue:
            self._queue.popleft().remote_value.cancel()
        error, self._error = self._error, None
        assert error is not None
        raise error

    # -- the dispatcher thread ----------------------------------------------------------------
    def _loop(self) -> None:
        """The thread's body. Should it fail (MPI wedged on a dead rank, say), the failure
        becomes the job's error, raised by join() and every later call, instead of a silent
        dead thread that join() would wait for until its deadline."""
        try:
            self._move_closures()
        except BaseException as exc:  # noqa: BLE001 - handed to the user's thread below
            log.error("the chief's dispatcher thread failed: %s", exc)
            with self._cond:
                if self._fatal is None:
                    self._fatal = UnavailableError(
                        f"the chief's dispatcher thread, which sends scheduled functions to the "
                        f"workers, failed: {type(exc).__name__}: {exc}")
                    self._fatal.__cause__ = exc
                self._cond.notify_all()

    def _move_closures(self) -> None:
        transport = self._runtime.transport
        use_client(self._runtime.client)  # results may hold variables of this rank
        # The chief's thread shares the cores with the workers: it polls, yielding the core
        # between polls, for only _SPIN_SECONDS after its last message, then sleeps. Two
        # closures in flight per worker hide the sleep (a worker has its next closure while one
        # runs); the short spin catches the results of short closures without a sleep.
        backoff = Backoff(spin_seconds=_SPIN_SECONDS, quick_polls=0)
        while True:  # the job's lifetime: until shutdown
            with self._cond:
                if self._stopping:
                    return
            busy = self._drain(transport)
            gone = transport.gone()
            if gone:  # before any work is sent: nothing goes to a rank whose process ended
                self._fail_gone(gone)
            busy = self._send_work() or busy
            # Heartbeats that came while large arguments were sent count before any verdict.
            busy = self._drain(transport) or busy
            self._check_heartbeats()
            transport.progress()  # a large argument's buffer is freed once it has left
            if busy:
                backoff.reset()
            else:
                backoff.pause()

    def _send_work(self) -> bool:
        picks = []
        with self._cond:
            if self._error is not None or self._fatal is not None:
                return False  # queued closures wait: they are cancelled when the error is raised
            full = len(self._queue) >= self._capacity  # schedule() may wait for room
            for worker in self._workers:
                while worker.alive and len(worker.inflight) < self._per_worker:
                    if worker.tagged:
                        closure = worker.tagged.popleft()
                    elif self._queue:
                        closure = self._queue.popleft()
                    else:
                        break
                    closure.sent_generation = worker.generation
                    worker.inflight[closure.closure_id] = closure
                    picks.append((worker, closure))
            if picks and full:
                self._cond.notify_all()
        for worker, closure in picks:
            self._send(worker, closure)
        return bool(picks)

    def _send(self, worker: _Worker, closure: Closure) -> None:
        fn = closure.function
        payload = None
        if fn.function_id not in worker.sent_functions:
            payload = dumps_function(fn)
            worker.sent_functions.add(fn.function_id)

        def own(value: Any) -> Any:
            if isinstance(value, PerWorkerValues):
                return ResourceRef(value.values[worker.task].resource_id)
            return value

        try:
            args, kwargs = closure.args, closure.kwargs
            if args or kwargs:  # (mapping nothing costs ~10 us: a closure without arguments skips it)
                args, kwargs = nest.map_structure(own, (args, kwargs))
            messages.send(self._runtime.transport, worker.rank, messages.Work(
                closure.closure_id, closure.attempt, fn.function_id, payload, args, kwargs,
                closure.resource_id, closure.is_dataset_fn))
        except Exception as exc:  # noqa: BLE001 - e.g. arguments that cannot be pickled
            worker.sent_functions.discard(fn.function_id)
            with self._cond:
                worker.inflight.pop(closure.closure_id, None)
                self._record_error(closure, exc)
                self._cond.notify_all()

    def _on_message(self, source: int, tag: int, buffer: Any) -> None:
        task_type, task = self._runtime.roles.task_of(source)
        if task_type == "ps":
            self._ps_seen[source] = time.monotonic()
            return
        if task_type != "worker":
            return
        worker = self._workers[task]
        worker.last_seen = time.monotonic()
        if tag != Tag.RESULT:
            return  # heartbeats only refresh last_seen
        result = messages.decode(tag, buffer)
        assert isinstance(result, messages.Result)
        closure_id, attempt, outcome, payload = (result.closure_id, result.attempt,
                                                 result.outcome, result.payload)
        value: Any = None
        if outcome == Outcome.OK:
            try:
                value = loads_payload(unpack_frames(payload))
            except Exception as exc:  # noqa: BLE001 - a value the chief cannot unpickle
                outcome, value = Outcome.ERROR, dumps_error(TypeError(
                    f"The result of closure {closure_id} arrived from "
                    f"{self._runtime.roles.describe(source)} but cannot be read on the "
                    f"coordinator: {type(exc).__name__}: {exc}"), self._runtime.where)
        else:
            value = bytes(payload)
        with self._cond:
            closure = worker.inflight.get(closure_id)
            if closure is None or closure.attempt != attempt:
                return  # a late answer for a closure already given to another worker
            if outcome == Outcome.PREEMPTED:
                self._restart(worker)
            else:
                del worker.inflight[closure_id]
                self._finished += 1
                if outcome == Outcome.OK:
                    closure.remote_value.set_value(value)
                else:
                    self._record_error(closure, loads_error(value))
                if outcome == Outcome.STUCK and worker.alive:
                    self._fail(worker, f"closure {closure_id} ran past MPIDIST_PS_CLOSURE_TIMEOUT")
            # The user's waits (join, a full queue, shutdown) end on an error or with nothing in
            # flight; waking them for every result costs the dispatcher a thread switch per
            # closure. Their progress deadlines still see each result at their next poll.
            if outcome != Outcome.OK or not self._inflight_count():
                self._cond.notify_all()

    def _record_error(self, closure: Closure, error: BaseException) -> None:
        if closure.worker is not None:
            # Every worker builds the same resource (a dataset_fn): its error is raised once,
            # as TF raises it once when it traces dataset_fn on the coordinator.
            if closure.family in self._failed_resources:
                closure.remote_value.set_error(error)
                return
            self._failed_resources.add(closure.family)
        if isinstance(error, PSUnavailableError):  # fatal: its variables are gone
            if error.ps_rank is not None:
                self.lost.setdefault(error.ps_rank, "a parameter server that did not answer")
            if self._fatal is None:
                self._fatal = error
        elif self._error is None:
            self._error = error
        closure.remote_value.set_error(error)

    def _requeue_inflight(self, worker: _Worker) -> None:
        """The worker lost its in-flight closures: the ordinary ones go back to the front of
        the queue (TF re-queues them), to run on any worker."""
        for closure in reversed(list(worker.inflight.values())):
            closure.attempt += 1
            if closure.worker is None:
                closure.remote_value.abort()
                self._queue.appendleft(closure)
        worker.inflight.clear()

    def _restart(self, worker: _Worker) -> None:
        """A preempted worker came back as a new process: run its in-flight closures again,
        rebuild its resources (iterators start over, as TF's do) before new work."""
        log.warning("%s was preempted: re-running its closures and rebuilding its resources",
                    self._runtime.roles.describe(worker.rank))
        self._requeue_inflight(worker)
        worker.generation += 1
        worker.sent_functions.clear()
        worker.tagged = collections.deque(worker.resources)
        for closure in worker.resources:
            closure.attempt += 1
            closure.remote_value.reset()

    def _drain(self, transport: Any) -> bool:
        """Handle every message waiting on the control channel; whether there was one."""
        got_any = False
        while (got := transport.try_recv(CTRL, ANY, ANY)) is not None:
            self._on_message(*got)
            got_any = True
        return got_any

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        stalled = now - self._last_check > self._heartbeat_limit / 3
        self._last_check = now
        if stalled:
            # This thread itself did not run for a heartbeat's interval (the GIL held by a
            # large pickle, a loaded machine): the silence it saw is its own, not the peers'.
            # Their clocks restart from now.
            with self._cond:
                for worker in self._workers:
                    worker.last_seen = max(worker.last_seen, now - self._heartbeat_limit / 3)
                for rank in self._ps_seen:
                    self._ps_seen[rank] = max(self._ps_seen[rank], now - self._heartbeat_limit / 3)
            return
        with self._cond:
            for worker in self._workers:
                if worker.alive and now - worker.last_seen > self._heartbeat_limit:
                    self._fail(worker, f"no heartbeat for {now - worker.last_seen:.1f} s")
            for rank, seen in self._ps_seen.items():
                if now - seen > self._heartbeat_limit and rank not in self.lost:
                    self._fail_ps(rank, now - seen)

    def _fail_gone(self, gone: dict[int, str]) -> None:
        """Ranks whose process ended (the transport saw it): failed now, not after three
        missed heartbeats, and sent nothing more."""
        with self._cond:
            for worker in self._workers:
                if worker.alive and worker.rank in gone:
                    self._fail(worker, gone[worker.rank])
            for rank in self._ps_seen:
                if rank in gone and rank not in self.lost:
                    self._fail_ps(rank, reason=gone[rank])

    def _fail_ps(self, rank: int, silent: float = 0.0, reason: str | None = None) -> None:
        """A parameter server stopped its heartbeats (``silent`` seconds), or its process ended
        (``reason``): fatal at once (its variables are gone), without waiting for a request's
        MPIDIST_PS_TIMEOUT."""
        where = self._runtime.roles.describe(rank)
        if reason is None:
            reason = (f"no heartbeat for {silent:.1f} s (one every "
                      f"{get_config().ps_heartbeat_seconds:g} s, MPIDIST_PS_HEARTBEAT_SECONDS; "
                      "three missed mark it failed)")
        log.warning("parameter server %s failed (%s)", where, reason)
        self.lost[rank] = reason
        self._runtime.forget(rank)
        if self._fatal is None:
            self._fatal = PSUnavailableError(
                f"parameter server {where} is gone: {reason}. "
                "A parameter server that fails cannot be replaced: "
                "restart the job and restore the latest checkpoint (docs/ps.md, 'Failures').",
                ps_rank=rank, task=self._runtime.roles.task_name(rank))
        self._cond.notify_all()

    def _fail(self, worker: _Worker, reason: str) -> None:
        where = self._runtime.roles.describe(worker.rank)
        log.warning("%s failed (%s): its closures run on the other workers", where, reason)
        worker.alive = False
        self._runtime.forget(worker.rank)
        self.lost[worker.rank] = reason
        self._requeue_inflight(worker)
        worker.tagged.clear()
        for closure in worker.resources:
            closure.remote_value.abort()
        alive = sum(w.alive for w in self._workers)
        if not alive and self._fatal is None:
            self._fatal = UnavailableError(
                f"all {len(self._workers)} workers of the cluster are unavailable (last: {where}, "
                f"{reason}); scheduled functions cannot run. Restart the job.")
        self._cond.notify_all()

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self, timeout: float) -> None:
        """Refuse new closures, cancel what is queued, let in-flight closures finish (at most
        ``timeout`` seconds; a worker whose closure is still running then is lost), stop the
        thread; then stop every worker (``finalize`` False when a rank is lost) and wait
        (bounded) for each live one to say goodbye."""
        with self._cond:
            if self._closed:
                return  # shut down already (coordinator.shutdown(), then the chief's exit)
            self._closed = True
            queued, running = len(self._queue), self._inflight_count()
            if (queued or running) and self._fatal is None:
                log.warning(
                    "%d scheduled functions had not finished when the coordinator shut down: "
                    "%d queued are cancelled, %d running may take %g s more (call "
                    "coordinator.join() to wait for them).", queued + running, queued, running,
                    timeout)
            while self._queue:
                self._queue.popleft().remote_value.cancel()
            try:
                wait_until(lambda: not self._inflight_count() or self._fatal is not None,
                           "the functions still running at shutdown to finish", self._on_whom(),
                           pause=self._cond.wait, timeout=timeout, setting="MPIDIST_PS_TIMEOUT")
            except DeadlineExceededError as err:
                log.warning("%s", err)
                for worker in self._workers:
                    if worker.alive and worker.inflight:
                        self.lost[worker.rank] = "still running a function at shutdown"
                        for closure in worker.inflight.values():
                            closure.remote_value.set_error(err)
            self._stopping = True
        try:
            join_thread(self._thread, "the dispatcher thread to stop", timeout=timeout)
        except DeadlineExceededError as err:
            log.warning("%s", err)
        alive = [w.rank for w in self._workers if w.alive and w.rank not in self.lost]
        if self.lost and self._runtime.transport.owns_process:
            # Said before any rank is told to leave: the launcher may end this one soon after.
            ignore_interrupts()
            announce(loss_report(self._runtime.roles, self.lost))
        stop_workers(self._runtime.transport, self._runtime.roles, alive, min(timeout, 30.0),
                     finalize=not self.lost)

    @property
    def fatal(self) -> BaseException | None:
        """The error that ended the job's use (a failed ps, no worker left), if any."""
        return self._fatal
