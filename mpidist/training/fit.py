"""``mpidist.fit`` / ``mpidist.evaluate``: a Keras-style loop for the user's own model object.

A model is any object with

* ``trainable_variables``: the variables to train (created in ``strategy.scope()``);
* ``loss_and_gradients(x, y)``: ``(per_example_loss, gradients)`` or ``(per_example_loss,
  gradients, predictions)`` for one replica's batch, the gradients being those of
  ``per_example_loss.sum()`` (one per trainable variable, in order);
* optionally ``predict(x)`` (metrics and ``evaluate`` need predictions) and
  ``per_example_loss(x, y)`` (``evaluate``'s loss without gradients).

Or, instead of ``loss_and_gradients``, only the forward pass and loss: ``loss(params, x, y)``
returning the per-example losses (or ``(per_example_losses, predictions)``), where ``params``
are the trainable variables' values in order; the gradients then come from an autodiff
backend (``autodiff=``, see ``mpidist.autodiff``), and the function must be written with its
array functions (``autograd.numpy`` / ``jax.numpy``).

Each step sums, over every replica of every worker, the loss, the example count and the
gradients in one fused all-reduce, and divides by the true global count. The update is
therefore the gradient of the mean loss of the global batch, whatever the strategy, replica
count or size of the last batch. Same seed, same global batch: same weights.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn, cast

import numpy as np

from mpidist.backend import array_module, as_array
from mpidist.data.dataset import INFINITE_CARDINALITY, Dataset
from mpidist.data.distributed import DistributedDataset, epoch_iterator
from mpidist.core import state
from mpidist.core.messages import named_instance, short_repr
from mpidist.core.signatures import accepts
from mpidist.core.user_calls import labelled
from mpidist.strategies.alone_warning import warn_if_alone
from mpidist.strategies.context import get_strategy
from mpidist.training.autodiff import BACKENDS, model_loss_and_gradients, model_per_example_loss
from mpidist.training.callbacks import BackupAndRestore, Callback, History, check_callbacks
from mpidist.training.keras_parts import (KerasCallbackHooks, KerasCallback, KerasMetric,
                                         callbacks_for_rank, is_keras_callback,
                                         remove_directory)
from mpidist.training.losses import check_per_example
from mpidist.training.metric_names import metric_from
from mpidist.training.metrics import Metric
from mpidist.training.optimizers import Optimizer
from mpidist.types import ReduceOp
from mpidist.values.variables import Variable

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy

__all__ = ["fit", "evaluate"]


def _check_model(model: Any, need_gradients: bool = True) -> None:
    missing = [] if hasattr(model, "trainable_variables") else ["trainable_variables"]
    if need_gradients and not (hasattr(model, "loss_and_gradients") or hasattr(model, "loss")):
        missing.append("loss_and_gradients")
    if missing:
        raise TypeError(
            f"The model ({type(model).__name__}) lacks {missing}: a model exposes "
            "`trainable_variables` and either `loss_and_gradients(x, y)` returning "
            "(per_example_loss, gradients[, predictions]) or `loss(params, x, y)` returning "
            "the per-example losses, differentiated by an autodiff backend (docs/autodiff.md).")
    _check_trainable_variables(model)


def _check_trainable_variables(model: Any) -> None:
    """``model.trainable_variables`` is read as a list of Variables: say what is wrong with it
    in the model's terms, not as an error from deep inside the loop."""
    name = type(model).__name__
    variables = model.trainable_variables
    if callable(variables):
        raise TypeError(
            f"{name}.trainable_variables is a method; fit reads it as a list of variables. "
            "Make it a property (put @property above `def trainable_variables(self):`) or an "
            "attribute holding the list.")
    if isinstance(variables, Variable) or hasattr(variables, "assign"):
        raise TypeError(
            f"{name}.trainable_variables must be a list of mpidist.Variable objects, got one "
            f"variable ({short_repr(variables)}): return a list, e.g. [self.w].")
    if isinstance(variables, (str, bytes)) or not isinstance(variables, Iterable):
        raise TypeError(
            f"{name}.trainable_variables must be a list of mpidist.Variable objects, got "
            f"{type(variables).__name__} {short_repr(variables)}.")
    for i, var in enumerate(variables):
        if not isinstance(var, Variable) and not hasattr(var, "assign"):
            raise TypeError(
                f"{name}.trainable_variables[{i}] is {type(var).__name__} {short_repr(var)}, not "
                "an mpidist.Variable: create each weight as mpidist.Variable(initial_value) "
                "inside `with strategy.scope():` and list those.")


def _check_autodiff(autodiff: object, call: str) -> None:
    if autodiff is not None and autodiff not in BACKENDS:
        raise ValueError(f"{call}: autodiff must be one of {BACKENDS} or None (autograd for "
                         f"host arrays, JAX for GPU arrays), got {autodiff!r}.")


def _model_outputs(model: Any, x: Any, y: Any, autodiff: str | None) -> tuple[Any, ...]:
    """``(per_example_loss, gradients[, predictions])`` of one replica's batch: the model's
    own backward pass where it has one, else its ``loss`` differentiated by ``autodiff``."""
    if hasattr(model, "loss_and_gradients"):
        outputs = model.loss_and_gradients(x, y)
        check_per_example(outputs[0], y, "loss_and_gradients(x, y)")
        return cast(tuple[Any, ...], outputs)
    return model_loss_and_gradients(model, x, y, backend=autodiff)


def _resolve_strategy(strategy: Strategy | None, model: Any, optimizer: Any, call: str) -> Strategy:
    """The strategy to run ``call`` under: the one that owns the model's variables (and the
    optimizer's state), which must agree with ``strategy`` when given.

    Without this, a model built in ``strategy.scope()`` but trained by ``fit(model, ...)`` would
    run under the default strategy: every MPI rank alone on the whole dataset.
    """
    owners: dict[int, tuple[Any, str]] = {}
    for var in model.trainable_variables:
        owner = getattr(var, "distribute_strategy", None)
        if owner is not None:
            owners.setdefault(id(owner), (owner, f"variable {getattr(var, 'name', '?')!r}"))
    if len(owners) > 1:
        listing = "; ".join(f"{what} under {named_instance(s)}" for s, what in owners.values())
        raise ValueError(
            f"{call}: the model's variables belong to {len(owners)} different strategies "
            f"({listing}). Create every variable of the model in one `with strategy.scope():`.")
    model_owner = next(iter(owners.values()))[0] if owners else None
    if optimizer is not None:
        opt_owner = getattr(getattr(optimizer, "iterations", None), "distribute_strategy", None)
        if opt_owner is not model_owner and (opt_owner is not None or owners):
            where = ("outside any strategy's scope" if model_owner is None
                     else f"under {named_instance(model_owner)}")
            opt_where = ("outside any strategy's scope" if opt_owner is None
                         else f"under {named_instance(opt_owner)}")
            raise ValueError(
                f"{call}: the optimizer was created {opt_where} but the model's variables "
                f"{where}. Create the model and the optimizer in the same "
                "`with strategy.scope():` block.")
    if strategy is None:
        return model_owner if model_owner is not None else get_strategy()
    if model_owner is not None and model_owner is not strategy:
        raise ValueError(
            f"{call}: strategy={named_instance(strategy)} but the model's variables were "
            f"created under {named_instance(model_owner)}. Pass the strategy whose scope "
            "created the model (or leave strategy= out: fit and evaluate use the variables' "
            "strategy).")
    return strategy


def _distributed(strategy: Strategy, dataset: Any) -> Any:
    if isinstance(dataset, DistributedDataset):
        return dataset
    return strategy.experimental_distribute_dataset(dataset)


def _epoch_steps(data: Any, epoch: int) -> Iterator[Any]:
    if isinstance(data, (DistributedDataset, Dataset)):
        return epoch_iterator(data, epoch)
    return iter(data)


def _split(batch: Any) -> Sequence[Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch
    raise ValueError(
        "fit and evaluate expect a dataset of (x, y) pairs; got an element of type "
        f"{type(batch).__name__}.")


def _predictions(model: Any, x: Any, outputs: Any) -> Any:
    if len(outputs) > 2:
        return outputs[2]
    if not hasattr(model, "predict"):
        raise TypeError(
            "Metrics need predictions: give the model a predict(x) method, or return "
            "(per_example_loss, gradients, predictions) from loss_and_gradients.")
    return model.predict(x)


def _loss_totals(per_example: Any) -> Any:
    """This replica's ``[sum of the per-example losses, number of examples]`` (float64)."""
    xp = array_module(per_example)
    return xp.stack([xp.asarray(per_example, dtype=np.float64).sum(),
                     xp.asarray(np.float64(np.shape(per_example)[0]))])


def _metrics(metrics: Iterable[Metric | str | Any], strategy: Strategy, where: str) -> list[Metric]:
    """Metric objects, and those given by name (Keras' "accuracy", "mse", ...) created in the
    strategy's scope."""
    with strategy.scope():
        return [metric_from(m, where) for m in metrics]


def _update_metrics(metrics: Sequence[Metric], model: Any, x: Any, y: Any, outputs: Any) -> None:
    if metrics:
        predictions = _predictions(model, x, outputs)
        for metric in metrics:
            metric.update_state(y, predictions)


class _Progress:
    """The chief's progress display: a tqdm bar over an epoch's steps when stderr is a
    terminal (verbose 1 / "auto"), one line per epoch otherwise (verbose 2, or not a tty)."""

    def __init__(self, verbose: Any, chief: bool, epochs: int, steps: int | None) -> None:
        if verbose == "auto":
            verbose = 1
        self._on = bool(verbose) and chief
        self._bar = self._on and verbose == 1 and sys.stderr.isatty()
        self._epochs, self._steps = epochs, steps
        self._tqdm = None

    def epoch_begin(self, epoch: int) -> None:
        if self._bar:
            from tqdm import tqdm  # noqa: PLC0415 - only for interactive runs

            self._tqdm = tqdm(total=self._steps, desc=f"Epoch {epoch + 1}/{self._epochs}",
                              unit="step", leave=True)

    def step(self, logs: Any) -> None:
        if self._tqdm is not None:
            self._tqdm.update(1)
            self._tqdm.set_postfix({k: f"{v:.4g}" for k, v in logs.items()}, refresh=False)

    def epoch_end(self, epoch: int, logs: Any) -> None:
        if self._tqdm is not None:
            self._tqdm.set_postfix({k: f"{v:.4g}" for k, v in logs.items()})
            self._tqdm.close()
            self._tqdm = None
        elif self._on:
            values = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
            print(f"Epoch {epoch + 1}/{self._epochs} - {values}", flush=True)


class _FitLoop:
    def __init__(self, model: Any, optimizer: Any, strategy: Strategy, metrics: Iterable[Metric],
                 autodiff: str | None = None) -> None:
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.autodiff = autodiff
        self.metrics = list(metrics)
        self.epoch = 0
        self.global_step = 0
        self._loss_sum = 0.0
        self._count = 0.0
        self._resume: tuple[int, int, float, float] | None = None

    # -- what BackupAndRestore saves and restores ---------------------------------------------
    def epoch_totals(self) -> tuple[float, float]:
        return self._loss_sum, self._count

    def resume_at(self, epoch: int, step: int, loss_sum: float, count: float) -> None:
        self._resume = (epoch, step, loss_sum, count)

    # -- one replica's step ---------------------------------------------------------------------
    def _replica_step(self, x: Any, y: Any) -> Any:
        outputs = _model_outputs(self.model, x, y, self.autodiff)
        per_example, grads = outputs[0], list(outputs[1])
        variables = list(self.model.trainable_variables)
        if len(grads) != len(variables):
            raise ValueError(
                f"loss_and_gradients returned {len(grads)} gradients for {len(variables)} "
                "trainable variables; give one gradient per variable, in order.")
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:  # checked before any communication: nothing is half-applied
                raise ValueError(
                    f"loss_and_gradients returned None as the gradient of variable "
                    f"{getattr(v, 'name', i)!r} (position {i}); fit sums every gradient across "
                    "replicas, so return zeros of the variable's shape where the loss does not "
                    "depend on it.")
        # One all-reduce of the loss totals and the gradients, then the global-batch mean.
        totals = self.optimizer.apply_mean_gradients(zip(grads, variables),
                                                     _loss_totals(per_example))
        _update_metrics(self.metrics, self.model, x, y, outputs)
        return totals

    def train(self, data: Any, epochs: int, callbacks: Sequence[Callback], progress: _Progress,
              steps_per_epoch: int | None, initial_epoch: int) -> dict[str, Any]:
        start_epoch, skip = initial_epoch, 0
        if self._resume is not None:
            start_epoch, skip, self._loss_sum, self._count = self._resume
            self.global_step = int(self.optimizer.iterations.numpy())
        logs = {}
        for epoch in range(start_epoch, epochs):
            self.epoch = epoch
            if skip == 0:
                self._loss_sum = self._count = 0.0
                for metric in self.metrics:
                    metric.reset_state()
            for cb in callbacks:
                cb.on_epoch_begin(epoch)
            progress.epoch_begin(epoch)
            steps = _epoch_steps(data, epoch)
            seen = 0  # batches this epoch's data gave (an empty epoch is refused below)
            ran_out = False
            for step, batch in enumerate(steps):
                seen += 1
                if steps_per_epoch is not None and step >= steps_per_epoch:
                    break
                if step < skip:
                    continue  # done before the backup this run resumed from
                x, y = _split(batch)
                for cb in callbacks:
                    cb.on_train_batch_begin(step)
                totals = self.strategy.run(self._replica_step, args=(x, y))
                total, n = as_array(self.strategy.experimental_local_results(totals)[0])
                self._loss_sum += float(total)
                self._count += float(n)
                self.global_step += 1
                step_logs = {"loss": float(total) / float(n)}
                progress.step(step_logs)
                for cb in callbacks:
                    cb.on_train_batch_end(step, step_logs)
                if _stop_requested(self.model):  # Keras: the epoch ends here
                    break
            else:  # the data ended before steps_per_epoch steps: tf.keras warns and stops
                ran_out = steps_per_epoch is not None and 0 < seen < steps_per_epoch
            if seen == 0:
                if epoch == start_epoch:
                    _refuse_empty("fit")
                warnings.warn(
                    f"fit: Your input ran out of data; interrupting training at epoch {epoch}: "
                    "an iterator (not a Dataset) is used up after one pass. Pass a Dataset, or a "
                    "dataset that repeats with `steps_per_epoch`.", UserWarning, stacklevel=3)
                break
            skip = 0
            logs = {"loss": self._loss_sum / self._count if self._count else float("nan")}
            for metric in self.metrics:
                logs[metric.name] = float(metric.result())
            progress.epoch_end(epoch, logs)
            for cb in callbacks:
                cb.on_epoch_end(epoch, logs)
            if ran_out:  # every worker sees the same end of data (the iterator agrees it)
                warnings.warn(
                    f"fit: Your input ran out of data; interrupting training after epoch {epoch}"
                    f": it gave {seen} batch(es), not steps_per_epoch={steps_per_epoch}. Make "
                    "sure that your dataset can generate at least `steps_per_epoch * epochs` "
                    "batches: use `.repeat()` when building it, or a smaller steps_per_epoch.",
                    UserWarning, stacklevel=3)
                break
            if _agreed_stop(self.strategy, _stop_requested(self.model)):
                break
        return logs


def _stop_requested(model: Any) -> bool:
    """Keras's ``model.stop_training``, which a callback sets (EarlyStopping, a user's own)."""
    return bool(getattr(model, "stop_training", False))


def _agreed_stop(strategy: Strategy, wanted: bool) -> bool:
    """Whether any rank's callbacks asked to stop: one tiny all-gather per epoch, so that every
    rank leaves after the same epoch even where a callback decided on one rank only."""
    comm = strategy.extended.communicator
    if comm is None or comm.size <= 1:
        return wanted
    options = strategy.extended.communication_options
    flags = comm.all_gather(np.array([[1 if wanted else 0]], np.uint8),
                            timeout=None if options is None else options.timeout_seconds)
    return bool(np.asarray(flags).any())


@labelled("fit")
@accepts(epochs=int, strategy="mpidist.strategies.strategy:Strategy | None",
         metrics=Iterable[Metric | str | KerasMetric],
         callbacks=Iterable[Callback | KerasCallback] | Callback | KerasCallback,
         steps_per_epoch=int | None, initial_epoch=int, verbose=Literal["auto", 0, 1, 2],
         autodiff=str | None)
def fit(model: Any, dataset: Any, epochs: int = 1, *, optimizer: Any,
        strategy: Strategy | None = None, metrics: Iterable[Metric | str | KerasMetric] = (),
        callbacks: Iterable[Callback | KerasCallback] | Callback | KerasCallback = (),
        steps_per_epoch: int | None = None,
        initial_epoch: int = 0, verbose: Literal["auto", 0, 1, 2] = "auto",
        autodiff: str | None = None) -> History:
    """Train ``model`` on ``dataset`` for ``epochs`` epochs; returns a History.

    Args:
        model: the user's model object (see the module docstring for what it must have).
        dataset: an ``mpidist.data.Dataset`` (or iterable) of ``(x, y)`` GLOBAL batches, split
            across replicas with ``experimental_distribute_dataset``; or a DistributedDataset.
        epochs: the epoch to stop at (epochs run from ``initial_epoch``).
        optimizer: an ``mpidist.optimizers`` optimizer created in the strategy's scope.
        strategy: defaults to the strategy whose scope created the model's variables (else the
            current strategy, ``mpidist.get_strategy()``); a different strategy than the
            variables' is a ValueError naming both.
        metrics: ``mpidist.metrics`` objects created in the scope; reset every epoch and
            reported in the logs under their ``name``.
        callbacks: ``mpidist.callbacks.Callback`` objects (e.g. ``BackupAndRestore``).
        steps_per_epoch: stop each epoch after this many steps (default: the whole dataset).
        verbose: "auto" / 1 (a progress bar on the chief when stderr is a terminal, else a line
            per epoch), 2 (a line per epoch on the chief), 0 (silent).
        autodiff: for a model with ``loss(params, x, y)`` and no ``loss_and_gradients``: the
            backend that differentiates it, ``"autograd"`` or ``"jax"`` (None: autograd for
            host arrays, JAX for GPU arrays).

    Collective under MultiWorkerMirroredStrategy: every rank calls it with the same arguments.
    """
    _check_model(model)
    _check_autodiff(autodiff, "fit")
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"fit: optimizer must be an mpidist.optimizers optimizer (e.g. "
            f"mpidist.optimizers.SGD(0.01)), got {type(optimizer).__name__} {optimizer!r}.")
    strategy = _resolve_strategy(strategy, model, optimizer, "fit")
    mode = state.current_mode()
    if mode.replica_context is not None and not mode.is_default:
        raise RuntimeError("fit() must be called outside strategy.run (in cross-replica context).")
    if strategy.is_default:
        warn_if_alone("fit with the default strategy", stacklevel=4)  # each rank alone
    data = _distributed(strategy, dataset)
    loop = _FitLoop(model, optimizer, strategy, _metrics(metrics, strategy, "fit"), autodiff)
    history = History()
    # one callback alone is taken as a list of one, as Keras 3 does (tree.flatten)
    given: list[Any] = [callbacks] if isinstance(callbacks, Callback) \
        or is_keras_callback(callbacks) else list(cast(Iterable[Any], callbacks))
    # Keras's own callbacks: their files written on the chief only (docs/training.md)
    given, temporary = callbacks_for_rank(given, strategy.extended.should_checkpoint)
    run: list[Callback] = [KerasCallbackHooks(cb) if is_keras_callback(cb) else cb for cb in given]
    hooks = run + [history]
    check_callbacks(hooks)
    steps = steps_per_epoch if steps_per_epoch is not None else _known_steps(data, "fit")
    params = {"epochs": epochs, "steps": steps}
    for cb in hooks:
        cb.set_context(model, optimizer, strategy, params)
        if isinstance(cb, BackupAndRestore):
            cb.attach(loop)
    progress = _Progress(verbose, strategy.extended.should_save_summary, epochs, steps)
    with contextlib.suppress(AttributeError):  # Keras clears it at fit's start too
        model.stop_training = False
    try:
        with strategy.scope():
            for cb in hooks:
                cb.on_train_begin()
            logs = loop.train(data, epochs, hooks, progress, steps_per_epoch, initial_epoch)
            for cb in hooks:
                cb.on_train_end(logs)
    finally:
        remove_directory(temporary)
    return history


def _known_steps(data: Any, call: str) -> int | None:
    """The steps of one pass over ``data``, or None where unknown; an epoch that could never
    end (an infinite dataset) or never start (an empty one) is refused up front, as Keras does,
    instead of training forever or reporting a NaN loss."""
    n = data.cardinality() if hasattr(data, "cardinality") else -2
    if n == INFINITE_CARDINALITY:
        fix = ("pass `steps_per_epoch=N`" if call == "fit" else
               "pass a finite dataset (e.g. `dataset.take(N)`)")
        raise ValueError(
            f"{call}: When passing an infinitely repeating dataset, you must specify the "
            f"`steps_per_epoch` argument: the dataset (cardinality {n}, e.g. from `.repeat()`) "
            f"never ends, so an epoch would never end; {fix}.")
    if n == 0:
        _refuse_empty(call)
    return n if n >= 0 else None


def _refuse_empty(call: str) -> NoReturn:
    raise ValueError(
        f"{call}: Expected input data to be non-empty: the dataset yields no batch (e.g. "
        "`batch(n, drop_remainder=True)` with fewer than n rows, or a filter or take(0) "
        "that keeps nothing), so there is nothing to train or evaluate on.")


@labelled("evaluate")
@accepts(strategy="mpidist.strategies.strategy:Strategy | None",
         metrics=Iterable[Metric | str | KerasMetric], verbose=Literal["auto", 0, 1, 2],
         autodiff=str | None)
def evaluate(model: Any, dataset: Any, *, strategy: Strategy | None = None,
             metrics: Iterable[Metric | str | KerasMetric] = (), verbose: Literal["auto", 0, 1, 2] = 0,
             autodiff: str | None = None) -> dict[str, float]:
    """The mean per-example loss over ``dataset`` and each metric's result, as a dict.

    ``per_example_loss(x, y)`` gives the loss when the model has it; otherwise
    ``loss(params, x, y)`` on the variables' values (computed with ``autodiff``'s arrays, as
    in ``fit``), or the loss from ``loss_and_gradients`` (its gradients are discarded). The
    strategy is that of the model's variables unless given (as in ``fit``). Collective under
    MultiWorkerMirroredStrategy: every rank calls it with the same arguments.
    """
    _check_model(model, need_gradients=False)
    _check_autodiff(autodiff, "evaluate")
    strategy = _resolve_strategy(strategy, model, None, "evaluate")
    data = _distributed(strategy, dataset)
    _known_steps(data, "evaluate")  # an infinite or empty dataset is refused up front
    metrics = _metrics(metrics, strategy, "evaluate")

    def replica_step(x: Any, y: Any) -> Any:
        outputs: tuple[Any, ...]
        if hasattr(model, "per_example_loss"):
            per_example, outputs = model.per_example_loss(x, y), ()
        elif not hasattr(model, "loss_and_gradients") and hasattr(model, "loss"):
            per_example, predictions = model_per_example_loss(model, x, y, autodiff)
            outputs = () if predictions is None else (per_example, None, predictions)
        else:
            outputs = model.loss_and_gradients(x, y)
            per_example = outputs[0]
        check_per_example(per_example, y, "the model's per-example loss")
        _update_metrics(metrics, model, x, y, outputs)
        return _loss_totals(per_example)

    with strategy.scope():
        for metric in metrics:
            metric.reset_state()
        totals = np.zeros(2)
        for batch in _epoch_steps(data, 0):
            x, y = _split(batch)
            per_replica = strategy.run(replica_step, args=(x, y))
            totals += as_array(strategy.reduce(ReduceOp.SUM, per_replica, axis=None))
        logs = {"loss": totals[0] / totals[1] if totals[1] else float("nan")}
        for metric in metrics:
            logs[metric.name] = float(metric.result())
    if verbose and strategy.extended.should_save_summary:
        print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)
    return logs
