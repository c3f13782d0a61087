"""Type names for what flows through an input pipeline (annotations only: nothing imports this
module at run time).

An element of a dataset is a nest (tuples, namedtuples, dicts) whose leaves are host arrays, so
its type is ``Any`` to a checker; the names say what a parameter holds.
"""

from typing import Any, TypeAlias

__all__ = ["Block", "Element", "Leaves", "Step", "Structure"]

Element: TypeAlias = Any
"""One element of a dataset, or one batch: a ``numpy.ndarray``, or a tuple / namedtuple / dict
nest of them (``(features, labels)``, ``{"x": ..., "y": ...}``)."""

Structure: TypeAlias = Any
"""A nest of the same shape as an element holding something else at its leaves (TensorSpecs,
dtypes, shapes)."""

Leaves: TypeAlias = list[Any]
"""One element's leaves, flattened (``nest.flatten``): host arrays."""

Step: TypeAlias = tuple[Element, list[Leaves | None]]
"""One step of a worker's input: the element structure, and per local replica the leaves of its
sub-batch, or None where the replica gets no element this step."""

Block: TypeAlias = Element
"""Several consecutive elements at once, as file readers produce them: a nest in the element's
structure whose leaves share a leading dimension, the elements being its rows."""
