"""The sources of ``Dataset``: ``from_tensor_slices``, ``from_tensors``, ``range`` and
``from_generator``."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import to_data
from mpidist.data.base import UNKNOWN_CARDINALITY, Dataset, apply_source_shard
from mpidist.data.context import IterationContext
from mpidist.data.ops.registry import register
from mpidist.data.spec import TensorSpec, spec_of
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Element, Structure

__all__: list[str] = []


_SAMPLED_ROWS = 64  # rows of an in-memory source the DATA-sharding agreement compares


class _TensorSlices(Dataset):
    def __init__(self, tensors: Element) -> None:
        super().__init__()
        leaves = nest.flatten(tensors)
        if not leaves:
            raise ValueError("from_tensor_slices needs at least one array.")
        for leaf in leaves:
            if leaf.ndim == 0:
                raise InvalidArgumentError(
                    f"from_tensor_slices needs arrays with at least one dimension to slice; got a "
                    f"scalar {leaf!r}. Use from_tensors for a single element.")
        n: int = leaves[0].shape[0]
        for leaf in leaves[1:]:
            if leaf.shape[0] != n:
                raise InvalidArgumentError(
                    f"from_tensor_slices: dimensions {n} and {leaf.shape[0]} are not compatible; "
                    "every component must have the same number of rows.")
        leaves = [_snapshot(leaf) for leaf in leaves]
        self._tensors = nest.pack_sequence_as(tensors, leaves)
        self._flat, self._n = leaves, n

    def _index_source(self) -> Dataset | None:
        return self

    def _iterate_indices(self, ctx: IterationContext) -> Iterator[int]:
        return iter(apply_source_shard(ctx, range(self._n)))

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        flat, structure = self._flat, self._tensors
        single = len(flat) == 1 and not nest.is_nested(structure)
        for i in self._iterate_indices(ctx):
            yield flat[0][i] if single else nest.pack_sequence_as(structure, [leaf[i] for leaf in flat])

    def _rows(self, indices: np.ndarray) -> Element:
        """The rows ``indices`` of every component, as new arrays, in the element structure."""
        return nest.pack_sequence_as(self._tensors, [np.take(leaf, indices, axis=0) for leaf in self._flat])

    def _compute_spec(self) -> Structure:
        return nest.map_structure(lambda a: TensorSpec(a.shape[1:], a.dtype), self._tensors)

    def _cardinality(self) -> int:
        return self._n

    def _source_count(self) -> int | None:
        return self._n

    def _listed_units(self) -> tuple[str, ...] | None:
        names = self._flat[0]
        if len(self._flat) != 1 or names.ndim != 1 or names.dtype.kind not in "USO":
            return None
        return tuple(n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names)

    def _order_units(self) -> tuple[str, ...]:
        # A sample, not the whole array: cheap at any size, and a worker's own slice or
        # permutation of the data differs in almost every sampled row.
        rows = np.unique(np.linspace(0, self._n - 1, num=min(self._n, _SAMPLED_ROWS), dtype=np.int64))
        digest = hashlib.blake2b(digest_size=8)
        for leaf in self._flat:
            digest.update(f"{leaf.dtype.str}{leaf.shape}".encode())
            if leaf.dtype.kind != "O":
                digest.update(np.ascontiguousarray(leaf[rows]).tobytes())
        return (f"rows {digest.hexdigest()}",)


def _snapshot(array: Any) -> np.ndarray:
    """A read-only copy: the dataset holds its data as it was when built (as tf.data embeds a
    constant), and elements that are views of it cannot be written through."""
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy


class _Tensors(Dataset):
    def __init__(self, tensors: Element) -> None:
        super().__init__()
        self._tensors = nest.map_structure(_snapshot, tensors)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        if ctx.source_shard is None or ctx.source_shard[1] == 0:
            yield self._tensors

    def _compute_spec(self) -> Structure:
        return spec_of(self._tensors)

    def _cardinality(self) -> int:
        return 1

    def _source_count(self) -> int | None:
        return 1


class _Range(Dataset):
    def __init__(self, r: range, dtype: np.dtype[Any]) -> None:
        super().__init__()
        self._range, self._dtype = r, dtype

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        make = self._dtype.type
        for i in apply_source_shard(ctx, self._range):
            yield make(i)

    def _compute_spec(self) -> Structure:
        return TensorSpec((), self._dtype)

    def _cardinality(self) -> int:
        return len(self._range)

    def _source_count(self) -> int | None:
        return len(self._range)


class _Generator(Dataset):
    def __init__(self, generator: Callable[..., Iterable[Any]], args: tuple[Any, ...],
                 signature: Structure) -> None:
        super().__init__()
        self._generator, self._args, self._signature = generator, args, signature

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        it = iter(self._generator(*self._args))
        if ctx.source_shard is not None:
            num, index = ctx.source_shard
            it = itertools.islice(it, index, None, num)
        for count, element in enumerate(it):
            element = to_data(element, f"`generator` element {count}")
            if self._signature is not None:
                element = _conform(element, self._signature, count)
            yield element

    def _compute_spec(self) -> Structure:
        if self._signature is not None:
            return self._signature
        for element in self._iterate(IterationContext()):
            return spec_of(element)
        raise ValueError(
            "The generator yielded no element, so its element_spec is unknown; pass "
            "output_signature to from_generator.")

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def _source_count(self) -> int | None:
        return None


def _conform(element: Element, signature: Structure, count: int) -> Element:
    try:
        nest.assert_same_structure(signature, element)
    except ValueError:
        raise InvalidArgumentError(
            f"`generator` yielded an element ({count}) that did not match the expected structure "
            f"{signature}: {element!r}.") from None

    def fit(spec: TensorSpec, x: Any) -> Any:
        try:
            x = x.astype(spec.dtype, copy=False) if x.dtype != spec.dtype else x
        except (TypeError, ValueError):
            x = None
        if x is None or not spec.is_compatible_with(x):
            raise InvalidArgumentError(
                f"`generator` yielded an element ({count}) of shape {getattr(x, 'shape', '?')} "
                f"that does not fit the output_signature {spec}.")
        return x

    return nest.map_structure(fit, signature, element)


register("from_tensor_slices", _TensorSlices)
register("from_tensors", _Tensors)
register("range", _Range)
register("from_generator", _Generator)
