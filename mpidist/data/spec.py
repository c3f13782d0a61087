"""Type specs of dataset elements: ``TensorSpec`` (shape with ``None`` for unknown dims, and a
NumPy dtype) and ``PerReplicaSpec`` (one spec per local replica of a distributed dataset)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.backend import is_array
from mpidist.core import nest
from mpidist.core.signatures import ArrayLike, accepts

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from mpidist.data.element import Element, Structure

__all__ = ["TensorSpec", "PerReplicaSpec", "DatasetSpec", "spec_of", "most_specific_common",
           "empty_like_spec"]


class TensorSpec:
    """The shape and dtype of an array. ``shape`` is a tuple with ``None`` for a dimension that
    varies, or None when even the rank is unknown."""

    __slots__ = ("shape", "dtype", "name")

    def __init__(self, shape: Iterable[int | None] | None, dtype: DTypeLike = np.float32,
                 name: str | None = None) -> None:
        self.shape: tuple[int | None, ...] | None = (
            None if shape is None else tuple(None if d is None else int(d) for d in shape))
        self.dtype: np.dtype[Any] = np.dtype(dtype)
        self.name = name

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def batch_dim(self) -> int | None:
        """The leading dimension: an int, or None when unknown (or the rank is)."""
        return self.shape[0] if self.shape else None

    @accepts(array=ArrayLike)
    def is_compatible_with(self, array: Any) -> bool:
        """Whether ``array`` (or a TensorSpec) fits this spec."""
        if not isinstance(array, TensorSpec):
            array = np.asarray(array)  # a number or a nested list, as TF converts it
        dtype = np.dtype(array.dtype)
        # a string of any length fits a string spec (TF's tf.string has no length; NumPy's has)
        if dtype != self.dtype and not (dtype.kind in "US" and dtype.kind == self.dtype.kind):
            return False
        if self.shape is None or array.shape is None:
            return True
        shape = tuple(array.shape)
        return len(shape) == len(self.shape) and all(
            d is None or e is None or d == e for d, e in zip(self.shape, shape))

    @accepts(size=int | None)
    def with_batch_dim(self, size: int | None) -> TensorSpec:
        """This spec with a leading dimension ``size`` (None: unknown) prepended."""
        return TensorSpec(None if self.shape is None else (size,) + self.shape, self.dtype)

    @accepts(size=int | None)
    def with_batch_size(self, size: int | None) -> TensorSpec:
        """This spec with its leading dimension replaced by ``size``."""
        return TensorSpec(None if self.shape is None else (size,) + self.shape[1:], self.dtype)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TensorSpec) and self.shape == other.shape
                and self.dtype == other.dtype and self.name == other.name)

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype, self.name))

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype.name}, name={self.name!r})"


class DatasetSpec:
    """The spec of an element that is itself a dataset (``window``'s windows): the element
    spec of that dataset. ``shape`` is () and ``dtype`` object, so code that reads a leaf's
    shape sees a scalar; such elements cannot be batched or converted to arrays."""

    __slots__ = ("element_spec",)
    shape: tuple[int, ...] = ()
    dtype: np.dtype[Any] = np.dtype(object)
    name = None

    def __init__(self, element_spec: Structure) -> None:
        self.element_spec = element_spec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetSpec) and self.element_spec == other.element_spec

    def __hash__(self) -> int:
        return hash(repr(self.element_spec))

    def __repr__(self) -> str:
        return f"DatasetSpec({self.element_spec!r}, TensorShape([]))"


class PerReplicaSpec:
    """The element spec of a distributed dataset: one spec per local replica."""

    __slots__ = ("_value_specs",)

    def __init__(self, *value_specs: Structure) -> None:
        self._value_specs = tuple(value_specs)

    @property
    def value_specs(self) -> tuple[Structure, ...]:
        return self._value_specs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PerReplicaSpec) and self._value_specs == other._value_specs

    def __hash__(self) -> int:
        return hash(self._value_specs)

    def __repr__(self) -> str:
        return f"PerReplicaSpec({', '.join(map(repr, self._value_specs))})"


def _leaf_spec(x: Any) -> TensorSpec:
    if not is_array(x):
        x = np.asarray(x)
    return TensorSpec(x.shape, x.dtype)


def spec_of(element: Element) -> Structure:
    """The TensorSpec structure of one concrete element."""
    return nest.map_structure(_leaf_spec, element)


def _common(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    if a.dtype != b.dtype:
        raise TypeError(f"Elements have different dtypes: {a.dtype.name} and {b.dtype.name}.")
    if a.shape is None or b.shape is None:
        return TensorSpec(None, a.dtype)
    if len(a.shape) != len(b.shape):
        raise TypeError(f"Elements have different ranks: shapes {a.shape} and {b.shape}.")
    return TensorSpec(tuple(x if x == y else None for x, y in zip(a.shape, b.shape)), a.dtype)


def most_specific_common(a: Structure, b: Structure) -> Structure:
    """The spec structure both ``a`` and ``b`` fit: dims that differ become None."""
    nest.assert_same_structure(a, b)
    return nest.map_structure(_common, a, b)


def empty_like_spec(spec: Structure) -> Element:
    """A structure of zero-length batches shaped like ``spec`` (unknown trailing dims → 0;
    unknown rank → one dimension)."""
    def empty(s: TensorSpec) -> np.ndarray:
        trailing = () if s.shape is None else s.shape[1:]
        return np.empty((0,) + tuple(0 if d is None else d for d in trailing), s.dtype)

    return nest.map_structure(empty, spec)
