"""The on-disk format of ``Dataset.save`` / ``Dataset.load``: a directory of shard files plus a
JSON metadata file holding the element spec.

Layout of a saved dataset at ``path``::

    path/mpidist-dataset.json   format name and version, element spec, shards, row counts
    path/shard-00000.<token>.mpds   one file per shard id that received at least one element
    ...

A shard file is self-describing, so a reader given only its name (FILE auto-sharding splits
the shard files across workers) knows its spec and row count::

    file header   "<8sIQQQII": MAGIC, format version, rows, blocks, file bytes, spec JSON
                  length, CRC-32 of the header's other fields and the spec JSON
    spec JSON     the element spec (``spec_to_json``) and the shard id
    blocks        each "<4sIQQI": BLOCK_MAGIC, table length, rows, payload length, CRC-32 of
                  table + payload; the table (JSON: each leaf's dtype and shape, leading
                  dimension = rows); the payload (each leaf's C-order bytes, 64-byte aligned)

Consecutive elements of a shard whose leaves have equal shapes and dtypes (strings of any
length alike: a block holds the longest) are stacked into one block of at most ``block_rows``
rows and about ``block_bytes`` bytes, so reading streams block by block and elements whose
shapes vary keep their shapes. The file header's rows and byte count are written last; a
reader compares them with the file's size before yielding a row, so a truncated file is a
DataLossError up front, and every block is checked (magic, sizes, CRC) as it is read.

Each save writes its own shard files (``shard-NNNNN.<writer token>.mpds``) beside the published
ones and fsyncs them; renaming the new metadata file over the old one publishes them in one
step (``mpidist.core.durable``), and only then are the replaced shards deleted. The metadata
also lists what it replaced, so a save killed before deleting them leaves that work to the
next. A kill at any moment leaves the last published dataset whole at ``path``; several
savers to one path each publish a whole copy. Nothing is pickled
and loading imports nothing: a namedtuple is found by its class path among the modules already
imported, else rebuilt as a namedtuple of the same name and fields.

This module knows nothing of ``Dataset`` (which builds ``save`` / ``load`` on it). The element spec's JSON
and its checks are in ``mpidist.data.saved_spec``, re-exported here.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, NamedTuple

import numpy as np

from mpidist.core import nest
from mpidist.core.durable import (
    StagedFile,
    dead_writer,
    fsync_directory,
    make_directories,
    named_error,
    open_staged,
    remove_file,
    write_file,
    writer_token,
)
from mpidist.data.saved_spec import DTYPE_KINDS, check_load_spec, leaf_fits, spec_from_json, spec_to_json
from mpidist.data.spec import TensorSpec
from mpidist.errors import DataLossError, InvalidArgumentError, NotFoundError

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "METADATA_FILE", "SHARD_SUFFIX", "DEFAULT_NUM_SHARDS",
    "DEFAULT_BLOCK_ROWS", "DEFAULT_BLOCK_BYTES", "SavedDataset", "ShardInfo", "ShardHeader",
    "spec_to_json", "spec_from_json", "write_dataset", "read_metadata", "read_shard_header",
    "read_shard_blocks", "is_saved_dataset", "check_load_spec",
]

FORMAT_NAME = "mpidist-saved-dataset"
FORMAT_VERSION = 1
METADATA_FILE = "mpidist-dataset.json"
SHARD_SUFFIX = ".mpds"
# TF's default shard_func is round-robin over its CPU budget; a fixed count instead, so the
# files (and FILE auto-sharding of them) do not depend on the machine that saved.
DEFAULT_NUM_SHARDS = 8
DEFAULT_BLOCK_ROWS = 65536
DEFAULT_BLOCK_BYTES = 4 << 20

MAGIC = b"\x93MPDS\r\n\x1a"  # binary-only bytes: a text-mode copy or a wrong file fails here
BLOCK_MAGIC = b"MPDB"
_FILE_HEAD = struct.Struct("<8sIQQQII")
_BLOCK_HEAD = struct.Struct("<4sIQQI")
_ALIGN = 64
_MAX_JSON = 64 << 20  # a larger header or table length is corruption, not data
_MAX_OPEN_FILES = 64  # shard files kept open at once while writing; others are reopened
# Another host's unpublished shards untouched this long are a killed save's: deleted.
_ABANDONED_SECONDS = 24 * 3600.0
_SHARD_NAME = re.compile(r"shard-[0-9]{5,}\.(.+)\.mpds")

# Pending rows of all shards together are flushed, largest first, above this many blocks.
_PENDING_BLOCKS = 16


# -- writing --------------------------------------------------------------------------------

def _shard_file(shard_id: int, token: str) -> str:
    """The file of shard ``shard_id`` written by the save ``token`` (its writer token): every
    save writes new files, which its metadata names once they are complete."""
    return f"shard-{shard_id:05d}.{token}{SHARD_SUFFIX}"


def _widen(dtype: np.dtype, other: np.dtype) -> np.dtype:
    """The dtype that holds rows of both: the longer of two string dtypes, else ``dtype``."""
    return other if dtype.kind in "US" and other.itemsize > dtype.itemsize else dtype


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _ShardWriter:
    """One shard file being written: rows buffered into a block until it is full or the next
    rows have other shapes, then written with its table and CRC."""

    def __init__(self, shard_id: int, path: str, spec_json: Any, block_rows: int,
                 block_bytes: int) -> None:
        self.shard_id, self.path = shard_id, path
        self.block_rows, self.block_bytes = block_rows, block_bytes
        self.rows = self.blocks = 0
        self.bytes = 0  # bytes written so far (the file's size once closed)
        self._buf: list[np.ndarray] | None = None  # pending block, capacity rows allocated
        self._n = 0  # rows pending in _buf
        self._cap = 0  # rows the pending block may reach
        self._file: StagedFile | None = None
        spec_bytes = json.dumps({"element_spec": spec_json, "shard": shard_id},
                                separators=(",", ":")).encode()
        self._spec_bytes = spec_bytes
        f = open_staged(path, "xb")
        try:
            self._write_head(f)
            f.write(spec_bytes)
            f.close()
        except BaseException:
            f.discard()
            with contextlib.suppress(OSError):  # not yet known to the save that cleans up
                os.unlink(path)
            raise
        self.bytes = _FILE_HEAD.size + len(spec_bytes)

    def _write_head(self, f: StagedFile) -> None:
        fields = (MAGIC, FORMAT_VERSION, self.rows, self.blocks, self.bytes,
                  len(self._spec_bytes))
        f.write(_FILE_HEAD.pack(*fields, _header_crc(fields, self._spec_bytes)))

    @property
    def pending_bytes(self) -> int:
        return 0 if self._buf is None else sum(a[:self._n].nbytes for a in self._buf)

    def add(self, leaves: list[np.ndarray], open_files: collections.OrderedDict[int, Any]
            ) -> None:
        """Append rows (each leaf has the same leading dimension) to this shard."""
        n, start = len(leaves[0]), 0
        while start < n:
            if self._buf is not None and not self._fits(leaves):
                self.flush(open_files)
            if self._buf is None:
                self._start_block(leaves)
            assert self._buf is not None
            k = min(n - start, self._cap - self._n)
            if self._n + k > len(self._buf[0]):  # grow geometrically up to the block's capacity
                grown = min(self._cap, max(self._n + k, 2 * len(self._buf[0])))
                self._buf = [_resized(a, grown, self._n) for a in self._buf]
            for i, leaf in enumerate(leaves):
                if leaf.dtype.itemsize > self._buf[i].dtype.itemsize:  # a longer string
                    self._buf[i] = _resized(self._buf[i], len(self._buf[i]), self._n,
                                            leaf.dtype)
                self._buf[i][self._n:self._n + k] = leaf[start:start + k]
            self._n += k
            start += k
            if self._n >= self._cap:
                self.flush(open_files)

    def _fits(self, leaves: list[np.ndarray]) -> bool:
        assert self._buf is not None
        return all(a.shape[1:] == b.shape[1:] and (a.dtype == b.dtype or (
            a.dtype.kind == b.dtype.kind and a.dtype.kind in "US"))
            for a, b in zip(self._buf, leaves))

    def _start_block(self, leaves: list[np.ndarray]) -> None:
        row_bytes = sum(leaf[:1].nbytes for leaf in leaves) if len(leaves[0]) else 0
        self._cap = max(1, min(self.block_rows, self.block_bytes // max(1, row_bytes)))
        first = min(self._cap, max(len(leaves[0]), 64))
        self._buf = [np.empty((first,) + leaf.shape[1:], leaf.dtype) for leaf in leaves]
        self._n = 0

    def flush(self, open_files: collections.OrderedDict[int, Any]) -> None:
        """Write the pending block, if any."""
        if self._buf is None:
            return
        leaves = [np.ascontiguousarray(a[:self._n]) for a in self._buf]
        self._buf, rows = None, self._n
        self._n = 0
        table = json.dumps([[a.dtype.str, list(a.shape)] for a in leaves],
                           separators=(",", ":")).encode()
        sizes = [a.nbytes for a in leaves]
        payload = sum(_aligned(s) for s in sizes[:-1]) + sizes[-1]
        crc = zlib.crc32(table)
        views = [a.reshape(-1).view(np.uint8).data for a in leaves]
        for i, v in enumerate(views):
            crc = zlib.crc32(v, crc)
            if i < len(views) - 1:
                crc = zlib.crc32(bytes(_aligned(sizes[i]) - sizes[i]), crc)
        f = self._open(open_files)
        f.write(_BLOCK_HEAD.pack(BLOCK_MAGIC, len(table), rows, payload, crc))
        f.write(table)
        for i, v in enumerate(views):
            f.write(v)
            if i < len(views) - 1:
                f.write(bytes(_aligned(sizes[i]) - sizes[i]))
        self.rows += rows
        self.blocks += 1
        self.bytes += _BLOCK_HEAD.size + len(table) + payload

    def _open(self, open_files: collections.OrderedDict[int, Any]) -> StagedFile:
        if self._file is None:
            while len(open_files) >= _MAX_OPEN_FILES:
                _, other = open_files.popitem(last=False)
                other.close_file()
            self._file = open_staged(self.path, "ab")  # open across blocks, closed in finish
            open_files[self.shard_id] = self
        open_files.move_to_end(self.shard_id)
        return self._file

    def close_file(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            f.close()

    def discard(self) -> None:
        """Close without raising (after a failure: the file is deleted next)."""
        if self._file is not None:
            self._file.discard()
            self._file = None

    def finish(self, open_files: collections.OrderedDict[int, Any]) -> None:
        """Flush, write the final header (rows, blocks, size), fsync and close."""
        self.flush(open_files)
        self.close_file()
        open_files.pop(self.shard_id, None)
        f = open_staged(self.path, "r+b")
        try:
            self._write_head(f)
            f.sync()
            f.close()
        finally:
            f.discard()


def _header_crc(fields: tuple[Any, ...], spec_bytes: bytes) -> int:
    return zlib.crc32(spec_bytes, zlib.crc32(_FILE_HEAD.pack(*fields, 0)))


def _resized(a: np.ndarray, rows: int, keep: int, dtype: np.dtype | None = None) -> np.ndarray:
    out = np.empty((rows,) + a.shape[1:], a.dtype if dtype is None else dtype)
    out[:keep] = a[:keep]
    return out


def _shard_id(value: Any, index: int) -> int:
    ok = (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu")
    if ok:
        shard = int(value)
        if 0 <= shard < 2**63:
            return shard
    raise InvalidArgumentError(
        f"Dataset.save: shard_func returned {value!r:.80} ({type(value).__name__}) for element "
        f"{index}; it must return an int shard id >= 0 (a Python or NumPy integer below 2**63), "
        "e.g. `int(label) % 4`.")


def _check_path(path: str) -> bool:
    """Whether ``path`` holds a published dataset (which a save replaces); False where there
    is nothing, an empty directory, or what a save killed before publishing left.
    InvalidArgumentError if it holds anything else."""
    if not os.path.lexists(path):
        return False
    if not os.path.isdir(path) or os.path.islink(path):
        raise InvalidArgumentError(
            f"Dataset.save: path={path!r} exists and is not a directory. Remove it or save to "
            "another path.")
    if is_saved_dataset(path):
        return True
    if all(_shard_token(n) is not None or n.startswith(f".{METADATA_FILE}.tmp-")
           for n in os.listdir(path)):  # empty, or what a save killed before publishing left
        return False
    raise InvalidArgumentError(
        f"Dataset.save: path={path!r} is a non-empty directory that is not a saved dataset "
        f"(it has no valid {METADATA_FILE}); Dataset.save replaces only a dataset it saved "
        "and never deletes other files. Save to a new or empty directory.")


def _structured_leaves(value: Any, spec: Any, what: str) -> list[np.ndarray]:
    """``value``'s leaves as arrays, if it has the element spec's structure."""
    try:
        nest.assert_same_structure(value, spec)
    except (ValueError, TypeError) as e:
        raise InvalidArgumentError(
            f"Dataset.save: {what} does not have the element spec's structure "
            f"{spec!r:.200}: {e}") from None
    return [np.asarray(x) for x in nest.flatten(value)]


def _as_leaves(element: Any, spec: Any, flat_spec: list[TensorSpec], index: int
               ) -> list[np.ndarray]:
    leaves = _structured_leaves(element, spec, f"element {index}")
    for leaf, s in zip(leaves, flat_spec):
        if not leaf_fits(s, leaf.dtype, leaf.shape):
            raise InvalidArgumentError(
                f"Dataset.save: element {index} has a leaf of dtype {leaf.dtype} and shape "
                f"{leaf.shape}, which does not fit its spec {s}.")
    return leaves


_Pieces = Iterator[tuple[int, list[np.ndarray]]]


def _element_pieces(elements: Iterable[Any], spec: Any, flat_spec: list[TensorSpec],
                    shard_of: Callable[[int, Any], Any] | None, num_shards: int) -> _Pieces:
    """(shard id, leaves with a leading dimension of 1) for each element."""
    for index, element in enumerate(elements):
        leaves = _as_leaves(element, spec, flat_spec, index)
        shard = index % num_shards if shard_of is None else _shard_id(
            shard_of(index, element), index)
        yield shard, [leaf[None] for leaf in leaves]


def _block_pieces(blocks: Iterable[Any], spec: Any, flat_spec: list[TensorSpec],
                  shard_of: Callable[[int, Any], Any] | None, num_shards: int) -> _Pieces:
    """(shard id, leaves) for the rows of each block that go to one shard."""
    index = 0
    for block in blocks:
        leaves = _structured_leaves(block, spec, f"the block of elements {index}..")
        n = len(leaves[0]) if leaves[0].ndim else -1
        for leaf, s in zip(leaves, flat_spec):
            if leaf.ndim == 0 or len(leaf) != n or not leaf_fits(s, leaf.dtype, leaf.shape[1:]):
                raise InvalidArgumentError(
                    f"Dataset.save: the block of elements {index}.. has a leaf of dtype "
                    f"{leaf.dtype} and shape {leaf.shape}, which is not {max(n, 0)} rows of "
                    f"its spec {s}.")
        if shard_of is None:
            for k in range(min(n, num_shards)):
                yield (index + k) % num_shards, [leaf[k::num_shards] for leaf in leaves]
        else:
            for j in range(n):
                row = nest.pack_sequence_as(spec, [leaf[j] for leaf in leaves])
                shard = _shard_id(shard_of(index + j, row), index + j)
                yield shard, [leaf[j:j + 1] for leaf in leaves]
        index += max(n, 0)


def write_dataset(elements: Iterable[Any], element_spec: Any, path: str | os.PathLike[str],
                  shard_of: Callable[[int, Any], Any] | None = None, *,
                  num_shards: int = DEFAULT_NUM_SHARDS, block_rows: int = DEFAULT_BLOCK_ROWS,
                  block_bytes: int = DEFAULT_BLOCK_BYTES, blocks: bool = False
                  ) -> SavedDataset:
    """Write ``elements`` (nests of arrays in ``element_spec``'s structure) as a saved dataset
    at ``path``, atomically, and return what ``read_metadata`` will say of it. With
    ``blocks=True``, ``elements`` yields blocks instead: nests whose leaves share a leading row
    dimension, each row one element (the fast path: no per-row Python work unless
    ``shard_of`` is given).

    ``shard_of(index, element)`` gives each element's shard id (an int >= 0); None assigns
    element ``i`` to shard ``i % num_shards`` (TF's round-robin). Only shards that receive an
    element get a file (an empty dataset gets one empty shard 0, so a reader has a file to
    read the spec from). An existing saved dataset or empty directory at ``path`` is
    replaced; anything else there is an error and is left as it was.
    """
    path = os.path.abspath(os.fspath(path))
    for name, value in (("num_shards", num_shards), ("block_rows", block_rows),
                        ("block_bytes", block_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(
                f"write_dataset: {name} must be an int >= 1, got {value!r:.80}.")
    if shard_of is not None and not callable(shard_of):
        raise TypeError(f"Dataset.save: shard_func must be a callable or None, got "
                        f"{type(shard_of).__name__} {shard_of!r:.80}.")
    spec_json = spec_to_json(element_spec)
    flat_spec = nest.flatten(element_spec)
    if not flat_spec:
        raise InvalidArgumentError(
            f"Dataset.save: the element spec {element_spec!r:.80} has no tensors; there is "
            "nothing to save.")
    published = _check_path(path)  # before reading any element: a bad path changes nothing
    what = f"Dataset.save to {path!r}"
    kept = (f"Nothing was published: {path!r} holds the last save, unchanged."
            if published else f"Nothing was published at {path!r}.")
    token = writer_token()  # this save's files: shard-NNNNN.<token>.mpds
    writers: dict[int, _ShardWriter] = {}
    open_files: collections.OrderedDict[int, Any] = collections.OrderedDict()
    created = not os.path.lexists(path)
    try:
        make_directories(path)
        pending_limit = _PENDING_BLOCKS * block_bytes
        pieces = _block_pieces if blocks else _element_pieces
        for count, (shard, leaves) in enumerate(
                pieces(elements, element_spec, flat_spec, shard_of, num_shards)):
            writer = writers.get(shard)
            if writer is None:
                writer = writers[shard] = _ShardWriter(
                    shard, os.path.join(path, _shard_file(shard, token)), spec_json,
                    block_rows, block_bytes)
            writer.add(leaves, open_files)
            if len(writers) > _PENDING_BLOCKS and count % 1024 == 0:
                # many shards each holding a partial block: bound their sum
                while sum(w.pending_bytes for w in writers.values()) > pending_limit:
                    max(writers.values(), key=lambda w: w.pending_bytes).flush(open_files)
        if not writers:
            writers[0] = _ShardWriter(0, os.path.join(path, _shard_file(0, token)), spec_json,
                                      block_rows, block_bytes)
        for writer in writers.values():
            writer.finish(open_files)
        done = sorted(writers.values(), key=lambda w: w.shard_id)
        shards = [{"id": w.shard_id, "file": os.path.basename(w.path), "rows": w.rows,
                   "bytes": w.bytes} for w in done]
        fsync_directory(path)  # the shards' names are on the disk before a pointer names them
        # What this save replaces goes into its metadata: if it is killed before deleting
        # those files, the next save learns them from here and deletes them.
        replaced = _published_files(path)
        metadata = json.dumps({
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "element_spec": spec_json,
            "rows": sum(w.rows for w in done), "shards": shards,
            "replaces": sorted(n for n in replaced if os.path.exists(os.path.join(path, n)))},
            indent=1).encode("utf-8")
        # The one publishing step: the metadata, renamed into place, names the new shards.
        write_file(os.path.join(path, METADATA_FILE), lambda f: f.write(metadata), what)
    except BaseException as exc:
        for writer in writers.values():
            writer.discard()
            with contextlib.suppress(OSError):
                os.unlink(writer.path)
        if created:  # a failed first save leaves no directory (unless another save's files)
            with contextlib.suppress(OSError):
                os.rmdir(path)
        if isinstance(exc, OSError):
            raise named_error(exc, what, kept, "write", path) from None
        raise
    _sweep(path, {os.path.basename(w.path) for w in writers.values()}, replaced)
    # What this save wrote, not a re-read: a concurrent saver to the same path (every rank
    # saving) may publish its own dataset and sweep this one's files meanwhile.
    return SavedDataset(os.path.abspath(path), element_spec,
                        tuple(ShardInfo(w.shard_id, os.path.abspath(w.path), w.rows, w.bytes)
                              for w in done), sum(w.rows for w in done))


def _shard_token(name: str) -> str | None:
    """The writer token of a shard file's name (``shard-NNNNN.<token>.mpds``), else None."""
    match = _SHARD_NAME.fullmatch(name)
    return None if match is None else match.group(1)


def _published_files(path: str) -> set[str]:
    """The shard files that the metadata at ``path`` names now, and those it says it replaced
    (its save may have been killed before deleting them): none without a valid metadata."""
    try:
        with open(os.path.join(path, METADATA_FILE), encoding="utf-8") as f:
            data = json.load(f)
        named = {os.path.basename(s["file"]) for s in data["shards"]}
        return named | {os.path.basename(n) for n in data.get("replaces", [])} - named
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def _sweep(path: str, ours: set[str], replaced: set[str]) -> None:
    """After publishing: delete the shards of the copy this save replaced and those that
    killed writers left (of this host: their process is gone; of another host: none of their
    files changed for ``_ABANDONED_SECONDS``). Shards of a writer still alive are another save
    running now: left alone, and named in a warning."""
    by_token: dict[str, list[str]] = collections.defaultdict(list)
    for name in sorted(os.listdir(path)):
        token = _shard_token(name)
        if token is not None and name not in ours:
            by_token[token].append(name)
    now = time.time()
    others: list[str] = []
    for token, names in by_token.items():
        doomed = [n for n in names if n in replaced]
        if dead_writer(token) or _untouched_since(path, names, now - _ABANDONED_SECONDS):
            doomed = names
        else:
            others += [] if len(doomed) == len(names) else [token]
        for name in doomed:
            try:
                remove_file(os.path.join(path, name))
            except OSError as exc:  # the new copy is published: only space is lost
                warnings.warn(f"Dataset.save: could not delete {name!r}, a shard of an older "
                              f"copy in {path!r} ({exc.strerror}); delete it by hand.",
                              RuntimeWarning, stacklevel=4)
    if others:
        warnings.warn(
            f"Dataset.save: {path!r} also holds shards of {len(others)} other save(s) running "
            f"now ({', '.join(sorted(others))}: host-pid-id). Each save publishes a complete "
            f"dataset and the last to finish is what {path!r} holds. Save from one process "
            "(the chief: strategy.cluster_resolver.task_id == 0), or each worker to its own "
            "path.", RuntimeWarning, stacklevel=4)


def _untouched_since(path: str, names: list[str], cutoff: float) -> bool:
    """Whether none of ``names`` in ``path`` was modified after ``cutoff`` (a save that
    writes keeps some of its files fresh)."""
    try:
        return max(os.stat(os.path.join(path, n)).st_mtime for n in names) < cutoff
    except (OSError, ValueError):
        return False


# -- reading --------------------------------------------------------------------------------

class ShardInfo(NamedTuple):
    id: int
    path: str
    rows: int
    bytes: int


class SavedDataset(NamedTuple):
    """What a saved dataset's metadata says: its directory, element spec, shard files (by id)
    and total row count."""

    path: str
    element_spec: Any
    shards: tuple[ShardInfo, ...]
    rows: int

    @property
    def shard_paths(self) -> tuple[str, ...]:
        return tuple(s.path for s in self.shards)


class ShardHeader(NamedTuple):
    """What a shard file's header says of it."""

    path: str
    element_spec: Any
    shard_id: int
    rows: int
    blocks: int
    bytes: int
    data_offset: int  # where the first block starts


def _not_saved(path: str, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Dataset.load: {path} is not a saved dataset: {what}. Was it written by "
        "Dataset.save? Pass the directory Dataset.save was given.")


def is_saved_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory holding this format's metadata (shards not checked)."""
    try:
        with open(os.path.join(os.fspath(path), METADATA_FILE), encoding="utf-8") as f:
            data = json.load(f)
        return isinstance(data, dict) and data.get("format") == FORMAT_NAME
    except (OSError, ValueError):
        return False


def read_metadata(path: str | os.PathLike[str]) -> SavedDataset:
    """The saved dataset at ``path``: NotFoundError if nothing is there, InvalidArgumentError
    if it is not a saved dataset, DataLossError if a shard file it lists is missing or has
    another size than was written."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise NotFoundError(f"Dataset.load: path {path} does not exist. Pass the directory "
                            "Dataset.save wrote.")
    if not os.path.isdir(path):
        raise _not_saved(path, "it is a file, not a directory")
    meta_path = os.path.join(path, METADATA_FILE)
    try:
        with open(meta_path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise _not_saved(path, f"it has no {METADATA_FILE}") from None
    except (OSError, ValueError) as e:
        raise _not_saved(path, f"its {METADATA_FILE} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise _not_saved(path, f"its {METADATA_FILE} does not name the format {FORMAT_NAME!r}")
    if data.get("version") != FORMAT_VERSION:
        raise _not_saved(
            path, f"it has format version {data.get('version')!r}, this mpidist reads version "
            f"{FORMAT_VERSION} (save it again with this version of mpidist)")
    try:
        spec = spec_from_json(data["element_spec"])
        shards = tuple(ShardInfo(int(s["id"]), os.path.join(path, os.path.basename(s["file"])),
                                 int(s["rows"]), int(s["bytes"])) for s in data["shards"])
        rows = int(data["rows"])
    except (KeyError, TypeError, ValueError) as e:
        raise _not_saved(path, f"its {METADATA_FILE} is malformed ({type(e).__name__}: {e})"
                         ) from None
    if not shards or sum(s.rows for s in shards) != rows:
        raise _not_saved(path, f"its {METADATA_FILE} lists shards of {sum(s.rows for s in shards)} "
                         f"rows in all but says the dataset has {rows}")
    for s in shards:
        try:
            size = os.stat(s.path).st_size
        except FileNotFoundError:
            raise DataLossError(
                f"Dataset.load: shard file {s.path} of the saved dataset {path} is missing "
                f"({s.rows} rows lost). Restore it, or save the dataset again.") from None
        if size != s.bytes:
            raise DataLossError(
                f"Dataset.load: shard file {s.path} has {size} bytes but {s.bytes} were written: "
                f"{'truncated' if size < s.bytes else 'changed'}. Restore it, or save the "
                "dataset again.")
    return SavedDataset(path, spec, shards, rows)


def _data_loss(path: str, what: str) -> DataLossError:
    return DataLossError(f"Dataset.load: shard file {path} is corrupted or truncated: {what}. "
                         "Restore it, or save the dataset again.")


def _read_exact(f: IO[bytes], n: int, path: str, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _data_loss(path, f"the file ends inside {what} ({len(data)} of {n} bytes)")
    return data


def _read_header(f: IO[bytes], path: str) -> ShardHeader:
    head = f.read(_FILE_HEAD.size)
    if len(head) < _FILE_HEAD.size or head[:8] != MAGIC:
        raise _data_loss(path, "it does not start with a shard header")
    *fields, crc = _FILE_HEAD.unpack(head)
    _, version, rows, blocks, size, spec_len = fields
    if spec_len > _MAX_JSON:
        raise _data_loss(path, f"its header claims a {spec_len}-byte spec")
    spec_bytes = _read_exact(f, spec_len, path, "the header")
    if _header_crc(tuple(fields), spec_bytes) != crc:
        raise _data_loss(path, "its header fails its CRC-32 check")
    if version != FORMAT_VERSION:
        raise _data_loss(path, f"it has format version {version}, expected {FORMAT_VERSION}")
    try:
        info = json.loads(spec_bytes)
        spec, shard_id = spec_from_json(info["element_spec"]), int(info["shard"])
    except (KeyError, TypeError, ValueError) as e:
        raise _data_loss(path, f"its header's spec is malformed ({e})") from None
    actual = os.fstat(f.fileno()).st_size
    if actual != size:
        raise _data_loss(path, f"it has {actual} bytes, its header says {size}"
                         + (" (truncated)" if actual < size else ""))
    return ShardHeader(path, spec, shard_id, rows, blocks, size, _FILE_HEAD.size + spec_len)


def read_shard_header(shard_path: str | os.PathLike[str]) -> ShardHeader:
    """A shard file's header (spec, rows, size), checked against the file's size, without
    reading its rows. For FileReader's ``_file_spec`` / ``_file_rows``."""
    path = os.fspath(shard_path)
    try:
        with open(path, "rb") as f:
            return _read_header(f, path)
    except FileNotFoundError:
        raise NotFoundError(f"Dataset.load: shard file {path} does not exist.") from None


def read_shard_blocks(shard_path: str | os.PathLike[str], element_spec: Any = None
                      ) -> Iterator[Any]:
    """The rows of one shard file in blocks: nests in the element structure whose leaves are
    arrays sharing a leading row dimension, as written. ``element_spec`` (default: the
    file's) gives the structure; it must describe the file's elements (``check_load_spec``).
    Any truncation or corruption is a DataLossError naming the file; a file that reads
    cleanly yields exactly the rows its header promises."""
    path = os.fspath(shard_path)
    if not os.path.exists(path):
        raise NotFoundError(f"Dataset.load: shard file {path} does not exist.")
    with open(path, "rb") as f:
        header = _read_header(f, path)
        spec = check_load_spec(element_spec, header.element_spec, path)
        flat_spec = nest.flatten(spec)
        nested = nest.is_nested(spec)
        rows = 0
        for b in range(header.blocks):
            what = f"block {b} of {header.blocks}"
            raw = _read_exact(f, _BLOCK_HEAD.size, path, f"the head of {what}")
            magic, table_len, n, payload_len, crc = _BLOCK_HEAD.unpack(raw)
            if magic != BLOCK_MAGIC or table_len > _MAX_JSON or rows + n > header.rows:
                raise _data_loss(path, f"{what} has a bad head")
            table_bytes = _read_exact(f, table_len, path, f"the table of {what}")
            leaves_meta = _parse_table(table_bytes, n, flat_spec, path, what)
            sizes = [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                     for dtype, shape in leaves_meta]
            if payload_len != sum(_aligned(s) for s in sizes[:-1]) + sizes[-1]:
                raise _data_loss(path, f"{what}'s payload length does not match its table")
            buf = np.empty(payload_len, np.uint8)
            got = f.readinto(buf.data)
            if got != payload_len:
                raise _data_loss(path, f"the file ends inside {what} ({got} of {payload_len} "
                                 "payload bytes)")
            if zlib.crc32(buf.data, zlib.crc32(table_bytes)) != crc:
                raise _data_loss(path, f"{what} fails its CRC-32 check")
            leaves, offset = [], 0
            for (dtype, shape), size in zip(leaves_meta, sizes):
                leaves.append(buf[offset:offset + size].view(dtype).reshape(shape))
                offset += _aligned(size)
            rows += n
            yield nest.pack_sequence_as(spec, leaves) if nested else leaves[0]
        if rows != header.rows or f.read(1):
            raise _data_loss(path, f"it holds {rows} rows in {header.blocks} blocks and then "
                             f"{'more bytes' if rows == header.rows else 'ends'}, its header "
                             f"says {header.rows} rows")


def _parse_table(table_bytes: bytes, rows: int, flat_spec: list[TensorSpec], path: str,
                 what: str) -> list[tuple[np.dtype, tuple[int, ...]]]:
    try:
        table = json.loads(table_bytes)
        out = [(np.dtype(str(d)), tuple(int(x) for x in shape)) for d, shape in table]
    except (TypeError, ValueError) as e:
        raise _data_loss(path, f"{what}'s table is malformed ({e})") from None
    if len(out) != len(flat_spec) or not out:
        raise _data_loss(path, f"{what} has {len(out)} leaves, the spec {len(flat_spec)}")
    for (dtype, shape), s in zip(out, flat_spec):
        if (dtype.kind not in DTYPE_KINDS or not shape or shape[0] != rows
                or min(shape) < 0 or not leaf_fits(s, dtype, shape[1:])):
            raise _data_loss(path, f"{what} has a leaf {dtype}{list(shape)} that does not fit "
                             f"{s} in blocks of {rows} rows")
    return out
