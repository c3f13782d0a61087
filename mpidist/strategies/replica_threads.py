"""Running one Python thread per local replica, and coordinating their merge_calls.

Each replica runs ``fn`` on its own persistent thread, in its own replica context and device.
When a replica calls ``merge_call`` it parks; once every replica has parked, the calling
(main) thread runs ``merge_fn`` once in cross-replica context with the replicas' arguments
regrouped, hands each replica its part of the result, and lets them all continue.

If a replica raises, or the replicas disagree on how many merge_calls they make, the others
are unwound and the first error (in replica order) is raised on the calling thread, with a
note naming the replica and device.
"""

import queue
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from mpidist.backend import device_context
from mpidist.core import state, user_calls
from mpidist.core.waiting import WaitKind, deadline_seconds, wait_until
from mpidist.core.devices import DeviceSpec
from mpidist.errors import DeadlineExceededError
from mpidist.values.containers import PerReplica
from mpidist.values.regroup import regroup, select_replica

if TYPE_CHECKING:
    from mpidist.strategies.replica_context import ReplicaContext
    from mpidist.strategies.strategy import Strategy

__all__ = ["ReplicaRunner"]

# A replica's merge_call, as its thread parks it: (merge_fn, args, kwargs, the caller's calls).
_Request: TypeAlias = tuple[Callable[..., Any], Any, Any, user_calls.Calls]


class _Unwind(BaseException):
    """Delivered to a parked replica to end it because another replica failed."""


class _Worker:
    """A daemon thread that runs the jobs put in its queue, one at a time."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()  # wait-ok: an idle replica thread, for the strategy's lifetime
            if job is None:
                return
            job()


# Replica states during one run.
_RUNNING, _PARKED, _RESUMED, _DONE, _FAILED, _UNWINDING, _UNWOUND = range(7)
_ACTIVE = frozenset((_RUNNING, _RESUMED, _UNWINDING))  # still to park or end


class _Run:
    """The shared state of one ``run`` across its replica threads (``cond``: the runner's one
    Condition, reused run after run since runs do not overlap)."""

    def __init__(self, n: int, cond: threading.Condition) -> None:
        self.cond = cond
        self.status = [_RUNNING] * n
        self.requests: list[_Request | None] = [None] * n
        self.merge_results: list[Any] = [None] * n
        self.results: list[Any] = [None] * n
        self.errors: list[BaseException | None] = [None] * n
        self.abandoned = False  # the calling thread gave up on this run


def _wake_the_caller_if_due(run: _Run) -> None:
    """After a replica parked or ended (lock held): wake the calling thread once no replica is
    still running, the only state in which its waits (every replica parked or ended; after a
    failure, every replica ended) can be over. Waking it at each replica's step instead costs
    a thread switch per replica per run for a check that fails."""
    if not any(s in _ACTIVE for s in run.status):
        run.cond.notify_all()


class _Link:
    """What a replica context holds to reach its own run (never a later one)."""

    __slots__ = ("runner", "run")

    def __init__(self, runner: "ReplicaRunner", run: _Run) -> None:
        self.runner = runner
        self.run = run

    def merge_call(self, replica_index: int, merge_fn: Callable[..., Any], args: Any,
                   kwargs: Any) -> Any:
        return self.runner.merge_call(self.run, replica_index, merge_fn, args, kwargs)


class ReplicaRunner:
    """Runs functions on one thread per replica for a strategy with several local devices."""

    def __init__(self, strategy: "Strategy", devices: Iterable[DeviceSpec],
                 make_replica_context: Callable[[int], "ReplicaContext"]) -> None:
        self._strategy = strategy
        self._devices = tuple(devices)
        self._make_replica_context = make_replica_context
        self._workers: list[_Worker] | None = None
        self._lock = threading.Lock()  # one run at a time per strategy
        self._cond = threading.Condition()  # every run's hand-offs (see _Run)
        self._owner: int | None = None  # the thread whose run holds the lock

    def _ensure_workers(self) -> list[_Worker]:
        if self._workers is None:
            self._workers = [_Worker(f"mpidist-replica-{i}") for i in range(len(self._devices))]
        return self._workers

    def __del__(self) -> None:
        for worker in self._workers or ():
            worker.jobs.put(None)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
            plain: bool) -> list[Any]:
        """Call ``fn`` on every replica; returns the list of per-replica results. ``plain``:
        no argument can hold a distributed value (``is_plain``), so none is unwrapped."""
        if self._owner == threading.get_ident():  # a merge_fn re-entering: it would wait forever
            raise RuntimeError(
                "strategy.run was called inside a merge_fn (or extended.update) of the same "
                "strategy's strategy.run, whose replica threads are parked in merge_call: mpidist "
                "runs one strategy.run at a time per strategy. Call it after the outer run returns.")
        if not self._lock.acquire(timeout=deadline_seconds(WaitKind.LOCAL)):
            raise DeadlineExceededError(
                f"strategy.run waited {deadline_seconds(WaitKind.LOCAL):g} s for the previous "
                "strategy.run of this strategy (on another thread) to end; one run at a time "
                "per strategy. Raise MPIDIST_WAIT_TIMEOUT if that run is only slow.")
        self._owner = threading.get_ident()
        try:
            workers = self._ensure_workers()
            run = _Run(len(self._devices), self._cond)
            try:
                for i, worker in enumerate(workers):
                    worker.jobs.put(self._job(run, i, fn, args, kwargs, plain))
                self._coordinate(run)
                return list(run.results)
            except BaseException:
                self._abandon(run)
                raise
        finally:
            self._owner = None
            self._lock.release()

    def _job(self, run: _Run, i: int, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], plain: bool) -> Callable[[], None]:
        device = self._devices[i]
        calls = user_calls.current_calls()  # collectives in the replica keep the caller's labels

        def job() -> None:
            ctx = self._make_replica_context(i)
            ctx._coordinator = _Link(self, run)
            outcome, value = _DONE, None
            try:
                with user_calls.adopt(calls), ctx, state.device_scope(device):
                    mine, my_kwargs = (args, kwargs) if plain else \
                        (select_replica(i, args), select_replica(i, kwargs))
                    if device.is_gpu:
                        with device_context(device):
                            value = fn(*mine, **my_kwargs)
                    else:  # no CuPy device to make current: skip the context manager's cost
                        value = fn(*mine, **my_kwargs)
            except _Unwind:
                outcome = _UNWOUND
            except BaseException as exc:  # noqa: BLE001 - reported on the calling thread
                outcome, value = _FAILED, exc
            with run.cond:
                if outcome == _FAILED:
                    run.errors[i] = value
                elif outcome == _DONE:
                    run.results[i] = value
                run.status[i] = outcome
                _wake_the_caller_if_due(run)

        return job

    # -- called on replica threads ----------------------------------------------------------
    def merge_call(self, run: _Run, replica_index: int, merge_fn: Callable[..., Any], args: Any,
                   kwargs: Any) -> Any:
        with run.cond:
            if run.abandoned:
                raise _Unwind()
            run.requests[replica_index] = (merge_fn, args, kwargs, user_calls.current_calls())
            run.status[replica_index] = _PARKED
            _wake_the_caller_if_due(run)
            wait_until(lambda: run.status[replica_index] != _PARKED,
                       f"the merge of replica {replica_index}'s merge_call",
                       "the thread that called strategy.run", pause=run.cond.wait)
            if run.status[replica_index] == _UNWINDING:
                raise _Unwind()
            run.status[replica_index] = _RUNNING
            result = run.merge_results[replica_index]
            run.merge_results[replica_index] = None
            return result

    # -- called on the calling thread -------------------------------------------------------
    def _coordinate(self, run: _Run) -> None:
        n = len(self._devices)
        while True:
            with run.cond:
                wait_until(lambda: all(s in (_PARKED, _DONE, _FAILED) for s in run.status),
                           "every replica to reach merge_call or return",
                           lambda: self._describe_running(run), pause=run.cond.wait)
                parked = [i for i in range(n) if run.status[i] == _PARKED]
                if not parked:
                    self._raise_first_error(run)
                    return
                if len(parked) < n:
                    failed = [i for i in range(n) if run.status[i] == _FAILED]
                    error = None if failed else RuntimeError(
                        "Some replicas made a different number of replica_context().merge_call() "
                        f"calls: replicas {parked} are waiting in merge_call while replicas "
                        f"{[i for i in range(n) if i not in parked]} have returned. Make every "
                        "replica take the same path through merge_call / all_reduce / "
                        "optimizer updates."
                    )
                    self._unwind(run, parked)
                    if error is not None:
                        raise error
                    self._raise_first_error(run)
                # Every replica is parked, so every request is there.
                requests = cast(list[_Request], list(run.requests))
            try:
                merged = self._merge(requests)
            except BaseException:
                with run.cond:
                    self._unwind(run, list(range(n)))
                raise
            with run.cond:
                for i in range(n):
                    run.merge_results[i] = select_replica(i, merged)
                    run.status[i] = _RESUMED
                run.cond.notify_all()

    def _merge(self, requests: list[_Request]) -> Any:
        strategy = self._strategy
        merge_fn = requests[0][0]
        args = regroup(tuple(r[1] for r in requests), PerReplica, self._devices)
        kwargs = regroup(tuple(r[2] for r in requests), PerReplica, self._devices)
        mode = state.Mode(strategy, cross_replica=strategy.extended)
        state.push_mode(mode)
        try:
            # The merge's collectives carry the replicas' labels (ReplicaContext.all_reduce...).
            with user_calls.adopt(requests[0][3]):
                return merge_fn(strategy, *args, **kwargs)
        finally:
            state.pop_mode(mode)

    def _unwind(self, run: _Run, parked: list[int]) -> None:
        """End the parked replicas and wait until every replica has finished (lock held)."""
        for i in parked:
            if run.status[i] == _PARKED:
                run.status[i] = _UNWINDING
        run.cond.notify_all()
        wait_until(lambda: all(s in (_DONE, _FAILED, _UNWOUND) for s in run.status),
                   "the other replicas to end after a failure",
                   lambda: self._describe_running(run), pause=run.cond.wait)

    def _describe_running(self, run: _Run) -> str:
        """The replicas a wait depends on, for its report."""
        running = [i for i, s in enumerate(run.status) if s in (_RUNNING, _RESUMED, _UNWINDING)]
        if not running:
            return "the replica threads"
        names = ", ".join(f"{i} ({self._devices[i]})" for i in running)
        return f"replica{'s' if len(running) > 1 else ''} {names}, still in the replica function"

    def _abandon(self, run: _Run) -> None:
        """After an interruption of the calling thread (e.g. KeyboardInterrupt): release parked
        replicas, and if some are still running retire these threads so the next run starts on
        fresh ones instead of queueing behind them."""
        with run.cond:
            run.abandoned = True
            for i, status in enumerate(run.status):
                if status == _PARKED:
                    run.status[i] = _UNWINDING
            run.cond.notify_all()
            still_running = any(s in (_RUNNING, _RESUMED) for s in run.status)
        if still_running:
            for worker in self._workers or ():  # (never None here: run made them)
                worker.jobs.put(None)
            self._workers = None

    def _raise_first_error(self, run: _Run) -> None:
        for i, error in enumerate(run.errors):
            if error is not None:
                error.add_note(f"(raised on replica {i}, device {self._devices[i]})")
                raise error
