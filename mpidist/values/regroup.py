"""Moving between per-replica structures and structures of distributed values.

``regroup`` merges the N per-replica results of ``run`` / ``merge_call`` into one structure;
``select_replica`` does the reverse for arguments.
"""

import collections.abc

from mpidist.core import nest
from mpidist.values.containers import DistributedValues, PerReplica
from mpidist.values.variables import Variable

__all__ = ["regroup", "select_replica", "select_local", "contains_distributed"]


def _container_of(value):
    """The distributed variable ``value`` is a component of, or None."""
    return value.distributed_container if isinstance(value, Variable) else None


def regroup(values, wrap_class=PerReplica, devices=None):
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
        return type(v0)._make(items) if nest.is_namedtuple(v0) else tuple(items)
    if isinstance(v0, collections.abc.Mapping):
        keys = set(v0.keys())
        for v in values[1:]:
            if not isinstance(v, collections.abc.Mapping) or set(v.keys()) != keys:
                raise ValueError(
                    f"Replicas returned mappings with different keys: {sorted(map(str, keys))} vs "
                    f"{sorted(map(str, getattr(v, 'keys', list)()))}."
                )
        merged = {k: regroup(tuple(v[k] for v in values), wrap_class, devices) for k in v0.keys()}
        return merged if type(v0) is dict else type(v0)(merged)
    # A component of a distributed variable stands for the variable, even with one replica.
    container = _container_of(v0)
    if container is not None and all(_container_of(v) is container for v in values[1:]):
        return container
    if all(v is v0 for v in values[1:]):
        return v0
    return wrap_class(values, devices)


def select_replica(replica_id, structure):
    """Replica ``replica_id``'s view of ``structure``: each DistributedValues that is not a
    distributed variable becomes its component; variables and plain values pass unchanged."""

    def pick(x):
        # A DistributedValues that is also a Variable is a distributed variable.
        if isinstance(x, DistributedValues) and not isinstance(x, Variable):
            return x.values[replica_id]
        return x

    return nest.map_structure(pick, structure)


def select_local(index, structure):
    """Like select_replica, but distributed variables also give their component."""

    def pick(x):
        return x.values[index] if isinstance(x, DistributedValues) else x

    return nest.map_structure(pick, structure)


def contains_distributed(structure):
    return any(isinstance(x, DistributedValues) for x in nest.flatten(structure))
