"""``mpidist.data.Dataset``: the part of ``tf.data`` the distribution guides use, over NumPy.

A Dataset is an immutable, lazy pipeline: each transformation returns a new Dataset wrapping
its input, and iterating one runs the chain from the source. Elements are NumPy arrays or
nested tuples / dicts of them. As in tf.data, a Python *list* is data (one array), while a tuple
or dict is structure.

Randomness is explicit and reproducible: ``shuffle(seed=s)`` gives the same sequence of orders on
every run and every rank; without a seed, a distributed dataset agrees one seed across workers
(see ``mpidist.data.distributed``) so sharding by data never duplicates or loses an example.
"""

from __future__ import annotations

import collections
import collections.abc
import hashlib
import inspect
import itertools
import os
from collections.abc import Callable, Hashable, Iterable, Iterator
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
from mpidist.data.background import iterate_in_background
from mpidist.data.parallel_map import cores_of_this_rank, map_in_parallel
from mpidist.data.file_names import file_list, file_name, match_patterns, require_file
from mpidist.data.finite import require_finite
from mpidist.data.ops.registry import operation
from mpidist.data.options import Options
from mpidist.data.saved_format import (
    check_load_spec,
    read_metadata,
    read_shard_blocks,
    read_shard_header,
    write_dataset,
)
from mpidist.data.spec import TensorSpec, most_specific_common, spec_of
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from mpidist.data.element import Block, Element, Structure

    # What a source shards by position: its row indices, file names or shard paths.
    _Sliceable = TypeVar("_Sliceable", range, np.ndarray, "tuple[str, ...]", "list[str]")

__all__ = ["Dataset", "FileReader", "BlockSizes", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY",
           "SHARD_HINT", "IterationContext", "iterate", "static_batch_size", "source_row_count",
           "find_file_reader", "file_count", "file_shard_units", "source_units",
           "order_units", "has_shard_hints", "stack_elements", "specs_match"]

AUTOTUNE = -1
_SAMPLED_ROWS = 64  # rows of an in-memory source the DATA-sharding agreement compares
SHARD_HINT = -1  # shard(SHARD_HINT, SHARD_HINT): filled in by AutoShardPolicy.HINT
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2
_AUTOTUNE_PREFETCH = 2  # what AUTOTUNE means for prefetch: double buffering


class IterationContext:
    """What one top-level iteration tells every node of the chain (see ``iterate``).

    ``iteration`` numbers the top-level iterations (a reshuffling shuffle reseeds per
    iteration); ``agreed_seed`` replaces unseeded shuffles' local random seeds (workers agree
    on it); ``source_shard`` is ``(num_shards, index)`` applied to the source at the start of
    the chain (FILE auto-sharding of a reader's file names, or of an in-memory source where no
    reader is found); ``file_shard`` is ``(num_shards, index, reader)``: the reader node whose
    file names FILE auto-sharding splits; ``shard_hint`` is ``(num_shards, index)`` for the
    ``shard(SHARD_HINT, SHARD_HINT)`` placeholders (HINT; one worker outside distribution).
    """

    def __init__(self, iteration: int = 0, agreed_seed: int | None = None,
                 source_shard: tuple[int, int] | None = None,
                 file_shard: tuple[int, int, Dataset] | None = None,
                 shard_hint: tuple[int, int] = (1, 0)) -> None:
        self.iteration = iteration
        self.agreed_seed = agreed_seed
        self.source_shard = source_shard
        self.file_shard = file_shard
        self.shard_hint = shard_hint
        # Set by a batch that cuts blocks of file rows (a hint: it changes block sizes, never
        # the elements): readers make blocks of whole batches, so batches are views of them.
        self.batch_rows: int | None = None
        self.row_offset = 0  # rows of the batched stream before this reader's first row
        self._instances: dict[int, int] = {}
        self._children: dict[tuple[tuple[int, int] | None, int | None], IterationContext] = {}
        # Set under ignore_errors: nodes that run a user function per element (map, filter,
        # ...) hand it an error that function raised and drop the element, instead of raising.
        self.skip_error: Callable[[Exception], None] | None = None

    def ignoring_errors(self, handler: Callable[[Exception], None]) -> IterationContext:
        """This context for the nodes upstream of an ``ignore_errors``: the same pass (its
        instance counts and children shared), with ``skip_error`` set to ``handler``."""
        copy = IterationContext.__new__(IterationContext)
        copy.__dict__.update(self.__dict__)
        copy.skip_error = handler
        return copy

    def file_shard_of(self, reader: Dataset) -> tuple[int, int] | None:
        """``(num_shards, index)`` if FILE auto-sharding splits ``reader``'s file names."""
        if self.file_shard is not None and self.file_shard[2] is reader:
            return self.file_shard[:2]
        return None

    def child(self, source_shard: tuple[int, int] | None = None, salt: int | None = None
              ) -> IterationContext:
        """The context a node iterates a dataset of its own with (a reader's file names, the
        datasets interleave opens): same pass, a seed derived from the agreed one."""
        key = (source_shard, salt)
        if key not in self._children:  # kept: a repeated pass must count its instances on
            seed = self.agreed_seed
            if seed is not None and salt is not None:
                seed = int(np.random.SeedSequence([seed, salt]).generate_state(1, np.uint64)[0])
            self._children[key] = IterationContext(self.iteration, seed, source_shard,
                                                   shard_hint=self.shard_hint)
        return self._children[key]

    def next_instance(self, node: Dataset) -> int:
        """How many iterators of ``node`` this iteration created before (repeat re-creates)."""
        n = self._instances.get(id(node), 0)
        self._instances[id(node)] = n + 1
        return n


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
        return _TensorSlices(to_data(tensors, "from_tensor_slices"))

    @staticmethod
    def from_tensors(tensors: Any, name: str | None = None) -> Dataset:
        """A dataset with the single element ``tensors``."""
        return _Tensors(to_data(tensors, "from_tensors"))

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
        return _Range(range(*bounds), np.dtype(dtype))

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
        return _Generator(generator, args, output_signature)

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
        files = _FileList(match_patterns(file_pattern))
        return _Shuffle(files, max(1, len(files._names)), seed, True) if shuffle else files

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
        shards = _ShardDatasets(info.shard_paths, spec)
        if reader_func is None:
            return _Loaded(shards.interleave(lambda shard: shard), info.rows)
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
        return _Batch(self, batch_size, flag("drop_remainder", drop_remainder))

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
        return _Shuffle(self, buffer_size, seed,
                        flag("reshuffle_each_iteration", reshuffle_each_iteration))

    def repeat(self, count: int | None = None, name: str | None = None) -> Dataset:
        """Repeat the dataset ``count`` times (None or -1: forever)."""
        count = -1 if count is None else count_or_all("count", count, "repeat forever")
        return _Repeat(self, count)

    def shard(self, num_shards: int, index: int, name: str | None = None) -> Dataset:
        """Every ``num_shards``-th element, starting at ``index``. ``shard(SHARD_HINT,
        SHARD_HINT)`` is a placeholder that AutoShardPolicy.HINT fills in with the number of
        workers and this worker's index (one worker, index 0, where nothing distributes it)."""
        num_shards, index = count_int("num_shards", num_shards), count_int("index", index)
        if num_shards == index == SHARD_HINT:
            return _Shard(self, None, None)
        if num_shards <= 0:
            raise InvalidArgumentError(
                f"Number of shards must be greater than zero (currently num_shards = {num_shards}).")
        if not 0 <= index < num_shards:
            raise InvalidArgumentError(
                f"Index must be between 0 and {num_shards - 1} (currently index = {index}).")
        return _Shard(self, num_shards, index)

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
        return _Map(self, map_func, threads, in_order)

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
            cycle_length = _cpu_count()
        cycle_length = positive_int("cycle_length", cycle_length)
        block_length = 1 if block_length is None else positive_int("block_length", block_length)
        if num_parallel_calls is not None and num_parallel_calls != AUTOTUNE:
            positive_int("num_parallel_calls", num_parallel_calls)
        if deterministic is not None:
            flag("deterministic", deterministic)
        return _Interleave(self, map_func, cycle_length, block_length)

    def flat_map(self, map_func: Callable[..., Dataset], name: str | None = None) -> Dataset:
        """``map_func(element)`` returns a Dataset for each element; their elements follow one
        another (``interleave`` with ``cycle_length=1``)."""
        return _Interleave(self, _check_map_func("flat_map", map_func), 1, 1)

    def take(self, count: int, name: str | None = None) -> Dataset:
        """At most ``count`` elements (-1: all)."""
        return _Take(self, count_or_all("count", count, "take all"))

    def skip(self, count: int, name: str | None = None) -> Dataset:
        """Everything after the first ``count`` elements (-1: skip all)."""
        return _Skip(self, count_or_all("count", count, "skip all"))

    def prefetch(self, buffer_size: int, name: str | None = None) -> Dataset:
        """Produce up to ``buffer_size`` elements ahead in a background thread (AUTOTUNE: 2)."""
        if buffer_size == AUTOTUNE:
            buffer_size = _AUTOTUNE_PREFETCH
        buffer_size = count_int("buffer_size", buffer_size)
        if buffer_size < 0:
            raise InvalidArgumentError(f"buffer_size must be >= 0 or AUTOTUNE, got {buffer_size}.")
        return _Prefetch(self, buffer_size) if buffer_size else self

    def with_options(self, options: Options, name: str | None = None) -> Dataset:
        """This dataset with ``options`` (an ``mpidist.data.Options``) set; fields it sets win
        over options set earlier in the chain."""
        if not isinstance(options, Options):
            raise TypeError(f"options must be an mpidist.data.Options, got {type(options).__name__}.")
        return _WithOptions(self, options)

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
            if isinstance(node, _WithOptions):
                merged = merged.merge(node._options)
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
        return _python_bytes(iter(self))

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

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        raise NotImplementedError

    def _compute_spec(self) -> Structure:
        return self._inputs[0].element_spec

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()

    def _index_source(self) -> _TensorSlices | None:
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

    def _chain_from_source(self) -> list[Dataset]:
        chain: list[Dataset] = []
        node: Dataset | None = self
        while node is not None:
            chain.append(node)
            node = node._inputs[0] if node._inputs else None
        return chain[::-1]


def _apply_source_shard(ctx: IterationContext, indices: _Sliceable) -> _Sliceable:
    if ctx.source_shard is None:
        return indices
    num, index = ctx.source_shard
    return indices[index::num]


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

    def _index_source(self) -> _TensorSlices | None:
        return self

    def _iterate_indices(self, ctx: IterationContext) -> Iterator[int]:
        return iter(_apply_source_shard(ctx, range(self._n)))

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
        for i in _apply_source_shard(ctx, self._range):
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


class _Batch(Dataset):
    def __init__(self, input_dataset: Dataset, batch_size: int, drop_remainder: bool) -> None:
        super().__init__((input_dataset,))
        self._batch_size, self._drop_remainder = batch_size, drop_remainder

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        n = self._batch_size
        if self._inputs[0]._yields_blocks():
            ctx.batch_rows = n
            yield from _batches_of_blocks(self._inputs[0]._blocks(ctx), n, self._drop_remainder)
            return
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

    def _compute_spec(self) -> Structure:
        size = self._batch_size if self._drop_remainder else None
        return nest.map_structure(lambda s: s.with_batch_dim(size), self._inputs[0].element_spec)

    def _batching(self) -> tuple[bool, int | None]:
        return True, self._batch_size

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return n // self._batch_size if self._drop_remainder else -(-n // self._batch_size)


def _batches_of_blocks(blocks: Iterable[Block], size: int, drop_remainder: bool
                       ) -> Iterator[Element]:
    """Batches of ``size`` rows cut from a stream of blocks: a view of the block where the
    batch lies inside one writable block, else a copy (never a view of a file mapping)."""
    pending: list[list[Any]] = []
    have, pack = 0, None
    for block in blocks:
        flat = nest.flatten(block)
        pack = nest.packer(block) if pack is None else pack
        rows, start = len(flat[0]), 0
        while start < rows:
            take = min(size - have, rows - start)
            if take == size and all(leaf.flags.writeable for leaf in flat):
                # a whole batch inside one block: a view (readers' blocks are fresh arrays, so
                # it keeps one block alive, never a file), saving the copy a concatenate makes
                yield pack([leaf[start:start + size] for leaf in flat])
                start += size
                continue
            pending.append([leaf[start:start + take] for leaf in flat])
            have, start = have + take, start + take
            if have == size:
                yield pack([np.concatenate(column) for column in zip(*pending)])
                pending, have = [], 0
    if have and not drop_remainder:
        if len(pending) == 1 and all(leaf.flags.writeable for leaf in pending[0]):
            yield pack(pending[0])  # type: ignore[misc]  # the short last batch, inside one block
        else:
            yield pack([np.concatenate(column) for column in zip(*pending)])  # type: ignore[misc]


def _pack(structure: Structure, leaves: list[Any]) -> Element:
    return nest.pack_sequence_as(structure, leaves) if nest.is_nested(structure) else leaves[0]


def _block_rows(block: Block) -> Iterator[Element]:
    """The rows of one block, one element each, copied: a view would keep the whole block
    alive for as long as the element lives (a shuffle buffer of views pins a block per row,
    and memory then grows with the data instead of the buffer)."""
    flat = nest.flatten(block)
    if not nest.is_nested(block):
        if flat[0].dtype == object:  # bytes (TFRecord records): 0-d object arrays, exact
            yield from (_object_row(row) for row in flat[0])
            return
        for row in flat[0]:
            yield row.copy()
        return
    pack = nest.packer(block)
    for i in range(len(flat[0])):
        yield pack([_object_row(leaf[i]) if leaf.dtype == object else leaf[i].copy()
                    for leaf in flat])


def _python_bytes(elements: Iterator[Element]) -> Iterator[Element]:
    """``elements``, with bytes records as ``bytes`` where the first element has any (decided
    once: the element spec is not computed, which would run a map function on stand-ins)."""
    first = next(elements, _NO_ELEMENT)
    if first is _NO_ELEMENT:
        return
    if not any(getattr(getattr(leaf, "dtype", None), "kind", "") == "O"
               for leaf in nest.flatten(first)):
        yield first
        yield from elements
        return
    yield nest.map_structure(_bytes_as_python, first)
    for element in elements:
        yield nest.map_structure(_bytes_as_python, element)


_NO_ELEMENT: Any = object()


def _bytes_as_python(x: Any) -> Any:
    return x.item() if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype == object else x


def _object_row(row: Any) -> np.ndarray:
    """A row of an object block (bytes, as ``TFRecordDataset`` and ``mpidist.io``'s string
    features give them: NumPy's ``S`` dtype drops trailing NUL bytes) as a 0-d object array,
    so that batching it again gives an object array, not a lossy ``S`` one."""
    if isinstance(row, np.ndarray):
        return row.copy()
    out = np.empty((), dtype=object)
    out[()] = row
    return out


def _stack(elements: list[Element]) -> Element:
    first = elements[0]
    columns: list[Any]
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

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return self._apply(lambda: self._inputs[0]._iterate(ctx), ctx)

    def _iterate_indices(self, ctx: IterationContext) -> Iterator[int]:
        return self._apply(lambda: self._inputs[0]._iterate_indices(ctx), ctx)

    def _index_source(self) -> _TensorSlices | None:
        return self._inputs[0]._index_source()

    def _yields_blocks(self) -> bool:
        return self._inputs[0]._yields_blocks()

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        return self._apply_blocks(lambda: self._inputs[0]._blocks(ctx), ctx)

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        """The output stream, given ``upstream()`` making a fresh input stream."""
        raise NotImplementedError

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        """``_apply`` over blocks of rows; as ``_apply`` where the op does not count rows."""
        return self._apply(upstream, ctx)


def _slice_rows(block: Block, start: int, stop: int | None = None, step: int = 1) -> Block:
    flat = nest.flatten(block)
    return _pack(block, [leaf[start:stop:step] for leaf in flat])


def _row_count(block: Block) -> int:
    return len(nest.flatten(block)[0])


class _Shuffle(_RowOrderOp):
    def __init__(self, input_dataset: Dataset, buffer_size: int, seed: int | None,
                 reshuffle: bool) -> None:
        super().__init__((input_dataset,))
        self._buffer_size, self._seed, self._reshuffle = buffer_size, seed, reshuffle
        # An unseeded shuffle is random per run but fixed for this object, as in tf.data.
        self._random_seed = int.from_bytes(os.urandom(8), "little")

    def _yields_blocks(self) -> bool:
        return False

    def _order_units(self) -> tuple[str, ...]:
        return () if self._seed is None else (f"shuffle(seed={self._seed})",)

    def _rng(self, ctx: IterationContext) -> np.random.Generator:
        instance = ctx.next_instance(self)
        if self._seed is not None:
            base = self._seed
        else:
            base = ctx.agreed_seed if ctx.agreed_seed is not None else self._random_seed
        # A seeded order depends on the seed and the elements alone, as in TF (not on where the
        # shuffle sits in the pipeline); unseeded shuffles share the agreed seed, so their
        # depth keeps two of them in one pipeline apart.
        position = [] if self._seed is not None else [self._depth]
        entropy = [base, *position] + ([ctx.iteration, instance] if self._reshuffle else [])
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
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
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        passes = itertools.count() if self._count < 0 else range(self._count)
        for _ in passes:
            produced = False
            for element in upstream():
                produced = True
                yield element
            if not produced:
                return  # repeating an empty dataset forever would spin

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if self._count == 0 or n == 0:
            return 0
        if self._count < 0:
            return INFINITE_CARDINALITY if n != UNKNOWN_CARDINALITY else UNKNOWN_CARDINALITY
        return n * self._count if n >= 0 else n


class _Shard(_RowOrderOp):
    def __init__(self, input_dataset: Dataset, num_shards: int | None, index: int | None) -> None:
        super().__init__((input_dataset,))
        self._num_shards, self._index = num_shards, index

    def _shard(self, ctx: IterationContext) -> tuple[int, int]:
        if self._num_shards is None:  # shard(SHARD_HINT, SHARD_HINT)
            return ctx.shard_hint
        return self._num_shards, self._index  # type: ignore[return-value]  # both set, or neither

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        num, index = self._shard(ctx)
        return itertools.islice(upstream(), index, None, num)

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        num, index = self._shard(ctx)
        position = 0
        for block in upstream():
            rows = _row_count(block)
            first = (index - position) % num
            if first < rows:
                yield _slice_rows(block, first, None, num)
            position += rows

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0 or self._num_shards is None:
            return n if n < 0 else UNKNOWN_CARDINALITY
        return max(0, -(-(n - self._index) // self._num_shards))  # type: ignore[operator]  # set

    def _is_hint(self) -> bool:
        return self._num_shards is None


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


class _Take(_RowOrderOp):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        it = upstream()
        return it if self._count < 0 else itertools.islice(it, self._count)

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        left = self._count
        if left < 0:
            yield from upstream()
            return
        for block in upstream() if left else ():
            rows = _row_count(block)
            yield block if rows <= left else _slice_rows(block, 0, left)
            left -= min(rows, left)
            if not left:
                return

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if self._count < 0:
            return n
        if n == INFINITE_CARDINALITY:
            return self._count
        return n if n == UNKNOWN_CARDINALITY else min(n, self._count)


class _Skip(_RowOrderOp):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = count

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        if self._count < 0:  # skip all: reads to the end, which an infinite input never reaches
            require_finite(self._inputs[0]._chain_from_source(), "skip(-1)")
        it = upstream()
        if self._count < 0:
            for _ in it:
                pass
            return
        yield from itertools.islice(it, self._count, None)

    def _apply_blocks(self, upstream: Callable[[], Iterator[Block]], ctx: IterationContext
                      ) -> Iterator[Block]:
        left = self._count
        if left < 0:
            require_finite(self._inputs[0]._chain_from_source(), "skip(-1)")
        for block in upstream():
            if left < 0:
                continue
            rows = _row_count(block)
            if rows > left:
                yield block if not left else _slice_rows(block, left)
            left = max(0, left - rows)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        return 0 if self._count < 0 else max(0, n - self._count)


class _WithOptions(_RowOrderOp):
    def __init__(self, input_dataset: Dataset, options: Options) -> None:
        super().__init__((input_dataset,))
        self._options = options

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        return upstream()


class _Prefetch(Dataset):
    def __init__(self, input_dataset: Dataset, buffer_size: int) -> None:
        super().__init__((input_dataset,))
        self._buffer_size = buffer_size

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return iterate_in_background(self._inputs[0]._iterate(ctx), self._buffer_size)


# -- Files ---------------------------------------------------------------------------------------
class _FileList(Dataset):
    """``list_files``'s source: the matching file names, sorted (list_files puts a shuffle after
    it), so that FILE auto-sharding splits the same sorted list on every worker."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self._names = np.array(names)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        yield from _apply_source_shard(ctx, self._names)

    def _compute_spec(self) -> Structure:
        return TensorSpec((), self._names.dtype)

    def _cardinality(self) -> int:
        return len(self._names)

    def _source_count(self) -> int | None:
        return len(self._names)

    def _listed_units(self) -> tuple[str, ...] | None:
        return tuple(str(n) for n in self._names)


class BlockSizes:
    """The block sizes a reader should use for one file: about its preferred size, but where
    a batch consumes the blocks, whole batches, the first block completing the batch in
    progress. A batch then lies inside one block and is a view of it: one copy from the file,
    as the raw library makes, instead of a second one to join pieces of two blocks."""

    __slots__ = ("batch_rows", "offset")

    def __init__(self, batch_rows: int | None = None, offset: int = 0) -> None:
        self.batch_rows, self.offset = batch_rows, offset

    def split(self, rows: int, preferred: int, exact: bool = False) -> Iterator[int]:
        """Block sizes summing to ``rows``; ``exact``: ``preferred`` each (the user's choice)."""
        b = self.batch_rows
        step = preferred if exact or not b else max(1, round(preferred / b)) * b
        position = 0 if exact or not b else -self.offset % b
        if position:
            yield min(position, rows)
        while position < rows:
            yield min(step, rows - position)
            position += step


# Element specs of files already read, while each file is unchanged (same inode, size and
# modification time): an interleave opens a new reader per file every epoch, and opening a file
# just for its header costs as much as reading megabytes of it (HDF5: ~0.5 ms).
_FILE_SPECS: collections.OrderedDict[tuple[object, ...], Structure] = collections.OrderedDict()
_FILE_SPECS_KEPT = 4096


def _file_identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


class FileReader(Dataset):
    """Base of the sources that stream the rows of files, one file after another, never
    holding a whole file: ``TextLineDataset``, the readers of ``mpidist.data.readers`` and
    ``Dataset.load``'s shards.

    ``filenames`` is one file name, a list of them, or a Dataset of them. A subclass says how
    to read one file: ``_file_spec(path)``, the element spec from what the file says of itself
    (a header, a schema) without reading its rows; ``_file_blocks(path, sizes)``, its rows in
    blocks (nests of arrays sharing a leading dimension, in the element's structure), of the
    sizes ``sizes.split(rows, preferred)`` gives where the reader can choose; optionally
    ``_file_rows(path)``, its row count from the header. Every file must have the first file's
    element spec: one that differs is an error naming both files, raised before any of its rows
    is produced.
    """

    reader = "FileReader"  # the public name, for messages

    def __init__(self, filenames: Any) -> None:
        super().__init__()
        if isinstance(filenames, Dataset):
            self._names_dataset: Dataset | None = filenames
            self._names: tuple[str, ...] | None = None
        else:
            self._names_dataset = None
            self._names = file_list(filenames, f"{self.reader}: filenames")
        self._file_specs: dict[str, Structure] = {}

    # -- what a subclass provides ----------------------------------------------------------------
    def _file_spec(self, path: str) -> Structure:
        raise NotImplementedError

    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        raise NotImplementedError

    def _file_rows(self, path: str) -> int | None:
        return None

    # -- the source --------------------------------------------------------------------------------
    def _file_names(self, ctx: IterationContext) -> Iterator[str]:
        shard = ctx.file_shard_of(self)
        if self._names is not None:
            return iter(self._names if shard is None else self._names[shard[1]::shard[0]])
        # no names: a dataset of them
        names = self._names_dataset._iterate(ctx.child(source_shard=shard))  # type: ignore[union-attr]
        return (file_name(n, f"{self.reader}: an element of filenames") for n in names)

    def _first_file(self) -> str:
        if self._names is not None:
            return self._names[0]
        for name in self._names_dataset:  # type: ignore[union-attr]  # no names: a dataset of them
            return file_name(name, f"{self.reader}: an element of filenames")
        raise InvalidArgumentError(f"{self.reader}: the dataset of file names is empty.")

    def _spec_args(self) -> Hashable:
        """The arguments of this reader that shape a file's element spec (hashable; e.g. the
        columns chosen), or None where specs must not be remembered across readers."""
        return None

    def _spec_of_file(self, path: str) -> Structure:
        if path not in self._file_specs:
            require_file(path, self.reader)
            args = self._spec_args()
            key = None if args is None else (type(self), args, path) + _file_identity(path)
            spec = _FILE_SPECS.get(key) if key is not None else None
            if spec is None:
                spec = self._file_spec(path)
                if key is not None:
                    _FILE_SPECS[key] = spec
                    while len(_FILE_SPECS) > _FILE_SPECS_KEPT:
                        _FILE_SPECS.pop(next(iter(_FILE_SPECS)))
            self._file_specs[path] = spec
        return self._file_specs[path]

    def _compute_spec(self) -> Structure:
        return self._spec_of_file(self._first_file())

    def _cardinality(self) -> int:
        if self._names is None:
            return UNKNOWN_CARDINALITY
        total = 0
        for path in self._names:
            rows = self._file_rows(require_file(path, self.reader))
            if rows is None:
                return UNKNOWN_CARDINALITY
            total += rows
        return total

    def _yields_blocks(self) -> bool:
        return True

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        expected, first = self.element_spec, self._first_file()
        produced = ctx.row_offset
        for path in self._file_names(ctx):
            got = self._spec_of_file(path)
            if not specs_match(got, expected):
                raise InvalidArgumentError(
                    f"{self.reader}: {path} holds elements {got}, but {first} holds {expected}: "
                    "every file one reader reads must have the same columns, dtypes and row "
                    "shapes. Convert the odd file, or read it in a pipeline of its own.")
            for block in self._file_blocks(path, BlockSizes(ctx.batch_rows, produced)):
                rows = _row_count(block)
                if rows:
                    produced += rows
                    yield block

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        for block in self._blocks(ctx):
            yield from _block_rows(block)

    def _reads_files(self) -> bool:
        return True

    def _file_names_count(self) -> int | None:
        if self._names is not None:
            return len(self._names)
        n = self._names_dataset._cardinality()  # type: ignore[union-attr]  # no names: a dataset
        return n if n >= 0 else None

    def _split_units(self) -> tuple[str, ...] | None:
        if self._names is not None:
            return tuple(self._names)
        # the shard applies at the source of the names' chain
        return self._names_dataset._chain_from_source()[0]._listed_units()  # type: ignore[union-attr]

    def _source_count(self) -> int | None:
        return None


class _SavedShard(FileReader):
    """The rows of one shard file of a saved dataset."""

    reader = "Dataset.load"

    def __init__(self, path: str, element_spec: Structure) -> None:
        super().__init__(path)
        self._spec = element_spec

    def _file_spec(self, path: str) -> Structure:
        return check_load_spec(self._spec, read_shard_header(path).element_spec, path)

    def _file_rows(self, path: str) -> int | None:
        return read_shard_header(path).rows

    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        return read_shard_blocks(path, self._spec)  # the blocks as written


class _ShardDatasets(Dataset):
    """A saved dataset's shards, one Dataset per element (``Dataset.load``'s ``reader_func``
    gets this): FILE auto-sharding splits it, each worker reading its own shard files."""

    def __init__(self, paths: Iterable[str], element_spec: Structure) -> None:
        super().__init__()
        self._paths, self._spec = tuple(paths), element_spec

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        for path in _apply_source_shard(ctx, self._paths):
            yield _SavedShard(path, self._spec)

    def _compute_spec(self) -> Structure:
        return TensorSpec((), np.dtype(object), name="shard dataset")

    def _cardinality(self) -> int:
        return len(self._paths)

    def _source_count(self) -> int | None:
        return len(self._paths)

    def _listed_units(self) -> tuple[str, ...] | None:
        return self._paths


class _Loaded(_RowOrderOp):
    """``Dataset.load``'s default result: the shards interleaved, with the saved row count as
    its cardinality (TF's load knows it too)."""

    def __init__(self, input_dataset: Dataset, rows: int) -> None:
        super().__init__((input_dataset,))
        self._rows = rows

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        return upstream()

    def _cardinality(self) -> int:
        return self._rows


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


def _check_fn(api: str, name: str, fn: Any) -> Any:
    if not callable(fn):
        raise TypeError(f"{api}: {name} must be a callable, got {short(fn)} of type "
                        f"{type(fn).__name__}.")
    return fn


def stack_elements(elements: list[Element]) -> Element:
    """Elements of one structure stacked into a batch (InvalidArgumentError naming the
    shapes where they differ)."""
    return _stack(elements)


def _check_map_func(api: str, map_func: object) -> Callable[..., Dataset]:
    if not callable(map_func):
        hint = (" Pass the reader class itself (interleave(NpyDataset)) or a function that "
                "builds one dataset per element (lambda f: NpyDataset(f)), not a dataset."
                if isinstance(map_func, Dataset) else "")
        raise TypeError(f"{api}: map_func must be a callable that returns a Dataset for each "
                        f"element, got {short(map_func)}.{hint}")
    return map_func


def _cpu_count() -> int:
    """The CPU cores this process may run on (TF's AUTOTUNE cycle length)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_END = object()


class _BlockCursor:
    """A position in a stream of blocks: how many rows are left in the current block, and the
    next rows of it."""

    __slots__ = ("_blocks", "_flat", "_position", "_rows")
    _flat: list[Any]  # set by available() before take() reads it

    def __init__(self, blocks: Iterator[Block]) -> None:
        self._blocks, self._flat, self._position, self._rows = blocks, None, 0, 0  # type: ignore[assignment]

    def available(self) -> int:
        """Rows left in the current block (the next block loaded if this one is used up);
        0 at the end of the stream."""
        while self._position >= self._rows:
            block = next(self._blocks, _END)
            if block is _END:
                return 0
            self._flat, self._position, self._rows = nest.flatten(block), 0, _row_count(block)
        return self._rows - self._position

    def take(self, n: int) -> list[Any]:
        """The next ``n`` rows (at most ``available()``), as flat leaves."""
        start = self._position
        self._position += n
        return [leaf[start:start + n] for leaf in self._flat]


def _rows_as_blocks(elements: Iterable[Element]) -> Iterator[Block]:
    for element in elements:
        yield nest.map_structure(lambda x: np.asarray(x)[np.newaxis], element)


class _Interleave(Dataset):
    """``interleave`` and ``flat_map`` (cycle length 1): TF's order, element by element, or
    block by block where the opened datasets read files (several rounds of the cycle at once,
    by one stack, where every open dataset has the rows at hand)."""

    def __init__(self, input_dataset: Dataset, map_func: Callable[..., Dataset], cycle_length: int,
                 block_length: int) -> None:
        super().__init__((input_dataset,))
        self._map_func, self._cycle_length, self._block_length = map_func, cycle_length, block_length
        self._api = "flat_map" if cycle_length == 1 and block_length == 1 else "interleave"
        self._probed: tuple[Dataset, Element] | tuple[None, None] | None = None

    def _open(self, index: int, element: Element, check: bool = True) -> Dataset:
        args = element if type(element) is tuple else (element,)
        inner = self._map_func(*args)
        if not isinstance(inner, Dataset):
            raise TypeError(
                f"{self._api}: map_func must return an mpidist.data.Dataset for each element; "
                f"for element {index} ({short(element)}) it returned {short(inner)}. Wrap "
                "arrays in Dataset.from_tensor_slices or from_tensors; to read files, return a "
                "reader (NpyDataset(filename), ParquetDataset, HDF5Dataset, TextLineDataset), "
                "which streams the file and lets FILE auto-sharding split the files.")
        if check and not specs_match(inner.element_spec, self.element_spec):
            raise InvalidArgumentError(
                f"{self._api}: the dataset map_func returned for element {index} "
                f"({short(element)}) has elements {inner.element_spec}, but the one for the "
                f"input's first element ({short(self._probe()[1])}) has {self.element_spec}: every "
                "dataset interleaved must have the same structure, dtypes and shapes.")
        return inner

    def _probe(self) -> tuple[Dataset, Element] | tuple[None, None]:
        """(the dataset map_func returns for the first input element, that element), or
        (None, None) for an empty input: what the element spec and the reader checks read."""
        if self._probed is None:
            first = next(self._inputs[0]._iterate(IterationContext()), _END)
            self._probed = (None, None) if first is _END else (
                self._open(0, first, check=False), first)
        return self._probed

    def _compute_spec(self) -> Structure:
        inner = self._probe()[0]
        if inner is None:
            raise ValueError(f"The element_spec of this {self._api} is unknown: its input has no "
                             "element to call map_func on.")
        return inner.element_spec

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        return 0 if n == 0 else UNKNOWN_CARDINALITY

    def _reads_files(self) -> bool:
        inner = self._probe()[0]
        return inner is not None and any(node._reads_files() for node in inner._chain_from_source())

    def _file_names_count(self) -> int | None:
        n = self._inputs[0]._cardinality()
        return n if n >= 0 else None

    def _split_units(self) -> tuple[str, ...] | None:
        return self._inputs[0]._chain_from_source()[0]._listed_units()  # sharded at its source

    def _yields_blocks(self) -> bool:
        inner = self._probe()[0]
        return inner is not None and inner._yields_blocks()

    def _opened(self, ctx: IterationContext) -> Iterator[tuple[int, Dataset]]:
        """(index, dataset) for each input element, the FILE shard applied to the input."""
        shard = ctx.file_shard_of(self)
        source = self._inputs[0]
        elements = source._iterate(ctx if shard is None else ctx.child(source_shard=shard))
        for index, element in enumerate(elements):
            yield index, self._open(index, element)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        return self._interleave(ctx, blocks=False)

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        return self._interleave(ctx, blocks=True)

    def _start(self, ctx: IterationContext, index: int, inner: Dataset, blocks: bool,
               produced: int = 0) -> Iterator[Element] | _BlockCursor:
        child = ctx.child(salt=index)
        if not blocks:
            return inner._iterate(child)
        if self._cycle_length == 1:  # one reader at a time: its blocks can align to batches
            child.batch_rows, child.row_offset = ctx.batch_rows, ctx.row_offset + produced
        return _BlockCursor(inner._blocks(child) if inner._yields_blocks()
                            else _rows_as_blocks(inner._iterate(child)))

    def _interleave(self, ctx: IterationContext, blocks: bool) -> Iterator[Element]:
        k, b = self._cycle_length, self._block_length
        # (called only with blocks)
        pack: Callable[[list[Any]], Element] = nest.packer(self.element_spec) if blocks else None  # type: ignore[assignment]
        opened: Iterator[Any] = self._opened(ctx)
        slots: list[Any]
        slots, cycle, position, live, end, produced = [None] * k, 0, 0, 0, False, 0
        while not end or live:
            slot = slots[cycle]
            if slot is None:
                if end:
                    cycle, position = (cycle + 1) % k, 0
                    continue
                item: Any = next(opened, _END)
                if item is _END:
                    end = True
                else:
                    slots[cycle], live = self._start(  # type: ignore[call-arg]  # item: (index, dataset)
                        ctx, *item, blocks, produced), live + 1
                continue
            if not blocks:
                element = next(slot, _END)
                taken = 0 if element is _END else 1
            else:
                if position == 0 and live == k and k > 1:
                    rounds = min(s.available() for s in slots) // b
                    if rounds >= 2:  # whole rounds of the cycle in one stack
                        yield pack(_stack_rounds(slots[cycle:] + slots[:cycle], rounds, b))
                        continue
                # One dataset open at a time (flat_map, cycle_length=1): block_length cannot
                # change the order, so all the rows at hand go on together, not b at a time.
                taken = slot.available() if k == 1 else min(slot.available(), b - position)
                element = pack(slot.take(taken)) if taken else _END
            if element is _END:
                slots[cycle], live = None, live - 1
                cycle, position = (cycle + 1) % k, 0
                continue
            yield element
            position, produced = position + taken, produced + taken
            if position >= b:
                cycle, position = (cycle + 1) % k, 0


def _stack_rounds(cursors: list[_BlockCursor], rounds: int, block_length: int) -> list[np.ndarray]:
    """``rounds`` rounds of the cycle over ``cursors`` (each with the rows at hand), in
    interleave order: block_length rows of each cursor in turn, round after round."""
    parts = [c.take(rounds * block_length) for c in cursors]
    out = []
    for column in zip(*parts):
        tail = column[0].shape[1:]
        stacked = np.stack([p.reshape((rounds, block_length) + tail) for p in column], axis=1)
        out.append(stacked.reshape((rounds * len(cursors) * block_length,) + tail))
    return out


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
    return any(isinstance(node, _Shard) and node._is_hint() for node in dataset._chain_from_source())
