"""``Dataset.prefetch``: elements produced ahead in a background thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from mpidist.data.background import iterate_in_background
from mpidist.data.base import Dataset
from mpidist.data.context import IterationContext
from mpidist.data.ops.registry import register

if TYPE_CHECKING:
    from mpidist.data.element import Element

__all__: list[str] = []


class _Prefetch(Dataset):
    def __init__(self, input_dataset: Dataset, buffer_size: int) -> None:
        super().__init__((input_dataset,))
        self._buffer_size = buffer_size

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return iterate_in_background(self._inputs[0]._iterate(ctx), self._buffer_size)


register("prefetch", _Prefetch)
