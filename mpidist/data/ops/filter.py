"""``Dataset.filter`` and ``Dataset.take_while``: a predicate of each element (a tuple element
as positional arguments, as in ``map``) returning a scalar bool.

A predicate that returns anything else (a number, an array of several bools) is a TypeError
naming the value. It is checked when the method is called where the predicate can run on a
stand-in element of ones (as tf.data traces it), and on every element otherwise.

Cardinality: UNKNOWN for both, whatever the input (TF's: its ``cardinality`` docs show a
``repeat()`` then ``filter`` as UNKNOWN).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.data.dataset import UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.common import as_bool, call_on_element, stand_in
from mpidist.data.ops.registry import register

if TYPE_CHECKING:
    from mpidist.data.element import Element

__all__ = ["FilterDataset", "TakeWhileDataset", "check_predicate"]


def check_predicate(api: str, predicate: Callable[..., Any], input_dataset: Dataset) -> None:
    """Run ``predicate`` on a stand-in element of ones; TypeError if it returns no scalar bool.
    A predicate that cannot run on the stand-in (it indexes data, it needs real values) is
    checked on each real element instead."""
    try:
        spec = input_dataset.element_spec
        element = stand_in(spec, 1)
        with np.errstate(all="ignore"):
            out = call_on_element(predicate, element)
    except Exception:  # noqa: BLE001 - checked on the real elements instead
        return
    as_bool(out, api, "a stand-in element of ones (the check tf.data makes when it traces it)")


def _test(predicate: Callable[..., Any], element: Element, api: str, index: int,
          ctx: IterationContext) -> bool | None:
    """The predicate's verdict, or None where it raised under ``ignore_errors``."""
    if ctx.skip_error is None:
        return as_bool(call_on_element(predicate, element), api, f"element {index}")
    try:
        return as_bool(call_on_element(predicate, element), api, f"element {index}")
    except Exception as e:  # noqa: BLE001 - ignore_errors downstream drops the element
        ctx.skip_error(e)
        return None


class FilterDataset(Dataset):
    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        super().__init__((input_dataset,))
        self._predicate = predicate
        check_predicate("filter", predicate, input_dataset)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        for index, element in enumerate(self._inputs[0]._iterate(ctx)):
            keep = _test(self._predicate, element, "filter", index, ctx)
            if keep:
                yield element

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY


class TakeWhileDataset(Dataset):
    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        super().__init__((input_dataset,))
        self._predicate = predicate
        check_predicate("take_while", predicate, input_dataset)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        for index, element in enumerate(self._inputs[0]._iterate(ctx)):
            keep = _test(self._predicate, element, "take_while", index, ctx)
            if keep is None:
                continue
            if not keep:
                return
            yield element

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY


register("filter", FilterDataset)
register("take_while", TakeWhileDataset)
