"""``ClusterCoordinator``: schedule functions onto the workers of a ParameterServerStrategy job
(TF ``cluster_coordinator.py``; spec §9.5-9.6; ps-design.md §3-4).

Closures go into one FIFO queue on the chief; one dispatcher thread sends each to a free worker
(at most ``MPIDIST_PS_INFLIGHT_PER_WORKER`` in flight per worker) and collects results. Every
closure runs at least once. TF's error rule: the first error of any closure is raised once by
the next ``schedule``/``join``/``done``, after in-flight closures finish; queued closures are
then cancelled. A worker that fails (preempted, or silent past three heartbeats) has its
closures run again elsewhere and its per-worker resources rebuilt; a parameter server that
fails is fatal: ``PSUnavailableError`` from every later call.
"""

import itertools
from typing import Any, cast

from mpidist.config import get_config
from mpidist.core import nest
from mpidist.core.function import is_function
from mpidist.core.messages import short_repr
from mpidist.logs import get_logger
from mpidist.ps.dispatch import Closure, Dispatcher
from mpidist.ps.failures import PSUnavailableError
from mpidist.ps.per_worker import PerWorkerDataset
from mpidist.ps.remote_value import PerWorkerValues, RemoteValue
from mpidist.ps.strategy import ParameterServerStrategy, register_coordinator

__all__ = ["ClusterCoordinator", "PSUnavailableError"]

log = get_logger("mpidist.ps")

_CLOSURE_QUEUE_MAX_SIZE = 256 * 1024  # TF's bound; schedule() blocks when it is reached


class ClusterCoordinator:
    """Schedules functions to run on the workers of ``strategy`` (one coordinator per strategy:
    ``ClusterCoordinator(s) is ClusterCoordinator(s)``)."""

    _strategy: ParameterServerStrategy
    _closure_ids: "itertools.count[int]"
    _dispatcher: Dispatcher

    def __new__(cls, strategy: Any) -> "ClusterCoordinator":
        if not isinstance(strategy, ParameterServerStrategy):
            raise ValueError(
                "Only `mpidist.experimental.ParameterServerStrategy` is supported to work with "
                "`mpidist.experimental.coordinator.ClusterCoordinator` currently.")
        existing = strategy.extended.coordinator
        if existing is not None:
            return cast(ClusterCoordinator, existing)
        if not strategy.extended.is_chief:
            raise RuntimeError("The ClusterCoordinator runs on the chief (rank 0) only.")
        self = super().__new__(cls)
        self._strategy = strategy
        self._closure_ids = itertools.count(1)
        self._dispatcher = Dispatcher(strategy.extended.runtime, _CLOSURE_QUEUE_MAX_SIZE)
        strategy.extended.coordinator = self
        return self

    @property
    def strategy(self) -> ParameterServerStrategy:
        return self._strategy

    # -- scheduling -------------------------------------------------------------------------
    def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run on some worker; returns its RemoteValue at once.

        ``fn`` must be decorated with ``@mpidist.function`` (TF: ``tf.function``).
        ``PerWorkerValues`` arguments (per-worker iterators) become the executing worker's own.
        """
        if not is_function(fn):
            raise TypeError(
                "`mpidist.experimental.coordinator.ClusterCoordinator.schedule` only accepts a "
                f"function decorated with `@mpidist.function`, got {fn!r}. Decorate it (TF code: "
                "replace @tf.function with @mpidist.function).")
        if args is not None and not isinstance(args, (tuple, list)):
            raise TypeError(
                f"schedule(fn, args=...) takes a tuple or list of positional arguments, got "
                f"{type(args).__name__}: for one argument write args=({short_repr(args)},).")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"schedule(fn, kwargs=...) takes a dict of keyword arguments, got "
                            f"{type(kwargs).__name__}.")
        args = () if args is None else tuple(args)
        kwargs = {} if kwargs is None else dict(kwargs)
        for leaf in nest.flatten((args, kwargs)):
            if isinstance(leaf, RemoteValue):
                raise ValueError(
                    "`mpidist.experimental.coordinator.RemoteValue` used as an input to scheduled "
                    "function is not yet supported. Fetch it first (rv.fetch()) and pass the value.")
            if isinstance(leaf, PerWorkerValues) and len(leaf) != self._strategy.extended.num_workers:
                raise ValueError(f"{leaf!r} has {len(leaf)} components but the cluster has "
                                 f"{self._strategy.extended.num_workers} workers.")
        closure = Closure(next(self._closure_ids), fn, args, kwargs, RemoteValue())
        self._dispatcher.put(closure)
        return closure.remote_value

    def join(self) -> None:
        """Block until every scheduled function has run (or raise the first error)."""
        self._dispatcher.finish()

    def done(self) -> bool:
        """Whether every scheduled function has run (raises the first error, as ``join``)."""
        return self._dispatcher.done()

    def fetch(self, val: Any) -> Any:
        """``val`` with every RemoteValue replaced by its fetched value (others unchanged)."""
        return nest.map_structure(lambda v: v.fetch() if isinstance(v, RemoteValue) else v, val)

    # -- per-worker resources -----------------------------------------------------------------
    def create_per_worker_dataset(self, dataset_fn: Any) -> PerWorkerDataset:
        """Build a dataset on every worker from a ``dataset_fn`` (no arguments), an
        ``mpidist.data.Dataset``, or ``strategy.distribute_datasets_from_function(...)``'s
        result. ``iter()`` of the result gives per-worker iterators to pass to ``schedule``."""
        return PerWorkerDataset(self, dataset_fn)

    def create_per_worker_resources(self, fn: Any, args: Any = None, kwargs: Any = None,
                                    building_dataset: bool = False) -> PerWorkerValues:
        """Run ``fn`` (an ``@mpidist.function``) once on every worker and keep its result there;
        a worker that restarts runs it again. Passed to ``schedule``, the returned
        PerWorkerValues becomes each worker's own result. (TF keeps this under the private name
        ``_create_per_worker_resources``, which works here too.)"""
        if not is_function(fn):
            raise TypeError("create_per_worker_resources: fn builds the per-worker resources on "
                            f"each worker, so it must be an @mpidist.function, got {fn!r}; "
                            "decorate it with @mpidist.function.")
        values = []
        family = 0
        for task in range(self._strategy.extended.num_workers):
            closure = Closure(next(self._closure_ids), fn, tuple(args or ()), dict(kwargs or {}),
                              RemoteValue(), worker=task, is_dataset_fn=building_dataset)
            family = closure.family = family or closure.closure_id
            closure.remote_value.resource_id = closure.resource_id
            self._dispatcher.put_resource(closure)
            values.append(closure.remote_value)
        return PerWorkerValues(values)

    _create_per_worker_resources = create_per_worker_resources

    @property
    def lost(self) -> dict[int, str]:
        """The ranks this job lost, each with why (a dead, silent or stuck worker; a failed
        ps): at the end they decide how the job leaves (docs/ps.md, "Failures")."""
        return self._dispatcher.lost

    @property
    def fatal(self) -> BaseException | None:
        """The error that ended the coordinator's use (a failed ps, no worker left), if any."""
        return self._dispatcher.fatal

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the workers and parameter servers (done at the chief's exit)."""
        self._dispatcher.shutdown(get_config().ps_timeout if timeout is None else timeout)


# The strategy creates its coordinator when the chief enters its scope (TF does too); it cannot
# import this module, which builds on it, so this module tells it how.
register_coordinator(ClusterCoordinator)
