"""``Dataset.concatenate``: this dataset's elements, then ``other``'s.

The two must have the same structure and dtypes (strings of any length alike); dims and ranks
that differ become unknown in the spec, as TF's most specific compatible type. The cardinality
is TF's: INFINITE if either is, else UNKNOWN if either is, else the sum.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from mpidist.data.arguments import short
from mpidist.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.common import common_spec
from mpidist.data.ops.registry import register

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["ConcatenateDataset"]


class ConcatenateDataset(Dataset):
    def __init__(self, input_dataset: Dataset, other: Dataset) -> None:
        if not isinstance(other, Dataset):
            raise TypeError(f"concatenate: `dataset` must be an mpidist.data.Dataset, got "
                            f"{short(other)} of type {type(other).__name__}.")
        super().__init__((input_dataset, other))
        spec = common_spec(input_dataset.element_spec, other.element_spec)
        if spec is None:
            raise TypeError(
                f"concatenate: incompatible dataset elements: {input_dataset.element_spec} vs. "
                f"{other.element_spec}. Both datasets need the same structure and dtypes; "
                "map one of them to match (e.g. cast with .astype).")
        self._spec = spec

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        yield from self._inputs[0]._iterate(ctx)
        yield from self._inputs[1]._iterate(ctx)

    def _compute_spec(self) -> Structure:
        return self._spec

    def _cardinality(self) -> int:
        a, b = (d._cardinality() for d in self._inputs)
        if INFINITE_CARDINALITY in (a, b):
            return INFINITE_CARDINALITY
        if UNKNOWN_CARDINALITY in (a, b):
            return UNKNOWN_CARDINALITY
        return a + b


register("concatenate", ConcatenateDataset)
