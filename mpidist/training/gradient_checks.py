"""What ``Optimizer.apply_gradients`` checks before it communicates or writes anything.

Every mistake is caught here, at the public boundary, with an error that names the offending
pair and says the fix, so that nothing is half-applied: no variable, slot or ``iterations``
changes when a check fails. The checks are one pass over the pairs with cheap type tests, so
the hot path (arrays of the right dtype and shape) pays a few attribute reads per variable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter, is_, itemgetter
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from mpidist.backend.traced import traced_error, traced_kind
from mpidist.core.messages import short_repr
from mpidist.strategies.context import has_strategy
from mpidist.values.containers import DistributedValues
from mpidist.values.distributed_variables import is_distributed_variable
from mpidist.types import Array
from mpidist.values.variables import Variable

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy

__all__ = ["checked_pairs", "GradientChecks"]

# Gradient dtypes a real variable accepts: they are cast to the variable's dtype.
_REAL_KINDS = frozenset("iuf")
# The gradients' (types, shapes, dtypes), as GradientChecks remembers them.
Signature: TypeAlias = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]



def _describe_owner(var: Variable) -> str:
    owner = var.distribute_strategy
    return "outside any strategy scope" if owner is None else f"in the scope of {owner}"


def _as_gradient(g: Any, index: int, var: Variable, caller: str) -> Array:
    """``g`` as an array (NumPy or CuPy arrays pass through untouched)."""
    if traced_kind(g) is not None:  # captured inside a loss function: it has no value here
        raise traced_error(g, f"{caller} (pair {index}, variable {var.name!r})",
                           "pass the gradients that mpidist.autodiff.value_and_grad returns")
    if isinstance(getattr(g, "dtype", None), np.dtype) and hasattr(g, "shape") \
            and not isinstance(g, Variable):
        return g
    if isinstance(g, DistributedValues) and not isinstance(g, Variable):
        raise TypeError(
            f"{caller}: the gradient of pair {index} (for variable {var.name!r}) is a "
            f"{type(g).__name__}; call {caller} inside strategy.run, where each replica "
            "passes its own gradient array."
        )
    if isinstance(g, Variable):
        return g.read_value()
    try:
        return np.asarray(g)
    except ValueError:  # a ragged nested list has no array form
        raise ValueError(
            f"{caller}: the gradient of pair {index} (for variable {var.name!r}) is not "
            f"an array: {short_repr(g)}; pass an array of shape {tuple(var.shape)}."
        ) from None


def _check_name(name: object, caller: str) -> None:
    if name is None or isinstance(name, str):
        return
    if isinstance(name, (list, tuple)) or hasattr(name, "__iter__"):
        raise TypeError(
            f"{caller} takes ONE iterable of (gradient, variable) pairs; its second "
            f"argument is `name`, got {type(name).__name__} {short_repr(name)}. It looks like "
            f"{caller}(gradients, variables) was called: pass "
            "zip(gradients, variables) instead."
        )
    raise TypeError(f"{caller}: `name` must be a string or None, got {short_repr(name)}.")


def checked_pairs(grads_and_vars: Iterable[Any], name: object, strategy: Strategy,
                  caller: str = "apply_gradients") -> list[tuple[Array, Variable]]:
    """The ``(gradient array, variable)`` pairs with a gradient, checked against ``strategy``
    (the strategy apply_gradients runs under); ``caller`` is the method the errors name.

    Raises:
        TypeError: not an iterable of pairs, a pair in the wrong order, a variable that is not
            an ``mpidist.Variable``, a gradient that is distributed or not a real number.
        ValueError: a pair of the wrong length, a shape mismatch, a variable listed twice, a
            variable of another strategy, or no gradient at all.
    """
    _check_name(name, caller)
    if isinstance(grads_and_vars, (Variable, DistributedValues, str, bytes, dict)) \
            or hasattr(grads_and_vars, "dtype") or not hasattr(grads_and_vars, "__iter__"):
        raise TypeError(
            f"{caller} takes an iterable of (gradient, variable) pairs, got "
            f"{type(grads_and_vars).__name__} {short_repr(grads_and_vars)}; pass e.g. "
            "zip(gradients, variables)."
        )
    extended = strategy.extended
    pairs: list[tuple[Array, Variable]] = []
    seen: dict[int, int] = {}
    for index, item in enumerate(grads_and_vars):
        if type(item) is not tuple and not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(
                f"{caller}: element {index} of grads_and_vars is {type(item).__name__} "
                f"{short_repr(item)}; each element must be a (gradient, variable) pair: pass "
                "zip(gradients, variables)."
            )
        g, v = item
        if not isinstance(v, Variable):
            if isinstance(g, Variable):
                raise TypeError(
                    f"{caller}: pair {index} is (variable {g.name!r}, {short_repr(v)}): the "
                    "order is (gradient, variable); pass zip(gradients, variables)."
                )
            raise TypeError(
                f"{caller}: the variable of pair {index} is {type(v).__name__} "
                f"{short_repr(v)}, not an mpidist.Variable; pass the variables the model trains "
                "(created with mpidist.Variable inside strategy.scope())."
            )
        previous = seen.get(id(v))
        if previous is not None:
            raise ValueError(
                f"{caller}: variable {v.name!r} appears twice (pairs {previous} and "
                f"{index}); add its gradients together and pass the variable once."
            )
        seen[id(v)] = index
        if g is None:
            continue
        if not extended.variable_created_in_scope(v):
            # Only a distributed variable names its strategy here; a plain one gets the
            # message below.
            owner = v.distribute_strategy if is_distributed_variable(v) else None
            if owner is not None and not has_strategy():
                # The usual slip: the step was called directly, not through strategy.run.
                raise ValueError(
                    f"{caller}: variable {v.name!r} was created in the scope of {owner}, "
                    f"but {caller} was called where no strategy is active (outside its "
                    "run and scope). Call it inside the step that `strategy.run(step, "
                    "args=...)` runs, with the strategy that created the variable.")
            raise ValueError(
                f"{caller}: variable {v.name!r} was created {_describe_owner(v)}, but "
                f"{caller} runs under {strategy}. Create the variables (and the "
                "optimizer) inside `with strategy.scope():` of the strategy that trains them."
            )
        g = _as_gradient(g, index, v, caller)
        kind = g.dtype.kind
        if kind not in _REAL_KINDS and not (kind == "c" and v.dtype.kind == "c"):
            raise TypeError(
                f"{caller}: the gradient of pair {index} (for variable {v.name!r} of "
                f"dtype {v.dtype}) has dtype {g.dtype}; gradients must be real numbers "
                f"(float or integer). Cast it, e.g. g.astype({v.dtype.name!r})."
            )
        if g.shape != v.shape:
            raise ValueError(
                f"Gradient of shape {tuple(g.shape)} does not match variable {v.name!r} of "
                f"shape {tuple(v.shape)} (pair {index}); pass a gradient of the variable's "
                "shape."
            )
        pairs.append((g, v))
    if not pairs:
        raise ValueError(
            "No gradients provided for any variable: every gradient is None (or "
            "grads_and_vars is empty); check that the loss depends on the variables."
        )
    return pairs


class GradientChecks:
    """``checked_pairs`` with a memory of the last call that passed every check, for the step
    that repeats: when the same variables come in the same order, under the same strategy,
    with gradients of the same array type, shape and dtype as last time, every check has the
    same outcome, so comparing with the memory replaces the checks (and no error is lost: any
    difference takes the full path). The comparison is a few C-level passes (``map`` and
    tuple equality), not a Python loop per pair, so its cost hardly grows with the number of
    variables. Replica threads share it: the memory is one tuple, replaced whole."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        # (strategy, variables, (types, shapes, dtypes) of the gradients); the signature tuple
        # is a new object whenever the full checks ran (see ``check``).
        self._memo: tuple[Any, tuple[Variable, ...], Signature] = (None, (), ((), (), ()))

    def check(self, grads_and_vars: Iterable[Any], name: object, strategy: Strategy,
              caller: str = "apply_gradients"
              ) -> tuple[list[Array], tuple[Variable, ...], Signature]:
        """``(gradients, variables, signature)``: the gradient arrays (a list), the variables
        they update (a tuple; the same tuple object as last time when nothing changed) and the
        gradients' ``(types, shapes, dtypes)`` (the same object as long as the calls repeat, so
        a caller may remember what it verified of it). ``caller``: the method errors name."""
        _check_name(name, caller)
        kind = type(grads_and_vars)
        if kind is not list and kind is not zip:
            return self._full(grads_and_vars, name, strategy, caller)
        # a list when ``kind is list`` (mypy cannot narrow through type())
        items: list[Any] = grads_and_vars if kind is list else list(  # type: ignore[assignment]
            grads_and_vars)
        memo = self._memo
        known, variables, signature = memo
        if strategy is known and len(items) == len(variables) and items \
                and self._pairs_repeat(items, kind is zip, variables):
            grads = list(map(_first, items))
            try:
                if tuple(map(type, grads)) == signature[0] \
                        and tuple(map(_shape, grads)) == signature[1] \
                        and tuple(map(_dtype, grads)) == signature[2]:
                    return grads, variables, signature
            except AttributeError:  # an object of a remembered type may still lack them
                pass
        return self._full(items, name, strategy, caller)

    @staticmethod
    def _pairs_repeat(items: Sequence[Any], from_zip: bool, variables: Sequence[Variable]) -> bool:
        """Every item is a (gradient, variable) tuple with the remembered variable."""
        if from_zip:  # a zip yields tuples of one length: checking the first checks them all
            first = items[0]
            if type(first) is not tuple or len(first) != 2:
                return False
        elif set(map(type, items)) != _TUPLE or set(map(len, items)) != _TWO:
            return False
        return all(map(is_, map(_second, items), variables))

    def _full(self, grads_and_vars: Iterable[Any], name: object, strategy: Strategy,
              caller: str
              ) -> tuple[list[Array], tuple[Variable, ...], Signature]:
        pairs = checked_pairs(grads_and_vars, name, strategy, caller)
        grads = [g for g, _ in pairs]
        variables = tuple(v for _, v in pairs)
        known, old, _ = self._memo
        if strategy is known and len(old) == len(variables) \
                and all(map(is_, old, variables)):
            variables = old  # keep the tuple the fused plan recognises
        signature = (tuple(map(type, grads)), tuple(map(_shape, grads)),
                     tuple(map(_dtype, grads)))
        self._memo = (strategy, variables, signature)
        return grads, variables, signature


_first, _second = itemgetter(0), itemgetter(1)
_shape, _dtype = attrgetter("shape"), attrgetter("dtype")
_TUPLE, _TWO = {tuple}, {2}
