"""What the distribution entry points accept as input, and the errors for what they do not.

``experimental_distribute_dataset`` takes an ``mpidist.data.Dataset`` of global batches, or a
plain iterable of batches (a list, a generator). Many other Python values are iterable too and
would be read as something else without a word: a NumPy array as one batch per row, a tuple
``(x, y)`` as two batches, a dict as its keys, a string as its characters. Those are refused
here, before anything is iterated or any collective is issued, with the value's type and shape
and the one-line fix. ``distribute_datasets_from_function`` applies the same rule to what its
``dataset_fn`` returns.
"""

from __future__ import annotations

import collections.abc
import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mpidist.backend import is_array

if TYPE_CHECKING:
    from mpidist.data.element import Element

__all__ = ["describe", "check_input", "check_dataset_fn", "is_one_shot"]

_FIX_GLOBAL = "mpidist.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH)"
_FIX_PER_REPLICA = ("mpidist.data.Dataset.from_tensor_slices(x)"
                    ".batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH))")


def describe(value: Any) -> str:
    """A short account of ``value`` for an error message: its type and, for arrays and
    containers of them, the shapes."""
    if is_array(value):
        return (f"a {type(value).__module__.split('.')[0]}.{type(value).__name__} of shape "
                f"{tuple(value.shape)} and dtype {value.dtype}")
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} item(s) ({_shapes(value)})"
    if isinstance(value, collections.abc.Mapping):
        return f"a {type(value).__name__} with keys {sorted(map(str, value))[:8]} ({_shapes(value.values())})"
    if value is None:
        return "None"
    text = repr(value)
    text = text[:60] + "..." if len(text) > 60 else text
    if hasattr(value, "element_spec"):
        return f"a dataset ({text})"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} ({text})"


def _shapes(items: Iterable[object]) -> str:
    parts = []
    for item in items:
        shape = getattr(item, "shape", None)
        parts.append(f"shape {tuple(shape)}" if shape is not None else type(item).__name__)
    return ", ".join(parts[:8]) + (", ..." if len(parts) > 8 else "")


def _misread(value: Any) -> str | None:
    """How iterating ``value`` as a stream of batches would misread it, or None if it is an
    acceptable stream (or not iterable at all, which ``check_input`` reports)."""
    if is_array(value):
        if value.ndim == 0:
            return "it is a single value, not a stream of batches"
        return f"iterating it gives {value.shape[0]} batch(es) of one row each"
    if isinstance(value, (str, bytes)):
        return "iterating it gives its characters"
    if isinstance(value, tuple):
        return (f"a tuple is one element's structure (features, labels): iterating it gives its "
                f"{len(value)} component(s) as separate batches")
    if isinstance(value, collections.abc.Mapping):
        return "a dict is one element's structure: iterating it gives its keys"
    if isinstance(value, (int, float, complex)) or value is None:
        return "it is not a stream of batches"
    return None


def check_input(value: Any, api: str, per_replica: bool = False) -> None:
    """Raise TypeError unless ``value`` can be read as a stream of batches by ``api``.

    ``per_replica`` says the batches are per replica (what a ``dataset_fn`` returns), which
    only changes the fix the message gives. Lists are checked item by item here (they are
    already in memory); other iterables are checked batch by batch as they are read.
    """
    fix = _FIX_PER_REPLICA if per_replica else _FIX_GLOBAL
    what = "dataset_fn returned" if per_replica else f"{api} was given"
    kind = "per-replica" if per_replica else "global"
    reason = _misread(value)
    if reason is None:
        try:
            iter(value)
        except TypeError:
            reason = "it is not iterable"
    if reason is not None:
        hint = ""
        if callable(value) and not per_replica:
            hint = (" To build each worker's pipeline from a function, call "
                    "strategy.distribute_datasets_from_function(dataset_fn) instead.")
        raise TypeError(
            f"{api} needs an mpidist.data.Dataset of {kind} batches (or a list or generator of "
            f"batches), but {what} {describe(value)}: {reason}. Build a dataset of {kind} "
            f"batches: {fix}.{hint}") from None
    if isinstance(value, list):
        for index, batch in enumerate(value):
            _check_batch(batch, index, api, kind, fix)


def _check_batch(batch: Element, index: int, api: str, kind: str, fix: str) -> None:
    leaves = _leaves(batch)
    problem = None
    if not leaves:
        problem = "has no array in it"
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        if shape is None or len(shape) == 0:
            problem = (f"has a component that is {describe(leaf)}, not an array with a leading "
                       "batch dimension")
            break
    if problem is not None:
        raise TypeError(
            f"{api} reads a list as a list of {kind} batches (each an array, or a tuple / dict of "
            f"arrays with a common leading dimension), but item {index} of the list "
            f"{problem}. For a list of examples, build a dataset: {fix}.")


def _leaves(batch: Element) -> list[Any]:
    if isinstance(batch, collections.abc.Mapping):
        return [leaf for v in batch.values() for leaf in _leaves(v)]
    if isinstance(batch, (tuple, list)):
        return [leaf for v in batch for leaf in _leaves(v)]
    return [batch]


def is_one_shot(value: object) -> bool:
    """Whether iterating ``value`` again would continue where the last pass stopped (a generator
    or other iterator) rather than start over (a list, a Dataset)."""
    return isinstance(value, collections.abc.Iterator)


def check_dataset_fn(dataset_fn: object) -> None:
    """``distribute_datasets_from_function``'s ``dataset_fn`` must be callable with one
    argument, the InputContext."""
    if isinstance(dataset_fn, type):  # callable, but calling a class builds one of its objects
        raise TypeError(
            f"dataset_fn must be a function of one argument, the mpidist.InputContext, that "
            f"returns this worker's dataset; got the class {dataset_fn.__qualname__}. Write "
            "`def dataset_fn(input_context): return mpidist.data.Dataset...` and pass that.")
    if not callable(dataset_fn):
        hint = ""
        if hasattr(dataset_fn, "element_spec") or isinstance(dataset_fn, collections.abc.Iterable):
            hint = (" For a dataset of global batches, call "
                    "strategy.experimental_distribute_dataset(dataset) instead.")
        raise TypeError(
            f"dataset_fn must be a function of one argument, the mpidist.InputContext, that "
            f"returns this worker's dataset; got {describe(dataset_fn)}.{hint}")
    try:
        signature = inspect.signature(dataset_fn)
    except (TypeError, ValueError):
        return  # a builtin or extension callable: nothing to check ahead of the call
    try:
        signature.bind(None)
    except TypeError:
        raise TypeError(
            f"dataset_fn must take one argument, the mpidist.InputContext, but "
            f"{getattr(dataset_fn, '__qualname__', dataset_fn)!s}{signature} cannot be called "
            "with one positional argument. Write it as `def dataset_fn(input_context): ...` "
            "(the argument may go unused).") from None
