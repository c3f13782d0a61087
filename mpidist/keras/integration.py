"""Keras 3 models under mpidist's strategies: what ``install`` wraps in Keras's JAX trainer.

``install`` (run when a strategy's scope is first entered with Keras imported) wraps:

* ``Variable.__init__``: each variable remembers the strategy whose scope it was created in;
* ``compile``: the model belongs to the current strategy (TF's checks: its variables were
  created in that scope; the backend is JAX; not a parameter-server strategy);
* ``fit``, ``evaluate``, ``predict``: they run in the model's strategy's scope (TF does the
  same), read mpidist Datasets, and, where the strategy has several replicas, use the step
  functions of ``replica_steps`` with the input rules, callbacks and agreements of TF
  multi-worker training;
* ``make_train_function``, ``make_test_function``, ``make_predict_function``: those step
  functions, for a model whose strategy has several replicas;
* ``Model.save`` and ``save_weights``: under a strategy across ranks the chief writes the path,
  the others a temporary copy they remove.

A model compiled outside every strategy's scope, or under a strategy of one replica, keeps
Keras's own step: nothing changes for it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import random
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from mpidist.keras import keras_api
from mpidist.keras.dataset_input import as_keras_input
from mpidist.keras.ownership import (current_strategy, model_strategy, record_compile,
                                     strategy_for_call, tag_variable)
from mpidist.keras.replica_steps import GLOBAL_BATCHES, LOCAL_BATCHES, ReplicaSteps
from mpidist.keras.worker_callbacks import (AgreeAfterRestore, AgreeOnStop,
                                            broadcast_model_state)
from mpidist.ps.strategy import ParameterServerStrategy
from mpidist.strategies.context import get_strategy
from mpidist.training.keras_parts import callbacks_for_rank, remove_directory

__all__ = ["install"]

_installed = [False]


class _ModelRun:
    """What a model compiled under a strategy of several replicas needs across its calls."""

    def __init__(self, model: Any, strategy: Any) -> None:
        self.strategy = strategy
        self.communicator = strategy.extended.communicator
        ids = strategy.experimental_local_results(
            strategy.experimental_distribute_values_from_function(
                lambda context: context.replica_id_in_sync_group))
        self.modes = {"train": GLOBAL_BATCHES, "test": GLOBAL_BATCHES,
                      "predict": GLOBAL_BATCHES}
        self.check_first: set[str] = set()
        self.synced = False
        self.steps = ReplicaSteps(model, self.communicator, [int(i) for i in ids],
                                  strategy.num_replicas_in_sync, self.modes.__getitem__,
                                  self._take_check)

    def _take_check(self, kind: str) -> bool:
        if kind in self.check_first:
            self.check_first.discard(kind)
            return True
        return False

    def start(self, kind: str, local_rows: bool) -> None:
        """A call begins: its input mode, and a check of its first global batch."""
        self.modes[kind] = LOCAL_BATCHES if local_rows else GLOBAL_BATCHES
        self.check_first.add(kind)


_runs: "weakref.WeakKeyDictionary[Any, _ModelRun]" = weakref.WeakKeyDictionary()


def _run_of(model: Any) -> _ModelRun | None:
    """The model's distributed run, or None where Keras's own step serves (one replica)."""
    strategy = model_strategy(model)
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return None
    run = _runs.get(model)
    if run is None or run.strategy is not strategy:
        _check_standard_steps(model)
        run = _runs[model] = _ModelRun(model, strategy)
    return run


def _check_standard_steps(model: Any) -> None:
    trainer = keras_api.jax_trainer_class()
    for step in ("train_step", "test_step", "predict_step"):
        if getattr(type(model), step) is not getattr(trainer, step):
            raise NotImplementedError(
                f"{type(model).__name__} overrides {step}(). Under a strategy with several "
                "replicas mpidist runs Keras's standard step on each replica and sums across "
                "them; a custom step cannot be split that way. Override compute_loss() (and "
                "compute_metrics()) instead, which the standard step calls.")


# -- compile --------------------------------------------------------------------------------
def _backend_error() -> ValueError:
    return ValueError(
        f"mpidist distributes Keras models on the JAX backend, but Keras runs on "
        f"{keras_api.backend_name()!r} in this process. Set KERAS_BACKEND=jax in the "
        "environment before Keras is imported (for example `export KERAS_BACKEND=jax`, or "
        "os.environ['KERAS_BACKEND'] = 'jax' before `import keras`).")


def _compile(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = current_strategy()
        if isinstance(strategy, ParameterServerStrategy):
            raise NotImplementedError(
                "model.compile()/fit() of a Keras model under ParameterServerStrategy is not "
                "supported. Train Keras models across MPI ranks with "
                "mpidist.MultiWorkerMirroredStrategy; with ParameterServerStrategy, schedule "
                "your own step with ClusterCoordinator (docs/ps.md).")
        record_compile(self)  # raises before Keras changes anything
        _runs.pop(self, None)  # new optimizer and metrics: new step functions
        return original(self, *args, **kwargs)
    return compile


# -- fit, evaluate, predict -------------------------------------------------------------------
def _agree_random_state(communicator: Any) -> None:
    """The chief's NumPy and Python random states on every rank, so the shuffles Keras draws
    for each epoch are the same everywhere."""
    numpy_state, python_state = communicator.all_gather_object(
        (np.random.get_state(), random.getstate()))[0]
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def _bind(original: Callable[..., Any], model: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    bound = inspect.signature(original).bind(model, *args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.update(arguments.pop("kwargs", {}))
    return arguments


def _call(original: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    arguments = dict(arguments)
    model = arguments.pop("self")
    return original(model, **arguments)


def _scope_of(strategy: Any) -> Any:
    """The strategy's scope (TF runs fit in the model's), or nothing for a model of none."""
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def _fit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        a = _bind(original, self, args, kwargs)
        strategy = strategy_for_call(self, "fit")
        with _scope_of(strategy):
            a["x"], local_rows = as_keras_input(a["x"], strategy or get_strategy())
            if local_rows:
                a["shuffle"] = False  # a Dataset is shuffled by its own transformations
            if a.get("validation_data") is not None:
                a["validation_data"], _ = as_keras_input(a["validation_data"],
                                                         strategy or get_strategy())
            if strategy is None:  # Keras's own fit; mpidist Datasets still read as input
                return _call(original, a)
            run = _run_of(self)
            if run is None:
                return _call(original, a)
            run.start("train", local_rows)
            communicator = run.communicator
            if communicator is None:
                return _call(original, a)
            if a["shuffle"]:
                _agree_random_state(communicator)
            a["callbacks"], temporary = callbacks_for_rank(
                a["callbacks"], strategy.extended.should_checkpoint)
            a["callbacks"] += [AgreeAfterRestore(communicator), AgreeOnStop(communicator)]
            try:
                history = _call(original, a)
            finally:
                remove_directory(temporary)
            run.synced = True
            return history
    return fit


def _inference(original: Callable[..., Any], kind: str, method: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        a = _bind(original, self, args, kwargs)
        strategy = strategy_for_call(self, method)
        with _scope_of(strategy):
            a["x"], local_rows = as_keras_input(a["x"], strategy or get_strategy())
            run = _run_of(self)
            if run is not None:
                run.start(kind, local_rows)
                if run.communicator is not None and not run.synced and self.built:
                    broadcast_model_state(self, run.communicator)
                    run.synced = True
            return _call(original, a)
    return call


# -- saving -----------------------------------------------------------------------------------
def _chief_saves(original: Callable[..., Any]) -> Callable[..., Any]:
    """``model.save`` / ``save_weights`` of a model under a strategy across ranks: the chief
    writes the path; another rank writes a copy into a temporary directory and removes it (TF's
    rule for workers that save), so every rank may call it with the same path."""
    @functools.wraps(original)
    def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = model_strategy(self)
        if strategy is None or strategy.extended.communicator is None \
                or strategy.extended.should_checkpoint \
                or not isinstance(filepath, (str, os.PathLike)):
            return original(self, filepath, *args, **kwargs)
        with tempfile.TemporaryDirectory(prefix="mpidist-worker-save-") as directory:
            name = os.path.basename(os.fspath(filepath).rstrip(os.sep)) or "model"
            return original(self, os.path.join(directory, name), *args, **kwargs)
    return save


# -- the step functions ---------------------------------------------------------------------
def _make(original: Callable[..., Any], attribute: str, step: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def make(self: Any, force: bool = False) -> Any:
        run = _run_of(self)
        if run is None:
            return original(self, force)
        if getattr(self, attribute) is None or force:
            setattr(self, attribute, getattr(run.steps, step))
        return getattr(self, attribute)
    return make


def _tagging(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        tag_variable(self)
    return init


def install() -> None:
    """Wrap Keras's JAX trainer (once per process); see the module's docstring."""
    if _installed[0]:
        return
    _installed[0] = True
    if keras_api.backend_name() != "jax":
        trainer = keras_api.Trainer
        original = trainer.compile

        @functools.wraps(original)
        def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
            if current_strategy() is not None:
                raise _backend_error()
            return original(self, *args, **kwargs)
        trainer.compile = compile
        return
    variable = keras_api.KerasVariable
    variable.__init__ = _tagging(variable.__init__)
    trainer = keras_api.jax_trainer_class()
    trainer.compile = _compile(trainer.compile)
    trainer.fit = _fit(trainer.fit)
    trainer.evaluate = _inference(trainer.evaluate, "test", "evaluate")
    trainer.predict = _inference(trainer.predict, "predict", "predict")
    model = keras_api.model_class()
    model.save = _chief_saves(model.save)
    model.save_weights = _chief_saves(model.save_weights)
    trainer.make_train_function = _make(trainer.make_train_function, "train_function",
                                        "train_function")
    trainer.make_test_function = _make(trainer.make_test_function, "test_function",
                                       "test_function")
    trainer.make_predict_function = _make(trainer.make_predict_function, "predict_function",
                                          "predict_function")
