"""The public context functions (``get_strategy`` ...) and the checks strategies make on it.

``experimental_set_strategy`` and ``require_cross_replica_or_default`` live in
``mpidist.strategies.strategy``, beside the scope and StrategyExtended they work on.
"""

from typing import TYPE_CHECKING, NoReturn

from mpidist.core import state

if TYPE_CHECKING:
    from mpidist.strategies.replica_context import ReplicaContext
    from mpidist.strategies.strategy import Strategy

__all__ = [
    "get_strategy",
    "has_strategy",
    "get_replica_context",
    "in_cross_replica_context",
    "require_replica_context",
    "wrong_strategy_scope",
]


def get_strategy() -> "Strategy":
    """The current strategy: the innermost ``scope()``'s, else the default strategy."""
    strategy: Strategy = state.current_mode().strategy  # (an annotation: no call at run time)
    return strategy


def has_strategy() -> bool:
    """Whether a strategy other than the default one is current."""
    return not state.current_mode().is_default


def get_replica_context() -> "ReplicaContext | None":
    """The current ReplicaContext, or None in cross-replica context."""
    context: ReplicaContext | None = state.current_mode().replica_context
    return context


def in_cross_replica_context() -> bool:
    """True inside ``strategy.scope()`` (and in merge_call / update functions), outside ``run``."""
    return state.current_mode().cross_replica is not None


def wrong_strategy_scope(strategy: "Strategy", mode: state.Mode) -> NoReturn:
    if mode.is_default:
        raise RuntimeError(f'Need to be inside "with strategy.scope()" for {strategy}')
    raise RuntimeError(f"Mixing different mpidist.Strategy objects: {mode.strategy} is not {strategy}")


def require_replica_context(replica_ctx: "ReplicaContext") -> None:
    """Raise unless ``replica_ctx`` is the current replica context."""
    mode = state.current_mode()
    if mode.replica_context is replica_ctx:
        return
    if mode.replica_context is None:
        raise RuntimeError(
            "Need to be inside `call_for_each_replica()`: merge_call is a replica-context method; "
            "call it from the function given to strategy.run."
        )
    if mode.strategy is replica_ctx.strategy:
        raise RuntimeError("Mismatching ReplicaContext.")
    raise RuntimeError(
        f"Mismatching mpidist.Strategy objects: {mode.strategy} is not {replica_ctx.strategy}."
    )
