"""``Dataset.zip`` and ``Dataset.enumerate``.

``zip`` pairs up the elements of a structure of datasets, ending with the shortest. Its
cardinality is TF's: unknown if any input's is, else the smallest finite one (infinite if all
are infinite). The chain (``_inputs[0]``) runs through the first dataset of the structure, so
FILE auto-sharding finds a reader there; every input is iterated with the same context, so an
in-memory source shard applies alike to each.

``enumerate`` pairs each element with its int64 index from ``start``: TF zips a range with the
dataset; here it is a node of its own over the dataset, so the dataset stays the chain's input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short
from mpidist.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.registry import register
from mpidist.data.spec import TensorSpec

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["ZipDataset", "EnumerateDataset", "zip_cardinality"]


def _check_structure(datasets: Any) -> None:
    """A (nested) tuple / dict / namedtuple of Datasets; lists are refused as TF refuses them."""
    if isinstance(datasets, Dataset):
        return
    if isinstance(datasets, list):
        raise TypeError(
            "Dataset.zip: a Python list of datasets is not supported (in tf.data a list is data, "
            "not structure); pass a tuple instead: Dataset.zip((a, b)) or Dataset.zip(a, b).")
    if not nest.is_nested(datasets):
        raise TypeError(
            f"Dataset.zip: expected datasets, or a (nested) tuple / dict of datasets, got "
            f"{short(datasets)} of type {type(datasets).__name__}.")
    children = datasets.values() if isinstance(datasets, dict) else datasets
    for child in children:
        if not isinstance(child, Dataset):
            if not nest.is_nested(child):
                raise TypeError(
                    f"Dataset.zip: every leaf of the structure must be an mpidist.data.Dataset, "
                    f"got {short(child)} of type {type(child).__name__} in {short(datasets)}.")
            _check_structure(child)


def zip_cardinality(counts: list[int]) -> int:
    """TF's rule: UNKNOWN if any is, else the smallest finite count (INFINITE if none is)."""
    result = INFINITE_CARDINALITY
    for n in counts:
        if n == UNKNOWN_CARDINALITY:
            return UNKNOWN_CARDINALITY
        if n != INFINITE_CARDINALITY and (result == INFINITE_CARDINALITY or n < result):
            result = n
    return result


class ZipDataset(Dataset):
    def __init__(self, datasets: Any) -> None:
        _check_structure(datasets)
        leaves = nest.flatten(datasets)
        if not leaves:
            raise TypeError("Dataset.zip: must be given at least one dataset.")
        super().__init__(leaves)
        self._structure = datasets

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        iterators = [d._iterate(ctx) for d in self._inputs]
        while True:
            parts = []
            for it in iterators:
                for part in it:
                    parts.append(part)
                    break
                else:
                    return
            yield nest.pack_sequence_as(self._structure, parts)

    def _compute_spec(self) -> Structure:
        return nest.pack_sequence_as(self._structure, [d.element_spec for d in self._inputs])

    def _cardinality(self) -> int:
        return zip_cardinality([d._cardinality() for d in self._inputs])


class EnumerateDataset(Dataset):
    def __init__(self, input_dataset: Dataset, start: int) -> None:
        super().__init__((input_dataset,))
        self._start = start

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        for index, element in enumerate(self._inputs[0]._iterate(ctx), self._start):
            yield np.int64(index), element

    def _compute_spec(self) -> Structure:
        return TensorSpec((), np.int64), self._inputs[0].element_spec

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()


register("zip", ZipDataset)
register("enumerate", EnumerateDataset)
