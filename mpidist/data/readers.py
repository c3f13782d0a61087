"""Streaming readers of the files HPC users keep training data in: text lines, NumPy ``.npy``
and ``.npz``, Parquet (pyarrow) and HDF5 (h5py).

Each reader is a ``FileReader`` (``mpidist.data.dataset``): a Dataset of the rows of one file
after another, read in blocks of a few MiB, so memory is bounded by a block, never by a file.
The element spec comes from each file's header or schema alone; a file whose spec differs
from the first file's, a missing file, or a file shorter than its header promises is an error
naming the file before any of its rows is produced. Every reader works alone
(``NpyDataset(["a.npy", "b.npy"])``) and as the map function of ``interleave``
(``Dataset.list_files("train-*.npy", shuffle=False).interleave(NpyDataset, cycle_length=2)``),
the pipeline FILE auto-sharding splits by file.

pyarrow and h5py are optional extras, imported when a reader that needs one is built.
"""

from __future__ import annotations

import ast
import gzip
import importlib
import os
import zipfile
import zlib
from collections.abc import Collection, Hashable, Iterable, Iterator
from types import ModuleType, TracebackType
from typing import IO, TYPE_CHECKING, Any, Literal, cast

import numpy as np

from mpidist.core import nest
from mpidist.data.arguments import count_int, positive_int, short
from mpidist.data.dataset import AUTOTUNE, Dataset
from mpidist.data.file_reader import FileReader
from mpidist.data.file_kinds import HEAD_BYTES, vet_compression, with_kind_hint
from mpidist.data.spec import TensorSpec
from mpidist.errors import DataLossError, InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.context import IterationContext
    from mpidist.data.file_reader import BlockSizes
    from mpidist.data.element import Block, Structure

__all__ = ["TextLineDataset", "NpyDataset", "NpzDataset", "ParquetDataset", "HDF5Dataset",
           "StreamFileReader", "COMPRESSION_TYPES", "decompressed_chunks", "optional_module"]

# Rows per block: about this many bytes. Measured (benchmarks/readers_throughput.py, .npy
# batch(256)): 1 MiB read 15 GB/s into fresh blocks, 4 MiB 9 GB/s (fresh 4 MiB buffers are
# new, zeroed pages each time; 1 MiB ones are reused by malloc), 256 KiB no faster.
BLOCK_BYTES = 1 << 20


def optional_module(module: str, reader: str, extra: str) -> ModuleType:
    """An optional extra's module, or an ImportError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'{reader} needs {module.split(".")[0]}: pip install "mpidist[{extra}]" '
                          f"(or install {module.split('.')[0]} yourself). ({e})") from e


def _block_rows(reader: str, block_rows: int | None) -> int | None:
    return None if block_rows is None else positive_int(f"{reader}: block_rows", block_rows)


def _block_split(sizes: BlockSizes, rows: int, row_bytes: int, block_rows: int | None
                 ) -> Iterator[int]:
    """Block sizes for ``rows`` rows: the user's ``block_rows`` exactly, else about
    BLOCK_BYTES, in whole batches where a batch consumes them (``BlockSizes``)."""
    return sizes.split(rows, _rows_per_block(row_bytes, block_rows), exact=block_rows is not None)


def _rows_per_block(row_bytes: int, block_rows: int | None) -> int:
    """``block_rows`` if given, else the rows that fill about BLOCK_BYTES (at least one)."""
    return block_rows if block_rows is not None else max(1, BLOCK_BYTES // max(1, row_bytes))


def _named_keys(reader: str, argument: str, value: object) -> list[str]:
    """A list of str keys from one str or a list / tuple of them."""
    keys = [value] if isinstance(value, str) else value
    if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) for k in keys):
        raise TypeError(f"{reader}: {argument} must be a str or a non-empty list of str, got "
                        f"{short(value)}.")
    if len(set(keys)) != len(keys):
        raise InvalidArgumentError(f"{reader}: {argument} names a key twice: {list(keys)}.")
    return list(keys)


def _missing(reader: str, path: str, argument: str, wanted: Iterable[str],
             available: Collection[str], what: str) -> None:
    absent = [k for k in wanted if k not in available]
    if absent:
        raise InvalidArgumentError(
            f"{reader}: {argument} {absent[0]!r} is not in {path}; it holds the {what} "
            f"{sorted(available)}. Pass {argument} from these.")


def _same_rows(reader: str, path: str, counts: dict[str, int]) -> int:
    """The row count every one of ``counts`` ({key: rows}) shares, else an error naming them."""
    if len(set(counts.values())) > 1:
        raise InvalidArgumentError(
            f"{reader}: the arrays chosen from {path} have different numbers of rows "
            f"({', '.join(f'{k}: {n}' for k, n in counts.items())}); an element takes one row of "
            "each, so they must have the same length. Choose arrays of equal length.")
    return next(iter(counts.values()))


# -- Text lines ----------------------------------------------------------------------------------
COMPRESSION_TYPES = (None, "", "GZIP", "ZLIB")
_TEXT_CHUNK = 256 << 10  # TF's default buffer_size for TextLineDataset
_TEXT_BLOCK_CHARS = 1 << 20  # rows x longest line per block: one long line cannot blow up a block


def decompressed_chunks(reader: str, path: str, compression: str | None, given: object,
                        chunk: int) -> Iterator[bytes]:
    """The bytes of ``path``, decompressed (``compression``: None, "GZIP" or "ZLIB"; ``given``:
    the compression_type as the user wrote it), ``chunk`` bytes at a time, once its first bytes
    agree with ``compression`` (else an error saying which compression_type to pass). A
    stream that ends early is DataLossError naming the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            vet_compression(reader, path, compression, given, COMPRESSION_TYPES[2:], head,
                            len(head) < HEAD_BYTES)
            f.seek(0)
            if compression == "GZIP":
                with gzip.GzipFile(fileobj=f, mode="rb") as unzipped:
                    while data := unzipped.read(chunk):
                        yield data
                return
            if compression is None:
                while data := f.read(chunk):
                    yield data
                return
            inflate = zlib.decompressobj()
            while data := f.read(chunk):
                if out := inflate.decompress(data):
                    yield out
            if out := inflate.flush():
                yield out
            if not inflate.eof:
                raise EOFError("the zlib stream ends before its end marker")
    except DataLossError:
        raise  # vet_compression's, naming the file and the compression_type to pass
    except (EOFError, OSError, zlib.error) as e:
        raise DataLossError(
            f"{reader}: {path} is not a complete {compression} file: {e}. Check "
            "compression_type, or re-copy the file.") from e


class StreamFileReader(FileReader):
    """A reader of files read as byte streams, plain or compressed (``TextLineDataset``,
    ``TFRecordDataset``): TF's ``compression_type``, ``buffer_size`` and
    ``num_parallel_reads`` arguments, checked alike, and with ``num_parallel_reads`` N > 1 (or
    AUTOTUNE) N files read at a time, their elements interleaved one each as TF orders them
    (``interleave`` with ``cycle_length=N``)."""

    def __init__(self, filenames: Any, compression_type: str | None = None,
                 buffer_size: int | None = None, num_parallel_reads: int | None = None,
                 name: str | None = None) -> None:
        reader = self.reader
        if compression_type not in COMPRESSION_TYPES:
            raise InvalidArgumentError(
                f"{reader}: compression_type must be None, '', 'GZIP' or 'ZLIB', got "
                f"{short(compression_type)}.")
        if buffer_size is not None and count_int(f"{reader}: buffer_size", buffer_size) < 0:
            raise InvalidArgumentError(
                f"{reader}: buffer_size must be >= 0 (0: the default), got {buffer_size}.")
        if num_parallel_reads is not None and num_parallel_reads != AUTOTUNE:
            positive_int(f"{reader}: num_parallel_reads", num_parallel_reads)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{reader}: name must be a str or None, got {short(name)}.")
        self._compression = compression_type or None
        self._compression_arg = compression_type  # as given, for messages ('' or None)
        self._chunk = buffer_size or _TEXT_CHUNK
        self._parallel = num_parallel_reads
        super().__init__(filenames)

    def _blocks(self, ctx: IterationContext) -> Iterator[Block]:
        if self._parallel is None or self._parallel == 1:
            return super()._blocks(ctx)
        return self._interleaved_blocks(ctx)

    def _interleaved_blocks(self, ctx: IterationContext) -> Iterator[Block]:
        names = list(self._file_names(ctx))  # this worker's files where FILE sharding splits them
        if not names:
            return
        one_file = lambda f: type(self)(f, self._compression_arg, self._chunk)  # noqa: E731
        elements = Dataset.from_tensor_slices(names).interleave(one_file,
                                                                cycle_length=self._parallel)
        yield from elements._blocks(ctx.child(salt=-1))


class TextLineDataset(StreamFileReader):
    """``tf.data.TextLineDataset``: one element per line of the files, the line ending ("\\n"
    or "\\r\\n") stripped; a last line without a newline is an element too.

    Elements are NumPy str scalars (UTF-8 decoded; TF gives bytes): ``line == "text"`` works
    and batches are ``<U`` arrays. A file that is not UTF-8 is an error naming it.
    ``compression_type``: None or "" (plain), "GZIP" or "ZLIB". ``buffer_size``: bytes read at
    a time (0 or None: 256 KiB). ``num_parallel_reads``: with N > 1 (or AUTOTUNE), the lines
    of N files at a time, interleaved one line each as TF orders them (``interleave`` with
    ``cycle_length=N``); None: one file after another.
    """

    reader = "TextLineDataset"

    def _spec_args(self) -> Hashable:
        return ()  # one str per line, whatever the options

    def _file_spec(self, path: str) -> Structure:
        return TensorSpec((), np.str_)

    def _raw_chunks(self, path: str) -> Iterator[bytes]:
        return decompressed_chunks(self.reader, path, self._compression, self._compression_arg,
                                   self._chunk)

    # sizes: lines vary, blocks are by characters
    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        tail, offset = b"", 0
        for chunk in self._raw_chunks(path):
            data = tail + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                tail = data
                continue
            tail = data[cut + 1:]
            yield from self._line_blocks(path, data[:cut], offset)
            offset += cut + 1
        if tail:
            yield from self._line_blocks(path, tail, offset)

    def _line_blocks(self, path: str, data: bytes, offset: int) -> Iterator[np.ndarray]:
        """Blocks of the lines of ``data`` (lines joined by "\\n"), each a <U array whose rows
        times longest line stays under _TEXT_BLOCK_CHARS."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgumentError(
                f"TextLineDataset: {path} is not UTF-8 text (byte {offset + e.start}: "
                f"{data[e.start:e.start + 8]!r}); elements are str. Convert the file to UTF-8.") from e
        lines = text.split("\n")
        if "\r" in text:
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        lengths = list(map(len, lines))
        if max(lengths) * len(lines) <= _TEXT_BLOCK_CHARS:
            yield np.array(lines, dtype=np.str_)
            return
        start, longest = 0, 0
        for i, n in enumerate(lengths):
            longest = max(longest, n)
            if i > start and longest * (i + 1 - start) > _TEXT_BLOCK_CHARS:
                yield np.array(lines[start:i], dtype=np.str_)
                start, longest = i, n
        yield np.array(lines[start:], dtype=np.str_)


# -- NumPy .npy and .npz ---------------------------------------------------------------------------
class _NpyHeader:
    __slots__ = ("shape", "dtype", "fortran", "offset")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any], fortran: bool, offset: int
                 ) -> None:
        self.shape, self.dtype, self.fortran, self.offset = shape, dtype, fortran, offset

    @property
    def data_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


def _read_npy_header(f: IO[bytes], reader: str, where: str) -> _NpyHeader:
    """The header of the .npy stream ``f`` (positioned at its start); ``where`` names it."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        elif version == (3, 0):  # np.save's utf-8 header, for non-latin-1 field names
            size = int.from_bytes(f.read(4), "little")
            header = ast.literal_eval(f.read(size).decode("utf-8"))
            shape, fortran = header["shape"], header["fortran_order"]
            dtype = fmt.descr_to_dtype(header["descr"])
        else:
            raise ValueError(f"format version {version} is not one NumPy writes")
    except (ValueError, SyntaxError, KeyError, EOFError, UnicodeDecodeError) as e:
        raise DataLossError(f"{reader}: {where} is not a .npy file NumPy can read ({e}). Write it "
                            "with numpy.save.") from e
    header = _NpyHeader(tuple(shape), np.dtype(dtype), bool(fortran), f.tell())
    if header.dtype.hasobject:
        raise InvalidArgumentError(
            f"{reader}: {where} holds Python objects (dtype {header.dtype}), which .npy stores "
            "pickled and cannot be read in rows. Save arrays of numbers, bools or fixed-width "
            "strings.")
    if not header.shape:
        raise InvalidArgumentError(
            f"{reader}: {where} holds a 0-d array (one scalar), which has no rows. Save an array "
            "with a leading row dimension (e.g. np.save(f, np.atleast_1d(x))).")
    return header


def _check_size(reader: str, where: str, header: _NpyHeader, actual: int) -> None:
    expected = header.offset + header.data_bytes
    if actual < expected:
        raise DataLossError(
            f"{reader}: {where} is truncated: its header promises an array of shape "
            f"{header.shape} and dtype {header.dtype}, {expected} bytes with the header, but it "
            f"has {actual} bytes. Re-copy or re-write the file.")


def _read_into(f: IO[bytes], out: np.ndarray, reader: str, where: str) -> np.ndarray:
    """Fill ``out`` (a fresh C-contiguous array) from ``f``; DataLossError if ``f`` ends first."""
    if not out.nbytes:
        return out
    view = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # a buffer
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])  # type: ignore[attr-defined]  # files and zip members have it
        if not n:
            raise DataLossError(f"{reader}: {where} ended after {got} of the {len(view)} bytes of "
                                "a block: it was truncated while being read.")
        got += n
    return out


def _npy_blocks(f: IO[bytes], header: _NpyHeader, block_sizes: Iterable[int], reader: str,
                where: str) -> Iterator[np.ndarray]:
    """The rows of the .npy data at ``f``'s position in blocks of ``block_sizes`` rows, each
    block a fresh array (one read, no mapping of the file)."""
    row_shape = header.shape[1:]
    for rows in block_sizes:
        yield _read_into(f, np.empty((rows,) + row_shape, header.dtype), reader, where)


def _fortran_blocks(path: str, header: _NpyHeader, block_sizes: Iterable[int]
                    ) -> Iterator[np.ndarray]:
    """Row blocks of a Fortran-ordered .npy (rows are not contiguous there): each block copied
    out of a mapping that lives only while the block is copied."""
    start = 0
    for rows in block_sizes:
        whole = np.memmap(path, header.dtype, "r", header.offset, header.shape, order="F")
        block = np.ascontiguousarray(whole[start:start + rows])
        del whole
        start += rows
        yield block


class NpyDataset(FileReader):
    """The rows of ``.npy`` files (``numpy.save``): element ``i`` of a file is ``array[i]``
    (a 1-D file gives scalars), file after file.

    Read ``block_rows`` rows at a time (None: about 1 MiB) into fresh arrays; the whole file is
    never loaded or mapped. The spec and row count come from the header; a file shorter than its
    header says is a DataLossError when it is opened. Object arrays (pickled) cannot be read.
    """

    reader = "NpyDataset"

    def _spec_args(self) -> Hashable:
        return ()


    def __init__(self, filenames: Any, block_rows: int | None = None) -> None:
        self._rows_per_block = _block_rows(self.reader, block_rows)
        super().__init__(filenames)

    def _header(self, path: str, f: IO[bytes]) -> _NpyHeader:
        try:
            header = _read_npy_header(f, self.reader, path)
        except DataLossError as e:  # not a .npy: say what it is, if its first bytes tell
            raise with_kind_hint(e, path, self.reader) from e.__cause__
        _check_size(self.reader, path, header, os.fstat(f.fileno()).st_size)
        return header

    def _file_header(self, path: str) -> _NpyHeader:
        with open(path, "rb") as f:
            return self._header(path, f)

    def _file_spec(self, path: str) -> Structure:
        header = self._file_header(path)
        return TensorSpec(header.shape[1:], header.dtype)

    def _file_rows(self, path: str) -> int | None:
        return self._file_header(path).shape[0]

    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        with open(path, "rb", buffering=0) as f:
            header = self._header(path, f)  # again: the file may have changed since the spec
            blocks = _block_split(sizes, header.shape[0], header.row_bytes, self._rows_per_block)
            if header.fortran and len(header.shape) > 1:
                yield from _fortran_blocks(path, header, blocks)
            else:
                yield from _npy_blocks(f, header, blocks, self.reader, path)


class NpzDataset(FileReader):
    """The rows of ``.npz`` files (``numpy.savez`` or ``savez_compressed``): each element is a
    dict ``{key: array[key][i]}`` of the arrays ``keys`` (a str or a list of them; None: every
    array in the first file), which must have the same number of rows.

    Each member is streamed through ``zipfile`` (decompressed as it is read), ``block_rows``
    rows at a time (None: about 1 MiB over the chosen arrays), never loaded whole.
    """

    reader = "NpzDataset"

    def _spec_args(self) -> Hashable:
        return ("*",) if self._keys is None else tuple(self._keys)  # "*": every key

    def __init__(self, filenames: Any, keys: str | list[str] | tuple[str, ...] | None = None,
                 block_rows: int | None = None) -> None:
        self._keys = None if keys is None else _named_keys(self.reader, "keys", keys)
        self._rows_per_block = _block_rows(self.reader, block_rows)
        super().__init__(filenames)

    def _open(self, path: str) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise with_kind_hint(DataLossError(
                f"{self.reader}: {path} is not a complete .npz (zip) file: {e}. Re-copy it, or "
                "write it with numpy.savez."), path, self.reader) from e

    def _members(self, path: str, archive: zipfile.ZipFile) -> dict[str, tuple[str, _NpyHeader]]:
        """{key: (member name, header)} of the chosen arrays, each member's size checked."""
        names = {n[:-4]: n for n in archive.namelist() if n.endswith(".npy")}
        keys = self._keys if self._keys is not None else list(names)
        _missing(self.reader, path, "keys", keys, names, "arrays")
        if not keys:
            raise InvalidArgumentError(f"{self.reader}: {path} holds no arrays.")
        members = {}
        for key in keys:
            where = f"{path} (array {key!r})"
            with self._guard(where), archive.open(names[key]) as member:
                header = _read_npy_header(member, self.reader, where)
            _check_size(self.reader, where, header, archive.getinfo(names[key]).file_size)
            members[key] = (names[key], header)
        _same_rows(self.reader, path, {k: h.shape[0] for k, (_, h) in members.items()})
        return members

    def _guard(self, where: str) -> _DataLossOn:
        return _DataLossOn((zipfile.BadZipFile, EOFError, zlib.error), self.reader, where)

    def _file_spec(self, path: str) -> Structure:
        with self._open(path) as archive:
            members = self._members(path, archive)
        return {k: TensorSpec(h.shape[1:], h.dtype) for k, (_, h) in members.items()}

    def _file_rows(self, path: str) -> int | None:
        with self._open(path) as archive:
            members = self._members(path, archive)
        return next(iter(members.values()))[1].shape[0]

    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        with self._open(path) as archive:
            members = self._members(path, archive)
            row_bytes = sum(h.row_bytes for _, h in members.values())
            n = next(iter(members.values()))[1].shape[0]
            # the same sizes for every member: their blocks are zipped into elements
            blocks = list(_block_split(sizes, n, row_bytes, self._rows_per_block))
            opened, streams = [], {}
            try:
                with self._guard(path):
                    for key, (name, header) in members.items():
                        opened.append(self._open_member(path, archive, name))  # side by side
                        where = f"{path} (array {key!r})"
                        _read_npy_header(opened[-1], self.reader, where)  # on to the data
                        streams[key] = _npy_blocks(opened[-1], header, blocks, self.reader,
                                                   where)
                    for blocks in zip(*streams.values()):
                        yield dict(zip(streams, blocks))
            finally:
                for member in opened:
                    member.close()


    def _open_member(self, path: str, archive: zipfile.ZipFile, name: str) -> IO[bytes]:
        """A stream of member ``name``: an uncompressed one (numpy.savez) read straight from
        the file, as a .npy is (zipfile's stream would copy every block twice more); a
        compressed one through zipfile, decompressed as it is read."""
        info = archive.getinfo(name)
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
            return archive.open(name)
        f = open(path, "rb", buffering=0)  # noqa: SIM115  (closed by _file_blocks)
        f.seek(info.header_offset)
        local = f.read(30)  # the local header: signature ... name and extra lengths at 26
        if local[:4] != b"PK\x03\x04":
            f.close()
            raise DataLossError(f"{self.reader}: {path} is damaged: no local header for {name!r}. "
                                "Re-copy or re-write the file.")
        f.seek(info.header_offset + 30 + int.from_bytes(local[26:28], "little")
               + int.from_bytes(local[28:30], "little"))
        return f


class _DataLossOn:
    """A context in which ``errors`` (a damaged archive's) become DataLossError naming it."""

    def __init__(self, errors: tuple[type[BaseException], ...], reader: str, where: str) -> None:
        self._errors, self._reader, self._where = errors, reader, where

    def __enter__(self) -> _DataLossOn:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> Literal[False]:
        if kind is not None and issubclass(kind, self._errors):
            raise DataLossError(f"{self._reader}: {self._where} is damaged: {value}. Re-copy "
                                "or re-write the file.") from value
        return False


# -- Parquet ---------------------------------------------------------------------------------------
_PARQUET_BATCH_ROWS = 64 << 10  # pyarrow's own iter_batches default


class ParquetDataset(FileReader):
    """The rows of Parquet files: each element is a dict ``{column: value}`` of ``columns``
    (a str or a list of them; None: every column of the first file).

    Read through ``pyarrow.parquet.ParquetFile.iter_batches`` (``batch_rows`` rows at a time,
    only the chosen columns), never a whole file. Columns of numbers, bools and strings (str
    elements) or bytes, and fixed-size lists of numbers (a row is an array of the list's
    shape). Variable-length lists cannot be rows of one shape, and a null has no value: both
    are errors naming the column (nothing is filled in). Needs pyarrow (``mpidist[parquet]``).
    """

    reader = "ParquetDataset"

    def _spec_args(self) -> Hashable:
        return ("*",) if self._columns is None else tuple(self._columns)  # "*": every column


    def __init__(self, filenames: Any, columns: str | list[str] | tuple[str, ...] | None = None,
                 batch_rows: int | None = None) -> None:
        self._pa = optional_module("pyarrow", self.reader, "parquet")
        self._pq = optional_module("pyarrow.parquet", self.reader, "parquet")
        self._columns = None if columns is None else _named_keys(self.reader, "columns", columns)
        self._batch_rows = None if batch_rows is None else positive_int(
            f"{self.reader}: batch_rows", batch_rows)
        super().__init__(filenames)

    def _open(self, path: str) -> Any:
        try:
            return self._pq.ParquetFile(path)
        except (self._pa.ArrowException, OSError) as e:
            raise with_kind_hint(DataLossError(
                f"{self.reader}: {path} is not a readable Parquet file: {e}. Re-copy it, or "
                "write it with pyarrow.parquet.write_table."), path, self.reader) from e

    def _chosen(self, path: str, parquet: Any) -> dict[str, Any]:
        schema = parquet.schema_arrow
        columns = self._columns if self._columns is not None else list(schema.names)
        _missing(self.reader, path, "columns", columns, schema.names, "columns")
        return {c: schema.field(c).type for c in columns}

    def _leaf(self, path: str, column: str, arrow_type: Any) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """(dtype, row shape) of a column of ``arrow_type``, or an error saying why not."""
        types = self._pa.types
        if types.is_fixed_size_list(arrow_type):
            dtype, shape = self._leaf(path, column, arrow_type.value_type)
            if dtype.kind in "US":
                raise self._unreadable(path, column, arrow_type, "lists of strings")
            return dtype, (arrow_type.list_size,) + shape
        if types.is_list(arrow_type) or types.is_large_list(arrow_type) or (
                hasattr(types, "is_list_view") and types.is_list_view(arrow_type)):
            raise self._unreadable(
                path, column, arrow_type, "a variable-length list, whose rows have no one shape; "
                "write it as a fixed-size list (pa.list_(type, size))")
        if types.is_string(arrow_type) or types.is_large_string(arrow_type):
            return np.dtype(np.str_), ()
        if types.is_binary(arrow_type) or types.is_large_binary(arrow_type):
            return np.dtype(np.bytes_), ()
        if types.is_integer(arrow_type) or types.is_floating(arrow_type) or types.is_boolean(arrow_type):
            return np.dtype(arrow_type.to_pandas_dtype()), ()
        raise self._unreadable(path, column, arrow_type, "not a type with a NumPy row")

    def _unreadable(self, path: str, column: str, arrow_type: Any, why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.reader}: column {column!r} of {path} has type {arrow_type}: {why}. Columns "
            "of numbers, bools, strings and fixed-size lists of numbers are read; leave this one "
            "out with columns=[...], or convert it.")

    def _file_spec(self, path: str) -> Structure:
        parquet = self._open(path)
        try:
            return {c: TensorSpec(shape, dtype)
                    for c, t in self._chosen(path, parquet).items()
                    for dtype, shape in [self._leaf(path, c, t)]}
        finally:
            parquet.close()

    def _file_rows(self, path: str) -> int | None:
        parquet = self._open(path)
        try:
            return cast(int, parquet.metadata.num_rows)
        finally:
            parquet.close()

    def _check_statistics(self, path: str, parquet: Any, columns: Collection[str]) -> None:
        """Nulls the footer's statistics count: an error before any row is read."""
        meta = parquet.metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for j in range(group.num_columns):
                chunk = group.column(j)
                name = chunk.path_in_schema.split(".")[0]
                stats = chunk.statistics
                if name in columns and stats is not None and stats.has_null_count and stats.null_count:
                    raise self._nulls(path, name, f"row group {g} has {stats.null_count}")

    def _nulls(self, path: str, column: str, count: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.reader}: column {column!r} of {path} has nulls ({count}), which have no value "
            "in an array row; nothing is filled in. Fill or drop them when writing the file, or "
            "leave the column out with columns=[...].")

    def _to_numpy(self, path: str, column: str, array: Any, dtype: np.dtype[Any]) -> np.ndarray:
        if array.null_count:
            raise self._nulls(path, column, f"{array.null_count} in a batch")
        if dtype.kind in "US":
            return cast(np.ndarray, array.to_numpy(zero_copy_only=False).astype(dtype))
        if self._pa.types.is_fixed_size_list(array.type):
            values = array.flatten()
            rows = len(array)
            inner = self._to_numpy(path, column, values, dtype)
            return inner.reshape((rows, array.type.list_size) + inner.shape[1:])
        return cast(np.ndarray, array.to_numpy(zero_copy_only=False))

    # sizes: pyarrow's record batches decide
    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        parquet = self._open(path)
        try:
            chosen = self._chosen(path, parquet)
            dtypes = {c: self._leaf(path, c, t)[0] for c, t in chosen.items()}
            self._check_statistics(path, parquet, chosen)
            batches = parquet.iter_batches(batch_size=self._batch_rows or _PARQUET_BATCH_ROWS,
                                           columns=list(chosen))
            for batch in batches:
                yield {c: self._to_numpy(path, c, batch.column(c), dtypes[c]) for c in chosen}
        finally:
            parquet.close()


# -- HDF5 ------------------------------------------------------------------------------------------
class HDF5Dataset(FileReader):
    """The rows of datasets in HDF5 files: ``key`` is the path of one dataset (elements are its
    rows), a tuple / list of paths (tuple elements) or a dict ``{name: path}`` (dict elements);
    the datasets chosen must have the same number of rows.

    Read as row ranges ``dset[a:b]`` of ``block_rows`` rows (None: about 1 MiB, whole chunks),
    never a whole dataset. Variable-length strings become str elements. Needs h5py
    (``mpidist[hdf5]``).
    """

    reader = "HDF5Dataset"

    def _spec_args(self) -> Hashable:
        return repr(self._key)  # a str, or a tuple / dict of str


    def __init__(self, filenames: Any, key: str | list[str] | tuple[str, ...] | dict[str, str],
                 block_rows: int | None = None) -> None:
        self._h5py = optional_module("h5py", self.reader, "hdf5")
        if isinstance(key, list):
            key = tuple(key)
        if not nest.is_nested(key):
            _named_keys(self.reader, "key", key)
        elif not all(isinstance(k, str) for k in nest.flatten(key)) or not nest.flatten(key):
            raise TypeError(f"{self.reader}: key must be a dataset path (a str), or a tuple, list "
                            f"or dict of them, got {short(key)}.")
        else:
            _named_keys(self.reader, "key", nest.flatten(key))
        self._key = key
        self._rows_per_block = _block_rows(self.reader, block_rows)
        super().__init__(filenames)

    def _open(self, path: str) -> Any:
        try:
            return self._h5py.File(path, "r")
        except OSError as e:
            raise with_kind_hint(DataLossError(
                f"{self.reader}: {path} is not a readable HDF5 file: {e}. Re-copy it, or write "
                "it with h5py."), path, self.reader) from e

    def _datasets(self, path: str, f: Any) -> list[Any]:
        """The chosen h5py datasets (flat, in nest order), checked."""
        paths = nest.flatten(self._key)
        found = [f.get(p) for p in paths]
        absent = [p for p, d in zip(paths, found) if not isinstance(d, self._h5py.Dataset)]
        if absent:
            names = []
            f.visititems(lambda name, obj: names.append(name)
                         if isinstance(obj, self._h5py.Dataset) else None)
            _missing(self.reader, path, "key", absent, names, "datasets")
        for p, d in zip(paths, found):
            if not d.shape:
                raise InvalidArgumentError(
                    f"{self.reader}: dataset {p!r} of {path} is a scalar (shape ()), which has "
                    "no rows. Choose datasets with a leading row dimension.")
        _same_rows(self.reader, path, {p: d.shape[0] for p, d in zip(paths, found)})
        return found

    def _dtype(self, path: str, name: str, dset: Any) -> tuple[np.dtype[Any], bool]:
        """(the NumPy dtype of the rows, whether they are read as str)."""
        string = self._h5py.check_string_dtype(dset.dtype)
        if string is not None and string.length is None:
            return np.dtype(np.str_), True
        if dset.dtype.hasobject:
            raise InvalidArgumentError(
                f"{self.reader}: dataset {name!r} of {path} has variable-length elements "
                f"({dset.dtype}), which have no one row shape. Store fixed-shape arrays.")
        return dset.dtype, False

    def _file_spec(self, path: str) -> Structure:
        with self._open(path) as f:
            leaves = [TensorSpec(d.shape[1:], self._dtype(path, p, d)[0])
                      for p, d in zip(nest.flatten(self._key), self._datasets(path, f))]
        return nest.pack_sequence_as(self._key, leaves) if nest.is_nested(self._key) else leaves[0]

    def _file_rows(self, path: str) -> int | None:
        with self._open(path) as f:
            return cast(int, self._datasets(path, f)[0].shape[0])

    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        with self._open(path) as f:
            dsets = self._datasets(path, f)
            paths = nest.flatten(self._key)
            strings = [self._dtype(path, p, d)[1] for p, d in zip(paths, dsets)]
            readers = [d.asstr() if s else d for d, s in zip(dsets, strings)]
            row_bytes = sum(int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize
                            for d in dsets)
            n = dsets[0].shape[0]
            if self._rows_per_block is None and sizes.batch_rows is None:
                # whole chunks, so each is decoded once
                rows = _rows_per_block(row_bytes, None)
                chunk = max((d.chunks[0] for d in dsets if d.chunks), default=1)
                blocks = sizes.split(n, max(chunk, rows // chunk * chunk), exact=True)
            else:  # the user's block_rows, or whole batches (each batch then a view)
                blocks = _block_split(sizes, n, row_bytes, self._rows_per_block)
            start = 0
            for rows in blocks:
                leaves = [r[start:start + rows] for r in readers]
                start += rows
                leaves = [np.asarray(x, dtype=np.str_) if s else x for x, s in zip(leaves, strings)]
                yield nest.pack_sequence_as(self._key, leaves) if nest.is_nested(self._key) else leaves[0]

