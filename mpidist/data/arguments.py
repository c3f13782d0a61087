"""What users hand to ``Dataset`` methods, checked and converted before a dataset is built.

Data (``from_tensor_slices``, ``from_tensors``, generator elements, ``map`` results) becomes
host arrays in its structure: tuples and dicts stay structure, a Python list is data (one
array), as in tf.data; what cannot be an array (ragged lists, None, Python objects) is refused
with the value and the fix. Counts, sizes, seeds and flags are checked for type and range, so
``batch(2.5)``, ``shard("2", 0)`` or ``drop_remainder="False"`` never silently mean something
else.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from mpidist.backend import as_array, is_array
from mpidist.core import nest
from mpidist.data.spec import TensorSpec
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["to_data", "short", "flatten_up_to", "positive_int", "count_int", "count_or_all",
           "flag", "check_signature", "seed_int", "op_names_checked"]

_C = TypeVar("_C", bound=type)


def to_data(x: Any, what: str) -> Element:
    """User input as a data structure: tuples / dicts stay structure, everything else an array.
    ``what`` names where the value came from, for the error a value that is no array gets."""
    if isinstance(x, (tuple, collections.abc.Mapping)):
        return nest.map_structure(lambda leaf: _leaf_array(leaf, what), _lists_as_leaves(x))
    return _leaf_array(x, what)


def _lists_as_leaves(x: Any) -> Any:
    # nest treats lists as structure; tf.data treats them as tensors, so wrap them first.
    if isinstance(x, list):
        return _ListLeaf(x)
    if isinstance(x, collections.abc.Mapping):
        items = {k: _lists_as_leaves(v) for k, v in x.items()}
        return items if type(x) is dict else type(x)(items)  # type: ignore[call-arg]  # its own class
    if isinstance(x, tuple):
        values = [_lists_as_leaves(v) for v in x]
        return type(x)._make(values) if nest.is_namedtuple(x) else tuple(values)  # type: ignore[attr-defined]
    return x


class _ListLeaf:
    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


def _leaf_array(x: Any, what: str) -> np.ndarray:
    if isinstance(x, _ListLeaf):
        x = x.items
    given = x
    if is_array(x):
        x = as_array(x)  # device arrays are brought to the host: pipelines run there
    else:
        try:
            x = np.asarray(x)
        except ValueError:  # NumPy's "inhomogeneous shape": nested lists of unequal lengths
            raise ValueError(
                f"{what}: cannot convert a non-rectangular Python sequence to an array "
                f"({short(given)}): every row must have the same length. Pad the rows, or make "
                "each one a separate element.") from None
    if x.dtype == object and not _bytes_array(x):
        raise ValueError(
            f"{what}: {short(given)} holds Python objects (None, sets, mixed types), which a "
            "dataset cannot carry: give numbers, booleans or strings (NumPy arrays of them).")
    return cast(np.ndarray, x)


def _bytes_array(x: np.ndarray) -> bool:
    """An object array of bytes alone: TF's tf.string values kept exactly (NumPy's ``S``
    dtype drops trailing NUL bytes), as TFRecordDataset and mpidist.io give them."""
    return all(type(v) is bytes for v in x.flat)


def short(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def flatten_up_to(structure: Structure, value: Any) -> list[Any]:
    """``value``'s parts at the leaves of ``structure`` (a shape tuple is one leaf there)."""
    if not nest.is_nested(structure):
        return [value]
    mismatch = ValueError(f"output_shapes {value!r} does not match output_types {structure!r}: "
                          "give one shape per type, in the same structure.")
    if isinstance(structure, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping) or set(value) != set(structure):
            raise mismatch
        parts = [value[k] for k in sorted(structure)]
        children = [structure[k] for k in sorted(structure)]
    else:
        if not isinstance(value, (tuple, list)) or len(value) != len(structure):
            raise mismatch
        parts, children = list(value), list(structure)
    return [leaf for child, part in zip(children, parts) for leaf in flatten_up_to(child, part)]


def positive_int(name: str, value: object) -> int:
    value = count_int(name, value)
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be greater than zero, got {value}.")
    return value


def count_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}.")
    if not -2 ** 63 <= value < 2 ** 63:  # tf.data's counts are int64 (and islice's limit)
        raise InvalidArgumentError(f"{name} must fit in an int64, got {value}.")
    return int(value)


def count_or_all(name: str, value: object, meaning: str) -> int:
    """A count where -1 means all; other negatives are refused (tf.data reads them as -1)."""
    value = count_int(name, value)
    if value < -1:
        raise InvalidArgumentError(
            f"{name} must be >= 0, or -1 to {meaning}; got {value}.")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} of type "
                        f"{type(value).__name__}.")
    return bool(value)


def check_signature(name: str, signature: Structure) -> None:
    """Every leaf of ``signature`` is a TensorSpec (a dtype alone says nothing of the shape)."""
    for leaf in nest.flatten(signature):
        if not isinstance(leaf, TensorSpec):
            raise TypeError(
                f"{name} must be a TensorSpec or a tuple / dict of them, e.g. "
                f"mpidist.data.TensorSpec(shape=(None,), dtype=np.float32); got {short(leaf)} "
                f"in {short(signature)}.")


def seed_int(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int or None, got {seed!r}.")
    return int(seed)


def op_names_checked(cls: _C) -> _C:
    """Class decorator: every public method of ``cls`` that takes ``name`` (TF's name of the
    operation) refuses anything but a str or None. A data argument given one place too far
    lands there (``from_tensor_slices(x, y)``: ``y`` is the name) and would otherwise be
    dropped without a word."""
    for attr, value in list(vars(cls).items()):
        if attr.startswith("_"):
            continue
        wrapper = type(value) if isinstance(value, (staticmethod, classmethod)) else None
        fn = value.__func__ if wrapper is not None else value
        if not inspect.isfunction(fn):
            continue
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params]
        if "name" not in names:
            continue
        positional = params[names.index("name")].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        index = names.index("name") if positional else None  # None: keyword only
        checked = _checking_name(fn, index, f"{cls.__name__}.{attr}")
        setattr(cls, attr, wrapper(checked) if wrapper is not None else checked)
    return cls


def _checking_name(fn: Callable[..., Any], index: int | None, where: str
                   ) -> Callable[..., Any]:
    hint = (" Several arrays go in one tuple: Dataset.from_tensor_slices((x, y))."
            if where.endswith(("from_tensor_slices", "from_tensors")) else "")

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        name = kwargs.get("name", args[index] if index is not None and len(args) > index
                          else None)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{where}: argument 'name' got {short(name)}; it is the operation's "
                            f"name, a str or None, not data.{hint}")
        return fn(*args, **kwargs)

    return checked
