"""Blocks of rows (nests of arrays sharing a leading dimension) and the elements made of
them: what the batching, row-order and file-reading nodes share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Block, Element, Structure

__all__ = ["pack", "block_rows", "python_bytes", "object_row", "stack", "slice_rows", "row_count"]


def pack(structure: Structure, leaves: list[Any]) -> Element:
    return nest.pack_sequence_as(structure, leaves) if nest.is_nested(structure) else leaves[0]


def block_rows(block: Block) -> Iterator[Element]:
    """The rows of one block, one element each, copied: a view would keep the whole block
    alive for as long as the element lives (a shuffle buffer of views pins a block per row,
    and memory then grows with the data instead of the buffer)."""
    flat = nest.flatten(block)
    if not nest.is_nested(block):
        if flat[0].dtype == object:  # bytes (TFRecord records): 0-d object arrays, exact
            yield from (object_row(row) for row in flat[0])
            return
        for row in flat[0]:
            yield row.copy()
        return
    pack = nest.packer(block)
    for i in range(len(flat[0])):
        yield pack([object_row(leaf[i]) if leaf.dtype == object else leaf[i].copy()
                    for leaf in flat])


def python_bytes(elements: Iterator[Element]) -> Iterator[Element]:
    """``elements``, with bytes records as ``bytes`` where the first element has any (decided
    once: the element spec is not computed, which would run a map function on stand-ins)."""
    first = next(elements, _NO_ELEMENT)
    if first is _NO_ELEMENT:
        return
    if not any(getattr(getattr(leaf, "dtype", None), "kind", "") == "O"
               for leaf in nest.flatten(first)):
        yield first
        yield from elements
        return
    yield nest.map_structure(_bytes_as_python, first)
    for element in elements:
        yield nest.map_structure(_bytes_as_python, element)


_NO_ELEMENT: Any = object()


def _bytes_as_python(x: Any) -> Any:
    return x.item() if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype == object else x


def object_row(row: Any) -> np.ndarray:
    """A row of an object block (bytes, as ``TFRecordDataset`` and ``mpidist.io``'s string
    features give them: NumPy's ``S`` dtype drops trailing NUL bytes) as a 0-d object array,
    so that batching it again gives an object array, not a lossy ``S`` one."""
    if isinstance(row, np.ndarray):
        return row.copy()
    out = np.empty((), dtype=object)
    out[()] = row
    return out


def stack(elements: list[Element]) -> Element:
    first = elements[0]
    columns: list[Any]
    if not nest.is_nested(first):
        columns = [elements]
    else:
        flats = [nest.flatten(e) for e in elements]
        columns = list(zip(*flats))
    stacked = []
    for c, column in enumerate(columns):
        try:
            stacked.append(np.stack(column))
        except ValueError:
            shapes = [np.shape(x) for x in column]
            bad = next(i for i, s in enumerate(shapes) if s != shapes[0])
            raise InvalidArgumentError(
                f"Cannot batch tensors with different shapes in component {c}. First element had "
                f"shape {list(shapes[0])} and element {bad} had shape {list(shapes[bad])}.") from None
    return stacked[0] if not nest.is_nested(first) else nest.pack_sequence_as(first, stacked)


def slice_rows(block: Block, start: int, stop: int | None = None, step: int = 1) -> Block:
    flat = nest.flatten(block)
    return pack(block, [leaf[start:stop:step] for leaf in flat])


def row_count(block: Block) -> int:
    return len(nest.flatten(block)[0])
