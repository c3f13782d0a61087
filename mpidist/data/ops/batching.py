"""``unbatch``, ``padded_batch`` and ``rebatch``: batches split, padded and re-cut.

``unbatch`` splits the first dimension of every component (they must agree). Its cardinality
is the input's times the batch size where every component has the same static leading
dimension, else UNKNOWN (INFINITE stays INFINITE).

``padded_batch`` pads each component of each element to a common shape before stacking: a
dimension given in ``padded_shapes`` is padded to that size (an element longer than it is an
InvalidArgumentError), a dimension given as None / -1, or every unknown dimension where
``padded_shapes`` is None, to the longest in the batch. ``padding_values`` default to 0, ""
for strings and False for bools; one scalar serves every component.

``rebatch`` re-cuts a stream of batches into batches of the given size (or sizes, in turn),
copying each row once, as ``unbatch().batch(n)`` would give them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import short
from mpidist.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IterationContext
from mpidist.data.ops.registry import register
from mpidist.data.spec import TensorSpec
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__ = ["UnbatchDataset", "PaddedBatchDataset", "RebatchDataset", "padded_shapes_of"]


def _require_batched(api: str, spec: Structure) -> None:
    for i, leaf in enumerate(nest.flatten(spec)):
        if leaf.shape == ():
            raise ValueError(
                f"{api}: cannot split a scalar component (component {i}: {leaf}); every "
                "component needs a leading (batch) dimension.")


def _batch_size(flat: list[Any], api: str) -> int:
    n = len(flat[0])
    for i, leaf in enumerate(flat[1:], 1):
        if len(leaf) != n:
            raise InvalidArgumentError(
                f"{api}: input element must have the same batch size in each component. "
                f"Component 0 had size {n} but component {i} had size {len(leaf)}.")
    return n


class UnbatchDataset(Dataset):
    def __init__(self, input_dataset: Dataset) -> None:
        super().__init__((input_dataset,))
        _require_batched("unbatch", input_dataset.element_spec)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        spec = self._inputs[0].element_spec
        nested = nest.is_nested(spec)
        pack = nest.packer(spec)
        for element in self._inputs[0]._iterate(ctx):
            flat = [np.asarray(leaf) for leaf in nest.flatten(element)]
            if any(leaf.ndim == 0 for leaf in flat):
                raise InvalidArgumentError("unbatch: input element must have a non-scalar "
                                           "value in each component.")
            n = _batch_size(flat, "unbatch")
            for i in range(n):
                yield pack([leaf[i] for leaf in flat]) if nested else flat[0][i]

    def _compute_spec(self) -> Structure:
        return nest.map_structure(
            lambda s: TensorSpec(None if s.shape is None else s.shape[1:], s.dtype),
            self._inputs[0].element_spec)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        sizes = {s.batch_dim for s in nest.flatten(self._inputs[0].element_spec)}
        size = sizes.pop() if len(sizes) == 1 else None
        return UNKNOWN_CARDINALITY if size is None else n * size

    def _batching(self) -> tuple[bool, int | None]:
        return True, None  # its elements are no batches


# -- padded_batch --------------------------------------------------------------------------------
def _shape(value: Any, where: str) -> tuple[int | None, ...] | None:
    """One padded shape: an int (a vector's length), a tuple / list / array of ints, None or
    -1 (the longest in the batch), or a TensorSpec-like object with ``shape``."""
    if value is None:
        return None
    if isinstance(value, TensorSpec):
        return value.shape
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"padded_batch: padded_shapes{where} must be a shape (a tuple or list "
                        f"of ints, None or -1), got {short(value)}.")
    dims: list[int | None] = []
    for d in value:
        if d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d == -1):
            dims.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            dims.append(int(d))
        else:
            raise TypeError(f"padded_batch: padded_shapes{where} = {short(value)} has the "
                            f"dimension {d!r}; a dimension is an int >= 0, or None / -1 for the "
                            "longest in the batch.")
    return tuple(dims)


def _flatten_to(spec: Structure, value: Any, name: str, leaf: Any, where: str = "") -> list[Any]:
    """``value``'s parts at the leaves of ``spec``, each read by ``leaf(part, where)``."""
    if not nest.is_nested(spec):
        return [leaf(value, where)]
    if isinstance(spec, dict):
        if not isinstance(value, dict) or set(value) != set(spec):
            raise ValueError(f"padded_batch: {name}{where} = {short(value)} does not match the "
                             f"structure of the elements {spec}.")
        keys = list(nest.flatten({k: k for k in spec}))
        return [p for k in keys for p in _flatten_to(spec[k], value[k], name, leaf,
                                                     f"{where}[{k!r}]")]
    if not isinstance(value, (tuple, list)) or len(value) != len(spec):
        raise ValueError(f"padded_batch: {name}{where} = {short(value)} does not match the "
                         f"structure of the elements {spec}: give one per component.")
    return [p for i, (s, v) in enumerate(zip(spec, value))
            for p in _flatten_to(s, v, name, leaf, f"{where}[{i}]")]


def padded_shapes_of(spec: Structure, padded_shapes: Any) -> list[tuple[int | None, ...] | None]:
    """The padded shape of each component (flat), checked against the element spec."""
    flat_spec = nest.flatten(spec)
    if padded_shapes is None:
        return [s.shape for s in flat_spec]
    shapes = _flatten_to(spec, padded_shapes, "padded_shapes", _shape)
    for i, (s, shape) in enumerate(zip(flat_spec, shapes)):
        # Ranks only: a spec traced by map may know a dimension that varies with the data
        # (the stand-ins and the first element agreed by chance); an element longer than its
        # padded size is refused as it comes.
        if s.shape is not None and shape is not None and len(s.shape) != len(shape):
            raise ValueError(
                f"padded_batch: the padded shape {shape} is not compatible with the shape "
                f"{s.shape} of component {i} of the elements ({s}): give one dimension per "
                "dimension of the component.")
    return shapes


def _padding_value(value: Any, spec: TensorSpec, where: str) -> Any:
    if value is None:
        return np.zeros((), spec.dtype)[()] if spec.dtype.kind not in "US" else spec.dtype.type()
    array = np.asarray(value)
    if array.shape != ():
        raise ValueError(f"padded_batch: padding_values{where} must be a scalar, got "
                         f"{short(value)} of shape {array.shape}.")
    strings = (array.dtype.kind in "US", spec.dtype.kind in "US")
    if strings[0] != strings[1]:
        raise TypeError(f"padded_batch: padding_values{where} = {short(value)} has dtype "
                        f"{array.dtype}, which cannot pad a component of dtype {spec.dtype}.")
    return array[()] if strings[0] else array.astype(spec.dtype)[()]


def _padding_values(spec: Structure, padding_values: Any) -> list[Any]:
    flat_spec = nest.flatten(spec)
    if padding_values is None or not nest.is_nested(padding_values):
        return [_padding_value(padding_values, s, "") for s in flat_spec]
    parts = _flatten_to(spec, padding_values, "padding_values", lambda v, w: (v, w))
    return [_padding_value(v, s, w) for (v, w), s in zip(parts, flat_spec)]


def _pad_column(column: list[np.ndarray], shape: tuple[int | None, ...] | None, pad: Any,
                index: int, padded_to_longest: bool) -> np.ndarray:
    ranks = {a.ndim for a in column}
    if len(ranks) != 1:
        raise InvalidArgumentError(f"padded_batch: the elements of component {index} have "
                                   f"different ranks: shapes {[a.shape for a in column]}.")
    rank = ranks.pop()
    target = []
    for d in range(rank):
        longest = max(a.shape[d] for a in column)
        fixed = None if shape is None or padded_to_longest else shape[d]
        if fixed is not None and longest > fixed:
            raise InvalidArgumentError(
                f"padded_batch: attempted to pad to a smaller size than the input element: "
                f"component {index} has dimension {d} of size {longest}, but padded_shapes "
                f"gives {fixed}.")
        target.append(longest if fixed is None else fixed)
    dtype = np.result_type(*column) if column[0].dtype.kind in "US" else column[0].dtype
    out = np.full((len(column), *target), pad, dtype=dtype)
    for i, a in enumerate(column):
        if a.ndim:
            out[i][tuple(slice(0, n) for n in a.shape)] = a
        else:
            out[i] = a
    return out


class PaddedBatchDataset(Dataset):
    def __init__(self, input_dataset: Dataset, batch_size: int, padded_shapes: Any,
                 padding_values: Any, drop_remainder: bool) -> None:
        super().__init__((input_dataset,))
        spec = input_dataset.element_spec
        self._batch_size, self._drop_remainder = batch_size, drop_remainder
        self._shapes = padded_shapes_of(spec, padded_shapes)
        self._to_longest = padded_shapes is None  # every dimension: the longest in the batch
        self._pads = _padding_values(spec, padding_values)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        spec = self._inputs[0].element_spec
        pack = nest.packer(spec)
        it = self._inputs[0]._iterate(ctx)
        while True:
            elements = list(itertools.islice(it, self._batch_size))
            if not elements or (self._drop_remainder and len(elements) < self._batch_size):
                return
            columns = zip(*([np.asarray(x) for x in nest.flatten(e)] for e in elements))
            yield pack([_pad_column(list(c), shape, pad, i, self._to_longest) for i, (c, shape, pad)
                        in enumerate(zip(columns, self._shapes, self._pads))])

    def _compute_spec(self) -> Structure:
        size = self._batch_size if self._drop_remainder else None
        flat = [TensorSpec(None if shape is None else (size, *shape), s.dtype)
                for s, shape in zip(nest.flatten(self._inputs[0].element_spec), self._shapes)]
        return nest.pack_sequence_as(self._inputs[0].element_spec, flat)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        b = self._batch_size
        return n // b if self._drop_remainder else -(-n // b)

    def _batching(self) -> tuple[bool, int | None]:
        return True, self._batch_size


# -- rebatch ---------------------------------------------------------------------------------------
class RebatchDataset(Dataset):
    def __init__(self, input_dataset: Dataset, sizes: list[int], drop_remainder: bool) -> None:
        super().__init__((input_dataset,))
        _require_batched("rebatch", input_dataset.element_spec)
        self._sizes, self._drop_remainder = sizes, drop_remainder

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        pack = nest.packer(self._inputs[0].element_spec)
        sizes = itertools.cycle(self._sizes)
        want = next(sizes)
        pending: list[list[np.ndarray]] = []
        have = 0
        for element in self._inputs[0]._iterate(ctx):
            flat = [np.asarray(leaf) for leaf in nest.flatten(element)]
            rows, start = _batch_size(flat, "rebatch"), 0
            while start < rows:
                take = min(want - have, rows - start)
                pending.append([leaf[start:start + take] for leaf in flat])
                have, start = have + take, start + take
                if have == want:
                    yield pack([np.concatenate(c) for c in zip(*pending)])
                    pending, have, want = [], 0, next(sizes)
        if have and not self._drop_remainder:
            yield pack([np.concatenate(c) for c in zip(*pending)])

    def _compute_spec(self) -> Structure:
        same = len(set(self._sizes)) == 1 and self._drop_remainder
        size = self._sizes[0] if same else None
        return nest.map_structure(lambda s: s.with_batch_size(size),
                                  self._inputs[0].element_spec)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        return INFINITE_CARDINALITY if n == INFINITE_CARDINALITY else (
            0 if n == 0 else UNKNOWN_CARDINALITY)

    def _batching(self) -> tuple[bool, int | None]:
        return True, self._sizes[0] if len(set(self._sizes)) == 1 else None


register("unbatch", UnbatchDataset)
register("padded_batch", PaddedBatchDataset)
register("rebatch", RebatchDataset)
