"""The loop of a worker rank: run the closures the chief sends, report each result.

A closure's function arrives once (then it is cached by id); its arguments arrive with each
call, per-worker resources (datasets, iterators) as references the worker resolves to its own
objects. Updates a closure posted to parameter servers are fenced before its result is sent, so
once the chief has the result every update is visible.

A watchdog thread, every ``MPIDIST_PS_HEARTBEAT_SECONDS``: tells the chief the worker is alive
(even while a long closure runs); listens for the chief's own heartbeat, and ends the rank when
the chief has been silent for ``MPIDIST_PS_COORDINATOR_TIMEOUT``; and fails a closure that has
run past ``MPIDIST_PS_CLOSURE_TIMEOUT`` with DeadlineExceededError naming the function and the
worker (the closure's thread cannot be stopped: the worker is abandoned, takes no more work, and
leaves the process at the chief's SHUTDOWN).
"""

import dataclasses
import threading
import time
from typing import Any

from mpidist.config import get_config
from mpidist.core import nest
from mpidist.core.waiting import Wait
from mpidist.errors import OutOfRangeError
from mpidist.logs import get_logger
from mpidist.ps import messages
from mpidist.ps.liveness import ChiefGoneError, ChiefWatch, leave_without_finalize
from mpidist.ps.runtime import TaskRuntime
from mpidist.ps.serialization import dumps_error, dumps_payload, loads_function, pack_frames
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.values.variables import Variable
from mpidist.ps.transport import ANY, CTRL, Backoff
from mpidist.ps.wire import Outcome, Tag

__all__ = ["WorkerLoop", "ResourceRef", "worker_index", "num_workers"]

log = get_logger("mpidist.ps")


@dataclasses.dataclass(frozen=True)
class ResourceRef:
    """Stands for a per-worker resource (a dataset, an iterator) in a closure's arguments."""

    resource_id: int


_context = threading.local()


def worker_index() -> int:
    """The index of the worker running this code (inside a scheduled function or a
    ``dataset_fn``), e.g. to shard input files by worker. 0 on the coordinator."""
    return getattr(_context, "task_id", 0)


def num_workers() -> int:
    """The number of workers of the job (inside a scheduled function or a ``dataset_fn``)."""
    return getattr(_context, "num_workers", 1)


@dataclasses.dataclass
class _Running:
    """The closure this worker's main thread is running, as its watchdog sees it."""

    closure_id: int
    attempt: int
    name: str
    wait: Wait            # its deadline (MPIDIST_PS_CLOSURE_TIMEOUT) and report
    reported: bool = False


class WorkerLoop:
    """Serves one worker task until the chief's SHUTDOWN (or until the chief is gone:
    ChiefGoneError)."""

    def __init__(self, runtime: TaskRuntime, strategy: Any) -> None:
        self._runtime = runtime
        self._strategy = strategy
        self._functions: dict[int, Any] = {}
        self._resources: dict[int, Any] = {}
        self._closures_done = 0
        self._closures_started = 0
        self._task_id = runtime.roles.task_id
        self._chief = runtime.roles.chief_rank
        self._stop_watchdog = threading.Event()
        self._watch = ChiefWatch(runtime.roles, runtime.transport.gone)
        self._lock = threading.Lock()
        self._running: _Running | None = None
        self._gone: ChiefGoneError | None = None  # set by the watchdog (in-process clusters)
        self._abandoned = False  # a closure ran past its deadline: no more work runs here
        self._shutdown: Any = None  # a SHUTDOWN the watchdog took while a closure ran
        self.finalize = True  # False when the chief's SHUTDOWN says a rank of the job is lost

    @property
    def where(self) -> str:
        return self._runtime.where

    def _send(self, message: messages.ControlMessage) -> None:
        messages.send(self._runtime.transport, self._chief, message)

    def serve(self) -> None:
        transport = self._runtime.transport
        faults = self._runtime.faults  # the fault-injection seam; None: nothing is injected
        self._send(messages.Hello(self._task_id, self._local_gpus()))
        watchdog = threading.Thread(target=self._watchdog, daemon=True,
                                    name=f"mpidist-worker-watchdog-{self._task_id}")
        watchdog.start()
        backoff = Backoff()
        try:
            while True:  # the job's lifetime: it ends at SHUTDOWN, or when the chief is gone
                got = transport.try_recv(CTRL, self._chief, ANY)
                if got is None:
                    if self._gone is not None:
                        raise self._gone
                    if self._shutdown is not None:
                        self._on_shutdown(self._shutdown)
                        return
                    backoff.pause()
                    continue
                backoff.reset()
                self._watch.heard()
                _, tag, buffer = got
                if tag == Tag.SHUTDOWN:
                    self._on_shutdown(buffer)
                    return
                if tag == Tag.WORK and not self._abandoned:
                    if faults is not None and faults.worker_work(self, self._task_id,
                                                                 self._closures_done):
                        return
                    work = messages.decode(tag, buffer)
                    assert isinstance(work, messages.Work)
                    self._run(work)
        finally:
            self._stop_watchdog.set()
            self._send(messages.Bye(self._task_id))

    def _on_shutdown(self, buffer: Any) -> None:
        if not self._shutdown_word(buffer).finalize:
            self.finalize = False

    @staticmethod
    def _shutdown_word(buffer: Any) -> messages.Shutdown:
        word = messages.decode(Tag.SHUTDOWN, buffer)
        assert isinstance(word, messages.Shutdown)
        return word

    def _local_gpus(self) -> int:
        counts = self._runtime.resolver.num_accelerators()
        return int(counts.get("GPU", 0)) if isinstance(counts, dict) else 0

    # -- the watchdog thread ---------------------------------------------------------------------
    def _watchdog(self) -> None:
        interval = get_config().ps_heartbeat_seconds
        transport = self._runtime.transport
        while not self._stop_watchdog.wait(interval):  # wait-ok: the heartbeat period
            self._send(messages.Heartbeat())
            # Only the chief's heartbeats: the main thread takes every other message.
            while transport.try_recv(CTRL, self._chief, Tag.HEARTBEAT) is not None:
                self._watch.heard()
            if self._shutdown is None and (got := transport.try_recv(CTRL, self._chief,
                                                                     Tag.SHUTDOWN)) is not None:
                self._shutdown_now(got[2])
            transport.progress()
            self._check_closure()
            try:
                self._watch.check()
            except ChiefGoneError as gone:
                if transport.owns_process:  # the main thread may be inside a closure: leave now
                    leave_without_finalize(1, str(gone))
                self._gone = gone
                return

    def _shutdown_now(self, buffer: Any) -> None:
        """The chief ended the job while this worker's main thread may be inside a closure
        (waiting on a lost ps, say): a job that lost a rank is left at once (no MPI_Finalize);
        a normal shutdown is handed to the main loop."""
        lost = not self._shutdown_word(buffer).finalize
        if lost and self._runtime.transport.owns_process:
            self._send(messages.Bye(self._task_id))
            self._runtime.transport.close(1.0)
            leave_without_finalize(1)
        self._shutdown = buffer

    def _check_closure(self) -> None:
        """Fail the running closure past its deadline (once): the chief gets a STUCK result
        naming the function and this worker, and sends no more work here."""
        with self._lock:
            running = self._running
            if running is None or running.reported or time.monotonic() < running.wait.deadline:
                return
            running.reported = True
            self._abandoned = True
        error = running.wait.error()
        error.args = (f"The scheduled function {running.name!r} (closure {running.closure_id}) "
                      f"did not return: {error.args[0]} {self._runtime.where} is abandoned: it "
                      "runs no more functions and leaves the job at its end.",)
        log.warning("%s", error)
        self._send(messages.Result(running.closure_id, running.attempt, Outcome.STUCK,
                                   dumps_error(error, self._runtime.where)))
        if self._runtime.transport.owns_process:
            threading.Thread(target=self._leave_at_shutdown, daemon=True,
                             name=f"mpidist-worker-abandoned-{self._task_id}").start()

    def _leave_at_shutdown(self) -> None:
        """An abandoned worker (its main thread stuck in a closure) leaves the process at the
        chief's SHUTDOWN, or when the chief is gone."""
        transport = self._runtime.transport
        shutdown: list[Any] = []

        def ready() -> bool:
            got = transport.try_recv(CTRL, self._chief, Tag.SHUTDOWN)
            if got is not None:
                shutdown.append(got)
            return bool(shutdown)

        try:
            self._watch.until(ready, "the chief's SHUTDOWN (an abandoned worker)", poll=0.05)
        except ChiefGoneError as gone:
            leave_without_finalize(1, str(gone))
        self._send(messages.Bye(self._task_id))
        transport.close(1.0)
        leave_without_finalize(1, f"{self._runtime.where} was abandoned with a scheduled "
                                  "function still running (MPIDIST_PS_CLOSURE_TIMEOUT): it leaves "
                                  "with exit code 1.")

    def wait_for_shutdown(self, what: str) -> None:
        """Stop heartbeats and answers until the chief's SHUTDOWN, which is obeyed;
        ChiefGoneError when the chief is gone (an injected hang: ``faults``)."""
        self._stop_watchdog.set()
        transport = self._runtime.transport

        def shutdown() -> bool:
            got = transport.try_recv(CTRL, self._chief, ANY)
            if got is None:
                return False
            self._watch.heard()
            if got[1] == Tag.SHUTDOWN:
                self._on_shutdown(got[2])
                return True
            return False

        self._watch.until(shutdown, what, poll=0.01)

    def _function(self, fn_id: int, payload: bytes | None) -> Any:
        if payload is not None:
            self._functions[fn_id] = loads_function(payload)
        return self._functions[fn_id]

    def _resolve(self, value: Any) -> Any:
        return self._resources[value.resource_id] if isinstance(value, ResourceRef) else value

    def forget(self) -> None:
        """Drop cached functions and per-worker resources (an injected preemption: a restarted
        process has neither)."""
        self._functions.clear()
        self._resources.clear()

    def _run(self, work: messages.Work) -> None:
        closure_id, attempt = work.closure_id, work.attempt
        runtime = self._runtime
        extended = self._strategy.extended
        _context.task_id, _context.num_workers = self._task_id, runtime.roles.num_workers
        self._closures_started += 1
        runtime.client.closure = self._closures_started
        try:
            fn = self._function(work.function_id, work.function)
            with self._lock:
                self._running = _Running(closure_id, attempt, _function_name(fn), Wait(
                    f"the scheduled function {_function_name(fn)!r} (closure {closure_id}) to "
                    "return", runtime.where, get_config().ps_closure_timeout,
                    setting="MPIDIST_PS_CLOSURE_TIMEOUT"))
            args, kwargs = tuple(work.args), dict(work.kwargs)
            if args or kwargs:  # (mapping nothing costs ~10 us: a closure without arguments skips it)
                args, kwargs = nest.map_structure(self._resolve, (args, kwargs))
            extended.in_dataset_fn = work.is_dataset_fn
            try:
                with self._strategy.scope():
                    value = fn(*args, **kwargs)
            except StopIteration as end:  # next() on a used-up per-worker iterator
                raise _end_of_sequence(fn, self._task_id) from end
            finally:
                extended.in_dataset_fn = False
            runtime.client.fence()
            if work.resource_id:
                self._resources[work.resource_id] = value
                value = None
            outcome: tuple[Outcome, bytes] = (Outcome.OK, self._serialized(value))
        except Exception as exc:  # noqa: BLE001 - every error of a closure goes to the chief
            try:
                runtime.client.fence()
            except Exception:  # noqa: BLE001 - the closure's own error is the one reported
                pass
            outcome = (Outcome.ERROR, dumps_error(exc, runtime.where))
        with self._lock:
            running, self._running = self._running, None
        runtime.client.closure = 0
        if running is not None and running.reported:
            return  # failed by the watchdog already: the chief has moved on
        faults = runtime.faults
        if faults is not None:
            outcome = faults.closure_done(self, closure_id, attempt) or outcome
        self._closures_done += 1
        self._send(messages.Result(closure_id, attempt, *outcome))

    @staticmethod
    def _serialized(value: Any) -> bytes:
        """The result as the chief gets it: variables become their values now (TF's function
        returns tensors, not variables); a value that cannot travel is the closure's error."""
        def snapshot(leaf: Any) -> Any:
            return leaf.read_value() if isinstance(leaf, (Variable, ShardedVariable)) else leaf

        try:
            return bytes(pack_frames(dumps_payload(nest.map_structure(snapshot, value))))
        except Exception as exc:
            raise TypeError(f"The value the scheduled function returned cannot be sent to the "
                            f"coordinator ({type(exc).__name__}: {exc}); return arrays, numbers or "
                            "structures of them.") from exc


def _end_of_sequence(fn: Any, task_id: int) -> OutOfRangeError:
    """TF's error for a scheduled function whose ``next(iterator)`` found the end of its
    worker's dataset (a bare StopIteration says nothing, and ends loops it passes through)."""
    return OutOfRangeError(
        f"End of sequence: the scheduled function {_function_name(fn)!r} called next() on "
        f"worker {task_id}'s per-worker iterator, whose dataset has no more elements. "
        "Each worker iterates its own full copy: `.repeat()` the dataset in dataset_fn to "
        "train for longer, or catch mpidist.errors.OutOfRangeError around join() to end "
        "the epoch, as with TensorFlow's ClusterCoordinator.")


def _function_name(fn: Any) -> str:
    """The user's name of a scheduled function (an ``@mpidist.function`` or a plain one)."""
    inner = getattr(fn, "python_function", None) or getattr(fn, "__wrapped__", None) or fn
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or repr(fn)
