"""Type specs of dataset elements: ``TensorSpec`` (shape with ``None`` for unknown dims, and a
NumPy dtype) and ``PerReplicaSpec`` (one spec per local replica of a distributed dataset)."""

import numpy as np

from mpidist.backend import is_array
from mpidist.core import nest

__all__ = ["TensorSpec", "PerReplicaSpec", "spec_of", "most_specific_common", "empty_like_spec"]


class TensorSpec:
    """The shape (a tuple; ``None`` for a dimension that varies) and dtype of an array."""

    __slots__ = ("shape", "dtype", "name")

    def __init__(self, shape, dtype=np.float32, name=None):
        self.shape = tuple(None if d is None else int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.name = name

    def is_compatible_with(self, array):
        """Whether ``array`` (or a TensorSpec) fits this spec."""
        shape = tuple(array.shape)
        dtype = np.dtype(array.dtype)
        return (dtype == self.dtype and len(shape) == len(self.shape)
                and all(d is None or e is None or d == e for d, e in zip(self.shape, shape)))

    def with_batch_dim(self, size):
        """This spec with a leading dimension ``size`` (None: unknown) prepended."""
        return TensorSpec((size,) + self.shape, self.dtype)

    def __eq__(self, other):
        return (isinstance(other, TensorSpec) and self.shape == other.shape
                and self.dtype == other.dtype)

    def __hash__(self):
        return hash((self.shape, self.dtype))

    def __repr__(self):
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype.name}, name={self.name!r})"


class PerReplicaSpec:
    """The element spec of a distributed dataset: one spec per local replica."""

    __slots__ = ("_value_specs",)

    def __init__(self, *value_specs):
        self._value_specs = tuple(value_specs)

    @property
    def value_specs(self):
        return self._value_specs

    def __eq__(self, other):
        return isinstance(other, PerReplicaSpec) and self._value_specs == other._value_specs

    def __hash__(self):
        return hash(self._value_specs)

    def __repr__(self):
        return f"PerReplicaSpec({', '.join(map(repr, self._value_specs))})"


def _leaf_spec(x):
    if not is_array(x):
        x = np.asarray(x)
    return TensorSpec(x.shape, x.dtype)


def spec_of(element):
    """The TensorSpec structure of one concrete element."""
    return nest.map_structure(_leaf_spec, element)


def _common(a, b):
    if a.dtype != b.dtype:
        raise TypeError(f"Elements have different dtypes: {a.dtype.name} and {b.dtype.name}.")
    if len(a.shape) != len(b.shape):
        raise TypeError(f"Elements have different ranks: shapes {a.shape} and {b.shape}.")
    return TensorSpec(tuple(x if x == y else None for x, y in zip(a.shape, b.shape)), a.dtype)


def most_specific_common(a, b):
    """The spec structure both ``a`` and ``b`` fit: dims that differ become None."""
    nest.assert_same_structure(a, b)
    return nest.map_structure(_common, a, b)


def empty_like_spec(spec):
    """A structure of zero-length batches shaped like ``spec`` (unknown trailing dims → 0)."""
    def empty(s):
        return np.empty((0,) + tuple(0 if d is None else d for d in s.shape[1:]), s.dtype)

    return nest.map_structure(empty, spec)
