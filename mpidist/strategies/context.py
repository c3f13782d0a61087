"""The public context functions (``get_strategy`` ...) and the checks strategies make on it."""

from mpidist.core import state

__all__ = [
    "get_strategy",
    "has_strategy",
    "get_replica_context",
    "in_cross_replica_context",
    "experimental_set_strategy",
    "require_cross_replica_or_default",
    "require_replica_context",
    "wrong_strategy_scope",
]


def get_strategy():
    """The current strategy: the innermost ``scope()``'s, else the default strategy."""
    return state.current_mode().strategy


def has_strategy():
    """Whether a strategy other than the default one is current."""
    return not state.current_mode().is_default


def get_replica_context():
    """The current ReplicaContext, or None in cross-replica context."""
    return state.current_mode().replica_context


def in_cross_replica_context():
    """True inside ``strategy.scope()`` (and in merge_call / update functions), outside ``run``."""
    return state.current_mode().cross_replica is not None


_global_scope = [None]


def experimental_set_strategy(strategy):
    """Make ``strategy`` current for the whole process, like a ``with strategy.scope():`` that
    never ends; ``None`` goes back to the default strategy."""
    old = _global_scope[0]
    if old is not None:
        old._exit_global()
        _global_scope[0] = None
    if has_strategy():
        raise RuntimeError(
            "Must not be called inside a `mpidist.Strategy` scope: leave the `with "
            "strategy.scope():` block first."
        )
    if strategy is not None:
        scope = strategy.scope()
        scope._enter_global()
        _global_scope[0] = scope


def wrong_strategy_scope(strategy, mode):
    if mode.is_default:
        raise RuntimeError(f'Need to be inside "with strategy.scope()" for {strategy}')
    raise RuntimeError(f"Mixing different mpidist.Strategy objects: {mode.strategy} is not {strategy}")


def require_cross_replica_or_default(extended):
    """Raise unless we are in ``extended``'s cross-replica context or in the default mode."""
    mode = state.current_mode()
    if mode.cross_replica is extended:
        return
    if mode is state.default_mode():
        return
    strategy = extended._container_strategy()
    if mode.strategy is not strategy:
        wrong_strategy_scope(strategy, mode)
    raise RuntimeError(
        "Method requires being in cross-replica context, use get_replica_context().merge_call()"
    )


def require_replica_context(replica_ctx):
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
