"""``Dataset.ignore_errors``: the input's elements, less those whose making raised an error.

An error raised by a user function on one element (a ``map`` function, a ``filter`` or
``take_while`` predicate, a ``scan`` function, upstream of this node) drops that element and
the pass goes on, as in TF. An error that ends an upstream stage itself (a generator that
raised, a ``batch`` of elements of different shapes) ends the input there: a Python iterator
that raised cannot be resumed, so the pass ends early, silently but for ``log_warning``.
Cardinality: UNKNOWN (INFINITE stays INFINITE), as elements may be dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mpidist.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.registry import register

if TYPE_CHECKING:
    from mpidist.data.element import Element

__all__ = ["IgnoreErrorsDataset"]

_log = logging.getLogger("mpidist.data")


class IgnoreErrorsDataset(Dataset):
    def __init__(self, input_dataset: Dataset, log_warning: bool) -> None:
        super().__init__((input_dataset,))
        self._log_warning = log_warning

    def _skip(self, error: Exception) -> None:
        if self._log_warning:
            _log.warning("ignore_errors: dropped an element whose making raised %s: %s",
                         type(error).__name__, error)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        it = self._inputs[0]._iterate(ctx.ignoring_errors(self._skip))
        while True:
            try:
                element = next(it)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - the stage that raised has ended
                self._skip(e)
                return
            yield element

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        return INFINITE_CARDINALITY if n == INFINITE_CARDINALITY else UNKNOWN_CARDINALITY


register("ignore_errors", IgnoreErrorsDataset)
