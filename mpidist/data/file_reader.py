"""The sources that read files: ``FileReader`` (the base of ``TextLineDataset``, the readers
of ``mpidist.data.readers``, ``TFRecordDataset`` and ``Dataset.load``'s shards) and
``BlockSizes``, ``list_files``' source, and ``Dataset.load``'s shard datasets and result."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.data.base import (
    UNKNOWN_CARDINALITY,
    Dataset,
    apply_source_shard,
    source_units,
    specs_match,
)
from mpidist.data.blocks import block_rows, row_count
from mpidist.data.context import IterationContext
from mpidist.data.file_names import file_list, file_name, require_file
from mpidist.data.ops.row_order import RowOrderOp
from mpidist.data.ops.registry import register
from mpidist.data.saved_format import check_load_spec, read_shard_blocks, read_shard_header
from mpidist.data.spec import TensorSpec
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Block, Element, Structure

__all__ = ['FileReader', 'BlockSizes']


# -- Files ---------------------------------------------------------------------------------------
class _FileList(Dataset):
    """``list_files``'s source: the matching file names, sorted (list_files puts a shuffle after
    it), so that FILE auto-sharding splits the same sorted list on every worker."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self._names = np.array(names)

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        yield from apply_source_shard(ctx, self._names)

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
                rows = row_count(block)
                if rows:
                    produced += rows
                    yield block

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        for block in self._blocks(ctx):
            yield from block_rows(block)

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
        return source_units(self._names_dataset)  # type: ignore[arg-type]

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
        for path in apply_source_shard(ctx, self._paths):
            yield _SavedShard(path, self._spec)

    def _compute_spec(self) -> Structure:
        return TensorSpec((), np.dtype(object), name="shard dataset")

    def _cardinality(self) -> int:
        return len(self._paths)

    def _source_count(self) -> int | None:
        return len(self._paths)

    def _listed_units(self) -> tuple[str, ...] | None:
        return self._paths


class _Loaded(RowOrderOp):
    """``Dataset.load``'s default result: the shards interleaved, with the saved row count as
    its cardinality (TF's load knows it too)."""

    def __init__(self, input_dataset: Dataset, rows: int) -> None:
        super().__init__((input_dataset,))
        self._saved_rows = rows

    def _apply(self, upstream: Callable[[], Iterator[Element]], ctx: IterationContext
               ) -> Iterator[Element]:
        return upstream()

    def _cardinality(self) -> int:
        return self._saved_rows


register("list_files", _FileList)
register("shard_datasets", _ShardDatasets)
register("loaded", _Loaded)
