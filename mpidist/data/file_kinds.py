"""What a file holds, told from its first bytes, so that a reader given the wrong kind of file
(or the wrong ``compression_type``) says so, instead of passing it on to a decoder or a
third-party library whose error names neither the file nor the fix ("convert the file to
UTF-8" for a gzip file, "incorrect header check" for a plain one).

``vet_compression`` checks the first bytes of a file against a reader's ``compression_type``
when the file is opened (a few hundred bytes, once per file); ``with_kind_hint`` adds "it looks
like ..." to a reader's error about a file it could not open (only then: no cost otherwise).
"""

from __future__ import annotations

import codecs
import zlib
from collections.abc import Callable
from typing import NamedTuple

from mpidist.errors import DataLossError, InvalidArgumentError

__all__ = ["HEAD_BYTES", "FileKind", "sniff", "read_head", "vet_compression", "with_kind_hint"]

# Bytes read to tell a file's kind: a zlib stream is only believed when this much of it
# inflates (a text file starting "x^" has a zlib header; 512 bytes of text never inflated in
# 20,000 random tries, while 16 bytes did 5% of the time).
HEAD_BYTES = 512


class FileKind(NamedTuple):
    name: str  # "GZIP", the compression_type value where a reader takes one
    looks: str  # "looks GZIP-compressed"
    evidence: str  # "it starts with the gzip magic bytes 1f 8b"
    fix: str  # what to do where a reader cannot read this kind
    reader: str = ""  # the mpidist reader of this kind of file, if one
    text_like: bool = False  # its magic is plain ASCII, so a text file may start with it


def _zlib(head: bytes, whole: bool) -> bool:
    """A zlib stream (RFC 1950): a valid header whose data inflates; to its end if ``head``
    is the whole file."""
    if len(head) < 2 or head[0] & 0x0F != 8 or head[0] >> 4 > 7 or head[1] & 0x20 \
            or (head[0] << 8 | head[1]) % 31:
        return False
    inflate = zlib.decompressobj()
    try:
        inflate.decompress(head)
    except zlib.error:
        return False
    return inflate.eof or not whole


def _starts(magic: bytes) -> Callable[[bytes, bool], bool]:
    return lambda head, whole: head.startswith(magic)


def _bzip2(head: bytes, whole: bool) -> bool:  # "BZh", a block size digit, a block or end magic
    return head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] in (
        b"1AY&SY", b"\x17rE8P\x90")


def _zip(head: bytes, whole: bool) -> bool:  # a local file header, or an empty archive's end
    return head[:4] in (b"PK\x03\x04", b"PK\x05\x06")


def _zlib_kind(head: bytes) -> FileKind:
    return FileKind("ZLIB", "looks ZLIB-compressed",
                    f"it starts with the zlib header {head[:2].hex(' ')}",
                    "decompress it first (Python's zlib.decompress)")


_GZIP = FileKind("GZIP", "looks GZIP-compressed", "it starts with the gzip magic bytes 1f 8b",
                 "decompress it first (gunzip)")
_BZIP2 = FileKind("BZIP2", "looks BZIP2-compressed", "it starts with the bzip2 magic bytes 'BZh'",
                  "decompress it first (bunzip2)")
_XZ = FileKind("XZ", "looks XZ-compressed", "it starts with the xz magic bytes fd 37 7a 58 5a 00",
               "decompress it first (unxz)")
_ZSTD = FileKind("ZSTD", "looks Zstandard-compressed",
                 "it starts with the zstd magic bytes 28 b5 2f fd", "decompress it first (unzstd)")
_NPY = FileKind("NPY", "looks like a NumPy .npy file", "it starts with the .npy magic \\x93NUMPY",
                "read it with NpyDataset", "NpyDataset")
_ZIP = FileKind("ZIP", "looks like a zip archive (.npz files are zip archives)",
                "it starts with the zip magic bytes 'PK\\x03\\x04'",
                "read a .npz with NpzDataset, or unzip it first", "NpzDataset")
_HDF5 = FileKind("HDF5", "looks like an HDF5 file", "it starts with the HDF5 signature \\x89HDF",
                 "read it with HDF5Dataset", "HDF5Dataset")
_PARQUET = FileKind("PARQUET", "looks like a Parquet file",
                    "it starts with the Parquet magic bytes 'PAR1'", "read it with ParquetDataset",
                    "ParquetDataset", text_like=True)

# (test of the first bytes, kind or a function of the first bytes giving it), first match wins.
_KINDS: list[tuple[Callable[[bytes, bool], bool], FileKind | Callable[[bytes], FileKind]]] = [
    (_starts(b"\x1f\x8b"), _GZIP),
    (_zlib, _zlib_kind),
    (_bzip2, _BZIP2),
    (_starts(b"\xfd7zXZ\x00"), _XZ),
    (_starts(b"\x28\xb5\x2f\xfd"), _ZSTD),
    (_starts(b"\x93NUMPY"), _NPY),
    (_zip, _ZIP),
    (_starts(b"\x89HDF\r\n\x1a\n"), _HDF5),
    (_starts(b"PAR1"), _PARQUET),
]


def sniff(head: bytes, whole: bool = False) -> FileKind | None:
    """The kind of file whose first bytes are ``head`` (``whole``: the file is no longer), or
    None where no known magic matches (plain text, or a kind not listed)."""
    for matches, kind in _KINDS:
        if matches(head, whole):
            return kind if isinstance(kind, FileKind) else kind(head)
    return None


def read_head(path: str) -> tuple[bytes, bool]:
    """``path``'s first HEAD_BYTES bytes and whether that is the whole file (b"", True if it
    cannot be read: the caller's own error says why)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return b"", True
    return head, len(head) < HEAD_BYTES


def _is_text(head: bytes) -> bool:
    try:  # not final: the head may end inside a character
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def vet_compression(reader: str, path: str, compression: str | None, given: object,
                    readable: tuple[str, ...], head: bytes, whole: bool) -> None:
    """Raise if the first bytes ``head`` of ``path`` contradict ``compression`` (None: plain;
    ``given``: the argument as the user wrote it). ``readable``: the compression_type values
    ``reader`` takes. An empty file is no evidence either way."""
    if not head:
        return
    if compression is None:
        kind = sniff(head, whole)  # a whole short file must inflate to its end: tiny texts may not
        if kind is None or kind.text_like:
            return
        if kind.name in readable:
            raise InvalidArgumentError(
                f"{reader}: {path} {kind.looks} ({kind.evidence}) but compression_type is "
                f"{given!r}: pass compression_type={kind.name!r}.")
        raise InvalidArgumentError(
            f"{reader}: {path} {kind.looks} ({kind.evidence}), which is not text {reader} "
            f"reads (plain, or compression_type {' / '.join(map(repr, readable))}): {kind.fix}.")
    kind = sniff(head)  # not whole: a truncated stream is DataLossError "not complete" later
    if kind is not None and kind.name == compression:
        return
    expected = "start with the gzip magic bytes 1f 8b" if compression == "GZIP" else \
        "start with a zlib header (e.g. 78 9c) whose data inflates"
    if kind is not None:
        found = f"it {kind.looks} ({kind.evidence}): " + (
            f"pass compression_type={kind.name!r}" if kind.name in readable else kind.fix)
    elif _is_text(head):
        found = f"it looks like plain text ({head[:16]!r}...): pass compression_type=None"
    else:
        found = f"it starts with {head[:8].hex(' ')}: check that it is the file meant"
    # TF's class for a compressed stream it cannot inflate: DataLossError.
    raise DataLossError(f"{reader}: {path} is not {compression} data (compression_type="
                        f"{given!r}): it does not {expected}; {found}.")


def with_kind_hint(error: Exception, path: str, reader: str) -> Exception:
    """``error`` (a reader's: ``path`` could not be opened as its format) with "It looks
    like ..." added where ``path``'s first bytes say what it is instead; else ``error``."""
    kind = sniff(*read_head(path))
    if kind is None or kind.reader == reader:  # unknown, or the reader's own kind: damaged
        return error
    return type(error)(f"{error} It {kind.looks} ({kind.evidence}): {kind.fix}.")
