"""Exactly-once evaluation on the workers of a ParameterServerStrategy job (ps-design.md §3.6).

``ClusterCoordinator.schedule`` runs a closure at least once: a preempted worker's closure runs
again elsewhere, and whatever it wrote to the parameter servers is then written twice. So a
metric updated on the parameter servers by evaluation closures may count an example twice (TF
gives no visitation guarantee either). ``exact_evaluation`` counts each example once the way
Keras's ``pss_evaluation_shards`` does: one closure per shard of the dataset, each closure
*returns* its shard's partial sums instead of writing them anywhere, and the chief adds up each
shard's result once. A shard that runs twice still has one RemoteValue, which holds one result.
"""

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpidist.core import nest
from mpidist.core.function import is_function
from mpidist.data.dataset import INFINITE_CARDINALITY, Dataset
from mpidist.ps.coordinator import ClusterCoordinator

__all__ = ["exact_evaluation"]


def _check_arguments(coordinator: Any, eval_fn: Any, dataset: Any, num_shards: Any) -> None:
    if not isinstance(coordinator, ClusterCoordinator):
        raise TypeError(
            "exact_evaluation needs the job's mpidist.experimental.coordinator.ClusterCoordinator "
            f"as its first argument, got {coordinator!r}.")
    if not is_function(eval_fn):
        raise TypeError(
            f"exact_evaluation runs eval_fn on the workers, so it must be decorated with "
            f"`@mpidist.function`, got {eval_fn!r}.")
    if not isinstance(dataset, Dataset):
        raise TypeError(
            f"exact_evaluation shards an mpidist.data.Dataset, got {dataset!r}. Build one with "
            "mpidist.data.Dataset.from_tensor_slices(...) (batched or not: shards are cut "
            "element by element, so a batched dataset is sharded by batches).")
    if dataset.cardinality() == INFINITE_CARDINALITY:
        raise ValueError(
            "exact_evaluation needs a finite dataset (each shard is read to its end), but "
            f"{dataset!r} is infinite: remove its repeat().")
    if isinstance(num_shards, bool) or not isinstance(num_shards, numbers.Integral) \
            or num_shards < 1:
        raise ValueError(f"num_shards must be an integer >= 1, got {num_shards!r}; a few "
                         "shards per worker balance the load.")


def _is_number(value: Any) -> bool:
    if isinstance(value, (np.ndarray, np.generic)):
        return np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_
    return isinstance(value, numbers.Number)


def _add_up(partials: Sequence[Any]) -> Any:
    """The leaf-wise sum of the shards' results, added in shard order (so the total does not
    depend on which worker ran which shard)."""
    first = partials[0]
    for shard, partial in enumerate(partials):
        try:
            nest.assert_same_structure(first, partial)
        except ValueError as exc:
            raise ValueError(
                f"exact_evaluation: eval_fn returned {partial!r} for shard {shard} but {first!r} "
                "for shard 0; it must return the same structure of numbers for every shard.") \
                from exc
        for leaf in nest.flatten(partial):
            if not _is_number(leaf):
                raise TypeError(
                    f"exact_evaluation adds up eval_fn's results, but shard {shard} returned "
                    f"{leaf!r}: return partial sums (numbers or arrays), e.g. "
                    "{'correct': n_correct, 'count': n}, and divide on the chief.")

    def add(*leaves: Any) -> Any:
        shapes = {np.shape(leaf) for leaf in leaves}
        if len(shapes) > 1:
            raise ValueError(
                f"exact_evaluation: eval_fn returned arrays of different shapes {sorted(shapes)} "
                "for the same entry of different shards; partial sums must have one shape.")
        total = leaves[0]
        for leaf in leaves[1:]:
            total = total + leaf
        return total

    return nest.map_structure(add, *partials)


def exact_evaluation(coordinator: ClusterCoordinator, eval_fn: Any, dataset: Dataset,
                     num_shards: int) -> Any:
    """Evaluate ``dataset`` on the workers, counting every element exactly once.

    Schedules ``eval_fn(dataset.shard(num_shards, i))`` for each shard ``i`` (any free worker
    takes it), waits for them with ``coordinator.join()`` and returns the sum, leaf by leaf, of
    what the shards returned.

    Args:
        coordinator: The job's ClusterCoordinator.
        eval_fn: An ``@mpidist.function`` that takes one shard (an ``mpidist.data.Dataset``),
            reads it to its end and **returns** partial sums: a number, an array, or a nested
            tuple / dict of them, the same structure for every shard (e.g.
            ``{"correct": 41, "count": 45}``). It may read variables; it must not write to the
            parameter servers (metrics, ``assign*``): a shard whose worker is preempted runs
            again, and its writes would count twice, while its returned value counts once.
        dataset: A finite ``mpidist.data.Dataset``; shards are cut element by element (so a
            batched dataset is sharded by batches).
        num_shards: How many closures to schedule: a few per worker balance the load.

    Returns:
        The shards' results added up in shard order (the same structure as one shard's).

    Raises:
        TypeError / ValueError: a bad argument, before anything is scheduled; results that
            cannot be added up (not numbers, or different structures or shapes per shard).
        The first error of any scheduled function, as ``coordinator.join()`` raises it (an
            error of a training closure scheduled earlier included): nothing is then returned.
    """
    _check_arguments(coordinator, eval_fn, dataset, num_shards)
    remote_values = [coordinator.schedule(eval_fn, args=(dataset.shard(num_shards, i),))
                     for i in range(int(num_shards))]
    coordinator.join()  # wait-ok: bounded inside (MPIDIST_WAIT_TIMEOUT, restarted by progress)
    return _add_up([value.fetch() for value in remote_values])
