"""Nested structures of lists, tuples, namedtuples and mappings (the subset of ``tf.nest`` we need).

Anything else is a leaf, including arrays and distributed values. Mapping keys are visited in
sorted order when they sort, as ``tf.nest`` does, else in insertion order.
"""

import collections.abc
import functools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["is_nested", "flatten", "pack_sequence_as", "packer", "map_structure", "is_namedtuple"]


def is_namedtuple(x: object) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def is_nested(x: object) -> bool:
    return isinstance(x, (list, tuple, collections.abc.Mapping))


def _sorted_keys(mapping: Mapping[Any, Any]) -> list[Any]:
    keys = list(mapping.keys())
    try:
        return sorted(keys)
    except TypeError:
        return keys


def _children(x: Any) -> list[Any]:
    if isinstance(x, collections.abc.Mapping):
        return [x[k] for k in _sorted_keys(x)]
    return list(x)


def _rebuild(template: Any, children: list[Any]) -> Any:
    if isinstance(template, collections.abc.Mapping):
        items = dict(zip(_sorted_keys(template), children))
        ordered = {k: items[k] for k in template}
        if type(template) is dict:
            return ordered
        if isinstance(template, collections.defaultdict):
            out: collections.defaultdict[Any, Any] = collections.defaultdict(
                template.default_factory)
            out.update(ordered)
            return out
        # Mapping declares no constructor; the concrete mapping types here take a dict.
        return type(template)(ordered)  # type: ignore[call-arg]
    if is_namedtuple(template):
        return type(template)._make(children)
    if isinstance(template, tuple):
        return tuple(children)
    return list(children)


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure`` in a deterministic order."""
    out: list[Any] = []
    stack = [structure]
    while stack:
        x = stack.pop()
        if is_nested(x):
            stack.extend(reversed(_children(x)))
        else:
            out.append(x)
    return out


def pack_sequence_as(structure: Any, flat: Iterable[Any]) -> Any:
    """Rebuild ``structure`` with its leaves replaced, in order, by ``flat``."""
    leaves = list(flat)
    pos = 0

    def build(x: Any) -> Any:
        nonlocal pos
        if is_nested(x):
            return _rebuild(x, [build(c) for c in _children(x)])
        leaf = leaves[pos]
        pos += 1
        return leaf

    try:
        result = build(structure)
        if pos != len(leaves):
            raise ValueError(
                f"Structure has {pos} leaves but {len(leaves)} values were given to pack into it."
            )
    finally:
        # build refers to itself, a cycle: without this every leaf lived until the next GC
        leaves.clear()
    return result


def packer(structure: Any) -> Callable[[list[Any]], Any]:
    """``lambda leaves: pack_sequence_as(structure, leaves)``, prepared once for packing many
    times (a stream of batches): one level of a tuple or dict packs without walking the
    structure again."""
    if not is_nested(structure):
        return operator.itemgetter(0)
    children = _children(structure)
    if any(is_nested(c) for c in children) or type(structure) not in (tuple, dict):
        return functools.partial(pack_sequence_as, structure)
    if type(structure) is tuple:
        return tuple
    keys = _sorted_keys(structure)
    where = [(k, keys.index(k)) for k in structure]  # leaves come in sorted-key order
    return lambda leaves: {k: leaves[i] for k, i in where}


def assert_same_structure(a: Any, b: Any) -> None:
    """Raise ValueError unless ``a`` and ``b`` nest the same way (leaf values may differ)."""
    if is_nested(a) != is_nested(b):
        raise ValueError(f"The two structures don't have the same nested structure: {a!r} vs {b!r}.")
    if not is_nested(a):
        return
    if isinstance(a, collections.abc.Mapping) != isinstance(b, collections.abc.Mapping):
        raise ValueError(f"The two structures don't have the same sequence type: {a!r} vs {b!r}.")
    if isinstance(a, collections.abc.Mapping) and set(a.keys()) != set(b.keys()):
        raise ValueError(
            f"The two structures don't have the same keys: {sorted(map(str, a))} vs {sorted(map(str, b))}."
        )
    ca, cb = _children(a), _children(b)
    if len(ca) != len(cb):
        raise ValueError(
            f"The two structures don't have the same number of elements: {len(ca)} vs {len(cb)}."
        )
    for x, y in zip(ca, cb):
        assert_same_structure(x, y)


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Apply ``fn`` to corresponding leaves of ``structures``; the result nests like the first."""
    first = structures[0]
    for other in structures[1:]:
        assert_same_structure(first, other)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(first, [fn(*leaves) for leaves in zip(*flats)])
