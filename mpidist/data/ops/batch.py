"""``Dataset.batch``: consecutive elements stacked into batches, by one vectorised take per
component over a from_tensor_slices source, by slicing blocks of file rows, else element
by element."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.base import (
    Dataset,
    blocks_of,
    index_source,
    iterate_indices,
    row_taker,
    yields_blocks,
)
from mpidist.data.blocks import stack
from mpidist.data.context import IterationContext
from mpidist.data.ops.registry import register

if TYPE_CHECKING:
    from mpidist.data.element import Block, Element, Structure

__all__: list[str] = []


class _Batch(Dataset):
    def __init__(self, input_dataset: Dataset, batch_size: int, drop_remainder: bool) -> None:
        super().__init__((input_dataset,))
        self._batch_size, self._drop_remainder = batch_size, drop_remainder

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        n = self._batch_size
        if yields_blocks(self._inputs[0]):
            ctx.batch_rows = n
            yield from _batches_of_blocks(blocks_of(self._inputs[0], ctx), n, self._drop_remainder)
            return
        source = index_source(self._inputs[0])
        if source is not None:
            indices = iterate_indices(self._inputs[0], ctx)
            take_rows = row_taker(source)
            while True:
                rows = np.fromiter(itertools.islice(indices, n), dtype=np.intp, count=-1)
                if not len(rows) or (self._drop_remainder and len(rows) < n):
                    return
                yield take_rows(rows)
        it = self._inputs[0]._iterate(ctx)
        while True:
            elements = list(itertools.islice(it, n))
            if not elements or (self._drop_remainder and len(elements) < n):
                return
            yield stack(elements)

    def _compute_spec(self) -> Structure:
        size = self._batch_size if self._drop_remainder else None
        return nest.map_structure(lambda s: s.with_batch_dim(size), self._inputs[0].element_spec)

    def _batching(self) -> tuple[bool, int | None]:
        return True, self._batch_size

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return n // self._batch_size if self._drop_remainder else -(-n // self._batch_size)


def _batches_of_blocks(blocks: Iterable[Block], size: int, drop_remainder: bool
                       ) -> Iterator[Element]:
    """Batches of ``size`` rows cut from a stream of blocks: a view of the block where the
    batch lies inside one writable block, else a copy (never a view of a file mapping)."""
    pending: list[list[Any]] = []
    have, pack = 0, None
    for block in blocks:
        flat = nest.flatten(block)
        pack = nest.packer(block) if pack is None else pack
        rows, start = len(flat[0]), 0
        while start < rows:
            take = min(size - have, rows - start)
            if take == size and all(leaf.flags.writeable for leaf in flat):
                # a whole batch inside one block: a view (readers' blocks are fresh arrays, so
                # it keeps one block alive, never a file), saving the copy a concatenate makes
                yield pack([leaf[start:start + size] for leaf in flat])
                start += size
                continue
            pending.append([leaf[start:start + take] for leaf in flat])
            have, start = have + take, start + take
            if have == size:
                yield pack([np.concatenate(column) for column in zip(*pending)])
                pending, have = [], 0
    if have and not drop_remainder:
        if len(pending) == 1 and all(leaf.flags.writeable for leaf in pending[0]):
            yield pack(pending[0])  # type: ignore[misc]  # the short last batch, inside one block
        else:
            yield pack([np.concatenate(column) for column in zip(*pending)])  # type: ignore[misc]


register("batch", _Batch)
