"""CSV files: ``mpidist.data.experimental.CsvDataset`` and ``make_csv_dataset`` (tf.data's
names and arguments).

Rows are read by pyarrow's streaming CSV reader (``pyarrow.csv.open_csv``: C++, in blocks of
``buffer_size`` bytes, typed columns, missing values as nulls filled with the column's
default). pyarrow's errors name neither the line nor, for a bad value, the row; so when it
refuses a file, the file is read again with Python's ``csv`` module up to the first bad row,
and the error names the file, the line and the column. ``ignore_errors`` (make_csv_dataset)
reads with Python's ``csv`` module throughout, dropping bad rows, as TF's ``ignore_errors``
does. Needs pyarrow (``mpidist[csv]``).
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.data.arguments import count_int, flag, positive_int, short
from mpidist.data.dataset import AUTOTUNE, Dataset
from mpidist.data.file_reader import FileReader
from mpidist.data.file_kinds import read_head, vet_compression
from mpidist.data.readers import COMPRESSION_TYPES, decompressed_chunks, optional_module
from mpidist.data.spec import TensorSpec
from mpidist.errors import InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.file_reader import BlockSizes
    from mpidist.data.element import Block, Structure

__all__ = ["CsvDataset", "make_csv_dataset"]

_BLOCK_BYTES = 1 << 20  # pyarrow's own default block_size
# CSV dtypes TF takes, and their NumPy dtypes (strings are str, as TextLineDataset's lines)
_DTYPES: dict[str, np.dtype[Any]] = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
           "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "string": np.dtype(np.str_)}


def _dtype_name(value: object) -> str | None:
    """"float32" / ... / "string" if ``value`` spells a CSV dtype (np.float32, "int64",
    tf.string, str), else None."""
    if any(value is t for t in (str, bytes, np.str_, np.bytes_)) or (
            isinstance(value, str) and value in ("string", "str")):
        return "string"
    name = value if isinstance(value, str) else getattr(value, "name", None)
    if not isinstance(name, str) and isinstance(value, type):
        try:
            name = np.dtype(value).name
        except TypeError:
            name = None
    return name if name in _DTYPES else None


class _Column:
    """One column's dtype name and default (None: required)."""

    __slots__ = ("dtype", "default")

    def __init__(self, dtype: str, default: Any) -> None:
        self.dtype, self.default = dtype, default


def _record_defaults(reader: str, record_defaults: object) -> list[_Column]:
    if not isinstance(record_defaults, (list, tuple)) or not record_defaults:
        raise TypeError(f"{reader}: record_defaults must be a non-empty list, one entry per "
                        f"column read, got {short(record_defaults)}.")
    columns = []
    for i, d in enumerate(record_defaults):
        name = _dtype_name(d)
        if name is not None:  # a dtype: a required column
            columns.append(_Column(name, None))
            continue
        array = np.asarray(d)
        if array.size > 1:
            raise InvalidArgumentError(
                f"{reader}: record_defaults[{i}] is {short(d)}: give one default value (or [value]), "
                "a dtype, or an empty array of a dtype for a required column.")
        kind = array.dtype.kind
        if kind == "U" or kind == "S":
            dtype = "string"
        elif kind == "f":
            dtype = "float64" if array.dtype == np.float64 and isinstance(d, np.ndarray) else "float32"
        elif kind in "iu":
            dtype = "int64" if array.dtype == np.int64 and isinstance(d, np.ndarray) else "int32"
        else:
            raise InvalidArgumentError(
                f"{reader}: record_defaults[{i}] is {short(d)} of dtype {array.dtype}; CSV columns "
                "are float32, float64, int32, int64 or string.")
        if array.size == 0:  # an empty array: required, of its dtype (TF: an empty tensor)
            columns.append(_Column(dtype, None))
            continue
        value = array.reshape(-1)[0]
        if dtype == "string":
            value = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        columns.append(_Column(dtype, _DTYPES[dtype].type(value)))
    return columns


class CsvDataset(FileReader):
    """``tf.data.experimental.CsvDataset``: one element per record of the CSV files, a tuple of
    scalars, one per column read (``select_cols`` / ``exclude_cols``: column indices; none:
    every column).

    ``record_defaults``: one entry per column read: a default value (``[0.0]``, ``0``,
    ``[""]``: used where the field is empty or ``na_value``) or a dtype (``np.float32``,
    ``"int64"``, ``str``; or an empty array of one): a required column, whose missing value
    is an error. Column dtypes: float32, float64, int32, int64 and string (str elements; TF
    gives bytes). ``header``: skip each file's first line. ``use_quote_delim``: '"' quotes a
    field (and '""' inside one is a quote). A record with another number of fields than the
    file's first line, a value that does not parse as its column's dtype, or a missing value
    of a required column is InvalidArgumentError naming the file, line and column.
    ``compression_type``: None / "" / "GZIP" / "ZLIB". Needs pyarrow (``mpidist[csv]``).
    """

    reader = "CsvDataset"

    def __init__(self, filenames: Any, record_defaults: Sequence[Any], compression_type: str | None = None,
                 buffer_size: int | None = None, header: bool = False, field_delim: str = ",",
                 use_quote_delim: bool = True, na_value: str = "", select_cols: Sequence[int] | None = None,
                 exclude_cols: Sequence[int] | None = None, name: str | None = None,
                 *, _skip_bad_rows: bool = False) -> None:
        reader = self.reader
        self._pa = optional_module("pyarrow", reader, "csv")
        self._pacsv = optional_module("pyarrow.csv", reader, "csv")
        self._columns = _record_defaults(reader, record_defaults)
        if compression_type not in COMPRESSION_TYPES:
            raise InvalidArgumentError(f"{reader}: compression_type must be None, '', 'GZIP' or "
                                       f"'ZLIB', got {short(compression_type)}.")
        if buffer_size is not None and count_int(f"{reader}: buffer_size", buffer_size) < 0:
            raise InvalidArgumentError(f"{reader}: buffer_size must be >= 0, got {buffer_size}.")
        if not isinstance(field_delim, str) or len(field_delim) != 1 or field_delim in '"\r\n':
            raise InvalidArgumentError(f"{reader}: field_delim must be one character (not a quote "
                                       f"or a newline), got {short(field_delim)}.")
        if not isinstance(na_value, str):
            raise TypeError(f"{reader}: na_value must be a str, got {short(na_value)}.")
        if select_cols is not None and exclude_cols is not None:
            raise InvalidArgumentError(f"{reader}: give select_cols or exclude_cols, not both.")
        self._select = self._indices("select_cols", select_cols)
        self._exclude = self._indices("exclude_cols", exclude_cols)
        if self._select is not None and len(self._select) != len(self._columns):
            raise InvalidArgumentError(
                f"{reader}: select_cols picks {len(self._select)} columns but record_defaults has "
                f"{len(self._columns)} entries; give one default (or dtype) per selected column.")
        self._compression = compression_type or None
        self._compression_arg = compression_type
        self._block = buffer_size or _BLOCK_BYTES
        self._header = flag(f"{reader}: header", header)
        self._delim, self._na = field_delim, na_value
        self._quote = flag(f"{reader}: use_quote_delim", use_quote_delim)
        self._skip_bad = _skip_bad_rows
        super().__init__(filenames)

    def _indices(self, argument: str, value: object) -> list[int] | None:
        if value is None:
            return None
        items = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
        if not items or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0
                                for i in items):
            raise InvalidArgumentError(f"{self.reader}: {argument} must be a non-empty list of column "
                                       f"indices (ints >= 0), got {short(value)}.")
        if any(b <= a for a, b in itertools.pairwise(items)):
            raise InvalidArgumentError(f"{self.reader}: {argument} must be in increasing order "
                                       f"without repeats (as TF requires), got {list(items)}.")
        return [int(i) for i in items]

    def _spec_args(self) -> Hashable:
        return tuple(c.dtype for c in self._columns)

    def _file_spec(self, path: str) -> Structure:
        return tuple(TensorSpec((), _DTYPES[c.dtype]) for c in self._columns)

    # -- which file columns are read ---------------------------------------------------------------
    def _chosen(self, path: str, width: int) -> list[int]:
        """The file's column indices read, given its first line's field count ``width``."""
        if self._select is not None:
            if self._select[-1] >= width:
                raise InvalidArgumentError(
                    f"{self.reader}: select_cols asks for column {self._select[-1]} but {path} has "
                    f"{width} columns (line {1}); pick columns below {width}.")
            return self._select
        if self._exclude is not None:
            chosen = [i for i in range(width) if i not in self._exclude]
        else:
            chosen = list(range(width))
        if len(chosen) != len(self._columns):
            raise InvalidArgumentError(
                f"{self.reader}: {path} has {width} columns (its line 1)"
                + (f", {len(chosen)} after exclude_cols" if self._exclude is not None else "")
                + f", but record_defaults has {len(self._columns)} entries; give one per column "
                "read (or pick columns with select_cols).")
        return chosen

    # -- reading -----------------------------------------------------------------------------------
    def _stream(self, path: str) -> Any:
        """A binary file object of ``path``'s decompressed bytes (its kind checked first)."""
        if self._compression is None:
            head, whole = read_head(path)
            vet_compression(self.reader, path, None, self._compression_arg, COMPRESSION_TYPES[2:],
                            head, whole)
            return open(path, "rb")  # the caller closes it
        chunks = decompressed_chunks(self.reader, path, self._compression, self._compression_arg,
                                     self._block)
        return io.BufferedReader(_ChunkStream(chunks), self._block)

    def _first_width(self, path: str) -> int:
        with self._stream(path) as f:
            for fields, _ in self._python_rows(path, f, skip_header=False):
                return len(fields)
        return len(self._columns) if self._select is None else self._select[-1] + 1

    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        width = self._first_width(path)
        chosen = self._chosen(path, width)
        if self._skip_bad:
            yield from self._python_blocks(path, chosen)
            return
        try:
            yield from self._arrow_blocks(path, chosen, width)
        except self._pa.ArrowException as e:
            self._diagnose(path, chosen)  # raises naming the line, where Python's csv sees it
            raise InvalidArgumentError(f"{self.reader}: {path} is not CSV pyarrow can read: {e}") from e

    def _arrow_blocks(self, path: str, chosen: list[int], width: int) -> Iterator[Block]:
        pa, pacsv = self._pa, self._pacsv
        names = [f"c{i}" for i in range(width)]
        types = {"string": pa.string(), "float32": pa.float32(), "float64": pa.float64(),
                 "int32": pa.int32(), "int64": pa.int64()}

        def bad_row(row: Any) -> str:
            return "error"  # the error then names the line (_diagnose)

        read = pacsv.ReadOptions(skip_rows=1 if self._header else 0, block_size=self._block,
                                 column_names=names, use_threads=False)
        parse = pacsv.ParseOptions(delimiter=self._delim, quote_char='"' if self._quote else False,
                                   invalid_row_handler=bad_row)
        chosen_names = [f"c{i}" for i in chosen]
        convert = pacsv.ConvertOptions(
            column_types={n: types[c.dtype] for n, c in zip(chosen_names, self._columns)},
            include_columns=chosen_names, null_values=[self._na, ""], strings_can_be_null=True,
            quoted_strings_can_be_null=True)
        with self._stream(path) as f:
            try:
                batches = pacsv.open_csv(f, read_options=read, parse_options=parse,
                                         convert_options=convert)
            except pa.ArrowInvalid as e:
                if "Empty CSV file" in str(e):
                    return
                raise
            for batch in batches:
                block = []
                for n, column in zip(chosen_names, self._columns):
                    array = batch.column(n)
                    if array.null_count:
                        if column.default is None:
                            raise pa.ArrowInvalid("a required value is missing")
                        array = array.fill_null(column.default.item() if column.dtype != "string"
                                                else str(column.default))
                    values = array.to_numpy(zero_copy_only=False)
                    block.append(values.astype(np.str_) if column.dtype == "string" else values)
                if len(block[0]):
                    yield tuple(block)

    # -- Python's csv module: line numbers, and ignore_errors --------------------------------------
    def _python_rows(self, path: str, f: Any, skip_header: bool) -> Iterator[tuple[list[str], int]]:
        """(fields, line number) of each record (blank lines skipped, as pyarrow does)."""
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        rows = csv.reader(text, delimiter=self._delim, quotechar='"', doublequote=True,
                          quoting=csv.QUOTE_MINIMAL if self._quote else csv.QUOTE_NONE, strict=False)
        start = 0
        try:
            for fields in rows:
                line = start + 1
                start = rows.line_num
                if skip_header and line == 1 and self._header:
                    continue
                if not fields:
                    continue
                yield fields, line
        except UnicodeDecodeError as e:
            raise InvalidArgumentError(f"{self.reader}: {path} is not UTF-8 text ({e}); convert it "
                                       "to UTF-8.") from e
        except csv.Error as e:
            raise InvalidArgumentError(f"{self.reader}: {path} line {rows.line_num}: {e}.") from e

    def _convert(self, path: str, line: int, fields: list[str], chosen: list[int], width: int
                 ) -> tuple[Any, ...]:
        """The record's values, or InvalidArgumentError naming file, line and column."""
        if len(fields) != width:
            raise InvalidArgumentError(
                f"{self.reader}: {path} line {line} has {len(fields)} fields, but {width} are "
                f"expected (as on its first line): {short(self._delim.join(fields))}. Fix "
                "the line, or pass ignore_errors=True to make_csv_dataset to drop such lines.")
        out = []
        for i, column in zip(chosen, self._columns):
            text = fields[i]
            if text == "" or text == self._na:
                if column.default is None:
                    raise InvalidArgumentError(
                        f"{self.reader}: {path} line {line} column {i} is missing ({text!r}) and "
                        f"the column is required (record_defaults gives a dtype, {column.dtype}, "
                        "not a default). Give record_defaults a default value for it, or fill "
                        "the file.")
                out.append(column.default)
                continue
            try:
                value = _parse_value(text, column.dtype)
            except (ValueError, OverflowError) as e:
                raise InvalidArgumentError(
                    f"{self.reader}: {path} line {line} column {i}: {text!r} is not a "
                    f"{column.dtype} ({e}). Fix the value, or give the column a dtype that holds "
                    "it.") from e
            out.append(value)
        return tuple(out)

    def _diagnose(self, path: str, chosen: list[int]) -> None:
        width = self._first_width(path)
        with self._stream(path) as f:
            for fields, line in self._python_rows(path, f, skip_header=True):
                self._convert(path, line, fields, chosen, width)

    def _python_blocks(self, path: str, chosen: list[int]) -> Iterator[Block]:
        width = self._first_width(path)
        rows: list[tuple[Any, ...]] = []
        with self._stream(path) as f:
            for fields, line in self._python_rows(path, f, skip_header=True):
                try:
                    rows.append(self._convert(path, line, fields, chosen, width))
                except InvalidArgumentError:
                    if not self._skip_bad:
                        raise
                    continue
                if len(rows) >= 4096:
                    yield self._rows_block(rows)
                    rows = []
        if rows:
            yield self._rows_block(rows)

    def _rows_block(self, rows: list[tuple[Any, ...]]) -> Block:
        return tuple(np.array(list(col), dtype=_DTYPES[c.dtype])
                     for col, c in zip(zip(*rows), self._columns))


def _parse_value(text: str, dtype: str) -> Any:
    if dtype == "string":
        return text
    if dtype.startswith("int"):
        value = int(text)
        bits = 31 if dtype == "int32" else 63
        if not -2 ** bits <= value < 2 ** bits:
            raise OverflowError(f"out of the {dtype} range")
        return _DTYPES[dtype].type(value)
    return _DTYPES[dtype].type(float(text))


class _ChunkStream(io.RawIOBase):
    """A readable binary stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            self._rest = next(self._chunks, b"")
            if not self._rest:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        super().close()


# -- make_csv_dataset ------------------------------------------------------------------------------
def _infer(values: list[str]) -> str:
    """TF's inference: the narrowest of int32, int64, float32, float64, string that parses
    every non-missing value."""
    for dtype in ("int32", "int64", "float32", "float64"):
        try:
            for v in values:
                parsed = _parse_value(v, dtype)
                if dtype == "float32" and math.isinf(parsed) and not math.isinf(float(v)):
                    raise OverflowError
        except (ValueError, OverflowError):
            continue
        return dtype
    return "string"


def make_csv_dataset(file_pattern: Any, batch_size: int, column_names: Sequence[str] | None = None,
                     column_defaults: Sequence[Any] | None = None, label_name: str | None = None,
                     select_columns: Sequence[str | int] | None = None, field_delim: str = ",",
                     use_quote_delim: bool = True, na_value: str = "", header: bool = True,
                     num_epochs: int | None = None, shuffle: bool = True,
                     shuffle_buffer_size: int = 10000, shuffle_seed: int | None = None,
                     prefetch_buffer_size: int | None = None, num_parallel_reads: int | None = None,
                     sloppy: bool = False, num_rows_for_inference: int = 100,
                     compression_type: str | None = None, ignore_errors: bool = False) -> Dataset:
    """``tf.data.experimental.make_csv_dataset``: batches of ``(features, label)`` (an
    OrderedDict ``{column name: [batch] array}`` and the ``label_name`` column) or of features
    alone, read from the CSV files matching ``file_pattern`` (a glob or a list of them).

    Column names come from ``column_names`` or each file's header line; column dtypes from
    ``column_defaults`` or inferred (int32, int64, float32, float64, else string) from the first
    ``num_rows_for_inference`` rows of the first file (missing values then default to 0 / "").
    The pipeline is TF's: the files (shuffled if ``shuffle``), ``num_parallel_reads`` of them
    interleaved, shuffle (``shuffle_buffer_size``, ``shuffle_seed``) and repeat
    (``num_epochs``; None: forever), batch (the last partial batch dropped when repeating
    forever, kept otherwise), then prefetch. FILE auto-sharding splits the files.
    ``sloppy`` is accepted (the order is always deterministic here). ``ignore_errors``: bad
    lines are dropped instead of raising.
    """
    where = "make_csv_dataset"
    batch_size = positive_int(f"{where}: batch_size", batch_size)
    if num_epochs is not None:
        num_epochs = positive_int(f"{where}: num_epochs", num_epochs)
    num_rows_for_inference = count_int(f"{where}: num_rows_for_inference", num_rows_for_inference)
    if num_rows_for_inference < 0:
        raise InvalidArgumentError(f"{where}: num_rows_for_inference must be 0 or more, got "
                                   f"{num_rows_for_inference}.")
    if shuffle_seed is not None:
        shuffle_seed = count_int(f"{where}: shuffle_seed", shuffle_seed)
    if column_names is not None and (isinstance(column_names, (str, bytes)) or
                                     np.ndim(column_names) != 1):
        raise TypeError(f"{where}: column_names must be a list of str, one per column, got "
                        f"{short(column_names)}.")
    files = Dataset.list_files(file_pattern, shuffle=False)
    names_list = [str(n) for n in files]
    if not names_list:
        raise InvalidArgumentError(f"{where}: no file matches {short(file_pattern)}.")
    first = names_list[0]
    header = flag(f"{where}: header", header)
    probe = CsvDataset(first, ["string"], compression_type, header=False, field_delim=field_delim,
                       use_quote_delim=use_quote_delim, select_cols=[0])
    head_rows = _head_rows(probe, first, num_rows_for_inference + 1)
    if column_names is None:
        if not header:
            raise InvalidArgumentError(f"{where}: header=False, so column_names must be given.")
        if not head_rows:
            raise InvalidArgumentError(f"{where}: {first} is empty; it has no header line.")
        column_names = list(head_rows[0])
    column_names = list(column_names)
    if not all(isinstance(n, str) for n in column_names) or len(set(column_names)) != len(column_names):
        raise InvalidArgumentError(f"{where}: column_names must be distinct str, got {column_names}.")
    data_rows = head_rows[1:] if header else head_rows[:num_rows_for_inference]
    if select_columns is not None:
        picked = []
        for c in select_columns:
            if isinstance(c, str):
                if c not in column_names:
                    raise InvalidArgumentError(f"{where}: select_columns names {c!r}, which is not a "
                                               f"column; the columns are {column_names}.")
                picked.append(column_names.index(c))
            elif isinstance(c, (int, np.integer)) and 0 <= c < len(column_names):
                picked.append(int(c))
            else:
                raise InvalidArgumentError(f"{where}: select_columns holds {c!r}: give column names "
                                           f"or indices below {len(column_names)}.")
        select = sorted(set(picked))
    else:
        select = list(range(len(column_names)))
    if column_defaults is not None:
        defaults = list(column_defaults)
        if len(defaults) == len(column_names) and len(select) != len(column_names):
            defaults = [defaults[i] for i in select]
        if len(defaults) != len(select):
            raise InvalidArgumentError(
                f"{where}: column_defaults has {len(defaults)} entries for {len(select)} columns "
                "read; give one per (selected) column.")
    else:
        defaults = []
        for i in select:
            seen = [r[i] for r in data_rows if i < len(r) and r[i] not in ("", na_value)]
            dtype = _infer(seen)
            defaults.append([""] if dtype == "string" else np.zeros(1, _DTYPES[dtype]))
    selected_names = [column_names[i] for i in select]
    if label_name is not None and label_name not in selected_names:
        raise InvalidArgumentError(f"{where}: label_name {label_name!r} is not among the columns "
                                   f"read: {selected_names}.")

    def read_file(path: Any) -> Dataset:
        return CsvDataset(path, defaults, compression_type, header=header, field_delim=field_delim,
                          use_quote_delim=use_quote_delim, na_value=na_value,
                          select_cols=select if select != list(range(len(column_names))) else None,
                          _skip_bad_rows=ignore_errors)

    shuffle = flag(f"{where}: shuffle", shuffle)
    files = Dataset.list_files(file_pattern, shuffle=shuffle, seed=shuffle_seed)
    cycle = 1 if num_parallel_reads is None else num_parallel_reads
    dataset = files.interleave(read_file, cycle_length=cycle)
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer_size, seed=shuffle_seed)
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    dataset = dataset.batch(batch_size, drop_remainder=num_epochs is None)

    def to_dict(*columns: Any) -> Any:
        features = OrderedDict(zip(selected_names, columns))
        if label_name is None:
            return features
        label = features.pop(label_name)
        return features, label

    dataset = dataset.map(to_dict)
    return dataset.prefetch(AUTOTUNE if prefetch_buffer_size is None else prefetch_buffer_size)


def _head_rows(probe: CsvDataset, path: str, rows: int) -> list[list[str]]:
    with probe._stream(path) as f:
        return [fields for fields, _ in itertools.islice(probe._python_rows(path, f, False), rows)]

