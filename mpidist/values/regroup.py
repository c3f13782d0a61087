"""Moving between per-replica structures and structures of distributed values.

``regroup`` merges the N per-replica results of ``run`` / ``merge_call`` into one structure;
``select_replica`` does the reverse for arguments.
"""

import collections.abc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mpidist.core import nest
from mpidist.core.devices import DeviceSpec
from mpidist.values.containers import DistributedValues, PerReplica
from mpidist.values.variables import Variable

__all__ = ["regroup", "select_replica", "select_local", "contains_distributed"]


def _container_of(value: object) -> DistributedValues | None:
    """The distributed variable ``value`` is a component of, or None."""
    return value.distributed_container if isinstance(value, Variable) else None


def regroup(values: Sequence[Any],
            wrap_class: Callable[[Sequence[Any], Iterable[DeviceSpec] | None], Any] = PerReplica,
            devices: Iterable[DeviceSpec] | None = None) -> Any:
    """Merge per-replica structures ``values`` (one per replica) into one structure.

    Lists, tuples (namedtuples included) and mappings are merged element-wise and must agree in
    length / keys. A leaf that is the identical object on every replica is returned unwrapped; a
    component of a distributed variable gives the variable; anything else is wrapped in
    ``wrap_class`` with ``devices``.
    """
    v0 = values[0]
    if isinstance(v0, list):
        for v in values[1:]:
            if not isinstance(v, list) or len(v) != len(v0):
                raise ValueError(
                    f"Replicas returned lists of different lengths or types: {v0!r} vs {v!r}."
                )
        return [regroup(tuple(v[i] for v in values), wrap_class, devices) for i in range(len(v0))]
    if isinstance(v0, tuple):
        for v in values[1:]:
            if not isinstance(v, tuple) or len(v) != len(v0):
                raise ValueError(
                    f"Replicas returned tuples of different lengths or types: {v0!r} vs {v!r}."
                )
        items = [regroup(tuple(v[i] for v in values), wrap_class, devices) for i in range(len(v0))]
        if nest.is_namedtuple(v0):
            return type(v0)._make(items)  # type: ignore[attr-defined]  # a namedtuple's own
        return tuple(items)
    if isinstance(v0, collections.abc.Mapping):
        keys = set(v0.keys())
        for v in values[1:]:
            if not isinstance(v, collections.abc.Mapping) or set(v.keys()) != keys:
                raise ValueError(
                    f"Replicas returned mappings with different keys: {sorted(map(str, keys))} vs "
                    f"{sorted(map(str, getattr(v, 'keys', list)()))}."
                )
        merged = {k: regroup(tuple(v[k] for v in values), wrap_class, devices) for k in v0}
        # Mapping declares no constructor; the concrete mapping types here take a dict.
        return merged if type(v0) is dict else type(v0)(merged)  # type: ignore[call-arg]
    # A component of a distributed variable stands for the variable, even with one replica.
    container = _container_of(v0)
    if container is not None and all(_container_of(v) is container for v in values[1:]):
        return container
    if all(v is v0 for v in values[1:]):
        return v0
    return wrap_class(values, devices)


def select_replica(replica_id: int, structure: Any) -> Any:
    """Replica ``replica_id``'s view of ``structure``: each DistributedValues that is not a
    distributed variable becomes its component; variables and plain values pass unchanged."""

    def pick(x: Any) -> Any:
        # A DistributedValues that is also a Variable is a distributed variable.
        if isinstance(x, DistributedValues) and not isinstance(x, Variable):
            return x.values[replica_id]
        return x

    return nest.map_structure(pick, structure)


def select_local(index: int, structure: Any) -> Any:
    """Like select_replica, but distributed variables also give their component."""

    def pick(x: Any) -> Any:
        return x.values[index] if isinstance(x, DistributedValues) else x

    return nest.map_structure(pick, structure)


def contains_distributed(structure: Any) -> bool:
    return any(isinstance(x, DistributedValues) for x in nest.flatten(structure))
