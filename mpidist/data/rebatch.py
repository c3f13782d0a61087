"""Turning a worker's stream of input elements into steps: one sub-batch per local replica.

Each generator here yields, per step, ``(structure, parts)``: the element structure (a nest
whose leaves are placeholders) and one entry per local replica, the flat list of that replica's
leaves (host arrays) or None where it gets no element this step. Staying flat keeps the
per-step cost to one ``pack`` when the step is handed out. A generator ends when its input
does; the distributed iterator then decides, with the other workers, whether the job as a
whole has more data (spec 7.1: replicas without data get empty batches until no replica
anywhere has any).

Sub-batches are views of the input batch (no copy) except where the balanced split needs
elements from two input batches at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from mpidist.core import nest
from mpidist.core.sharding import batch_sizes_for_worker, legacy_slices
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.distributed import InputWorkers
    from mpidist.data.element import Element, Leaves, Step

__all__ = ["legacy_steps", "balanced_steps", "per_worker_steps", "per_replica_steps",
           "leading_dim"]


def leading_dim(flat: Leaves, num_replicas: int) -> int:
    """The batch size of one element (its leaves' flattened list): the common first dimension."""
    if not flat:
        raise ValueError(
            "An input element has no components (an empty tuple or dict), so there is no batch "
            f"to split across {num_replicas} replicas. Give each element at least one array.")
    size: int | None = None
    for leaf in flat:
        if np.ndim(leaf) == 0:
            raise ValueError(
                f"An input element is a scalar ({leaf!r}) and cannot be split across "
                f"{num_replicas} replicas: batch the dataset first (dataset.batch("
                "global_batch_size)), so that each element has a leading batch dimension.")
        if size is None:
            size = leaf.shape[0]
        elif leaf.shape[0] != size:
            raise InvalidArgumentError(
                f"The components of an input batch have different batch sizes ({size} and "
                f"{leaf.shape[0]}); every component of an element must have the same leading "
                "dimension.")
    return size  # type: ignore[return-value]  # flat is not empty: its first leaf set it


def legacy_steps(batches: Iterable[Element], workers: InputWorkers) -> Iterator[Step]:
    """AUTO / DATA: each batch is one step, split ``ceil(B / N)``; worker ``w`` keeps global
    sub-batches ``w, w + W, ...`` (so every worker must see the same batches)."""
    W, w, R = workers.num_workers, workers.worker_index, workers.replicas_per_worker  # noqa: N806 - the spec's W, R
    n = W * R
    for batch in batches:
        flat = nest.flatten(batch)
        size = leading_dim(flat, n)
        slices = legacy_slices(size, W, R, w)
        yield batch, [[leaf[a:b] for leaf in flat] for a, b in slices]


def balanced_steps(batches: Iterable[Element], workers: InputWorkers,
                   global_batch_size: int | None) -> Iterator[Step]:
    """OFF / FILE: the stream of elements is cut into sub-batches cycling through
    ``batch_sizes_for_worker``; a replica whose sub-batch got no element gets None.

    A step can hand this worker only zero-size slots while its stream still has data (the
    slots rotate over workers), so the generator ends only once the stream is known to be
    exhausted; the cursor reads one batch ahead to know that as soon as it is true.
    """
    W, w, R = workers.num_workers, workers.worker_index, workers.replicas_per_worker  # noqa: N806 - the spec's W, R
    cursor = _Cursor(iter(batches), W * R)
    first_size = cursor.peek_size()
    if first_size is None:
        return
    if global_batch_size is None:
        global_batch_size = first_size
    sizes = batch_sizes_for_worker(global_batch_size, W, R, w)
    position = 0
    while True:
        step: list[Leaves | None] = []
        for _ in range(R):
            step.append(cursor.take(sizes[position % len(sizes)]))
            position += 1
        if cursor.exhausted and all(item is None for item in step):
            return
        yield cursor.structure, step


class _Cursor:
    """Reads ``size`` elements at a time from a stream of batches."""

    def __init__(self, batches: Iterator[Element], num_replicas: int) -> None:
        self._batches, self._n = batches, num_replicas
        self.structure: Element = None
        self._flat: Leaves = None  # type: ignore[assignment]  # set by _advance before take reads it
        self._offset = self._size = 0
        self.exhausted = False

    def _advance(self) -> bool:
        for batch in self._batches:
            flat = nest.flatten(batch)
            self.structure, self._flat = batch, flat
            self._size, self._offset = leading_dim(flat, self._n), 0
            if self._size:
                return True
        self.exhausted = True
        return False

    def peek_size(self) -> int | None:
        """Read the first batch (its structure is the step's); its size, or None if none."""
        return self._size if self._advance() else None

    def take(self, size: int) -> Leaves | None:
        pieces: list[Leaves] = []
        while size > 0 and not self.exhausted:
            n = min(size, self._size - self._offset)
            pieces.append([leaf[self._offset:self._offset + n] for leaf in self._flat])
            self._offset += n
            size -= n
            if self._offset >= self._size:
                self._advance()  # read ahead, so that exhaustion is known at once
        if not pieces:
            return None
        if len(pieces) == 1:
            return pieces[0]
        return [np.concatenate(parts) for parts in zip(*pieces)]


def per_worker_steps(elements: Iterable[Element], replicas_per_worker: int) -> Iterator[Step]:
    """``distribute_datasets_from_function``, one pipeline per worker: its elements are already
    per-replica batches, dealt to the local replicas in turn."""
    it = iter(elements)
    while True:
        step: list[Element] = []
        for element in it:
            step.append(element)
            if len(step) == replicas_per_worker:
                break
        if not step:
            return
        yield step[0], [nest.flatten(e) for e in step] + [None] * (replicas_per_worker - len(step))


def per_replica_steps(pipelines: Iterable[Iterable[Element]]) -> Iterator[Step]:
    """One pipeline per replica: each replica takes its own pipeline's next element."""
    iterators = [iter(p) for p in pipelines]
    done = [False] * len(iterators)
    while True:
        step: list[Element] = []
        for i, it in enumerate(iterators):
            element = None if done[i] else next(it, None)
            done[i] = element is None
            step.append(element)
        if all(done):
            return
        structure = next(e for e in step if e is not None)
        yield structure, [None if e is None else nest.flatten(e) for e in step]
