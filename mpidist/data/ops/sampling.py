"""``Dataset.choose_from_datasets`` and ``Dataset.sample_from_datasets``: each element taken
from one of several datasets of one structure, chosen by a dataset of indices or at random.

The datasets must have the same structure and dtypes: the first that differs from
``datasets[0]`` is a TypeError naming it and both specs. The spec is the most specific one all
fit. With ``stop_on_empty_dataset`` the first choice of an exhausted dataset ends the output;
without it that choice is skipped, and the output ends when the choices do or every dataset is
exhausted.

``sample_from_datasets`` draws each choice with probabilities ``weights`` (renormalised over
the datasets not yet exhausted, which is what skipping their draws amounts to), from a NumPy
generator seeded by ``seed`` (or, unseeded, a seed fixed for the dataset object, or the one
the workers agreed under distribution), so every run draws the same sequence. Every pass
draws it again unless ``rerandomize_each_iteration``. ``weights`` may also be a dataset of
weight vectors, one per draw.

Cardinality (TF's, from its DirectedInterleave): INFINITE if any dataset is infinite, else
UNKNOWN, whatever the choices and ``stop_on_empty_dataset`` (so a finite choice dataset over
infinite datasets still reads as INFINITE, as in TF).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short
from mpidist.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.common import common_spec
from mpidist.data.ops.registry import register
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["ChooseDataset", "SampleDataset"]

_END = object()
_CHOICE_SALT = 0x63686F6F  # the choice dataset's context: unsharded, its own seed


def _datasets(api: str, datasets: Any) -> tuple[list[Dataset], Structure]:
    if isinstance(datasets, Dataset) or not isinstance(datasets, (list, tuple)):
        raise TypeError(f"{api}: `datasets` must be a list of mpidist.data.Dataset, got "
                        f"{short(datasets)} of type {type(datasets).__name__}.")
    datasets = list(datasets)
    if not datasets:
        raise ValueError(f"{api}: `datasets` must not be empty.")
    for i, d in enumerate(datasets):
        if not isinstance(d, Dataset):
            raise TypeError(f"{api}: datasets[{i}] must be an mpidist.data.Dataset, got "
                            f"{short(d)} of type {type(d).__name__}.")
    spec = datasets[0].element_spec
    for i, d in enumerate(datasets[1:], 1):
        merged = common_spec(spec, d.element_spec)
        if merged is None:
            raise TypeError(
                f"{api}: all datasets must have the same structure and dtypes, but datasets[{i}] "
                f"has elements {d.element_spec} and datasets[0] has {datasets[0].element_spec}. "
                "Map them to one structure first.")
        spec = merged
    return datasets, spec


def _directed_cardinality(datasets: tuple[Dataset, ...]) -> int:
    """TF's rule for both (its DirectedInterleave): INFINITE as soon as one dataset is, else
    UNKNOWN, whatever the choices."""
    if any(d._cardinality() == INFINITE_CARDINALITY for d in datasets):
        return INFINITE_CARDINALITY
    return UNKNOWN_CARDINALITY


def _next(it: Iterator[Element]) -> Any:
    for element in it:
        return element
    return _END


def _interleave(datasets: list[Dataset], choices: Iterator[int], ctx: IterationContext,
                stop_on_empty: bool) -> Iterator[Element]:
    """The elements of ``datasets`` in the order ``choices`` picks them."""
    iterators: list[Iterator[Element] | None] = [d._iterate(ctx) for d in datasets]
    live = len(iterators)
    for choice in choices:
        it = iterators[choice]
        if it is None:
            continue
        element = _next(it)
        if element is _END:
            if stop_on_empty:
                return
            iterators[choice], live = None, live - 1
            if not live:
                return
            continue
        yield element


class ChooseDataset(Dataset):
    def __init__(self, datasets: Any, choice_dataset: Any, stop_on_empty: bool) -> None:
        api = "choose_from_datasets"
        datasets, self._spec = _datasets(api, datasets)
        if not isinstance(choice_dataset, Dataset):
            raise TypeError(f"{api}: `choice_dataset` must be an mpidist.data.Dataset of int64 "
                            f"scalars, got {short(choice_dataset)}.")
        choice_spec = choice_dataset.element_spec
        if nest.is_nested(choice_spec) or choice_spec.shape != () or \
                choice_spec.dtype != np.int64:
            raise TypeError(f"{api}: the elements of `choice_dataset` must be int64 scalars, "
                            f"got {choice_spec}. Map them with np.int64(x).")
        super().__init__((*datasets, choice_dataset))
        self._count, self._stop_on_empty = len(datasets), stop_on_empty

    def _choices(self, ctx: IterationContext) -> Iterator[int]:
        n = self._count
        for index, choice in enumerate(self._inputs[-1]._iterate(ctx.child(salt=_CHOICE_SALT))):
            if not 0 <= choice < n:
                raise InvalidArgumentError(
                    f"choose_from_datasets: choice {int(choice)} (element {index} of "
                    f"choice_dataset) is out of range: there are {n} datasets, [0, {n}).")
            yield int(choice)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return _interleave(list(self._inputs[:-1]), self._choices(ctx), ctx, self._stop_on_empty)

    def _compute_spec(self) -> Structure:
        return self._spec

    def _cardinality(self) -> int:
        return _directed_cardinality(self._inputs[:-1])


def _weights(api: str, weights: Any, count: int) -> np.ndarray | Dataset:
    if weights is None:
        return np.full(count, 1.0 / count)
    if isinstance(weights, Dataset):
        spec = weights.element_spec
        if nest.is_nested(spec) or spec.shape not in ((count,), (None,), None) or \
                spec.dtype.kind != "f":
            raise TypeError(f"{api}: a `weights` dataset must have float vectors of length "
                            f"{count} as elements, got {spec}.")
        return weights
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{api}: `weights` must be a list of {count} floats, got "
                        f"{short(weights)}.") from None
    if w.shape != (count,):
        raise ValueError(f"{api}: `weights` must have one weight per dataset ({count}), got "
                         f"{short(weights)} of shape {w.shape}.")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"{api}: `weights` must be finite, >= 0 and not all 0, got "
                         f"{short(weights)}.")
    normalised: np.ndarray = w / w.sum()
    return normalised


class SampleDataset(Dataset):
    def __init__(self, datasets: Any, weights: Any, seed: int | None, stop_on_empty: bool,
                 rerandomize: bool) -> None:
        api = "sample_from_datasets"
        datasets, self._spec = _datasets(api, datasets)
        super().__init__(datasets)
        self._weights = _weights(api, weights, len(datasets))
        self._seed, self._stop_on_empty, self._rerandomize = seed, stop_on_empty, rerandomize
        # Unseeded: random per run, fixed for this object (as an unseeded shuffle is).
        self._random_seed = int.from_bytes(os.urandom(8), "little")

    def _rng(self, ctx: IterationContext) -> np.random.Generator:
        instance = ctx.next_instance(self)
        base = self._seed if self._seed is not None else (
            ctx.agreed_seed if ctx.agreed_seed is not None else self._random_seed)
        position = [] if self._seed is not None else [self._depth]  # as Dataset.shuffle's
        entropy = [base, *position] + ([ctx.iteration, instance] if self._rerandomize else [])
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))

    def _choices(self, ctx: IterationContext, live: list[bool]) -> Iterator[int]:
        rng = self._rng(ctx)
        n = len(live)
        if isinstance(self._weights, Dataset):
            vectors: Iterator[Any] = self._weights._iterate(ctx.child(salt=_CHOICE_SALT))
        else:
            vectors = itertools.repeat(self._weights)  # the same weights for every draw
        for index, vector in enumerate(vectors):
            p = np.asarray(vector, dtype=np.float64)
            if p.shape != (n,) or np.any(p < 0) or not p.sum() > 0:
                raise InvalidArgumentError(
                    f"sample_from_datasets: weights element {index} is {short(vector)}; each "
                    f"must be {n} weights >= 0, not all 0.")
            if not self._stop_on_empty:
                p = np.where(live, p, 0.0)
                if not p.sum() > 0:
                    return  # the datasets still holding elements have weight 0
            yield int(rng.choice(n, p=p / p.sum()))

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        datasets = list(self._inputs)
        live = [True] * len(datasets)
        iterators: list[Iterator[Element]] = [d._iterate(ctx) for d in datasets]
        for choice in self._choices(ctx, live):
            element = _next(iterators[choice])
            if element is _END:
                if self._stop_on_empty:
                    return
                live[choice] = False
                if not any(live):
                    return
                continue
            yield element

    def _compute_spec(self) -> Structure:
        return self._spec

    def _cardinality(self) -> int:
        return _directed_cardinality(self._inputs)


register("choose_from_datasets", ChooseDataset)
register("sample_from_datasets", SampleDataset)
