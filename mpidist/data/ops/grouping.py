"""``group_by_window`` and ``bucket_by_sequence_length``: elements grouped by a key, each
group reduced a window at a time.

``group_by_window``: ``key_func(element)`` (a tuple element as positional arguments) gives an
int64 key. A group's window is full at ``window_size`` elements (or ``window_size_func(key)``,
asked when the window starts); then ``reduce_func(key, window)`` (``window`` a dataset of the
group's elements) returns a dataset whose elements are produced. At the end of the input the
windows in progress are reduced in increasing key order (TF keeps its groups in an ordered
map). The element spec is that of ``reduce_func``'s dataset for an empty window; cardinality
UNKNOWN (INFINITE stays INFINITE).

``bucket_by_sequence_length`` is TF's composition of it: bucket ``i`` takes the elements whose
``element_length_func`` is in ``[bucket_boundaries[i-1], bucket_boundaries[i])`` and batches
``bucket_batch_sizes[i]`` of them, with ``padded_batch`` (padding unknown dimensions to the
longest in the batch, or with ``pad_to_bucket_boundary`` to the bucket's boundary - 1) or,
with ``no_padding``, ``batch``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short
from mpidist.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.batching import padded_shapes_of
from mpidist.data.ops.common import ElementsDataset, call_on_element, describe
from mpidist.data.ops.registry import register
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["GroupByWindowDataset", "bucket_by_sequence_length"]


def _int_scalar(value: Any, api: str, what: str) -> int:
    """An int64 scalar from a user function: a Python or NumPy int, or a 0-d int array."""
    array = np.asarray(value) if not isinstance(value, bool) else None
    if array is None or array.shape != () or array.dtype.kind not in "iu":
        raise TypeError(f"{api}: {what} must return an int64 scalar, got {short(value)} of "
                        f"type {type(value).__name__}.")
    return int(array)


class GroupByWindowDataset(Dataset):
    def __init__(self, input_dataset: Dataset, key_func: Callable[..., Any],
                 reduce_func: Callable[[Any, Dataset], Dataset], window_size: int | None,
                 window_size_func: Callable[[Any], Any] | None) -> None:
        super().__init__((input_dataset,))
        self._key_func, self._reduce_func = key_func, reduce_func
        self._window_size, self._window_size_func = window_size, window_size_func
        self._spec = self._reduce(0, []).element_spec  # reduce_func checked when called, as traced

    def _size(self, key: int) -> int:
        if self._window_size is not None:
            return self._window_size
        size = _int_scalar(self._window_size_func(np.int64(key)),  # type: ignore[misc]  # one is set
                           "group_by_window", "window_size_func")
        if size <= 0:
            raise InvalidArgumentError(f"group_by_window: window size must be greater than "
                                       f"zero, but window_size_func({key}) returned {size}.")
        return size

    def _reduce(self, key: int, elements: list[Element]) -> Dataset:
        window = ElementsDataset(elements, self._inputs[0].element_spec)
        out = self._reduce_func(np.int64(key), window)
        if not isinstance(out, Dataset):
            raise TypeError(
                f"group_by_window: reduce_func {describe(self._reduce_func)} must return an "
                f"mpidist.data.Dataset (e.g. window.batch(n)), got {short(out)}.")
        return out

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        groups: dict[int, tuple[int, list[Element]]] = {}
        reduced = 0
        for element in self._inputs[0]._iterate(ctx):
            key = _int_scalar(call_on_element(self._key_func, element), "group_by_window",
                              "key_func")
            if key not in groups:
                groups[key] = (self._size(key), [])
            size, members = groups[key]
            members.append(element)
            if len(members) >= size:
                del groups[key]
                yield from self._reduce(key, members)._iterate(ctx.child(salt=reduced))
                reduced += 1
        for key in sorted(groups):
            yield from self._reduce(key, groups[key][1])._iterate(ctx.child(salt=reduced))
            reduced += 1

    def _compute_spec(self) -> Structure:
        return self._spec

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        return INFINITE_CARDINALITY if n == INFINITE_CARDINALITY else UNKNOWN_CARDINALITY

    def _batching(self) -> tuple[bool, int | None]:
        return True, None  # reduce_func decides what its elements are


def _int_list(api: str, name: str, value: Any, minimum: int) -> list[int]:
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{api}: {name} must be a list of ints, got {short(value)}.")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            raise TypeError(f"{api}: {name} must be a list of ints >= {minimum}, got "
                            f"{short(value)} (the value {v!r}).")
        out.append(int(v))
    return out


def bucket_by_sequence_length(input_dataset: Dataset, element_length_func: Callable[..., Any],
                              bucket_boundaries: Any, bucket_batch_sizes: Any,
                              padded_shapes: Any, padding_values: Any,
                              pad_to_bucket_boundary: bool, no_padding: bool,
                              drop_remainder: bool) -> Dataset:
    api = "bucket_by_sequence_length"
    boundaries = _int_list(api, "bucket_boundaries", bucket_boundaries, 0)
    sizes = _int_list(api, "bucket_batch_sizes", bucket_batch_sizes, 1)
    if len(sizes) != len(boundaries) + 1:
        raise ValueError(f"{api}: len(bucket_batch_sizes) must equal len(bucket_boundaries) + "
                         f"1, got {len(sizes)} sizes for {len(boundaries)} boundaries.")
    if any(a >= b for a, b in zip(boundaries, boundaries[1:])):
        raise ValueError(f"{api}: bucket_boundaries must be sorted in increasing order, got "
                         f"{boundaries}.")
    edges = np.asarray(boundaries, dtype=np.int64)

    def bucket(*args: Any) -> int:
        element = args[0] if len(args) == 1 else args
        length = _int_scalar(call_on_element(element_length_func, element), api,
                             "element_length_func")
        return int(np.searchsorted(edges, length, side="right"))

    def batching(bucket_id: Any, window: Dataset) -> Dataset:
        bucket_id = int(bucket_id)
        if no_padding:
            return window.batch(sizes[bucket_id], drop_remainder=drop_remainder)
        shapes = padded_shapes
        if pad_to_bucket_boundary:
            if bucket_id == len(boundaries):
                raise InvalidArgumentError(
                    f"{api}: when pad_to_bucket_boundary=True, elements must have length < "
                    f"max(bucket_boundaries) = {boundaries[-1] if boundaries else 0}.")
            shapes = _filled(window.element_spec, padded_shapes, boundaries[bucket_id] - 1)
        return window.padded_batch(sizes[bucket_id], padded_shapes=shapes,
                                   padding_values=padding_values, drop_remainder=drop_remainder)

    return GroupByWindowDataset(input_dataset, bucket, batching, None,
                                lambda bucket_id: np.int64(sizes[int(bucket_id)]))


def _filled(spec: Structure, padded_shapes: Any, filler: int) -> Any:
    """The padded shapes (the element spec's where None) with every unknown dimension set to
    ``filler``, in the element structure."""
    flat = padded_shapes_of(spec, padded_shapes)
    filled = [None if s is None else tuple(filler if d is None else d for d in s) for s in flat]
    return filled[0] if not nest.is_nested(spec) else nest.pack_sequence_as(spec, filled)


register("group_by_window", GroupByWindowDataset)
register("bucket_by_sequence_length", bucket_by_sequence_length)
