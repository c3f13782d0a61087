"""``Dataset.map``: a function of each element, on one thread or N."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import to_data
from mpidist.data.base import Dataset
from mpidist.data.context import IterationContext
from mpidist.data.ops.registry import register
from mpidist.data.parallel_map import map_in_parallel
from mpidist.data.spec import most_specific_common, spec_of

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__: list[str] = []


class _Map(Dataset):
    def __init__(self, input_dataset: Dataset, fn: Callable[..., Any], threads: int = 1,
                 deterministic: bool = True) -> None:
        super().__init__((input_dataset,))
        self._fn = fn
        self._threads, self._deterministic = threads, deterministic

    def _call(self, element: Element, index: int = 0) -> Element:
        args = element if type(element) is tuple else (element,)
        try:
            out = self._fn(*args)
        except TypeError:
            self._check_arity(args)
            raise
        if out is None:
            raise TypeError(
                f"map_func {getattr(self._fn, '__qualname__', self._fn)} returned None for "
                f"element {index}: it must return the transformed element (an array, or a "
                "tuple / dict of arrays). Is a `return` missing?")
        if isinstance(out, list):
            out = tuple(out)  # tf.data reads a returned list as a tuple (nested lists are data)
        return to_data(out, f"map_func's result for element {index}")

    def _check_arity(self, args: tuple[Any, ...]) -> None:
        """After map_func raised TypeError: if it cannot take the element's components as
        arguments at all, say so (tuple elements are passed as positional arguments)."""
        try:
            inspect.signature(self._fn).bind(*args)
        except ValueError:
            return  # no signature to check (a builtin)
        except TypeError:
            name = getattr(self._fn, "__qualname__", repr(self._fn))
            shape = (f"a tuple of {len(args)} components, passed as {len(args)} positional "
                     "arguments" if len(args) != 1 else "one value, passed as one argument")
            raise TypeError(
                f"map_func {name}{inspect.signature(self._fn)} cannot take the dataset's "
                f"elements: each element is {shape}. Give map_func one parameter per "
                "component (e.g. lambda x, y: ...).") from None

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        if self._threads > 1:
            yield from self._iterate_in_parallel(ctx)
            return
        for index, element in enumerate(self._inputs[0]._iterate(ctx)):
            if ctx.skip_error is None:
                yield self._call(element, index)
                continue
            try:
                out = self._call(element, index)
            except Exception as e:  # noqa: BLE001 - ignore_errors downstream drops the element
                ctx.skip_error(e)
                continue
            yield out

    def _iterate_in_parallel(self, ctx: IterationContext) -> Iterator[Element]:
        for done in map_in_parallel(self._call, self._inputs[0]._iterate(ctx), self._threads,
                                    self._deterministic):
            if ctx.skip_error is None:
                yield done.result()
                continue
            try:
                out = done.result()
            except Exception as e:  # noqa: BLE001 - ignore_errors downstream drops the element
                ctx.skip_error(e)
                continue
            yield out

    def _compute_spec(self) -> Structure:
        """map_func's output spec, found much as tf.data finds it, by tracing: map_func runs
        on two stand-in elements of the input spec (ones with every unknown dimension 1, twos
        with every unknown dimension 2) and on the first real element; a dimension is known only where all
        three agree, so sizes that follow the input's unknown dimensions or the data stay
        unknown. Where the stand-ins cannot be built or run (unknown rank, a function that
        rejects them), the first real element decides, the input's unknown batch dimension
        kept unknown."""
        spec = self._inputs[0].element_spec
        leaves = nest.flatten(spec)
        first = next((spec_of(e) for e in self._iterate(IterationContext())), None)
        traced = None
        if all(leaf.shape is not None for leaf in leaves):
            try:
                with np.errstate(all="ignore"):
                    a, b = (spec_of(self._call(_stand_in(spec, size))) for size in (1, 2))
                traced = most_specific_common(a, b)
                return traced if first is None else most_specific_common(traced, first)
            except Exception:  # noqa: BLE001 - the first real element decides instead
                pass
        if first is None:
            raise ValueError(
                "The element_spec of this map is unknown: map_func could not be traced and the "
                "input has no element to run it on.")
        if leaves and leaves[0].batch_dim is None:
            first = nest.map_structure(lambda s: s.with_batch_size(None) if s.rank else s, first)
        return first


def _stand_in(spec: Structure, unknown: int) -> Element:
    """Arrays shaped like ``spec`` filled with ``unknown``, each unknown dimension ``unknown``
    long: the two stand-ins differ in values as well as sizes, so an output size that
    follows a value (``np.full(x, x)``, TF's ``tf.fill([x], x)``) is unknown, as in TF."""
    return nest.map_structure(
        lambda s: np.full(tuple(unknown if d is None else d for d in s.shape), unknown, s.dtype),
        spec)


register("map", _Map)
