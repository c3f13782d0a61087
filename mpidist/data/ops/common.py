"""What several transformations share: calling a user function on an element as ``map`` does,
checking a predicate's result, merging the specs of datasets that must agree, and the small
in-memory dataset that windows and groups are made of."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short
from mpidist.data.dataset import Dataset, IterationContext
from mpidist.data.spec import DatasetSpec, TensorSpec

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["call_on_element", "as_bool", "common_spec", "stand_in", "ElementsDataset",
           "describe"]


def call_on_element(fn: Callable[..., Any], element: Element) -> Any:
    """``fn(*element)`` for a tuple element, else ``fn(element)``: tf.data's convention."""
    return fn(*element) if type(element) is tuple else fn(element)


def as_bool(value: Any, api: str, what: str) -> bool:
    """``value`` as a bool where it is a scalar boolean (Python bool, NumPy bool, 0-d bool
    array); TypeError naming what came back otherwise (a number, an array of several values):
    tf.data requires a scalar tf.bool."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.ndarray) and value.dtype == np.bool_ and value.shape == ():
        return bool(value)
    kind = (f"an array of shape {value.shape} and dtype {value.dtype}"
            if isinstance(value, np.ndarray) else f"{short(value)} of type {type(value).__name__}")
    raise TypeError(
        f"{api}: `predicate` must return a scalar boolean (a Python or NumPy bool), but for "
        f"{what} it returned {kind}. Compare explicitly (e.g. `x > 0`) and reduce arrays "
        "(`np.all(...)`) to one bool.")


def _common_leaf(a: TensorSpec, b: TensorSpec) -> TensorSpec | None:
    if isinstance(a, DatasetSpec) or isinstance(b, DatasetSpec):
        return a if a == b else None
    if a.dtype != b.dtype:
        if not (a.dtype.kind == b.dtype.kind and a.dtype.kind in "US"):
            return None
        dtype = np.promote_types(a.dtype, b.dtype)  # strings of any length are one type
    else:
        dtype = a.dtype
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorSpec(None, dtype)
    return TensorSpec(tuple(x if x == y else None for x, y in zip(a.shape, b.shape)), dtype)


def common_spec(a: Structure, b: Structure) -> Structure | None:
    """The most specific spec both ``a`` and ``b`` fit (dims or ranks that differ become
    unknown, strings of any length alike), or None where they cannot be one dataset's elements:
    another structure, or another dtype."""
    try:
        nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return None
    leaves = [_common_leaf(x, y) for x, y in zip(nest.flatten(a), nest.flatten(b))]
    if any(leaf is None for leaf in leaves):
        return None
    return nest.pack_sequence_as(a, leaves)


def stand_in(spec: Structure, unknown: int) -> Element:
    """Arrays shaped like ``spec`` filled with ``unknown``, each unknown dimension ``unknown``
    long (for tracing a user function without reading data, as ``map`` traces); raises
    ValueError where a rank is unknown."""
    def one(s: TensorSpec) -> np.ndarray:
        if s.shape is None or isinstance(s, DatasetSpec):
            raise ValueError("unknown rank")
        return np.full(tuple(unknown if d is None else d for d in s.shape), unknown, s.dtype)
    return nest.map_structure(one, spec)


class ElementsDataset(Dataset):
    """A dataset of elements already in memory, with a given element spec: the datasets that
    ``window`` and ``group_by_window`` hand to user functions."""

    def __init__(self, elements: list[Element], element_spec: Structure) -> None:
        super().__init__()
        self._elements, self._spec = elements, element_spec

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return iter(self._elements)

    def _compute_spec(self) -> Structure:
        return self._spec

    def _cardinality(self) -> int:
        return len(self._elements)

    def _source_count(self) -> int | None:
        return len(self._elements)


def describe(fn: object) -> str:
    """A user function as messages name it: its qualified name and signature."""
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        return f"{name}{inspect.signature(fn)}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(name)
