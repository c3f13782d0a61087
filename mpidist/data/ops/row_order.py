"""The transformations that only select or reorder their input's elements: ``shuffle``,
``repeat``, ``shard``, ``take``, ``skip`` and ``with_options``. They run the same way over
elements, over row indices of a from_tensor_slices source and over blocks of file rows."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from mpidist.data.base import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, chain_from_source
from mpidist.data.blocks import row_count, slice_rows
from mpidist.data.context import IterationContext
from mpidist.data.finite import require_finite
from mpidist.data.ops.registry import register
from mpidist.data.options import Options

if TYPE_CHECKING:
    from mpidist.data.element import Block, Element

__all__ = ['RowOrderOp']


class RowOrderOp(Dataset):
    """A transformation that only selects or reorders its input's elements: it runs the same
    way over elements and over row indices of a from_tensor_slices source."""

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return self._apply(lambda: self._inputs[0]._iterate(ctx), ctx)

    def _iterate_indices(self, ctx: IterationContext) -> Iterator[int]:
        return self._apply(lambda: self._inputs[0]._iterate_indices(ctx), ctx)

    def _index_source(self) -> Dataset | None:
        return self._inputs[0]._index_source()

    def _yields_blocks(self) -> bool:
        return self._inputs[0]._yields_blocks()

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        return self._apply_blocks(lambda: self._inputs[0]._blocks(ctx), ctx)

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        """The output stream, given ``upstream()`` making a fresh input stream."""
        raise NotImplementedError

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        """``_apply`` over blocks of rows; as ``_apply`` where the op does not count rows."""
        return self._apply(upstream, ctx)


class _Shuffle(RowOrderOp):
    def __init__(self, input_dataset: Dataset, buffer_size: int, seed: int | None,
                 reshuffle: bool) -> None:
        super().__init__((input_dataset,))
        self._buffer_size, self._seed, self._reshuffle = buffer_size, seed, reshuffle
        # An unseeded shuffle is random per run but fixed for this object, as in tf.data.
        self._random_seed = int.from_bytes(os.urandom(8), "little")

    def _yields_blocks(self) -> bool:
        return False

    def _order_units(self) -> tuple[str, ...]:
        return () if self._seed is None else (f"shuffle(seed={self._seed})",)

    def _rng(self, ctx: IterationContext) -> np.random.Generator:
        instance = ctx.next_instance(self)
        if self._seed is not None:
            base = self._seed
        else:
            base = ctx.agreed_seed if ctx.agreed_seed is not None else self._random_seed
        # A seeded order depends on the seed and the elements alone, as in TF (not on where the
        # shuffle sits in the pipeline); unseeded shuffles share the agreed seed, so their
        # depth keeps two of them in one pipeline apart.
        position = [] if self._seed is not None else [self._depth]
        entropy = [base, *position] + ([ctx.iteration, instance] if self._reshuffle else [])
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        rng = self._rng(ctx)
        it = upstream()
        buffer = list(itertools.islice(it, self._buffer_size))
        draws, pos = rng.random(1024), 0
        for element in it:
            if pos == len(draws):
                draws, pos = rng.random(1024), 0
            k = int(draws[pos] * len(buffer))
            pos += 1
            yield buffer[k]
            buffer[k] = element
        order = rng.permutation(len(buffer))
        for k in order:
            yield buffer[k]


class _Repeat(RowOrderOp):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        passes = itertools.count() if self._count < 0 else range(self._count)
        for _ in passes:
            produced = False
            for element in upstream():
                produced = True
                yield element
            if not produced:
                return  # repeating an empty dataset forever would spin

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if self._count == 0 or n == 0:
            return 0
        if self._count < 0:
            return INFINITE_CARDINALITY if n != UNKNOWN_CARDINALITY else UNKNOWN_CARDINALITY
        return n * self._count if n >= 0 else n


class _Shard(RowOrderOp):
    def __init__(self, input_dataset: Dataset, num_shards: int | None, index: int | None) -> None:
        super().__init__((input_dataset,))
        self._num_shards, self._index = num_shards, index

    def _shard(self, ctx: IterationContext) -> tuple[int, int]:
        if self._num_shards is None:  # shard(SHARD_HINT, SHARD_HINT)
            return ctx.shard_hint
        return self._num_shards, self._index  # type: ignore[return-value]  # both set, or neither

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        num, index = self._shard(ctx)
        return itertools.islice(upstream(), index, None, num)

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        num, index = self._shard(ctx)
        position = 0
        for block in upstream():
            rows = row_count(block)
            first = (index - position) % num
            if first < rows:
                yield slice_rows(block, first, None, num)
            position += rows

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0 or self._num_shards is None:
            return n if n < 0 else UNKNOWN_CARDINALITY
        return max(0, -(-(n - self._index) // self._num_shards))  # type: ignore[operator]  # set

    def _is_hint(self) -> bool:
        return self._num_shards is None


class _Take(RowOrderOp):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        it = upstream()
        return it if self._count < 0 else itertools.islice(it, self._count)

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        left = self._count
        if left < 0:
            yield from upstream()
            return
        for block in upstream() if left else ():
            rows = row_count(block)
            yield block if rows <= left else slice_rows(block, 0, left)
            left -= min(rows, left)
            if not left:
                return

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if self._count < 0:
            return n
        if n == INFINITE_CARDINALITY:
            return self._count
        return n if n == UNKNOWN_CARDINALITY else min(n, self._count)


class _Skip(RowOrderOp):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        if self._count < 0:  # skip all: reads to the end, which an infinite input never reaches
            require_finite(chain_from_source(self._inputs[0]), "skip(-1)")
        it = upstream()
        if self._count < 0:
            for _ in it:
                pass
            return
        yield from itertools.islice(it, self._count, None)

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        left = self._count
        if left < 0:
            require_finite(chain_from_source(self._inputs[0]), "skip(-1)")
        for block in upstream():
            if left < 0:
                continue
            rows = row_count(block)
            if rows > left:
                yield block if not left else slice_rows(block, left)
            left = max(0, left - rows)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return 0 if self._count < 0 else max(0, n - self._count)


class _WithOptions(RowOrderOp):
    def __init__(self, input_dataset: Dataset, options: Options) -> None:
        super().__init__((input_dataset,))
        self._options = options

    def _options_set(self) -> Options | None:
        return self._options

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        return upstream()


register("shuffle", _Shuffle)
register("repeat", _Repeat)
register("shard", _Shard)
register("take", _Take)
register("skip", _Skip)
register("with_options", _WithOptions)
