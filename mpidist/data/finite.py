"""Refusing, before anything is done, to read to its end a dataset that has no end.

An operation that needs the end of the data (``Dataset.save``, ``len()``, ``skip(-1)``) would
run forever on a dataset whose cardinality is known to be INFINITE: ``save`` writing shard
after shard, ``skip(-1)`` spinning. ``require_finite`` asks the cardinality first and raises an
error naming the call, the dataset, what made it infinite and the fix, so the call writes no
file and changes no state. A new consumer gets the check with one call.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mpidist.data.dataset import Dataset

__all__ = ["require_finite"]

# INFINITE_CARDINALITY; not imported from mpidist.data.dataset, which imports this module.
_INFINITE = -1

# Source nodes whose class name is not the call that builds them.
_SOURCE_CALLS = {"TensorSlices": "from_tensor_slices", "Tensors": "from_tensors",
                 "Generator": "from_generator", "FileList": "list_files",
                 "ShardDatasets": "load"}


def require_finite(chain: Sequence[Dataset], api: str,
                   error: type[Exception] = InvalidArgumentError) -> int:
    """The cardinality of the dataset ending ``chain`` (its nodes from the source on: a count
    or UNKNOWN), or ``error`` if it is INFINITE.

    ``api`` names the consuming call in the message (e.g. ``"Dataset.save"``); ``error`` is
    the class TensorFlow raises for it where it has one (``len()``: TypeError)."""
    n = chain[-1].cardinality()
    if n == _INFINITE:
        raise error(
            f"The dataset is infinite: {api} needs the end of the dataset, but this one has "
            f"cardinality INFINITE ({_cause(chain)}), so it has no end. Bound it first with "
            f".take(n) (e.g. dataset.take(1000)), or give repeat a count (repeat(n)). The "
            f"dataset: {_chain(chain)}.")
    return n


def _call_name(node: Dataset) -> str:
    """The call that built ``node``: ``range``, ``batch``, ``TextLineDataset``, ..."""
    name = type(node).__name__.lstrip("_")
    if name in _SOURCE_CALLS:
        return _SOURCE_CALLS[name]
    if type(node).__module__.startswith("mpidist.data.ops."):  # ZipDataset -> zip
        name = name.removesuffix("Dataset")
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    if name.endswith("Dataset"):  # a public reader: its own name
        return name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()  # WithOptions -> with_options


def _chain(chain: Sequence[Dataset]) -> str:
    return " -> ".join(_call_name(node) for node in chain)


def _cause(chain: Sequence[Dataset]) -> str:
    """What made ``dataset`` infinite: the first node from the source whose cardinality is."""
    for node in chain:
        if node.cardinality() == _INFINITE:
            name = _call_name(node)
            if name == "repeat":
                return "a repeat() with no count, or count=-1, repeats forever"
            return f"its {name} never ends"
    return "an input never ends"
