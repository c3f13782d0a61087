"""``IterationContext``: what one top-level iteration of a dataset tells every node of its
chain (which pass, the seed the workers agreed, the FILE shard to read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mpidist.data.base import Dataset

__all__ = ["IterationContext"]


class IterationContext:
    """What one top-level iteration tells every node of the chain (see ``iterate``).

    ``iteration`` numbers the top-level iterations (a reshuffling shuffle reseeds per
    iteration); ``agreed_seed`` replaces unseeded shuffles' local random seeds (workers agree
    on it); ``source_shard`` is ``(num_shards, index)`` applied to the source at the start of
    the chain (FILE auto-sharding of a reader's file names, or of an in-memory source where no
    reader is found); ``file_shard`` is ``(num_shards, index, reader)``: the reader node whose
    file names FILE auto-sharding splits; ``shard_hint`` is ``(num_shards, index)`` for the
    ``shard(SHARD_HINT, SHARD_HINT)`` placeholders (HINT; one worker outside distribution).
    """

    def __init__(self, iteration: int = 0, agreed_seed: int | None = None,
                 source_shard: tuple[int, int] | None = None,
                 file_shard: tuple[int, int, Dataset] | None = None,
                 shard_hint: tuple[int, int] = (1, 0)) -> None:
        self.iteration = iteration
        self.agreed_seed = agreed_seed
        self.source_shard = source_shard
        self.file_shard = file_shard
        self.shard_hint = shard_hint
        # Set by a batch that cuts blocks of file rows (a hint: it changes block sizes, never
        # the elements): readers make blocks of whole batches, so batches are views of them.
        self.batch_rows: int | None = None
        self.row_offset = 0  # rows of the batched stream before this reader's first row
        self._instances: dict[int, int] = {}
        self._children: dict[tuple[tuple[int, int] | None, int | None], IterationContext] = {}
        # Set under ignore_errors: nodes that run a user function per element (map, filter,
        # ...) hand it an error that function raised and drop the element, instead of raising.
        self.skip_error: Callable[[Exception], None] | None = None

    def ignoring_errors(self, handler: Callable[[Exception], None]) -> IterationContext:
        """This context for the nodes upstream of an ``ignore_errors``: the same pass (its
        instance counts and children shared), with ``skip_error`` set to ``handler``."""
        copy = IterationContext.__new__(IterationContext)
        copy.__dict__.update(self.__dict__)
        copy.skip_error = handler
        return copy

    def file_shard_of(self, reader: Dataset) -> tuple[int, int] | None:
        """``(num_shards, index)`` if FILE auto-sharding splits ``reader``'s file names."""
        if self.file_shard is not None and self.file_shard[2] is reader:
            return self.file_shard[:2]
        return None

    def child(self, source_shard: tuple[int, int] | None = None, salt: int | None = None
              ) -> IterationContext:
        """The context a node iterates a dataset of its own with (a reader's file names, the
        datasets interleave opens): same pass, a seed derived from the agreed one."""
        key = (source_shard, salt)
        if key not in self._children:  # kept: a repeated pass must count its instances on
            seed = self.agreed_seed
            if seed is not None and salt is not None:
                seed = int(np.random.SeedSequence([seed, salt]).generate_state(1, np.uint64)[0])
            self._children[key] = IterationContext(self.iteration, seed, source_shard,
                                                   shard_hint=self.shard_hint)
        return self._children[key]

    def next_instance(self, node: Dataset) -> int:
        """How many iterators of ``node`` this iteration created before (repeat re-creates)."""
        n = self._instances.get(id(node), 0)
        self._instances[id(node)] = n + 1
        return n
