"""``Dataset.scan``: ``scan_func(state, element)`` returns ``(new_state, output)``; the outputs
are the elements, the state carried from one element to the next from ``initial_state``.

As in TF, ``scan_func`` gets two arguments, the state and the element (a tuple element stays
one tuple). The new state must have the initial state's structure and dtypes: a state whose
dtype changes (NumPy promoting an int32 state to int64) is a TypeError naming both, as TF's
is. Each pass starts again from ``initial_state``. The output spec is found as ``map``'s:
from ``scan_func`` run on stand-in elements and on the first element. Cardinality: the
input's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short, to_data
from mpidist.data.dataset import Dataset, IterationContext
from mpidist.data.ops.common import describe, stand_in
from mpidist.data.ops.registry import register
from mpidist.data.spec import most_specific_common, spec_of

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["ScanDataset"]


class ScanDataset(Dataset):
    def __init__(self, input_dataset: Dataset, initial_state: Element,
                 scan_func: Callable[..., Any]) -> None:
        super().__init__((input_dataset,))
        self._initial_state, self._scan_func = initial_state, scan_func

    def _step(self, state: Element, element: Element, index: int) -> tuple[Element, Element]:
        out = self._scan_func(state, element)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(
                f"scan: scan_func {describe(self._scan_func)} must return a pair "
                f"(new_state, output_element); for element {index} it returned {short(out)}.")
        new_state = to_data(out[0], f"scan: the new state for element {index}")
        try:
            nest.assert_same_structure(self._initial_state, new_state)
        except ValueError:
            raise TypeError(
                f"scan: the new state must have the initial state's structure; for element "
                f"{index} scan_func returned {short(new_state)}, the initial state is "
                f"{short(self._initial_state)}.") from None
        for a, b in zip(nest.flatten(self._initial_state), nest.flatten(new_state)):
            if a.dtype != b.dtype and not (a.dtype.kind == b.dtype.kind and a.dtype.kind in "US"):
                raise TypeError(
                    f"scan: the element types for the new state must match the initial state: "
                    f"expected {a.dtype}, got {b.dtype} (element {index}). Cast the new state "
                    f"(e.g. `.astype(np.{a.dtype})`) or give initial_state that dtype.")
        output = out[1]
        if isinstance(output, list):
            output = tuple(output)
        return new_state, to_data(output, f"scan: scan_func's output for element {index}")

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        state = self._initial_state
        for index, element in enumerate(self._inputs[0]._iterate(ctx)):
            try:
                state, output = self._step(state, element, index)
            except Exception as e:
                if ctx.skip_error is None:
                    raise
                ctx.skip_error(e)  # ignore_errors downstream: the element is dropped
                continue
            yield output

    def _compute_spec(self) -> Structure:
        first = next((spec_of(e) for e in self._iterate(IterationContext())), None)
        try:
            with np.errstate(all="ignore"):
                spec = self._inputs[0].element_spec
                a, b = (spec_of(self._step(self._initial_state, stand_in(spec, n), 0)[1])
                        for n in (1, 2))
            traced = most_specific_common(a, b)
            return traced if first is None else most_specific_common(traced, first)
        except Exception:  # noqa: BLE001 - the first real element decides instead
            pass
        if first is None:
            raise ValueError("The element_spec of this scan is unknown: scan_func could not be "
                             "traced and the input has no element to run it on.")
        return first

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()


register("scan", ScanDataset)
