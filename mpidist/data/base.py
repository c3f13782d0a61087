"""The ``Dataset`` base class: tf.data's public methods (each checks its arguments and builds
the node of its operation, defined in ``mpidist.data.ops`` or ``mpidist.data.file_reader``),
the hooks the nodes override, and what the distribution layer and the nodes ask of a chain.
``mpidist.data.dataset`` re-exports the public names."""

from __future__ import annotations

import collections
import collections.abc
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from mpidist.core import nest
from mpidist.core.signatures import DType, DTypeStructure, accepts
from mpidist.core.tf_names import tf_name_hints
from mpidist.data.arguments import (
    check_signature,
    count_int,
    count_or_all,
    flag,
    flatten_up_to,
    op_names_checked,
    positive_int,
    seed_int,
    short,
    to_data,
)
from mpidist.data.blocks import python_bytes, stack
from mpidist.data.context import IterationContext
from mpidist.data.parallel_map import cores_of_this_rank
from mpidist.data.file_names import file_name, match_patterns
from mpidist.data.finite import require_finite
from mpidist.data.ops.registry import operation
from mpidist.data.options import Options
from mpidist.data.saved_format import check_load_spec, read_metadata, write_dataset
from mpidist.data.spec import TensorSpec
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from mpidist.data.element import Block, Element, Structure

    # What a source shards by position: its row indices, file names or shard paths.
    _Sliceable = TypeVar("_Sliceable", range, np.ndarray, "tuple[str, ...]", "list[str]")

__all__ = ["Dataset", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY",
           "SHARD_HINT", "iterate", "static_batch_size", "source_row_count",
           "find_file_reader", "file_count", "file_shard_units", "source_units",
           "order_units", "has_shard_hints", "stack_elements", "specs_match",
           "apply_source_shard", "chain_from_source", "yields_blocks", "blocks_of",
           "index_source", "iterate_indices", "row_taker"]

AUTOTUNE = -1
SHARD_HINT = -1  # shard(SHARD_HINT, SHARD_HINT): filled in by AutoShardPolicy.HINT
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2
_AUTOTUNE_PREFETCH = 2  # what AUTOTUNE means for prefetch: double buffering


_DATASET = "mpidist.data.dataset:Dataset"  # read by accepts on the first call


@tf_name_hints("Dataset")
@op_names_checked
class Dataset:
    """A lazy pipeline of elements (``tf.data.Dataset``). Build one with ``from_tensor_slices``,
    ``from_tensors``, ``range`` or ``from_generator`` and chain transformations."""

    @accepts(inputs=Iterable[_DATASET])  # type: ignore[valid-type]  # accepts reads the string
    def __init__(self, inputs: Iterable[Dataset] = ()) -> None:
        self._inputs = tuple(inputs)
        self._depth: int = 1 + max((d._depth for d in self._inputs), default=0)
        self._iterations = itertools.count()
        self._spec_cache: Structure = None

    # -- sources -----------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors: Any, name: str | None = None) -> Dataset:
        """One element per row of ``tensors`` (an array or a tuple/dict of arrays whose leading
        dimensions agree)."""
        return operation("from_tensor_slices")(to_data(tensors, "from_tensor_slices"))

    @staticmethod
    def from_tensors(tensors: Any, name: str | None = None) -> Dataset:
        """A dataset with the single element ``tensors``."""
        return operation("from_tensors")(to_data(tensors, "from_tensors"))

    @staticmethod
    @accepts(dtype=DType, name=str | None)
    def range(*args: int | np.integer[Any], dtype: DTypeLike = np.int64, name: str | None = None
              ) -> Dataset:
        """``range(stop)``, ``range(start, stop)`` or ``range(start, stop, step)`` as scalars."""
        if not 1 <= len(args) <= 3:
            raise ValueError("range takes 1 to 3 positional arguments (stop | start, stop[, step]), "
                             f"got {len(args)}.")
        names = ("stop",) if len(args) == 1 else ("start", "stop", "step")
        bounds = [count_int(name, a) for name, a in zip(names, args)]
        if len(bounds) == 3 and bounds[2] == 0:
            raise InvalidArgumentError("step must be a non-zero integer.")
        return operation("range")(range(*bounds), np.dtype(dtype))

    @staticmethod
    @accepts(output_types=DTypeStructure | None, args=tuple | list | None, name=str | None)
    def from_generator(generator: Any, output_types: Structure = None, output_shapes: Any = None,
                       args: tuple[Any, ...] | list[Any] | None = None,
                       output_signature: Any = None, name: str | None = None) -> Dataset:
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
        return operation("from_generator")(generator, args, output_signature)

    @staticmethod
    def list_files(file_pattern: Any, shuffle: bool | None = None, seed: int | None = None,
                   name: str | None = None) -> Dataset:
        """The files matching ``file_pattern`` (a glob pattern or a list of them), one file name
        (a str) per element. Sorted with ``shuffle=False``; shuffled otherwise (the default, as
        in TF), in a new order each pass; ``seed`` makes the orders reproducible. A pattern
        that matches nothing raises InvalidArgumentError naming it.

        Under ``experimental_distribute_dataset`` with several workers, the reader that reads
        these files (``interleave`` / ``flat_map`` of a reader, ``TextLineDataset``) is what
        FILE auto-sharding splits: each worker reads its own files (docs/input.md)."""
        shuffle = True if shuffle is None else flag("shuffle", shuffle)
        if seed is not None:
            seed = seed_int(seed)
        names = match_patterns(file_pattern)
        files = operation("list_files")(names)
        return operation("shuffle")(files, max(1, len(names)), seed, True) if shuffle else files

    @staticmethod
    def load(path: str | os.PathLike[str], element_spec: Structure = None, compression: str | None = None,
             reader_func: Callable[[Dataset], Dataset] | None = None) -> Dataset:
        """A dataset written by ``Dataset.save``: its shard files, read streaming.

        ``element_spec`` (default: the saved one) must describe the saved elements.
        ``reader_func(datasets)`` receives a dataset whose elements are the shards' datasets,
        sorted by shard id, and returns the dataset to produce; the default interleaves them
        as TF does (``datasets.interleave(lambda shard: shard, cycle_length=<CPU cores>)``).
        Under several workers FILE (and AUTO) sharding gives each worker its own shards."""
        if compression is not None:
            raise InvalidArgumentError(
                f"Dataset.load: compression={compression!r} is not supported: mpidist's saved "
                "datasets are not compressed. Pass compression=None.")
        info = read_metadata(file_name(path, "Dataset.load: path"))
        spec = check_load_spec(element_spec, info.element_spec, info.path)
        shards = operation("shard_datasets")(info.shard_paths, spec)
        if reader_func is None:
            return operation("loaded")(shards.interleave(lambda shard: shard), info.rows)
        if not callable(reader_func):
            raise TypeError(f"Dataset.load: reader_func must be a callable taking the dataset "
                            f"of shard datasets, got {short(reader_func)}.")
        out = reader_func(shards)
        if not isinstance(out, Dataset):
            raise TypeError(f"Dataset.load: reader_func must return an mpidist.data.Dataset, "
                            f"got {short(out)}.")
        return out

    def save(self, path: str | os.PathLike[str], compression: str | None = None,
             shard_func: Callable[..., int] | None = None, checkpoint_args: object = None) -> None:
        """Write this dataset's elements to the directory ``path`` (``Dataset.load`` reads it
        back): one file per shard, published at once by renaming the metadata that names them
        over the old, so ``path`` holds the old dataset or the new one, whole, whatever stops
        the save (a kill, a full disk: an OSError naming the path and the fix).

        ``shard_func(element)`` (a tuple element as positional arguments, as in ``map``) gives
        each element's shard, an int >= 0; by default elements go round-robin to 8 shards.
        Save from one rank (the chief), or each worker to its own path: workers saving to one
        path each publish a whole copy (the last wins), with a warning naming the others."""
        if compression is not None:
            raise InvalidArgumentError(
                f"Dataset.save: compression={compression!r} is not supported: mpidist writes "
                "uncompressed shards. Pass compression=None.")
        if checkpoint_args is not None:
            raise InvalidArgumentError(
                "Dataset.save: checkpoint_args is not supported (mpidist saves in one pass). "
                "Pass checkpoint_args=None.")
        if shard_func is not None and not callable(shard_func):
            raise TypeError(f"Dataset.save: shard_func must be a callable or None, got "
                            f"{short(shard_func)}.")
        shard_of = None if shard_func is None else (
            lambda index, element: shard_func(*element) if type(element) is tuple
            else shard_func(element))
        path = file_name(path, "Dataset.save: path")
        # before the directory is made: it would never end
        require_finite(self._chain_from_source(), "Dataset.save")
        if shard_of is None and self._yields_blocks():  # rows from files: whole blocks at once
            context = IterationContext(iteration=next(self._iterations))
            write_dataset(self._blocks(context), self.element_spec, path, blocks=True)
        else:
            write_dataset(iter(self), self.element_spec, path, shard_of)

    # -- transformations -----------------------------------------------------------------------
    def batch(self, batch_size: int, drop_remainder: bool = False, num_parallel_calls: int | None = None,
              deterministic: bool | None = None, name: str | None = None) -> Dataset:
        """Stack consecutive elements into batches of ``batch_size`` (the last may be short
        unless ``drop_remainder``)."""
        batch_size = positive_int("batch_size", batch_size)
        return operation("batch")(self, batch_size, flag("drop_remainder", drop_remainder))

    def shuffle(self, buffer_size: int, seed: int | None = None, reshuffle_each_iteration: bool = True,
                name: str | None = None) -> Dataset:
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
        return operation("shuffle")(self, buffer_size, seed,
                                    flag("reshuffle_each_iteration", reshuffle_each_iteration))

    def repeat(self, count: int | None = None, name: str | None = None) -> Dataset:
        """Repeat the dataset ``count`` times (None or -1: forever)."""
        count = -1 if count is None else count_or_all("count", count, "repeat forever")
        return operation("repeat")(self, count)

    def shard(self, num_shards: int, index: int, name: str | None = None) -> Dataset:
        """Every ``num_shards``-th element, starting at ``index``. ``shard(SHARD_HINT,
        SHARD_HINT)`` is a placeholder that AutoShardPolicy.HINT fills in with the number of
        workers and this worker's index (one worker, index 0, where nothing distributes it)."""
        num_shards, index = count_int("num_shards", num_shards), count_int("index", index)
        if num_shards == index == SHARD_HINT:
            return operation("shard")(self, None, None)
        if num_shards <= 0:
            raise InvalidArgumentError(
                f"Number of shards must be greater than zero (currently num_shards = {num_shards}).")
        if not 0 <= index < num_shards:
            raise InvalidArgumentError(
                f"Index must be between 0 and {num_shards - 1} (currently index = {index}).")
        return operation("shard")(self, num_shards, index)

    def map(self, map_func: Callable[..., Any], num_parallel_calls: int | None = None,
            deterministic: bool | None = None, name: str | None = None) -> Dataset:
        """Apply ``map_func`` to each element (a tuple element is passed as positional
        arguments). ``num_parallel_calls`` N (or ``AUTOTUNE``: the cores this rank may use)
        runs it on N threads at once (``mpidist.data.parallel_map``); ``deterministic``
        (default True, TF's) keeps the input's order, False yields results as they finish."""
        if not callable(map_func):
            raise TypeError(f"map_func must be callable, got {map_func!r}.")
        threads = 1
        if num_parallel_calls is not None:
            threads = cores_of_this_rank() if num_parallel_calls == AUTOTUNE else \
                positive_int("num_parallel_calls", num_parallel_calls)
        in_order = True if deterministic is None else flag("deterministic", deterministic)
        return operation("map")(self, map_func, threads, in_order)

    def interleave(self, map_func: Callable[..., Dataset], cycle_length: int | None = None,
                   block_length: int | None = None, num_parallel_calls: int | None = None,
                   deterministic: bool | None = None, name: str | None = None) -> Dataset:
        """``map_func(element)`` returns a Dataset for each element; their elements are
        interleaved (TF's order): ``cycle_length`` datasets are open at once, ``block_length``
        consecutive elements are taken from each in turn, and an exhausted one is replaced by
        the next input element's dataset when the cycle comes back to its place.

        ``cycle_length`` None / AUTOTUNE: the number of CPU cores this process may use (as in
        TF); ``block_length`` None: 1. ``num_parallel_calls`` and ``deterministic`` are
        accepted for compatibility: the order is always the deterministic one (overlap reading
        with the step by ``prefetch``). With a file reader as ``map_func``
        (``list_files(...).interleave(mpidist.data.NpyDataset)``) this is the pipeline FILE
        auto-sharding splits by file."""
        map_func = _check_map_func("interleave", map_func)
        if cycle_length is None or cycle_length == AUTOTUNE:
            cycle_length = cores_of_this_rank()  # TF's AUTOTUNE cycle length
        cycle_length = positive_int("cycle_length", cycle_length)
        block_length = 1 if block_length is None else positive_int("block_length", block_length)
        if num_parallel_calls is not None and num_parallel_calls != AUTOTUNE:
            positive_int("num_parallel_calls", num_parallel_calls)
        if deterministic is not None:
            flag("deterministic", deterministic)
        return operation("interleave")(self, map_func, cycle_length, block_length)

    def flat_map(self, map_func: Callable[..., Dataset], name: str | None = None) -> Dataset:
        """``map_func(element)`` returns a Dataset for each element; their elements follow one
        another (``interleave`` with ``cycle_length=1``)."""
        return operation("interleave")(self, _check_map_func("flat_map", map_func), 1, 1)

    def take(self, count: int, name: str | None = None) -> Dataset:
        """At most ``count`` elements (-1: all)."""
        return operation("take")(self, count_or_all("count", count, "take all"))

    def skip(self, count: int, name: str | None = None) -> Dataset:
        """Everything after the first ``count`` elements (-1: skip all)."""
        return operation("skip")(self, count_or_all("count", count, "skip all"))

    def prefetch(self, buffer_size: int, name: str | None = None) -> Dataset:
        """Produce up to ``buffer_size`` elements ahead in a background thread (AUTOTUNE: 2)."""
        if buffer_size == AUTOTUNE:
            buffer_size = _AUTOTUNE_PREFETCH
        buffer_size = count_int("buffer_size", buffer_size)
        if buffer_size < 0:
            raise InvalidArgumentError(f"buffer_size must be >= 0 or AUTOTUNE, got {buffer_size}.")
        return operation("prefetch")(self, buffer_size) if buffer_size else self

    def with_options(self, options: Options, name: str | None = None) -> Dataset:
        """This dataset with ``options`` (an ``mpidist.data.Options``) set; fields it sets win
        over options set earlier in the chain."""
        if not isinstance(options, Options):
            raise TypeError(f"options must be an mpidist.data.Options, got {type(options).__name__}.")
        return operation("with_options")(self, options)

    # -- transformations of mpidist.data.ops (this method checks the arguments, the op's module
    # builds the node; see mpidist/data/ops/__init__.py) -------------------------------------
    @staticmethod
    def zip(*args: Any, datasets: Any = None, name: str | None = None) -> Dataset:
        """A dataset of the elements of ``datasets`` (a dataset, or a nested tuple / dict of
        them) zipped together in that structure, ending with the shortest. ``zip(a, b)`` is
        ``zip((a, b))``, as since TF 2.13."""
        if args and datasets is not None:
            raise TypeError("Dataset.zip: pass the datasets either positionally or as "
                            "`datasets=`, not both.")
        if datasets is None:
            if not args:
                raise TypeError("Dataset.zip: must be given at least one dataset.")
            datasets = args[0] if len(args) == 1 else args
        return operation("zip")(datasets)

    def concatenate(self, dataset: Dataset, name: str | None = None) -> Dataset:
        """This dataset's elements followed by ``dataset``'s (same structure and dtypes)."""
        return operation("concatenate")(self, dataset)

    def filter(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """The elements for which ``predicate`` (a tuple element as positional arguments)
        returns True; it must return a scalar bool."""
        return operation("filter")(self, _check_fn("filter", "predicate", predicate))

    def take_while(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """The elements up to the first for which ``predicate`` returns False."""
        return operation("take_while")(self, _check_fn("take_while", "predicate", predicate))

    def enumerate(self, start: int = 0, name: str | None = None) -> Dataset:
        """``(index, element)`` pairs, the index an int64 counting from ``start``."""
        return operation("enumerate")(self, count_int("start", start))

    def cache(self, filename: str | os.PathLike[str] = "", name: str | None = None) -> Dataset:
        """The elements of the first complete pass, kept for later passes: in memory with
        ``filename=""``, else in the file ``<filename>.npcache``, written when a pass ends
        (atomically: a pass that stops early writes nothing) and read by every later pass and
        by any pipeline given the same filename."""
        return operation("cache")(self, file_name(filename, "cache: filename")
                                  if filename != "" else "")

    def unbatch(self, name: str | None = None) -> Dataset:
        """Each element's rows as elements: the first dimension of every component is split
        (all components must agree on it)."""
        return operation("unbatch")(self)

    def padded_batch(self, batch_size: int, padded_shapes: Any = None, padding_values: Any = None,
                     drop_remainder: bool = False, name: str | None = None) -> Dataset:
        """``batch`` for elements of different shapes: each component is padded to
        ``padded_shapes`` (None or -1 in a shape, or no ``padded_shapes``: the longest in the
        batch) with ``padding_values`` (default 0, "" for strings, False for bools)."""
        return operation("padded_batch")(self, positive_int("batch_size", batch_size),
                                         padded_shapes, padding_values,
                                         flag("drop_remainder", drop_remainder))

    def rebatch(self, batch_size: int | list[int], drop_remainder: bool = False,
                name: str | None = None) -> Dataset:
        """``unbatch().batch(batch_size)`` in one copy; ``batch_size`` may be a list of sizes,
        used in turn."""
        sizes = batch_size if isinstance(batch_size, (list, tuple, np.ndarray)) else [batch_size]
        if not len(sizes):
            raise InvalidArgumentError("rebatch: batch_size must not be an empty list.")
        checked = [positive_int("batch_size", s) for s in sizes]
        return operation("rebatch")(self, checked, flag("drop_remainder", drop_remainder))

    def window(self, size: int, shift: int | None = None, stride: int = 1,
               drop_remainder: bool = False, name: str | None = None) -> Dataset:
        """Windows of ``size`` elements, each a structure of datasets (one per component),
        starting every ``shift`` elements (default ``size``), taking every ``stride``-th;
        ``flat_map(lambda w: w.batch(size))`` makes them batches."""
        size = positive_int("size", size)
        shift = size if shift is None else positive_int("shift", shift)
        return operation("window")(self, size, shift, positive_int("stride", stride),
                                   flag("drop_remainder", drop_remainder))

    def scan(self, initial_state: Any, scan_func: Callable[..., Any],
             name: str | None = None) -> Dataset:
        """``scan_func(state, element)`` returns ``(new_state, output)`` for each element, the
        state starting at ``initial_state`` (its structure and dtypes kept)."""
        return operation("scan")(self, to_data(initial_state, "scan: initial_state"),
                                 _check_fn("scan", "scan_func", scan_func))

    @staticmethod
    def choose_from_datasets(datasets: Any, choice_dataset: Dataset,
                             stop_on_empty_dataset: bool = True) -> Dataset:
        """Element ``i`` comes from ``datasets[choice_i]``, ``choice_dataset`` giving the
        int64 indices; an empty chosen dataset ends it (``stop_on_empty_dataset``) or is
        skipped."""
        return operation("choose_from_datasets")(
            datasets, choice_dataset, flag("stop_on_empty_dataset", stop_on_empty_dataset))

    @staticmethod
    def sample_from_datasets(datasets: Any, weights: Any = None, seed: int | None = None,
                             stop_on_empty_dataset: bool = False,
                             rerandomize_each_iteration: bool | None = None) -> Dataset:
        """Each element from a dataset drawn at random with probabilities ``weights`` (default
        uniform); ``seed`` makes the draws reproducible. An empty dataset is skipped (drawn
        again among the others) unless ``stop_on_empty_dataset``. Each pass draws the same
        sequence unless ``rerandomize_each_iteration``."""
        if seed is not None:
            seed = seed_int(seed)
        rerandomize = (False if rerandomize_each_iteration is None
                       else flag("rerandomize_each_iteration", rerandomize_each_iteration))
        return operation("sample_from_datasets")(
            datasets, weights, seed, flag("stop_on_empty_dataset", stop_on_empty_dataset),
            rerandomize)

    def group_by_window(self, key_func: Callable[..., Any],
                        reduce_func: Callable[[Any, Dataset], Dataset],
                        window_size: int | None = None,
                        window_size_func: Callable[[Any], Any] | None = None,
                        name: str | None = None) -> Dataset:
        """Elements grouped by ``key_func(element)`` (an int64); every ``window_size``
        elements of a group (or ``window_size_func(key)``), and what is left of each group at
        the end, go to ``reduce_func(key, window_dataset)``, whose elements are produced."""
        if (window_size is None) == (window_size_func is None):
            raise ValueError("group_by_window: give exactly one of window_size and "
                             "window_size_func.")
        if window_size is not None:
            window_size = positive_int("window_size", window_size)
        else:
            _check_fn("group_by_window", "window_size_func", window_size_func)
        return operation("group_by_window")(
            self, _check_fn("group_by_window", "key_func", key_func),
            _check_fn("group_by_window", "reduce_func", reduce_func), window_size,
            window_size_func)

    def bucket_by_sequence_length(
            self, element_length_func: Callable[..., Any], bucket_boundaries: list[int],
            bucket_batch_sizes: list[int], padded_shapes: Any = None, padding_values: Any = None,
            pad_to_bucket_boundary: bool = False, no_padding: bool = False,
            drop_remainder: bool = False, name: str | None = None) -> Dataset:
        """Elements batched with others of similar length (``element_length_func``): bucket
        ``i`` holds lengths in ``[bucket_boundaries[i-1], bucket_boundaries[i])`` and is
        batched ``bucket_batch_sizes[i]`` at a time, padded as ``padded_batch`` pads."""
        return operation("bucket_by_sequence_length")(
            self, _check_fn("bucket_by_sequence_length", "element_length_func",
                            element_length_func),
            bucket_boundaries, bucket_batch_sizes, padded_shapes, padding_values,
            flag("pad_to_bucket_boundary", pad_to_bucket_boundary),
            flag("no_padding", no_padding), flag("drop_remainder", drop_remainder))

    def ignore_errors(self, log_warning: bool = False, name: str | None = None) -> Dataset:
        """The elements, less those whose making raised an error (in a ``map`` function, a
        ``filter`` predicate, ...); ``log_warning`` logs each error skipped."""
        return operation("ignore_errors")(self, flag("log_warning", log_warning))

    # -- inspection ------------------------------------------------------------------------------
    def options(self) -> Options:
        """The options of the whole chain, merged from the source outwards."""
        merged = Options()
        for node in self._chain_from_source():
            own = node._options_set()
            if own is not None:
                merged = merged.merge(own)
        return merged

    @property
    def element_spec(self) -> Structure:
        """The TensorSpec structure of the elements (None marks a dimension that varies)."""
        if self._spec_cache is None:
            self._spec_cache = self._compute_spec()
        return self._spec_cache

    def cardinality(self) -> int:
        """The number of elements: an int, ``INFINITE_CARDINALITY`` (-1) or
        ``UNKNOWN_CARDINALITY`` (-2)."""
        return self._cardinality()

    def __len__(self) -> int:
        # TF: TypeError "The dataset is infinite."
        n = require_finite(self._chain_from_source(), "len()", TypeError)
        if n == UNKNOWN_CARDINALITY:
            raise TypeError("The dataset length is unknown.")
        return n

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Iterator[Element]:
        return self._iterate(IterationContext(iteration=next(self._iterations)))

    def as_numpy_iterator(self) -> Iterator[Element]:
        """An iterator over the elements (they already are NumPy arrays), a bytes string
        (a TFRecord record) given as ``bytes``, as TF gives it."""
        return python_bytes(iter(self))

    def __repr__(self) -> str:
        name = type(self).__name__.lstrip("_")
        name = name if name.endswith("Dataset") else name + "Dataset"
        return f"<{name} element_spec={self.element_spec}>"

    # -- for subclasses and the distribution layer ----------------------------------------------
    if TYPE_CHECKING:  # what some nodes define and their callers check for first
        def _iterate_indices(self, ctx: IterationContext) -> Iterator[int]:
            """The row indices of the ``_index_source()`` this node produces (where it has one)."""
            raise NotImplementedError

        def _source_count(self) -> int | None:
            """How many elements this source holds (sources only), None where unknown."""
            raise NotImplementedError

        def _rows(self, indices: np.ndarray) -> Element:
            """The rows ``indices`` of every component (the ``_index_source()`` only)."""
            raise NotImplementedError

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        raise NotImplementedError

    def _compute_spec(self) -> Structure:
        return self._inputs[0].element_spec

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()

    def _index_source(self) -> Dataset | None:
        """The from_tensor_slices source whose rows are this dataset's elements, when every
        step between only selects or reorders elements; else None. Batch then gathers rows
        with one vectorised take per component instead of stacking elements one by one."""
        return None

    def _yields_blocks(self) -> bool:
        """Whether ``_blocks`` works here: file readers produce blocks of rows, and the nodes
        that only select rows (take, skip, shard, repeat) pass them on; ``batch`` then slices
        and concatenates blocks instead of stacking elements one by one."""
        return False

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        """The elements as blocks (only where ``_yields_blocks()``): an iterator of nests whose
        leaves share a leading dimension, the elements being their rows, in order."""
        raise NotImplementedError

    def _reads_files(self) -> bool:
        """Whether this node reads files whose names FILE auto-sharding can split."""
        return False

    def _batching(self) -> tuple[bool, int | None]:
        """(whether this node makes the batches its output holds, their static size or None):
        ``static_batch_size`` stops at the batching node closest to the output."""
        return False, None

    def _file_names_count(self) -> int | None:
        """How many file names this reader reads, or None where that is unknown."""
        return None

    def _split_units(self) -> tuple[str, ...] | None:
        """What FILE auto-sharding splits for this reader, in the order it splits them (file
        names, saved shards), or None where they are known only by reading (a generator)."""
        return None

    def _listed_units(self) -> tuple[str, ...] | None:
        """A source's elements as strings, where it is an in-memory list of names."""
        return None

    def _order_units(self) -> tuple[str, ...]:
        """What this node adds to the order and content of the elements that workers sharding
        by DATA must agree on: an explicit shuffle seed, a sample of an in-memory source."""
        return ()

    def _is_hint(self) -> bool:
        """Whether this node is a ``shard(SHARD_HINT, SHARD_HINT)`` placeholder."""
        return False

    def _options_set(self) -> Options | None:
        """The options this node sets (``with_options``), or None."""
        return None

    def _chain_from_source(self) -> list[Dataset]:
        chain: list[Dataset] = []
        node: Dataset | None = self
        while node is not None:
            chain.append(node)
            node = node._inputs[0] if node._inputs else None
        return chain[::-1]




def _check_fn(api: str, name: str, fn: Any) -> Any:
    if not callable(fn):
        raise TypeError(f"{api}: {name} must be a callable, got {short(fn)} of type "
                        f"{type(fn).__name__}.")
    return fn


def stack_elements(elements: list[Element]) -> Element:
    """Elements of one structure stacked into a batch (InvalidArgumentError naming the
    shapes where they differ)."""
    return stack(elements)


def _check_map_func(api: str, map_func: object) -> Callable[..., Dataset]:
    if not callable(map_func):
        hint = (" Pass the reader class itself (interleave(NpyDataset)) or a function that "
                "builds one dataset per element (lambda f: NpyDataset(f)), not a dataset."
                if isinstance(map_func, Dataset) else "")
        raise TypeError(f"{api}: map_func must be a callable that returns a Dataset for each "
                        f"element, got {short(map_func)}.{hint}")
    return map_func


# -- What the distribution layer asks of a dataset ---------------------------------------------
# Functions rather than Dataset methods: Dataset keeps tf.data's public API, and
# ``mpidist.data.distributed`` reads the chain through these.
def iterate(dataset: Dataset, context: IterationContext) -> Iterator[Element]:
    """An iterator over ``dataset``'s elements for one pass described by ``context`` (an
    IterationContext: which pass, the seed the workers agreed, the FILE shard to read)."""
    return dataset._iterate(context)


def static_batch_size(dataset: Dataset) -> int | None:
    """The batch size of the ``batch`` (or ``padded_batch``, ``rebatch`` of one size) closest
    to ``dataset``'s output; None where there is none, or the closest batching node makes
    batches of no one size (``unbatch``, ``rebatch`` of several sizes, ``group_by_window``)."""
    for node in reversed(dataset._chain_from_source()):
        batching, size = node._batching()
        if batching:
            return size
    return None


def source_row_count(dataset: Dataset) -> int | None:
    """How many elements the source at the start of ``dataset``'s chain holds (the unit FILE
    auto-sharding splits), or None where that is unknown (a generator)."""
    return dataset._chain_from_source()[0]._source_count()


def find_file_reader(dataset: Dataset) -> Dataset | None:
    """The node FILE auto-sharding splits, TF's rule: walking up from the output, the first
    node that reads files (a FileReader, or an interleave / flat_map whose datasets read
    files); None where the pipeline reads no files."""
    for node in reversed(dataset._chain_from_source()):
        if node._reads_files():
            return node
    return None


def file_count(reader: Dataset) -> int | None:
    """How many files ``reader`` (from ``find_file_reader``) reads, where known."""
    return reader._file_names_count()


def file_shard_units(reader: Dataset) -> tuple[str, ...] | None:
    """What FILE auto-sharding splits among the workers for ``reader`` (from
    ``find_file_reader``), in order: file names or saved shards; None where only reading
    would tell (a generator of names)."""
    return reader._split_units()


def source_units(dataset: Dataset) -> tuple[str, ...] | None:
    """The elements of the source at the start of ``dataset``'s chain as strings, where it is
    an in-memory list of names; None otherwise."""
    return dataset._chain_from_source()[0]._listed_units()


def order_units(dataset: Dataset) -> tuple[str, ...]:
    """What decides the order and content of ``dataset``'s elements, as strings, for workers
    that shard it by DATA and so must build the same sequence: explicit shuffle seeds and a
    sample of an in-memory source, along the chain."""
    return tuple(unit for node in dataset._chain_from_source() for unit in node._order_units())


def has_shard_hints(dataset: Dataset) -> bool:
    """Whether ``dataset``'s chain has a ``shard(SHARD_HINT, SHARD_HINT)`` placeholder."""
    return any(node._is_hint() for node in dataset._chain_from_source())


# -- What the nodes of other modules ask of their inputs ---------------------------------------
# Public functions over the hooks of ``Dataset`` (the nodes of ``mpidist.data.ops`` and
# ``mpidist.data.file_reader`` call them on datasets other than themselves).
def apply_source_shard(ctx: IterationContext, indices: _Sliceable) -> _Sliceable:
    """``indices`` (row indices, file names, shard paths) less those of other workers, where
    ``ctx`` applies a shard at the source."""
    if ctx.source_shard is None:
        return indices
    num, index = ctx.source_shard
    return indices[index::num]


def specs_match(a: Structure, b: Structure) -> bool:
    """Whether element specs ``a`` and ``b`` describe the same elements: structure, dtypes
    (strings of any length alike) and shapes, a dimension unknown in either matching any."""
    try:
        nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False

    def leaf(x: TensorSpec, y: TensorSpec) -> bool:
        same_dtype = x.dtype == y.dtype or (x.dtype.kind == y.dtype.kind and x.dtype.kind in "US")
        if not same_dtype:
            return False
        if x.shape is None or y.shape is None:
            return True
        return len(x.shape) == len(y.shape) and all(
            d is None or e is None or d == e for d, e in zip(x.shape, y.shape))

    return all(leaf(x, y) for x, y in zip(nest.flatten(a), nest.flatten(b)))


def chain_from_source(dataset: Dataset) -> list[Dataset]:
    """The nodes of ``dataset``'s chain (first inputs), from its source to ``dataset``."""
    return dataset._chain_from_source()


def yields_blocks(dataset: Dataset) -> bool:
    """Whether ``blocks_of(dataset, ...)`` works: ``dataset`` produces blocks of rows."""
    return dataset._yields_blocks()


def blocks_of(dataset: Dataset, ctx: IterationContext) -> Iterator[Block]:
    """``dataset``'s elements as blocks of rows (only where ``yields_blocks(dataset)``)."""
    return dataset._blocks(ctx)


def index_source(dataset: Dataset) -> Dataset | None:
    """The from_tensor_slices source whose rows are ``dataset``'s elements, or None."""
    return dataset._index_source()


def iterate_indices(dataset: Dataset, ctx: IterationContext) -> Iterator[int]:
    """The row indices of ``index_source(dataset)`` that ``dataset`` produces, in order."""
    return dataset._iterate_indices(ctx)


def row_taker(source: Dataset) -> Callable[[np.ndarray], Element]:
    """For an ``index_source``: the function from row indices to those rows of every
    component, as new arrays, in the element structure (one ``np.take`` per component)."""
    return source._rows
