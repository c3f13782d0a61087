"""Optimizers whose ``apply_gradients`` works under every strategy (spec 10.4).

In replica context (inside ``strategy.run``) ``apply_gradients`` sums the replicas' gradients
with one fused all-reduce (``ReplicaContext.all_reduce`` of the whole list, which packs it into
one ``batch_reduce_to``), clips them if asked, then ``merge_call``s once to update every
replica's copy of every variable with the same arithmetic on the same numbers, so the copies
stay bit-identical. Slot variables (momentum, Adam's moments) are created like their variables:
mirrored when the variable is, in the variable's strategy.

What an update computes is the optimizer's rule (``mpidist.ops.update_rules``: slots,
hyperparameters, one formula and its fused kernel); where it runs is the applier its strategy
declares (``StrategyExtended.update_applier``, ``mpidist.strategies.update_appliers``): the
replicas' fused or per-variable path here, or the parameter servers (``mpidist.ps.updates``).
"""

import inspect
import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, cast

import numpy as np

from mpidist.backend import array_module
from mpidist.core import state
from mpidist.core.messages import short_repr
from mpidist.core.signatures import CallShapes, accepts, check_callable, describe_value
from mpidist.core.tf_names import tf_name_hints
from mpidist.core.user_calls import user_call
from mpidist.strategies.context import get_replica_context, get_strategy, in_cross_replica_context
from mpidist.strategies.default import get_default_strategy
from mpidist.training.autodiff import gradients_for_minimize
from mpidist.training.fused_apply import HEAD, FusedPlan, components_of, grads_per_device
from mpidist.training.gradient_checks import GradientChecks
from mpidist.training.deferred_restore import restore_deferred
from mpidist.ops.update_rules import AdamRule, MomentumRule, SGDRule, UpdateRule
from mpidist.ops.update_rules import positive_float as _positive_float
from mpidist.strategies.update_appliers import UpdateApplier
from mpidist.types import ReduceOp, VariableAggregation
from mpidist.values.containers import DistributedValues, PerReplica
from mpidist.values.variables import Variable

__all__ = ["Optimizer", "SGD", "Adam", "UnknownSlotError"]


def _is_real_scalar(value: Any) -> bool:
    """A Python or NumPy real number, or a 0-d real array (what a schedule may return)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    dtype = getattr(value, "dtype", None)
    return isinstance(dtype, np.dtype) and dtype.kind in "iuf" and getattr(value, "shape", None) == ()


class UnknownSlotError(ValueError):
    """``get_slot`` of a variable or slot name the optimizer does not have (a bad argument;
    Keras 2 raised a bare KeyError from its slot dictionary)."""



def _components(x: Any) -> Any:
    """A distributed variable as a PerReplica of its component variables, so that
    ``extended.update`` hands each component of the updated variable the matching component."""
    if isinstance(x, DistributedValues):
        return PerReplica(x.values, x.devices)
    return x


_VARIABLES = "mpidist.values.variables:Variable | mpidist.ps.sharded_variable:ShardedVariable"

# The callables an optimizer takes, by the calls it makes of them (checked when handed over,
# not at their first call: core.signatures.CallShapes).
LEARNING_RATE = CallShapes(
    "a learning-rate schedule",
    {0: "f() (Keras's callable learning rate: the current rate)",
     1: "f(step) (a schedule, like Keras's LearningRateSchedule: the rate after `step` updates)"},
    example="lambda: 0.1, or lambda step: 0.1 * 0.96 ** step", unknown=1, also="a number")
LOSS = CallShapes(
    "the loss minimize differentiates",
    {0: "loss() (TF's: it reads the variables of var_list)",
     1: "loss(params) (value_and_grad's: the values of var_list, in order)"},
    example="lambda: ((w - 3.0) ** 2).sum()")
VAR_LIST = CallShapes("a var_list callable", {0: "var_list()"},
                      example="lambda: model.trainable_variables")


# Arguments of older Keras and TF optimizers, with what takes their place here.
_RENAMED_ARGUMENTS = {
    "lr": "`learning_rate`",
    "decay": "a schedule (learning_rate=lambda step: lr0 / (1 + decay * step))",
}


def _unknown_arguments(cls: type, unknown: dict[str, Any]) -> str:
    """The error for keyword arguments ``cls`` does not take, with the replacement of each one
    older Keras or TF took (``lr``, ``decay``)."""
    fixes = [f"`{key}` is {_RENAMED_ARGUMENTS[key]} now" for key in unknown
             if key in _RENAMED_ARGUMENTS]
    taken = ", ".join(p for p in inspect.signature(cls).parameters if p != "kwargs")
    return (f"{cls.__name__}() got unexpected keyword argument(s) {sorted(unknown)}"
            + (f" ({'; '.join(fixes)})" if fixes else "") + f". It takes: {taken}, clipnorm, "
            "clipvalue, global_clipnorm.")


def _numbers_only(owner: str, **values: Any) -> None:
    """TypeError for a callable given as a hyperparameter that only takes a number here
    (Keras 2 also called a zero-argument callable for momentum, beta_1, beta_2 and epsilon;
    here only learning_rate takes one): named at construction, not as "must be a number"."""
    for argument, value in values.items():
        if callable(value):
            raise TypeError(
                f"{owner}: argument {argument!r} got {describe_value(value)}; it accepts a "
                "number (of the optimizer's hyperparameters only learning_rate takes a "
                f"callable). Fix: pass its value, e.g. {argument}={_EXAMPLE_VALUES[argument]}.")


_EXAMPLE_VALUES = {"momentum": 0.9, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7,
                   "clipnorm": 1.0, "clipvalue": 0.5, "global_clipnorm": 1.0}


@tf_name_hints("Optimizer")
class Optimizer:
    """Base class: gradient aggregation, clipping, slots, ``iterations`` and checkpointing.

    Args:
        learning_rate: a float; or a callable, told apart by its signature when it is set:
            ``f()`` (Keras's callable learning rate, called at every update) or ``f(step)``
            (a schedule, like Keras's ``LearningRateSchedule``, called with the number of
            updates applied so far). Another signature is a TypeError naming it.
        clipnorm: clip each gradient to this L2 norm (after the all-reduce, as Keras does).
        clipvalue: clip each gradient element to ``[-clipvalue, clipvalue]``.
        global_clipnorm: clip all gradients together to this global L2 norm.
        name: a name for the optimizer's variables.

    Create the optimizer inside ``strategy.scope()``: its ``iterations`` counter is then a
    mirrored variable, like the slots created for mirrored variables.

    A subclass sets ``self._rule`` (an ``UpdateRule``) before calling ``__init__``; one that
    overrides ``_update_step(variable, gradient, slots, lr, step)`` instead declares a
    per-variable step of its own: it is never fused, and on parameter servers it reads,
    computes and writes.
    """

    _rule: UpdateRule | None = None
    _custom_step = False  # set for a class that defines its own _update_step

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_update_step" in cls.__dict__:
            cls._custom_step = True

    def __init__(self, learning_rate: Any, clipnorm: Any = None, clipvalue: Any = None,
                 global_clipnorm: Any = None, name: Any = "Optimizer", **unknown: Any) -> None:
        if unknown:
            raise TypeError(_unknown_arguments(type(self), unknown))
        _numbers_only(type(self).__name__, clipnorm=clipnorm, clipvalue=clipvalue,
                      global_clipnorm=global_clipnorm)
        if sum(x is not None for x in (clipnorm, clipvalue, global_clipnorm)) > 1:
            raise ValueError("Only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set.")
        self.clipnorm = None if clipnorm is None else _positive_float("clipnorm", clipnorm)
        self.clipvalue = None if clipvalue is None else _positive_float("clipvalue", clipvalue)
        self.global_clipnorm = (None if global_clipnorm is None
                                else _positive_float("global_clipnorm", global_clipnorm))
        if not isinstance(name, str):
            raise TypeError(f"Optimizer name must be a string, got {name!r}.")
        self.name = name
        self.learning_rate = learning_rate  # (checked by the property's setter)
        self._strategy = get_strategy()
        with self._strategy.scope():
            self._iterations = Variable(np.int64(0), trainable=False, name=f"{name}/iterations",
                                        aggregation=VariableAggregation.ONLY_FIRST_REPLICA)
        # per variable, in the order first seen: {slot name: variable}
        self._slots: list[dict[str, Variable]] = []
        self._var_index: dict[int, int] = {}  # id(variable) -> index into _slots
        self._owners: list[Any] = []  # the variable of each entry of _slots (rebuilds _var_index)
        # What a checkpoint numbers: the variables as the user passed them (a sharded variable
        # is one entry whose slots are saved whole), so slots restore under any sharding.
        self._checkpoint_groups: list[Any] = []
        self._checkpoint_index: dict[int, int] = {}  # id(variable) -> index into _checkpoint_groups
        self._joiners: dict[int, Any] = {}  # index into _checkpoint_groups -> applier that joins its shards
        # tuple of variable ids -> FusedPlan, or None where none fits
        self._plans: dict[tuple[int, ...], FusedPlan | None] = {}
        self._last_plan: FusedPlan | None = None
        self._checks = GradientChecks()  # remembers the last step's checked variables
        self._dtypes_checked: Any = None  # the variables tuple whose dtypes were last checked
        self._updates = _OptimizerUpdates(self)  # what the strategy's applier drives
        # (coefficients, dtype, cast) of the last fused update
        self._last_cast: tuple[Any, Any, Any] = ((), None, ())

    @property
    def iterations(self) -> Variable:
        """How many times ``apply_gradients`` has updated the variables."""
        return self._iterations

    @property
    def _slot_names(self) -> tuple[str, ...]:
        return self._rule.slots if self._rule is not None else ()

    @property
    def learning_rate(self) -> Any:
        """A number, or a callable: ``f()`` (Keras's callable learning rate) or ``f(step)``
        (a schedule of the updates applied so far), told apart by its signature when it is
        set (``LEARNING_RATE``); a callable that fits neither is a TypeError then. Set it at
        any time (Keras's learning-rate callbacks do): the next update uses it."""
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        if callable(value):
            self._lr_arity = check_callable(value, LEARNING_RATE, type(self).__name__,
                                            "learning_rate")
        else:
            value = _positive_float("learning_rate", value, allow_zero=True)
        self._learning_rate = value

    def _current_learning_rate(self, step: int | None = None) -> Any:
        """The learning rate at ``step`` (default: the current ``iterations``)."""
        lr = self._learning_rate
        if not callable(lr):
            return lr
        step = int(np.asarray(self._iterations)) if step is None else step
        value = lr(step) if self._lr_arity else lr()
        if not _is_real_scalar(value):
            raise TypeError(
                f"The learning_rate schedule of optimizer {self.name!r} returned {value!r} for "
                f"step {step}; it must return a number, e.g. "
                "lambda step: 0.1 * 0.9 ** step."
            )
        return float(value)

    # -- slots --------------------------------------------------------------------------------
    @accepts(var_list=Iterable[_VARIABLES])  # type: ignore[valid-type]  # accepts reads the string
    def build(self, var_list: Any) -> None:
        """Create the slot variables of ``var_list`` now (``apply_gradients`` does it on first
        use). Slots created after a ``Checkpoint.restore`` take their saved values here.
        Under ParameterServerStrategy call it on the coordinator, in the strategy's scope,
        before scheduling steps: each slot is created on its variable's parameter server (a
        ShardedVariable gets slots per shard, checkpointed as one full array per slot, as TF)."""
        var_list = list(var_list)
        self._check_dtypes(var_list)
        created = False
        for var in var_list:
            if id(var) in self._checkpoint_index:
                continue
            applier = _applier_of(var, self._strategy)
            shards = applier.shards(var)
            if shards is not None:
                created = self._build_one_each(shards, checkpointed_alone=False) or created
                self._checkpoint_index[id(var)] = len(self._checkpoint_groups)
                self._joiners[len(self._checkpoint_groups)] = applier
                self._checkpoint_groups.append(var)
                continue
            created = self._build_one_each([var], checkpointed_alone=True) or created
        if created:
            restore_deferred()  # TF's deferred restoration, before any update reads the slots

    def _check_dtypes(self, variables: Sequence[Any]) -> None:
        """TypeError naming the first variable that is not floating point (or complex): its
        every update would be rounded to its integer or boolean dtype (``lr * g`` = 0.05 adds
        0), a silent no-op. Checked before anything is created or updated."""
        for var in variables:
            dtype = np.dtype(getattr(var, "dtype", np.float64))
            if dtype.kind not in "fc":
                raise TypeError(
                    f"{type(self).__name__}: variable {getattr(var, 'name', var)!r} has dtype "
                    f"{dtype}, and an optimizer updates floating-point variables only: each "
                    f"update would be rounded to {dtype} (lr * gradient = 0.05 adds 0). Create "
                    "it with a float dtype (e.g. dtype=np.float32), or leave it out of the "
                    "gradients (trainable=False for a counter or a mask).")

    def _build_one_each(self, variables: Sequence[Any], checkpointed_alone: bool) -> bool:
        """Slots for each of ``variables`` that has none yet; ``checkpointed_alone``: each is a
        variable of its own in checkpoints (not a shard, checkpointed with its ShardedVariable)."""
        created = False
        for var in variables:
            if id(var) in self._var_index:
                continue
            strategy = getattr(var, "distribute_strategy", None) or self._strategy
            slots = {}
            names = self._slot_names
            rule: UpdateRule = self._rule  # type: ignore[assignment]  # names: a rule's slots
            with strategy.scope():
                where = strategy.extended.update_applier.slot_scope(strategy.extended, var) \
                    if names else contextlib.nullcontext()
                with where:
                    for slot in names:
                        slots[slot] = Variable(rule.initial_slot(slot, var.shape, var.dtype),
                                               trainable=False, name=f"{var.name}/{slot}")
            self._var_index[id(var)] = len(self._slots)
            self._slots.append(slots)
            self._owners.append(var)
            if checkpointed_alone:
                self._checkpoint_index[id(var)] = len(self._checkpoint_groups)
                self._checkpoint_groups.append(var)
            created = True
        return created

    def __getstate__(self) -> dict[str, Any]:
        # Sent to parameter-server workers with a scheduled function: variables travel as
        # handles, so the id-keyed indexes are rebuilt on arrival; plans are per process.
        state_ = dict(self.__dict__)
        for key in ("_var_index", "_checkpoint_index", "_plans", "_last_plan", "_checks",
                    "_dtypes_checked", "_updates", "_last_cast"):
            state_.pop(key, None)
        return state_

    def __setstate__(self, state_: dict[str, Any]) -> None:
        self.__dict__.update(state_)
        self._var_index = {id(v): i for i, v in enumerate(self._owners)}
        self._checkpoint_index = {id(v): i for i, v in enumerate(self._checkpoint_groups)}
        self._plans = {}
        self._last_plan = None
        self._checks = GradientChecks()
        self._dtypes_checked = None
        self._updates = _OptimizerUpdates(self)
        self._last_cast = ((), None, ())

    @accepts(slot_name=str)
    def get_slot(self, var: Any, slot_name: str) -> Variable:
        """The slot variable ``slot_name`` of ``var``; UnknownSlotError (a ValueError) if it has
        none."""
        index = self._var_index.get(id(var))
        shown = getattr(var, "name", None) or short_repr(var)
        if index is None:
            raise UnknownSlotError(
                f"Optimizer {self.name!r} has no slots for variable {shown!r}: it has not "
                "updated it yet. Call optimizer.build([var, ...]) or apply_gradients first.")
        if slot_name not in self._slots[index]:
            raise UnknownSlotError(
                f"{shown!r} has no slot {slot_name!r}; slots: {list(self._slot_names)}.")
        return self._slots[index][slot_name]

    def _checkpoint_dependencies(self) -> dict[str, Any]:
        """What a Checkpoint saves: the update counter and every slot, by variable order (a
        sharded variable's slots joined by its applier: one full-shape array each)."""
        slots = {}
        for i, var in enumerate(self._checkpoint_groups):
            joiner = self._joiners.get(i)
            if joiner is not None:
                per_shard = [self._slots[self._var_index[id(s)]] for s in joiner.shards(var)]
                entry = {name: joiner.join_shards(var, [p[name] for p in per_shard],
                                                  f"{var.name}/{name}")
                         for name in self._slot_names}
            else:
                entry = dict(self._slots[self._var_index[id(var)]])
            if entry:
                slots[str(i)] = entry
        return {"iterations": self._iterations, "slots": slots}

    # -- applying -----------------------------------------------------------------------------
    @accepts(var_list=Iterable[_VARIABLES] | Variable  # type: ignore[valid-type]  # accepts
             | Annotated[Callable, VAR_LIST])  # reads the string
    def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> Variable:
        """One update that lowers ``loss`` (TF's ``Optimizer.minimize``): the gradients of
        ``loss`` with respect to ``var_list``, then ``apply_gradients``. Returns what that
        returns, the ``iterations`` variable.

        Args:
            loss: A callable returning the scalar loss: TF's ``loss()``, which reads the
                variables of ``var_list`` (``lambda: ((w - 3.0) ** 2).sum()``), or
                value_and_grad's ``loss(params)``, which takes their values in order. Written
                with ``autograd.numpy`` (or ``jax.numpy``, GPU variables): it is
                differentiated by ``mpidist.autodiff.value_and_grad``'s machinery. Inside
                ``loss()`` the variables read as traced values wherever a read can carry the
                gradient (``x @ w + b``, ``w ** 2``, ``w[i]``, ``w.value()``, autograd's
                functions of ``w``); a constant read (``np.asarray(w)``, a plain NumPy
                function of ``w``, ``w.numpy()``, ``float(w)``) is a TypeError naming it. A
                loss value computed beforehand is a ValueError, as TF's without a tape.
            var_list: The variables to update: a list or tuple of them (one variable is
                taken as a list of one, as TF flattens it), or a zero-argument callable
                returning one (called before the loss here).
            tape: TF's GradientTape; mpidist has none: only None.

        A variable the loss does not use gets no gradient and is not updated (TF's None
        gradient); an integer or boolean variable is a TypeError. Like ``apply_gradients``,
        call it inside ``strategy.run`` (each replica's gradients are summed), or outside any
        strategy scope; in cross-replica context it raises TF's RuntimeError before the loss
        runs.
        """
        self._require_replica_context("minimize")
        where = f"{type(self).__name__}.minimize"
        if tape is not None:
            raise ValueError(
                f"{where}: argument 'tape' got {short_repr(tape)}; mpidist has no "
                "GradientTape: pass the loss as a callable (loss=lambda: ...) and leave tape "
                "None, or compute the gradients with mpidist.autodiff.value_and_grad and call "
                "apply_gradients.")
        if not callable(loss):
            raise ValueError(
                f"{where}: `tape` is required when a `Tensor` loss is passed (TF's error): "
                f"argument 'loss' got {short_repr(loss)}, a value computed beforehand, which "
                "carries no gradient. Pass the computation instead, a callable: "
                f"loss=lambda: <the expression>, e.g. {LOSS.example}.")
        arity = check_callable(loss, LOSS, where, "loss")
        if callable(var_list) and not isinstance(var_list, Variable):
            var_list = var_list()  # (its signature was checked on entry)
        variables = var_list
        if isinstance(var_list, Variable):
            variables = [var_list]  # TF flattens var_list: one variable is a list of one
        elif isinstance(var_list, Iterable) and not isinstance(var_list, (list, tuple, str)):
            variables = list(var_list)  # (anything else: gradients_for_minimize names it)
        _, grads = gradients_for_minimize(loss, arity, variables, where)
        return self.apply_gradients(zip(grads, variables))

    def _require_replica_context(self, method: str) -> None:
        """TF's RuntimeError for an update asked in cross-replica context (inside a
        strategy's scope, outside its run); none outside every scope."""
        if in_cross_replica_context() and not state.current_mode().is_default:
            raise RuntimeError(
                f"`{method}() cannot be called in cross-replica context. Use "
                "`mpidist.Strategy.run` to enter replica context.")

    @accepts(experimental_aggregate_gradients=bool)
    def apply_gradients(self, grads_and_vars: Any, name: Any = None,
                        experimental_aggregate_gradients: bool = True) -> Variable:
        """Apply one update: ``grads_and_vars`` is an iterable of ``(gradient, variable)``.

        In replica context the gradients are first summed over all replicas (one fused
        all-reduce) unless ``experimental_aggregate_gradients=False`` (then they must already
        be). Pairs whose gradient is None are skipped. Returns the ``iterations`` variable.

        Collective under MultiWorkerMirroredStrategy: every rank must call it, in the same order
        and with the same arguments (docs/multi_worker.md, "Collective calls").
        """
        self._require_replica_context("apply_gradients")
        strategy = get_strategy()
        return cast(Variable, strategy.extended.update_applier.apply_gradients(
            self._updates, strategy, grads_and_vars, name, experimental_aggregate_gradients))

    def apply_mean_gradients(self, grads_and_vars: Any, totals: Any) -> Any:
        """Apply the mean gradient over the global batch: ``mpidist.fit``'s update.

        ``totals`` is this replica's ``[sum of its per-example losses, number of examples]``
        (two real numbers: a float array is used as it is, anything else becomes float64,
        which keeps the loss sum as fit reports it). The gradients (this replica's sums over its examples) and
        ``totals`` are summed over all replicas in one all-reduce; the gradients are divided
        by the global number of examples and applied. Returns the summed totals. Every
        replica may hold a different number of examples (a short last batch): the mean is
        exact, not a mean of per-replica means. Replica context only (inside
        ``strategy.run``).

        Collective under MultiWorkerMirroredStrategy: every rank must call it, in the same order
        and with the same arguments (docs/multi_worker.md, "Collective calls").
        """
        ctx = get_replica_context()
        if ctx is None or in_cross_replica_context():
            raise RuntimeError(
                "apply_mean_gradients() sums the replicas' gradients and must be called in "
                "replica context: call it inside the step that `strategy.run` runs.")
        totals = _as_totals(totals)
        strategy = get_strategy()
        return strategy.extended.update_applier.apply_mean_gradients(
            self._updates, strategy, grads_and_vars, totals)

    def _apply_mean(self, strategy: Any, grads_and_vars: Any, totals: Any,
                    in_replicas: bool) -> Any:
        """``apply_mean_gradients`` (``OptimizerUpdates.apply_mean``): with ``in_replicas``,
        the totals ride in the head of the packed gradient buffer (one all-reduce, the
        division in place, one fused kernel) where the fused path applies; else, or where it
        does not, one all-reduce of ``[totals] + gradients`` and ``apply_gradients`` of the
        means."""
        grads, variables, signature = self._checks.check(grads_and_vars, None, strategy,
                                                         "apply_mean_gradients")
        hyperparameters = self.hyperparameters()
        if in_replicas:
            if variables is not self._dtypes_checked:
                self._check_dtypes(variables)
                self._dtypes_checked = variables
            self._check_strategy(strategy)
            with user_call("Optimizer.apply_mean_gradients", num_variables=len(variables),
                           aggregate=True, mean="examples", **hyperparameters):
                summed = self._lean_apply_mean(strategy, grads, variables, signature, totals,
                                               hyperparameters["learning_rate"])
            if summed is not None:
                return summed
        # The optimizer's settings join this all-reduce's cross-rank check: apply_gradients
        # below moves no data, so a rank with another learning rate would drift silently.
        with user_call("Optimizer.apply_mean_gradients", **hyperparameters):
            reduced = get_replica_context().all_reduce(  # type: ignore[union-attr]  # checked
                ReduceOp.SUM, [totals] + grads)
        count = _global_count(reduced[0])
        means = [g / g.dtype.type(count) for g in reduced[1:]]
        self.apply_gradients(zip(means, variables), experimental_aggregate_gradients=False)
        return reduced[0]

    def _apply_in_replicas(self, strategy: Any, grads_and_vars: Any, name: Any,
                           experimental_aggregate_gradients: bool) -> Variable:
        """The replicas' applier (``ReplicaUpdates``): sum, clip, then update every copy, with
        the fused kernel where the layout allows."""
        grads, variables, signature = self._checks.check(grads_and_vars, name, strategy)
        if variables is not self._dtypes_checked:  # the repeating step passes the same tuple
            self._check_dtypes(variables)
            self._dtypes_checked = variables
        self._check_strategy(strategy)
        ctx = get_replica_context()
        hyperparameters = self.hyperparameters()
        with user_call("Optimizer.apply_gradients", num_variables=len(variables),
                       aggregate=bool(experimental_aggregate_gradients), **hyperparameters):
            if self._lean_apply(strategy, grads, variables, signature,
                                experimental_aggregate_gradients, hyperparameters["learning_rate"]):
                return self._iterations
            if experimental_aggregate_gradients and ctx is not None:
                grads = list(ctx.all_reduce(ReduceOp.SUM, grads))
            grads = self._clip(grads)
            ctx.merge_call(self._distributed_apply, args=(grads, variables))  # type: ignore[union-attr]
        return self._iterations

    def hyperparameters(self) -> dict[str, Any]:
        """The settings that decide an update, as a dict: the optimizer's class, the current
        learning rate (a schedule's value at this step), clipping and the class's own
        settings. Under MultiWorkerMirroredStrategy the ranks agree on them with the gradients'
        all-reduce, so a rank given another learning rate is an error, not a silently
        diverging copy of the model."""
        return {"optimizer": type(self).__name__, "learning_rate": self._current_learning_rate(),
                "clipnorm": self.clipnorm, "clipvalue": self.clipvalue,
                "global_clipnorm": self.global_clipnorm, **self._own_hyperparameters()}

    def _own_hyperparameters(self) -> dict[str, Any]:
        return self._rule.hyperparameters() if self._rule is not None else {}

    def _check_strategy(self, strategy: Any) -> None:
        """The optimizer's own state (``iterations``) must live where its updates run."""
        mine = self._strategy
        if mine is not strategy and mine is not get_default_strategy():
            raise ValueError(
                f"Optimizer {self.name!r} was created in the scope of {mine} but "
                f"apply_gradients runs under {strategy}: create the optimizer inside the "
                "same `with strategy.scope():` as the variables it trains."
            )

    def _clip(self, grads: list[Any]) -> list[Any]:
        if self.clipvalue is not None:
            return [array_module(g).clip(g, -self.clipvalue, self.clipvalue) for g in grads]
        if self.clipnorm is not None:
            out = []
            for g in grads:
                xp = array_module(g)
                norm = float(xp.sqrt(xp.sum(xp.square(g))))
                out.append(g * (self.clipnorm / norm) if norm > self.clipnorm else g)
            return out
        if self.global_clipnorm is not None:
            total = float(np.sqrt(sum(float(array_module(g).sum(g * g)) for g in grads)))
            if total > self.global_clipnorm:
                return [g * (self.global_clipnorm / total) for g in grads]
        return grads

    # -- the fused path (docs/training.md, "How the step is fast") -----------------------------
    @property
    def _clips_by_norm(self) -> bool:
        """Norm clipping needs every gradient's norm first: it keeps the per-variable path."""
        return self.clipnorm is not None or self.global_clipnorm is not None

    def _fusable(self) -> bool:
        """Whether the update is the rule's fused kernel: not for a per-variable step of a
        subclass's own."""
        return self._rule is not None and not self._custom_step

    def _plan_for(self, variables: Sequence[Any]) -> FusedPlan | None:
        """The FusedPlan of this exact list of variables (built on first use), or None."""
        last = self._last_plan
        if last is not None and last.variables is variables:  # the repeating step
            return last
        key = tuple(map(id, variables))
        if key in self._plans:
            if self._plans[key] is not None:
                self._last_plan = self._plans[key]
            return self._plans[key]
        plan = None
        if self._fusable() and not any(id(v) in self._planned for v in variables):
            slot_vars = [self._slots[self._var_index[id(v)]] for v in variables]
            plan = FusedPlan.build(variables, slot_vars, self._slot_names)
        if len(self._plans) < 8:  # a model alternates between few lists, if any
            self._plans[key] = plan
        if plan is not None:
            self._last_plan = plan
        return plan

    @property
    def _planned(self) -> set[int]:
        return {id(v) for plan in self._plans.values() if plan is not None
                for v in plan.variables}

    def _lean_apply(self, strategy: Any, grads: list[Any], variables: Sequence[Any],
                    signature: Any, aggregate: bool, lr: Any) -> bool:
        """One local replica (OneDevice, the default strategy, one replica per rank): pack the
        gradients once, sum them across ranks as one buffer, one fused kernel, no merge_call.
        False (nothing touched) where this path does not apply; the caller then takes the
        general one."""
        reduce = aggregate and strategy.num_replicas_in_sync > 1
        packed = self._packed(strategy, grads, variables, signature, reduce, exact_dtype=reduce)
        if packed is None:
            return False
        plan, reduction = packed
        if reduction is not None:
            reduction.all_reduce_packed(plan.grads[0], plan.layout)
        self._fused_step(plan, 0, lr)
        self._count_step()
        return True

    def _lean_apply_mean(self, strategy: Any, grads: list[Any], variables: Sequence[Any],
                         signature: Any, totals: Any, lr: Any) -> Any:
        """``_lean_apply`` for ``apply_mean_gradients``: the gradients packed behind the totals
        (``FusedPlan.grads_with_head``), one all-reduce of both where the totals have the
        arena's dtype (else one each), the gradients divided in place by the global count,
        one fused kernel. The summed totals, or None (nothing touched) where the fused path
        does not apply."""
        if type(totals) is not np.ndarray:  # (its shape was checked by _as_totals)
            return None
        # exact_dtype: the division runs in the gradients' dtype, as the per-variable path's.
        packed = self._packed(strategy, grads, variables, signature,
                              reduce=strategy.num_replicas_in_sync > 1, exact_dtype=True)
        if packed is None or type(packed[0].grads[0]) is not np.ndarray:
            return None
        plan, reduction = packed
        flat, with_head = plan.grads[0], plan.grads_with_head[0]
        if with_head.dtype == totals.dtype:  # one all-reduce: the totals ride in the head
            with_head[:HEAD] = totals
            if reduction is not None:
                reduction.all_reduce_packed(with_head, plan.layout_with_head)
            summed = with_head[:HEAD].copy()
        else:  # e.g. float32 gradients: the float64 totals go first, on their own
            summed = totals if reduction is None else reduction.all_reduce(
                ReduceOp.SUM, [totals])[0].copy()
            if reduction is not None:
                reduction.all_reduce_packed(flat, plan.layout)
        # The division of the per-variable path (g / dtype(n)), in place over the arena.
        np.divide(flat, flat.dtype.type(_global_count(summed)), out=flat)
        self._fused_step(plan, 0, lr)
        self._count_step()
        return summed

    def _packed(self, strategy: Any, grads: list[Any], variables: Sequence[Any],
                signature: Any, reduce: bool, exact_dtype: bool
                ) -> tuple[FusedPlan, Any] | None:
        """The fused path's eligibility, in one place: ``(plan, reduction)`` with the gradients
        packed into the plan's buffer (``reduction`` the strategy's plan where they are to be
        summed across replicas, else None; ``exact_dtype``: only gradients of the arena's
        dtype, no cast); None, with nothing touched, where the path does not
        apply (clipping by norm, several local replicas, a first step without slots, a
        gradient the plan cannot take)."""
        if self._clips_by_norm:
            return None
        reduction = strategy.extended.reduction_plan() if reduce else None
        if reduction is not None and not reduction.packs_arena:
            return None
        last = self._last_plan
        if (last is None or last.variables is not variables) \
                and not all(id(v) in self._var_index for v in variables):
            return None  # the first step creates the slots, in cross-replica context
        plan = self._plan_for(variables)
        # One copy per variable means one local replica: no other replica thread runs this.
        if plan is None or plan.num_devices != 1 \
                or not plan.pack(0, grads, exact_dtype=exact_dtype, signature=signature):
            return None
        return plan, reduction

    def _fused_step(self, plan: FusedPlan, index: int, lr: Any) -> None:
        if self.clipvalue is not None:  # elementwise, so one pass over the arena is exact
            xp = array_module(plan.grads[index])
            xp.clip(plan.grads[index], -self.clipvalue, self.clipvalue, out=plan.grads[index])
        plan.update(index, self._fused_update, lr, self._completed_steps() + 1)

    def _completed_steps(self) -> int:
        """``iterations`` as an int, read in place from its first copy (the copies agree)."""
        copies = components_of(self._iterations)
        if copies is None:  # not a plain or mirrored variable: read it the public way
            return int(np.asarray(self._iterations))
        return int(copies[0].storage)

    def _count_step(self) -> None:
        """``iterations += 1`` on every copy (the fused path runs in replica context), in
        place: the counter is the optimizer's own int64, so no assign checks are needed."""
        copies: tuple[Variable, ...] = components_of(self._iterations)  # type: ignore[assignment]
        for copy in copies:  # (a plain or mirrored int64: never None here)
            storage = copy.storage
            storage += 1  # ndarray / CuPy in-place add

    def _distributed_apply(self, strategy: Any, grads: list[Any], variables: Sequence[Any]
                           ) -> None:
        """Cross-replica: update each variable's every copy, then count the step once."""
        last = self._last_plan
        if last is None or last.variables is not variables:  # a plan's variables have slots
            self.build(variables)
        lr = self._current_learning_rate()
        plan = None if self._clips_by_norm else self._plan_for(variables)
        if plan is not None:
            per_device = grads_per_device(grads, plan.num_devices)
            if all(plan.pack(i, g, exact_dtype=False) for i, g in enumerate(per_device)):
                for i in range(plan.num_devices):
                    self._fused_step(plan, i, lr)
                self._iterations.assign_add(1)
                return
        step = int(np.asarray(self._iterations)) + 1
        for grad, var in zip(grads, variables):
            slots = self._slots[self._var_index[id(var)]]
            slot_args = [_components(slots[name]) for name in self._slot_names]

            def apply(component: Any, g: Any, *slot_components: Any) -> None:
                self._update_step(component, g, slot_components, lr, step)

            strategy.extended.update(var, apply, args=(grad, *slot_args), group=False)
        self._iterations.assign_add(1)

    def _fused_update(self, w: Any, g: Any, slots: Any, lr: Any, step: int) -> None:
        """The rule's fused kernel over one device's arenas."""
        rule: UpdateRule = self._rule  # type: ignore[assignment]  # plans exist for rules only
        coefficients = rule.coefficients(lr, step)
        last = self._last_cast  # the repeating step (and every device after the first) hits
        # Equal floats have equal bits except 0.0 and -0.0: coefficients with a zero never hit.
        if last[0] != coefficients or last[1] is not w.dtype:
            cast = rule.cast(coefficients, w.dtype)
            last = (coefficients, w.dtype, cast)
            self._last_cast = ((), None, ()) if 0.0 in coefficients else last
        rule.fused(w, g, slots, last[2])

    def _update_step(self, variable: Any, gradient: Any, slots: Sequence[Any], lr: Any,
                     step: int) -> None:
        """Update one copy of a variable in place (``variable`` is a plain Variable, or a
        parameter server's) by the rule's formula: read, compute, write."""
        rule = self._rule
        if rule is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no update rule: set self._rule to an "
                "mpidist.ops.update_rules.UpdateRule, or override _update_step.")
        w = variable.current_array()
        g = gradient.astype(w.dtype, copy=False)
        step_ = rule.formula(w, g, tuple(s.current_array() for s in slots),
                             rule.cast(rule.coefficients(lr, step), w.dtype))
        for slot, value in zip(slots, step_.slots):
            slot.assign(value, read_value=False)
        if step_.subtract:
            variable.assign_sub(step_.delta, read_value=False)
        else:
            variable.assign_add(step_.delta, read_value=False)


def _applier_of(var: Any, default_strategy: Any) -> UpdateApplier:
    """The applier of the strategy ``var`` was created in (the optimizer's, for a value)."""
    strategy = getattr(var, "distribute_strategy", None) or default_strategy
    return cast(UpdateApplier, strategy.extended.update_applier)


class _OptimizerUpdates:
    """What an optimizer offers its strategy's applier (``strategies.update_appliers.
    OptimizerUpdates``): a view on the optimizer, so appliers use no private member of it."""

    __slots__ = ("_opt", "__weakref__")

    def __init__(self, optimizer: "Optimizer") -> None:
        self._opt: Optimizer = weakref.proxy(optimizer)  # the optimizer holds this view: no cycle

    @property
    def rule(self) -> UpdateRule | None:
        opt = self._opt
        return None if opt._custom_step else opt._rule

    @property
    def iterations(self) -> Variable:
        return self._opt._iterations

    def apply_in_replicas(self, strategy: Any, grads_and_vars: Any, name: Any,
                          aggregate: bool) -> Variable:
        return self._opt._apply_in_replicas(strategy, grads_and_vars, name, aggregate)

    def apply_mean(self, strategy: Any, grads_and_vars: Any, totals: Any,
                   in_replicas: bool) -> Any:
        return self._opt._apply_mean(strategy, grads_and_vars, totals, in_replicas)

    def check(self, strategy: Any, grads_and_vars: Any, name: Any) -> tuple[Any, Any]:
        grads, variables, _ = self._opt._checks.check(grads_and_vars, name, strategy)
        return grads, variables

    def require_slots(self, variables: Sequence[Any], why: str) -> None:
        opt = self._opt
        missing = [v.name for v in variables if id(v) not in opt._var_index]
        names = opt._slot_names
        if missing and names:
            raise RuntimeError(
                f"Optimizer {opt.name!r} has no slot variables ({', '.join(names)}) for "
                f"{missing[:3]}{' ...' if len(missing) > 3 else ''}. {why}")

    def build(self, variables: Sequence[Any]) -> None:
        self._opt.build(variables)

    def clip(self, grads: list[Any]) -> list[Any]:
        return self._opt._clip(grads)

    def count_step(self) -> int:
        return int(self._opt._iterations.assign_add(1))

    def learning_rate(self, step: int) -> Any:
        return self._opt._current_learning_rate(step)

    def slots_of(self, variable: Any) -> tuple[Variable, ...]:
        opt = self._opt
        slots = opt._slots[opt._var_index[id(variable)]]
        return tuple(slots[n] for n in opt._slot_names)

    def update_variable(self, variable: Any, gradient: Any, slots: Sequence[Any], lr: Any,
                        step: int) -> None:
        self._opt._update_step(variable, gradient, slots, lr, step)


class SGD(Optimizer):
    """Gradient descent with optional momentum and Nesterov momentum (Keras's rule):
    ``m = momentum * m - lr * g``; ``w += m`` (or ``w += momentum * m - lr * g`` with Nesterov);
    without momentum ``w -= lr * g``. The rules: ``update_rules.MomentumRule``, or
    ``SGDRule`` without momentum."""

    def __init__(self, learning_rate: Any = 0.01, momentum: Any = 0.0, nesterov: Any = False,
                 name: Any = "SGD", **kwargs: Any) -> None:
        _numbers_only(type(self).__name__, momentum=momentum)
        with_momentum = MomentumRule(momentum, nesterov)  # checks both
        self.momentum, self.nesterov = with_momentum.momentum, with_momentum.nesterov
        self._rule = with_momentum if self.momentum else SGDRule()
        super().__init__(learning_rate, name=name, **kwargs)

    def _own_hyperparameters(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "nesterov": self.nesterov}


class Adam(Optimizer):
    """Adam (Keras's rule): ``m += (g - m)(1 - beta_1)``, ``v += (g² - v)(1 - beta_2)``,
    ``w -= lr·sqrt(1 - beta_2^t)/(1 - beta_1^t) · m / (sqrt(v) + epsilon)``; with ``amsgrad``
    the running maximum of ``v`` is used. The rule: ``update_rules.AdamRule``."""

    def __init__(self, learning_rate: Any = 0.001, beta_1: Any = 0.9, beta_2: Any = 0.999,
                 epsilon: Any = 1e-7, amsgrad: Any = False, name: Any = "Adam",
                 **kwargs: Any) -> None:
        _numbers_only(type(self).__name__, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
        self._rule = AdamRule(beta_1, beta_2, epsilon, amsgrad)
        self.beta_1, self.beta_2 = self._rule.beta_1, self._rule.beta_2
        self.epsilon, self.amsgrad = self._rule.epsilon, self._rule.amsgrad
        super().__init__(learning_rate, name=name, **kwargs)


def _as_totals(totals: Any) -> Any:
    """``apply_mean_gradients``' totals: a float array of 2 as it is (host or GPU), any other
    two real numbers as float64; else ValueError."""
    dtype = getattr(totals, "dtype", None)
    if isinstance(dtype, np.dtype) and dtype.kind == "f" and np.shape(totals) == (HEAD,):
        return totals
    try:
        host = np.asarray(totals)
    except (TypeError, ValueError):  # a GPU array of integers, a ragged list, ...
        host = None
    if host is None or host.shape != (HEAD,) or host.dtype.kind not in "iuf":
        raise ValueError(
            "apply_mean_gradients: totals must be this replica's [sum of its per-example "
            f"losses, number of examples], {HEAD} real numbers; got {short_repr(totals)}. "
            "Build it with e.g. np.array([losses.sum(), len(losses)], dtype=np.float64).")
    return host.astype(np.float64)


def _global_count(summed_totals: Any) -> float:
    """The global number of examples from the summed ``[loss sum, count]``: a mean over no
    examples (or a count that is not a number) is an error on every rank, before any update."""
    count = float(summed_totals[1])
    if not count > 0 or not np.isfinite(count):
        raise ValueError(
            f"apply_mean_gradients: the replicas hold {count:g} examples in all (the sum of "
            "totals[1]); a mean gradient needs at least one. Give each replica's number of "
            "examples as totals[1].")
    return count
