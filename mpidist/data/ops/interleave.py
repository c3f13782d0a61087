"""``Dataset.interleave`` and ``Dataset.flat_map``: the elements of the datasets a function
returns for each input element, in TF's order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short
from mpidist.data.base import (
    UNKNOWN_CARDINALITY,
    Dataset,
    chain_from_source,
    source_units,
    specs_match,
)
from mpidist.data.blocks import row_count
from mpidist.data.context import IterationContext
from mpidist.data.ops.registry import register
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Block, Element, Structure

__all__: list[str] = []


_END = object()


class _BlockCursor:
    """A position in a stream of blocks: how many rows are left in the current block, and the
    next rows of it."""

    __slots__ = ("_blocks", "_flat", "_position", "_rows")
    _flat: list[Any]  # set by available() before take() reads it

    def __init__(self, blocks: Iterator[Block]) -> None:
        self._blocks, self._flat, self._position, self._rows = blocks, None, 0, 0  # type: ignore[assignment]

    def available(self) -> int:
        """Rows left in the current block (the next block loaded if this one is used up);
        0 at the end of the stream."""
        while self._position >= self._rows:
            block = next(self._blocks, _END)
            if block is _END:
                return 0
            self._flat, self._position, self._rows = nest.flatten(block), 0, row_count(block)
        return self._rows - self._position

    def take(self, n: int) -> list[Any]:
        """The next ``n`` rows (at most ``available()``), as flat leaves."""
        start = self._position
        self._position += n
        return [leaf[start:start + n] for leaf in self._flat]


def _rows_as_blocks(elements: Iterable[Element]) -> Iterator[Block]:
    for element in elements:
        yield nest.map_structure(lambda x: np.asarray(x)[np.newaxis], element)


class _Interleave(Dataset):
    """``interleave`` and ``flat_map`` (cycle length 1): TF's order, element by element, or
    block by block where the opened datasets read files (several rounds of the cycle at once,
    by one stack, where every open dataset has the rows at hand)."""

    def __init__(self, input_dataset: Dataset, map_func: Callable[..., Dataset], cycle_length: int,
                 block_length: int) -> None:
        super().__init__((input_dataset,))
        self._map_func, self._cycle_length, self._block_length = map_func, cycle_length, block_length
        self._api = "flat_map" if cycle_length == 1 and block_length == 1 else "interleave"
        self._probed: tuple[Dataset, Element] | tuple[None, None] | None = None

    def _open(self, index: int, element: Element, check: bool = True) -> Dataset:
        args = element if type(element) is tuple else (element,)
        inner = self._map_func(*args)
        if not isinstance(inner, Dataset):
            raise TypeError(
                f"{self._api}: map_func must return an mpidist.data.Dataset for each element; "
                f"for element {index} ({short(element)}) it returned {short(inner)}. Wrap "
                "arrays in Dataset.from_tensor_slices or from_tensors; to read files, return a "
                "reader (NpyDataset(filename), ParquetDataset, HDF5Dataset, TextLineDataset), "
                "which streams the file and lets FILE auto-sharding split the files.")
        if check and not specs_match(inner.element_spec, self.element_spec):
            raise InvalidArgumentError(
                f"{self._api}: the dataset map_func returned for element {index} "
                f"({short(element)}) has elements {inner.element_spec}, but the one for the "
                f"input's first element ({short(self._probe()[1])}) has {self.element_spec}: every "
                "dataset interleaved must have the same structure, dtypes and shapes.")
        return inner

    def _probe(self) -> tuple[Dataset, Element] | tuple[None, None]:
        """(the dataset map_func returns for the first input element, that element), or
        (None, None) for an empty input: what the element spec and the reader checks read."""
        if self._probed is None:
            first = next(self._inputs[0]._iterate(IterationContext()), _END)
            self._probed = (None, None) if first is _END else (
                self._open(0, first, check=False), first)
        return self._probed

    def _compute_spec(self) -> Structure:
        inner = self._probe()[0]
        if inner is None:
            raise ValueError(f"The element_spec of this {self._api} is unknown: its input has no "
                             "element to call map_func on.")
        return inner.element_spec

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        return 0 if n == 0 else UNKNOWN_CARDINALITY

    def _reads_files(self) -> bool:
        inner = self._probe()[0]
        return inner is not None and any(node._reads_files() for node in chain_from_source(inner))

    def _file_names_count(self) -> int | None:
        n = self._inputs[0]._cardinality()
        return n if n >= 0 else None

    def _split_units(self) -> tuple[str, ...] | None:
        return source_units(self._inputs[0])  # sharded at its source

    def _yields_blocks(self) -> bool:
        inner = self._probe()[0]
        return inner is not None and inner._yields_blocks()

    def _opened(self, ctx: IterationContext) -> Iterator[tuple[int, Dataset]]:
        """(index, dataset) for each input element, the FILE shard applied to the input."""
        shard = ctx.file_shard_of(self)
        source = self._inputs[0]
        elements = source._iterate(ctx if shard is None else ctx.child(source_shard=shard))
        for index, element in enumerate(elements):
            yield index, self._open(index, element)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return self._interleave(ctx, blocks=False)

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        return self._interleave(ctx, blocks=True)

    def _start(self, ctx: IterationContext, index: int, inner: Dataset, blocks: bool,
               produced: int = 0) -> Iterator[Element] | _BlockCursor:
        child = ctx.child(salt=index)
        if not blocks:
            return inner._iterate(child)
        if self._cycle_length == 1:  # one reader at a time: its blocks can align to batches
            child.batch_rows, child.row_offset = ctx.batch_rows, ctx.row_offset + produced
        return _BlockCursor(inner._blocks(child) if inner._yields_blocks()
                            else _rows_as_blocks(inner._iterate(child)))

    def _interleave(self, ctx: IterationContext, blocks: bool) -> Iterator[Element]:
        k, b = self._cycle_length, self._block_length
        # (called only with blocks)
        pack: Callable[[list[Any]], Element] = nest.packer(self.element_spec) if blocks else None  # type: ignore[assignment]
        opened: Iterator[Any] = self._opened(ctx)
        slots: list[Any]
        slots, cycle, position, live, end, produced = [None] * k, 0, 0, 0, False, 0
        while not end or live:
            slot = slots[cycle]
            if slot is None:
                if end:
                    cycle, position = (cycle + 1) % k, 0
                    continue
                item: Any = next(opened, _END)
                if item is _END:
                    end = True
                else:
                    slots[cycle], live = self._start(  # type: ignore[call-arg]  # item: (index, dataset)
                        ctx, *item, blocks, produced), live + 1
                continue
            if not blocks:
                element = next(slot, _END)
                taken = 0 if element is _END else 1
            else:
                if position == 0 and live == k and k > 1:
                    rounds = min(s.available() for s in slots) // b
                    if rounds >= 2:  # whole rounds of the cycle in one stack
                        yield pack(_stack_rounds(slots[cycle:] + slots[:cycle], rounds, b))
                        continue
                # One dataset open at a time (flat_map, cycle_length=1): block_length cannot
                # change the order, so all the rows at hand go on together, not b at a time.
                taken = slot.available() if k == 1 else min(slot.available(), b - position)
                element = pack(slot.take(taken)) if taken else _END
            if element is _END:
                slots[cycle], live = None, live - 1
                cycle, position = (cycle + 1) % k, 0
                continue
            yield element
            position, produced = position + taken, produced + taken
            if position >= b:
                cycle, position = (cycle + 1) % k, 0


def _stack_rounds(cursors: list[_BlockCursor], rounds: int, block_length: int) -> list[np.ndarray]:
    """``rounds`` rounds of the cycle over ``cursors`` (each with the rows at hand), in
    interleave order: block_length rows of each cursor in turn, round after round."""
    parts = [c.take(rounds * block_length) for c in cursors]
    out = []
    for column in zip(*parts):
        tail = column[0].shape[1:]
        stacked = np.stack([p.reshape((rounds, block_length) + tail) for p in column], axis=1)
        out.append(stacked.reshape((rounds * len(cursors) * block_length,) + tail))
    return out


register("interleave", _Interleave)
