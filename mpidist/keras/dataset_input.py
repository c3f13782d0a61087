"""mpidist Datasets as Keras input: each worker's batches, sharded by the strategy as TF does.

``model.fit(dataset)`` under a strategy distributes the dataset with
``strategy.experimental_distribute_dataset`` (auto-sharding by FILE or DATA, the rebatch into
replica batches) and hands Keras this worker's rows of each step as one batch, in replica
order; the step functions split it again among the local replicas. Keras reads it as a
``PyDataset`` read in order on the calling thread (``workers=1``), so no step is read twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from keras import tree
from keras.utils import PyDataset

from mpidist.data.dataset import Dataset
from mpidist.data.distributed import DistributedDataset, DistributedIterator
from mpidist.errors import InvalidArgumentError

__all__ = ["WorkerBatches", "as_keras_input"]


class WorkerBatches(PyDataset):  # type: ignore[misc]
    """This worker's batches of a distributed dataset, one Keras batch per step."""

    def __init__(self, distributed: DistributedDataset | Dataset, strategy: Any) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        self._distributed = distributed
        self._strategy = strategy
        self._iterator: Any = None
        self._next = 0
        cardinality = distributed.cardinality()
        self._steps = cardinality if cardinality >= 0 else None

    @property
    def num_batches(self) -> int | None:
        return self._steps

    def __len__(self) -> int:
        if self._steps is None:
            raise TypeError("The dataset is infinite or of unknown length: give fit "
                            "`steps_per_epoch` (and evaluate `steps`).")
        return self._steps

    def __getitem__(self, index: int) -> Any:
        if index == 0 or self._iterator is None:
            self._iterator, self._next = iter(self._distributed), 0
        if index != self._next:
            raise IndexError(f"An mpidist Dataset is read in order: step {index} was asked for "
                             f"after step {self._next - 1}. Do not shuffle it in fit "
                             "(shuffle the Dataset itself).")
        try:
            element = next(self._iterator)
        except StopIteration:
            raise IndexError(f"The dataset ended after {index} steps.") from None
        self._next += 1
        parts = self._strategy.experimental_local_results(element)
        if len(parts) == 1:
            return parts[0]
        return tree.map_structure(lambda *p: np.concatenate([np.asarray(a) for a in p]),
                                  *parts)


def as_keras_input(data: Any, strategy: Any) -> tuple[Any, bool]:
    """``(input Keras reads, whether it is this worker's own rows)`` for ``data``: mpidist
    Datasets (distributed by ``strategy``) and DistributedDatasets become WorkerBatches;
    anything else is returned unchanged, for Keras to read as global batches."""
    if isinstance(data, WorkerBatches):  # fit hands its converted validation data to evaluate
        return data, True
    if isinstance(data, DistributedIterator):
        raise InvalidArgumentError(
            "Keras got an iterator over a distributed dataset, whose elements are per-replica "
            "batches. Pass the DistributedDataset itself (or the mpidist Dataset of global "
            "batches) to fit/evaluate/predict: Keras reads it from the start of every epoch.")
    if isinstance(data, Dataset):
        data = strategy.experimental_distribute_dataset(data)
    if isinstance(data, (Dataset, DistributedDataset)):  # a Dataset: the default strategy's
        return WorkerBatches(data, strategy), True
    return data, False
