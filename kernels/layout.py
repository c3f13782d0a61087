"""Where each tensor sits in a flat fusion buffer: the offsets table, and TF's ways of cutting
a list of tensors into packs. Pure Python, no Numba: plans are cheap and cached by the caller."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["FusionLayout", "split_sizes", "group_by_size"]


class FusionLayout:
    """The offsets table of tensors of the given shapes laid end to end in one flat buffer.

    ``starts[k]`` is the element offset of tensor ``k`` and ``sizes[k]`` its element count;
    ``total`` is the flat length. Layouts are immutable and hashable by their shapes.
    """

    __slots__ = ("shapes", "sizes", "starts", "total", "_hash")

    def __init__(self, shapes: Iterable[Iterable[int]]) -> None:
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        self.sizes = tuple(math.prod(s) for s in self.shapes)
        starts: list[int] = []
        offset = 0
        for n in self.sizes:
            starts.append(offset)
            offset += n
        self.starts = tuple(starts)
        self.total = offset
        self._hash = hash(self.shapes)

    @classmethod
    def of(cls, tensors: Iterable[Any]) -> FusionLayout:
        return cls([np.shape(t) for t in tensors])

    def __len__(self) -> int:
        return len(self.shapes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FusionLayout) and other.shapes == self.shapes

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"FusionLayout({len(self.shapes)} tensors, {self.total} elements)"

    def views(self, flat: Any) -> list[Any]:
        """Tensor-shaped views into ``flat`` (no copies), one per entry of the table."""
        if flat.shape != (self.total,):
            raise ValueError(
                f"A flat buffer of shape ({self.total},) is needed for {self!r}, got shape "
                f"{tuple(flat.shape)}."
            )
        return [flat[s:s + n] if len(shape) == 1 else flat[s:s + n].reshape(shape)
                for s, n, shape in zip(self.starts, self.sizes, self.shapes)]


def split_sizes(total: int, num_packs: int) -> list[int]:
    """TF's concat-and-split cut of ``total`` elements into ``num_packs`` packs.

    Every pack gets ``total // num_packs`` elements and the last one also gets the remainder:
    ``split_sizes(11, 3) == [3, 3, 5]``.
    """
    if isinstance(num_packs, bool) or not isinstance(num_packs, (int, np.integer)) or num_packs <= 0:
        raise ValueError(f"num_packs must be greater than zero, got {num_packs!r}.")
    size = total // num_packs
    return [size] * (num_packs - 1) + [total - size * (num_packs - 1)]


def group_by_size(nbytes: Sequence[int], bytes_per_pack: int) -> list[list[int]]:
    """TF's greedy packing: indices of consecutive tensors grouped into packs.

    A new pack starts once the current one holds strictly more than ``bytes_per_pack`` bytes,
    so every pack but the last is at least that big. ``bytes_per_pack == 0`` gives one pack.

    Args:
        nbytes: Byte size of each tensor, in order.
        bytes_per_pack: Pack size threshold, >= 0.

    Returns:
        A list of lists of indices into ``nbytes``; empty when ``nbytes`` is.
    """
    if bytes_per_pack < 0:
        raise ValueError(f"bytes_per_pack must be >= 0, got {bytes_per_pack}.")
    if not nbytes:
        return []
    if bytes_per_pack == 0:
        return [list(range(len(nbytes)))]
    packs: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, n in enumerate(nbytes):
        if current and size > bytes_per_pack:
            packs.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    packs.append(current)
    return packs
