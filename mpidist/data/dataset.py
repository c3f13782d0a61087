"""``mpidist.data.Dataset``: the part of ``tf.data`` the distribution guides use, over NumPy.

A Dataset is an immutable, lazy pipeline: each transformation returns a new Dataset wrapping
its input, and iterating one runs the chain from the source. Elements are NumPy arrays or
nested tuples / dicts of them. As in tf.data, a Python *list* is data (one array), while a tuple
or dict is structure.

Randomness is explicit and reproducible: ``shuffle(seed=s)`` gives the same sequence of orders on
every run and every rank; without a seed, a distributed dataset agrees one seed across workers
(see ``mpidist.data.distributed``) so sharding by data never duplicates or loses an example.
"""

import collections.abc
import inspect
import itertools
import os
from collections.abc import Iterable, Iterator

import numpy as np

from mpidist.core import nest
from mpidist.core.signatures import DType, DTypeStructure, accepts
from mpidist.data.arguments import (
    check_signature,
    count_int,
    count_or_all,
    flag,
    flatten_up_to,
    positive_int,
    seed_int,
    short,
    to_data,
)
from mpidist.data.background import iterate_in_background
from mpidist.data.options import Options
from mpidist.data.spec import TensorSpec, most_specific_common, spec_of
from mpidist.errors import InvalidArgumentError

__all__ = ["Dataset", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY",
           "IterationContext", "iterate", "static_batch_size", "source_row_count"]

AUTOTUNE = -1
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2
_AUTOTUNE_PREFETCH = 2  # what AUTOTUNE means for prefetch: double buffering


class IterationContext:
    """What one top-level iteration tells every node of the chain (see ``iterate``).

    ``iteration`` numbers the top-level iterations (a reshuffling shuffle reseeds per
    iteration); ``agreed_seed`` replaces unseeded shuffles' local random seeds (workers agree
    on it); ``source_shard`` is ``(num_shards, index)`` for FILE auto-sharding.
    """

    def __init__(self, iteration=0, agreed_seed=None, source_shard=None):
        self.iteration = iteration
        self.agreed_seed = agreed_seed
        self.source_shard = source_shard
        self._instances = {}

    def next_instance(self, node):
        """How many iterators of ``node`` this iteration created before (repeat re-creates)."""
        n = self._instances.get(id(node), 0)
        self._instances[id(node)] = n + 1
        return n


_DATASET = "mpidist.data.dataset:Dataset"  # read by accepts on the first call


class Dataset:
    """A lazy pipeline of elements (``tf.data.Dataset``). Build one with ``from_tensor_slices``,
    ``from_tensors``, ``range`` or ``from_generator`` and chain transformations."""

    @accepts(inputs=Iterable[_DATASET])  # type: ignore[valid-type]  # accepts reads the string
    def __init__(self, inputs=()):
        self._inputs = tuple(inputs)
        self._depth = 1 + max((d._depth for d in self._inputs), default=0)
        self._iterations = itertools.count()
        self._spec_cache = None

    # -- sources -----------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors, name=None):
        """One element per row of ``tensors`` (an array or a tuple/dict of arrays whose leading
        dimensions agree)."""
        return _TensorSlices(to_data(tensors, "from_tensor_slices"))

    @staticmethod
    def from_tensors(tensors, name=None):
        """A dataset with the single element ``tensors``."""
        return _Tensors(to_data(tensors, "from_tensors"))

    @staticmethod
    @accepts(dtype=DType, name=str | None)
    def range(*args, dtype=np.int64, name=None):
        """``range(stop)``, ``range(start, stop)`` or ``range(start, stop, step)`` as scalars."""
        if not 1 <= len(args) <= 3:
            raise ValueError("range takes 1 to 3 positional arguments (stop | start, stop[, step]), "
                             f"got {len(args)}.")
        names = ("stop",) if len(args) == 1 else ("start", "stop", "step")
        bounds = [count_int(name, a) for name, a in zip(names, args)]
        if len(bounds) == 3 and bounds[2] == 0:
            raise InvalidArgumentError("step must be a non-zero integer.")
        return _Range(range(*bounds), np.dtype(dtype))

    @staticmethod
    @accepts(output_types=DTypeStructure | None, args=tuple | list | None, name=str | None)
    def from_generator(generator, output_types=None, output_shapes=None, args=None,
                       output_signature=None, name=None):
        """Elements from ``generator(*args)``, a callable returning an iterator (called again on
        each iteration). ``output_signature`` (TensorSpecs) fixes and checks the element type;
        without it the spec is taken from the first element."""
        if not callable(generator):
            hint = (" Pass the generator function itself (gen), not a generator object (gen()): "
                    "it is called again on each pass.") if isinstance(
                        generator, collections.abc.Iterator) else ""
            raise TypeError("`generator` must be a Python callable that returns an iterator, "
                            f"got {short(generator)}.{hint}")
        if output_signature is not None:
            check_signature("output_signature", output_signature)
        if output_signature is None and output_types is not None:
            types = nest.flatten(output_types)
            shapes = [None] * len(types) if output_shapes is None else \
                flatten_up_to(output_types, output_shapes)
            output_signature = nest.pack_sequence_as(
                output_types, [TensorSpec(s, t) for t, s in zip(types, shapes)])
        args = tuple(np.asarray(a) for a in (args or ()))
        return _Generator(generator, args, output_signature)

    # -- transformations -----------------------------------------------------------------------
    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None,
              name=None):
        """Stack consecutive elements into batches of ``batch_size`` (the last may be short
        unless ``drop_remainder``)."""
        batch_size = positive_int("batch_size", batch_size)
        return _Batch(self, batch_size, flag("drop_remainder", drop_remainder))

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True, name=None):
        """Shuffle through a buffer of ``buffer_size`` elements (tf.data's algorithm).

        With ``seed`` the sequence of orders is the same on every run and rank; each new
        iteration (an epoch, or a pass of ``repeat``) draws a new order unless
        ``reshuffle_each_iteration=False``.
        """
        if buffer_size == AUTOTUNE:
            buffer_size = 1 << 62
        buffer_size = positive_int("buffer_size", buffer_size)
        if seed is not None:
            seed = seed_int(seed)
        return _Shuffle(self, buffer_size, seed,
                        flag("reshuffle_each_iteration", reshuffle_each_iteration))

    def repeat(self, count=None, name=None):
        """Repeat the dataset ``count`` times (None or -1: forever)."""
        count = -1 if count is None else count_or_all("count", count, "repeat forever")
        return _Repeat(self, count)

    def shard(self, num_shards, index, name=None):
        """Every ``num_shards``-th element, starting at ``index``."""
        num_shards, index = count_int("num_shards", num_shards), count_int("index", index)
        if num_shards <= 0:
            raise InvalidArgumentError(
                f"Number of shards must be greater than zero (currently num_shards = {num_shards}).")
        if not 0 <= index < num_shards:
            raise InvalidArgumentError(
                f"Index must be between 0 and {num_shards - 1} (currently index = {index}).")
        return _Shard(self, num_shards, index)

    def map(self, map_func, num_parallel_calls=None, deterministic=None, name=None):
        """Apply ``map_func`` to each element (a tuple element is passed as positional
        arguments). Runs in the iterating thread; ``num_parallel_calls`` is accepted for
        compatibility (map a batched dataset to vectorise instead)."""
        if not callable(map_func):
            raise TypeError(f"map_func must be callable, got {map_func!r}.")
        return _Map(self, map_func)

    def take(self, count, name=None):
        """At most ``count`` elements (-1: all)."""
        return _Take(self, count_or_all("count", count, "take all"))

    def skip(self, count, name=None):
        """Everything after the first ``count`` elements (-1: skip all)."""
        return _Skip(self, count_or_all("count", count, "skip all"))

    def prefetch(self, buffer_size, name=None):
        """Produce up to ``buffer_size`` elements ahead in a background thread (AUTOTUNE: 2)."""
        if buffer_size == AUTOTUNE:
            buffer_size = _AUTOTUNE_PREFETCH
        buffer_size = count_int("buffer_size", buffer_size)
        if buffer_size < 0:
            raise InvalidArgumentError(f"buffer_size must be >= 0 or AUTOTUNE, got {buffer_size}.")
        return _Prefetch(self, buffer_size) if buffer_size else self

    def with_options(self, options, name=None):
        """This dataset with ``options`` (an ``mpidist.data.Options``) set; fields it sets win
        over options set earlier in the chain."""
        if not isinstance(options, Options):
            raise TypeError(f"options must be an mpidist.data.Options, got {type(options).__name__}.")
        return _WithOptions(self, options)

    # -- inspection ------------------------------------------------------------------------------
    def options(self):
        """The options of the whole chain, merged from the source outwards."""
        merged = Options()
        for node in self._chain_from_source():
            if isinstance(node, _WithOptions):
                merged = merged.merge(node._options)
        return merged

    @property
    def element_spec(self):
        """The TensorSpec structure of the elements (None marks a dimension that varies)."""
        if self._spec_cache is None:
            self._spec_cache = self._compute_spec()
        return self._spec_cache

    def cardinality(self):
        """The number of elements: an int, ``INFINITE_CARDINALITY`` (-1) or
        ``UNKNOWN_CARDINALITY`` (-2)."""
        return self._cardinality()

    def __len__(self):
        n = self.cardinality()
        if n == INFINITE_CARDINALITY:
            raise TypeError("The dataset is infinite.")
        if n == UNKNOWN_CARDINALITY:
            raise TypeError("The dataset length is unknown.")
        return n

    def __bool__(self):
        return True

    def __iter__(self):
        return self._iterate(IterationContext(iteration=next(self._iterations)))

    def as_numpy_iterator(self):
        """An iterator over the elements (they already are NumPy arrays)."""
        return iter(self)

    def __repr__(self):
        return f"<{type(self).__name__.lstrip('_')}Dataset element_spec={self.element_spec}>"

    # -- for subclasses and the distribution layer ----------------------------------------------
    def _iterate(self, ctx):
        raise NotImplementedError

    def _compute_spec(self):
        return self._inputs[0].element_spec

    def _cardinality(self):
        return self._inputs[0]._cardinality()

    def _index_source(self):
        """The from_tensor_slices source whose rows are this dataset's elements, when every
        step between only selects or reorders elements; else None. Batch then gathers rows
        with one vectorised take per component instead of stacking elements one by one."""
        return None

    def _chain_from_source(self):
        chain, node = [], self
        while node is not None:
            chain.append(node)
            node = node._inputs[0] if node._inputs else None
        return chain[::-1]


def _apply_source_shard(ctx, indices):
    if ctx.source_shard is None:
        return indices
    num, index = ctx.source_shard
    return indices[index::num]


class _TensorSlices(Dataset):
    def __init__(self, tensors):
        super().__init__()
        leaves = nest.flatten(tensors)
        if not leaves:
            raise ValueError("from_tensor_slices needs at least one array.")
        for leaf in leaves:
            if leaf.ndim == 0:
                raise InvalidArgumentError(
                    f"from_tensor_slices needs arrays with at least one dimension to slice; got a "
                    f"scalar {leaf!r}. Use from_tensors for a single element.")
        n = leaves[0].shape[0]
        for leaf in leaves[1:]:
            if leaf.shape[0] != n:
                raise InvalidArgumentError(
                    f"from_tensor_slices: dimensions {n} and {leaf.shape[0]} are not compatible; "
                    "every component must have the same number of rows.")
        leaves = [_snapshot(leaf) for leaf in leaves]
        self._tensors = nest.pack_sequence_as(tensors, leaves)
        self._flat, self._n = leaves, n

    def _index_source(self):
        return self

    def _iterate_indices(self, ctx):
        return iter(_apply_source_shard(ctx, range(self._n)))

    def _iterate(self, ctx):
        flat, structure = self._flat, self._tensors
        single = len(flat) == 1 and not nest.is_nested(structure)
        for i in self._iterate_indices(ctx):
            yield flat[0][i] if single else nest.pack_sequence_as(structure, [leaf[i] for leaf in flat])

    def _rows(self, indices):
        """The rows ``indices`` of every component, as new arrays, in the element structure."""
        return nest.pack_sequence_as(self._tensors, [np.take(leaf, indices, axis=0) for leaf in self._flat])

    def _compute_spec(self):
        return nest.map_structure(lambda a: TensorSpec(a.shape[1:], a.dtype), self._tensors)

    def _cardinality(self):
        return self._n

    def _source_count(self):
        return self._n


def _snapshot(array):
    """A read-only copy: the dataset holds its data as it was when built (as tf.data embeds a
    constant), and elements that are views of it cannot be written through."""
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy


class _Tensors(Dataset):
    def __init__(self, tensors):
        super().__init__()
        self._tensors = nest.map_structure(_snapshot, tensors)

    def _iterate(self, ctx):
        if ctx.source_shard is None or ctx.source_shard[1] == 0:
            yield self._tensors

    def _compute_spec(self):
        return spec_of(self._tensors)

    def _cardinality(self):
        return 1

    def _source_count(self):
        return 1


class _Range(Dataset):
    def __init__(self, r, dtype):
        super().__init__()
        self._range, self._dtype = r, dtype

    def _iterate(self, ctx):
        make = self._dtype.type
        for i in _apply_source_shard(ctx, self._range):
            yield make(i)

    def _compute_spec(self):
        return TensorSpec((), self._dtype)

    def _cardinality(self):
        return len(self._range)

    def _source_count(self):
        return len(self._range)


class _Generator(Dataset):
    def __init__(self, generator, args, signature):
        super().__init__()
        self._generator, self._args, self._signature = generator, args, signature

    def _iterate(self, ctx):
        it = iter(self._generator(*self._args))
        if ctx.source_shard is not None:
            num, index = ctx.source_shard
            it = itertools.islice(it, index, None, num)
        for count, element in enumerate(it):
            element = to_data(element, f"`generator` element {count}")
            if self._signature is not None:
                element = _conform(element, self._signature, count)
            yield element

    def _compute_spec(self):
        if self._signature is not None:
            return self._signature
        for element in self._iterate(IterationContext()):
            return spec_of(element)
        raise ValueError(
            "The generator yielded no element, so its element_spec is unknown; pass "
            "output_signature to from_generator.")

    def _cardinality(self):
        return UNKNOWN_CARDINALITY

    def _source_count(self):
        return None


def _conform(element, signature, count):
    try:
        nest.assert_same_structure(signature, element)
    except ValueError:
        raise InvalidArgumentError(
            f"`generator` yielded an element ({count}) that did not match the expected structure "
            f"{signature}: {element!r}.") from None

    def fit(spec, x):
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


class _Batch(Dataset):
    def __init__(self, input_dataset, batch_size, drop_remainder):
        super().__init__((input_dataset,))
        self._batch_size, self._drop_remainder = batch_size, drop_remainder

    def _iterate(self, ctx):
        n = self._batch_size
        source = self._inputs[0]._index_source()
        if source is not None:
            indices = self._inputs[0]._iterate_indices(ctx)
            while True:
                rows = np.fromiter(itertools.islice(indices, n), dtype=np.intp, count=-1)
                if not len(rows) or (self._drop_remainder and len(rows) < n):
                    return
                yield source._rows(rows)
        it = self._inputs[0]._iterate(ctx)
        while True:
            elements = list(itertools.islice(it, n))
            if not elements or (self._drop_remainder and len(elements) < n):
                return
            yield _stack(elements)

    def _compute_spec(self):
        size = self._batch_size if self._drop_remainder else None
        return nest.map_structure(lambda s: s.with_batch_dim(size), self._inputs[0].element_spec)

    def _cardinality(self):
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return n // self._batch_size if self._drop_remainder else -(-n // self._batch_size)


def _stack(elements):
    first = elements[0]
    if not nest.is_nested(first):
        columns = [elements]
    else:
        flats = [nest.flatten(e) for e in elements]
        columns = list(zip(*flats))
    stacked = []
    for c, column in enumerate(columns):
        try:
            stacked.append(np.stack(column))
        except ValueError:
            shapes = [np.shape(x) for x in column]
            bad = next(i for i, s in enumerate(shapes) if s != shapes[0])
            raise InvalidArgumentError(
                f"Cannot batch tensors with different shapes in component {c}. First element had "
                f"shape {list(shapes[0])} and element {bad} had shape {list(shapes[bad])}.") from None
    return stacked[0] if not nest.is_nested(first) else nest.pack_sequence_as(first, stacked)


class _RowOrderOp(Dataset):
    """A transformation that only selects or reorders its input's elements: it runs the same
    way over elements and over row indices of a from_tensor_slices source."""

    def _iterate(self, ctx):
        return self._apply(lambda: self._inputs[0]._iterate(ctx), ctx)

    def _iterate_indices(self, ctx):
        return self._apply(lambda: self._inputs[0]._iterate_indices(ctx), ctx)

    def _index_source(self):
        return self._inputs[0]._index_source()

    def _apply(self, upstream, ctx):
        """The output stream, given ``upstream()`` making a fresh input stream."""
        raise NotImplementedError


class _Shuffle(_RowOrderOp):
    def __init__(self, input_dataset, buffer_size, seed, reshuffle):
        super().__init__((input_dataset,))
        self._buffer_size, self._seed, self._reshuffle = buffer_size, seed, reshuffle
        # An unseeded shuffle is random per run but fixed for this object, as in tf.data.
        self._random_seed = int.from_bytes(os.urandom(8), "little")

    def _rng(self, ctx):
        instance = ctx.next_instance(self)
        if self._seed is not None:
            base = self._seed
        else:
            base = ctx.agreed_seed if ctx.agreed_seed is not None else self._random_seed
        entropy = [base, self._depth] + ([ctx.iteration, instance] if self._reshuffle else [])
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))

    def _apply(self, upstream, ctx):
        rng = self._rng(ctx)
        it = upstream()
        buffer = list(itertools.islice(it, self._buffer_size))
        draws, pos = rng.random(1024), 0
        for element in it:
            if pos == len(draws):
                draws, pos = rng.random(1024), 0
            k = int(draws[pos] * len(buffer))
            pos += 1
            yield buffer[k]
            buffer[k] = element
        order = rng.permutation(len(buffer))
        for k in order:
            yield buffer[k]


class _Repeat(_RowOrderOp):
    def __init__(self, input_dataset, count):
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream, ctx):
        passes = itertools.count() if self._count < 0 else range(self._count)
        for _ in passes:
            produced = False
            for element in upstream():
                produced = True
                yield element
            if not produced:
                return  # repeating an empty dataset forever would spin

    def _cardinality(self):
        n = self._inputs[0]._cardinality()
        if self._count == 0 or n == 0:
            return 0
        if self._count < 0:
            return INFINITE_CARDINALITY if n != UNKNOWN_CARDINALITY else UNKNOWN_CARDINALITY
        return n * self._count if n >= 0 else n


class _Shard(_RowOrderOp):
    def __init__(self, input_dataset, num_shards, index):
        super().__init__((input_dataset,))
        self._num_shards, self._index = num_shards, index

    def _apply(self, upstream, ctx):
        return itertools.islice(upstream(), self._index, None, self._num_shards)

    def _cardinality(self):
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return max(0, -(-(n - self._index) // self._num_shards))


class _Map(Dataset):
    def __init__(self, input_dataset, fn):
        super().__init__((input_dataset,))
        self._fn = fn

    def _call(self, element, index=0):
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

    def _check_arity(self, args):
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

    def _iterate(self, ctx):
        for index, element in enumerate(self._inputs[0]._iterate(ctx)):
            yield self._call(element, index)

    def _compute_spec(self):
        """map_func's output spec, found much as tf.data finds it, by tracing: map_func runs
        on two stand-in elements of the input spec (ones, every unknown dimension 1 in one and
        2 in the other) and on the first real element; a dimension is known only where all
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


def _stand_in(spec, unknown):
    """Ones shaped like ``spec``, each unknown dimension ``unknown`` long."""
    return nest.map_structure(
        lambda s: np.ones(tuple(unknown if d is None else d for d in s.shape), s.dtype), spec)


class _Take(_RowOrderOp):
    def __init__(self, input_dataset, count):
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream, ctx):
        it = upstream()
        return it if self._count < 0 else itertools.islice(it, self._count)

    def _cardinality(self):
        n = self._inputs[0]._cardinality()
        if self._count < 0:
            return n
        if n == INFINITE_CARDINALITY:
            return self._count
        return n if n == UNKNOWN_CARDINALITY else min(n, self._count)


class _Skip(_RowOrderOp):
    def __init__(self, input_dataset, count):
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream, ctx):
        it = upstream()
        if self._count < 0:
            for _ in it:
                pass
            return
        yield from itertools.islice(it, self._count, None)

    def _cardinality(self):
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return 0 if self._count < 0 else max(0, n - self._count)


class _WithOptions(_RowOrderOp):
    def __init__(self, input_dataset, options):
        super().__init__((input_dataset,))
        self._options = options

    def _apply(self, upstream, ctx):
        return upstream()


class _Prefetch(Dataset):
    def __init__(self, input_dataset, buffer_size):
        super().__init__((input_dataset,))
        self._buffer_size = buffer_size

    def _iterate(self, ctx):
        return iterate_in_background(self._inputs[0]._iterate(ctx), self._buffer_size)


# -- What the distribution layer asks of a dataset ---------------------------------------------
# Functions rather than Dataset methods: Dataset keeps tf.data's public API, and
# ``mpidist.data.distributed`` reads the chain through these.
def iterate(dataset: Dataset, context: IterationContext) -> Iterator:
    """An iterator over ``dataset``'s elements for one pass described by ``context`` (an
    IterationContext: which pass, the seed the workers agreed, the FILE shard to read)."""
    return dataset._iterate(context)


def static_batch_size(dataset: Dataset) -> int | None:
    """The batch size of the ``batch`` closest to ``dataset``'s output, else None."""
    for node in reversed(dataset._chain_from_source()):
        if isinstance(node, _Batch):
            return node._batch_size
    return None


def source_row_count(dataset: Dataset) -> int | None:
    """How many elements the source at the start of ``dataset``'s chain holds (the unit FILE
    auto-sharding splits), or None where that is unknown (a generator)."""
    return dataset._chain_from_source()[0]._source_count()
