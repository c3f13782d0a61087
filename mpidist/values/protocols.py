"""What the values layer asks of the strategies layer above it, declared here, below it.

Variables cannot import strategies (the layering runs the other way), yet a variable must
create itself the strategy's way, reduce or broadcast an update, and find its replica's copy.
These Protocols name exactly those calls; every strategy in ``mpidist.strategies`` implements
them with public methods and attributes (``tests/unit/test_architecture.py`` checks it), so
the values layer never reaches into a strategy's private members.

Who calls what:

- ``Variable(...)`` (the metaclass) asks the current strategy's ``extended.create_variable``.
- A MirroredVariable updated in replica context merge_calls through the replica context, then
  uses the extended's ``reduce_to`` / ``broadcast_to`` / ``first_replica_value``.
- A distributed variable picks its component with the replica context's ``local_replica_id``;
  a SyncOnReadVariable read cross-replica uses the strategy's ``scope`` and ``reduce``.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

__all__ = ["ExtendedProtocol", "ReplicaContextProtocol", "StrategyProtocol"]


@runtime_checkable
class ExtendedProtocol(Protocol):
    """The part of ``strategy.extended`` (a StrategyExtended) that variables use."""

    def create_variable(self, *args: Any, **kwargs: Any) -> Any:
        """Build the variable that ``mpidist.Variable(*args, **kwargs)`` means under this
        strategy: a plain Variable, or a MirroredVariable / SyncOnReadVariable."""

    def first_replica_value(self, value: Any) -> Any:
        """Replica 0's component of ``value``, replica 0 of the whole job (ONLY_FIRST_REPLICA
        aggregation)."""

    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any = None) -> Any:
        """Reduce ``value`` across replicas to ``destinations`` (public, checked)."""

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """Copy ``tensor`` to every device of ``destinations`` (public, checked)."""


@runtime_checkable
class StrategyProtocol(Protocol):
    """The part of a Strategy that variables use."""

    @property
    def extended(self) -> ExtendedProtocol:
        """The strategy's StrategyExtended."""

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas take part in each step, over all workers."""

    def scope(self) -> AbstractContextManager[Any]:
        """Enter the strategy's cross-replica context."""

    def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
        """Reduce ``value`` across replicas to a host array."""


@runtime_checkable
class ReplicaContextProtocol(Protocol):
    """The part of a ReplicaContext that variables use.

    Attributes:
        local_replica_id: This replica's index among the calling worker's replicas (the index
            of its component in a distributed variable), a plain int.
    """

    local_replica_id: int

    def merge_call(self, merge_fn: Callable[..., Any], args: tuple[Any, ...] = (),
                   kwargs: dict[str, Any] | None = None) -> Any:
        """Run ``merge_fn(strategy, *args, **kwargs)`` once, in cross-replica context."""
