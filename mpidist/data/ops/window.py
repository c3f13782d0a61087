"""``Dataset.window``: each element a window of the input, as in TF a structure of datasets.

Window ``k`` starts at input element ``k * shift`` and holds the elements ``k * shift + i *
stride`` for ``i < size`` that exist; without ``drop_remainder`` every start inside the input
gives a window (the last ones may be short), with it only full windows are produced. Each
window is the element's structure with one dataset per component (``DatasetSpec`` in the
element spec), so ``flat_map(lambda w: w.batch(size))`` turns windows into batches, and a
tuple element's windows reach ``flat_map`` as positional arguments. The input is read once,
holding only the elements of the windows in progress.

Cardinality (TF's): INFINITE / UNKNOWN as the input's; else, for ``n`` elements,
``ceil(n / shift)``, or with ``drop_remainder`` ``(n - (size - 1) * stride - 1) // shift + 1``
(0 where that is negative).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mpidist.core import nest
from mpidist.data.dataset import Dataset, IterationContext
from mpidist.data.ops.common import ElementsDataset
from mpidist.data.ops.registry import register
from mpidist.data.spec import DatasetSpec

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["WindowDataset", "window_cardinality"]


def window_cardinality(n: int, size: int, shift: int, stride: int, drop_remainder: bool) -> int:
    if n < 0:
        return n
    if drop_remainder:
        rest = n - ((size - 1) * stride + 1)
        return 0 if rest < 0 else rest // shift + 1
    return -(-n // shift)


class WindowDataset(Dataset):
    def __init__(self, input_dataset: Dataset, size: int, shift: int, stride: int,
                 drop_remainder: bool) -> None:
        super().__init__((input_dataset,))
        self._size, self._shift, self._stride = size, shift, stride
        self._drop_remainder = drop_remainder

    def _window(self, elements: list[Element]) -> Element:
        spec = self._inputs[0].element_spec
        flat_spec = nest.flatten(spec)
        columns: list[list[Element]] = [[] for _ in flat_spec]
        for element in elements:
            for column, leaf in zip(columns, nest.flatten(element)):
                column.append(leaf)
        return nest.pack_sequence_as(
            spec, [ElementsDataset(column, s) for column, s in zip(columns, flat_spec)])

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        size, shift, stride = self._size, self._shift, self._stride
        span = (size - 1) * stride + 1  # input elements from a window's first to its last
        it = self._inputs[0]._iterate(ctx)
        buffer: collections.deque[Element] = collections.deque()
        base, start, ended = 0, 0, False  # base: the input index of buffer[0]
        while True:
            while not ended and base + len(buffer) < start + span:
                for element in it:
                    buffer.append(element)
                    break
                else:
                    ended = True
            while buffer and base < start:  # drop what no window needs any more
                buffer.popleft()
                base += 1
            if base < start or not buffer:  # the window's first element does not exist
                return
            window = [buffer[i] for i in range(0, min(span, len(buffer)), stride)]
            if len(window) < size and self._drop_remainder:
                return
            yield self._window(window)
            start += shift

    def _compute_spec(self) -> Structure:
        return nest.map_structure(DatasetSpec, self._inputs[0].element_spec)

    def _cardinality(self) -> int:
        return window_cardinality(self._inputs[0]._cardinality(), self._size, self._shift,
                                  self._stride, self._drop_remainder)


register("window", WindowDataset)
