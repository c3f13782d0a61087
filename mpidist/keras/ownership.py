"""Which strategy a Keras model belongs to, by TF's rule: the one whose scope it was built and
compiled in.

Variables are tagged with the strategy current when they were created; ``compile`` records the
current strategy on the model and refuses a model whose variables were created under another
(TF's error, with its fix). ``fit``, ``evaluate`` and ``predict`` then run under the model's
strategy wherever they are called, and refuse to run inside the scope of a different one.
"""

from __future__ import annotations

import weakref
from typing import Any

from mpidist.strategies.context import get_strategy, has_strategy

__all__ = ["created_under", "model_strategy", "record_compile", "strategy_for_call",
           "tag_variable"]

_TAG = "mpidist_strategy"  # attribute set on each Keras variable created in a strategy's scope
_compiled_under: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def current_strategy() -> Any:
    """The strategy of the innermost mpidist scope, or None outside every scope."""
    return get_strategy() if has_strategy() else None


def tag_variable(variable: Any) -> None:
    """Remember the strategy current while ``variable`` is created (None: no scope)."""
    setattr(variable, _TAG, current_strategy())


def created_under(variable: Any) -> Any:
    return getattr(variable, _TAG, None)


def _describe(strategy: Any) -> str:
    return "no strategy's scope" if strategy is None else f"the scope of {strategy!r}"


def record_compile(model: Any) -> None:
    """At ``model.compile``: remember the current strategy, after checking that the model's
    variables were created under it (TF's rule). Raises ValueError, changing nothing."""
    strategy = current_strategy()
    for variable in model.weights:
        owner = created_under(variable)
        if owner is not strategy and strategy is not None:
            raise ValueError(
                f"Variable {variable.path!r} was not created in {_describe(strategy)}: it was "
                f"created in {_describe(owner)}. It is most likely because some layers, the "
                "model or the optimizer were created outside the distribution strategy scope. "
                "Create them inside it:\n"
                "    with strategy.scope():\n"
                "        model = make_model()\n"
                "        model.compile(...)")
    _compiled_under[model] = strategy


def model_strategy(model: Any) -> Any:
    """The strategy ``model`` was compiled under (None: outside every scope, or not compiled
    since mpidist's Keras integration was installed)."""
    return _compiled_under.get(model)


def strategy_for_call(model: Any, method: str) -> Any:
    """The strategy ``model.<method>`` runs under: the model's own. Raises ValueError when the
    call is made inside the scope of a different strategy (a model compiled outside the scope,
    or under another strategy)."""
    owner = model_strategy(model)
    current = current_strategy()
    if current is not None and current is not owner:
        raise ValueError(
            f"model.{method}() was called in the scope of {current!r}, but the model was built "
            f"and compiled in {_describe(owner)}. A model trains under the strategy it was "
            "created and compiled in: build and compile it inside `with strategy.scope():` "
            f"(the scope of the strategy {method} should use), then call {method}.")
    return owner
