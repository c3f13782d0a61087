"""TFRecord files without TensorFlow: the framing, ``TFRecordWriter`` and ``TFRecordOptions``.

A TFRecord file is a sequence of records, each framed as (little-endian)::

    uint64 length
    uint32 masked_crc32c(length)      # of the 8 length bytes
    byte   data[length]
    uint32 masked_crc32c(data)

where ``masked_crc32c(x) = ((c >> 15 | c << 17) + 0xA282EAD8) mod 2**32`` and ``c`` is the
CRC-32C (Castagnoli) of ``x``. A whole file may be GZIP- or ZLIB-compressed
(``compression_type``). The CRC comes from ``google-crc32c`` (Apache-2.0, hardware CRC32C
instructions: about 12 GB/s here); the framing is a few struct calls per record.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import IO, Any

import google_crc32c

from mpidist.errors import DataLossError, InvalidArgumentError

__all__ = ["TFRecordWriter", "TFRecordOptions", "TFRecordCompressionType", "crc32c",
           "masked_crc32c", "frame_record", "records_of"]

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")   # masked CRC of the data
_LENGTH = struct.Struct("<Q")
COMPRESSION_TYPES = (None, "", "GZIP", "ZLIB")


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC-32C (Castagnoli) of ``data``."""
    return int(google_crc32c.value(data))


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC-32C of ``data``: the CRC rotated right by 15 bits plus
    0xA282EAD8, modulo 2**32."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One record as it lies in a TFRecord file: header, data, footer."""
    length = _LENGTH.pack(len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + \
        _FOOTER.pack(masked_crc32c(data))


class TFRecordCompressionType:
    """``tf.io.TFRecordCompressionType``'s values (TF's names)."""

    NONE = 0
    ZLIB = 1
    GZIP = 2


_BY_ENUM = {0: "", 1: "ZLIB", 2: "GZIP"}


class TFRecordOptions:
    """``tf.io.TFRecordOptions``: how a TFRecord file is compressed. ``compression_type``:
    None, "" (none), "ZLIB", "GZIP" or a ``TFRecordCompressionType`` value;
    ``compression_level``: 0-9 (None: zlib's default, 6). TF's other fields (buffer sizes,
    zlib strategy) are accepted and do not change the bytes' meaning."""

    def __init__(self, compression_type: str | int | None = None, flush_mode: int | None = None,
                 input_buffer_size: int | None = None, output_buffer_size: int | None = None,
                 window_bits: int | None = None, compression_level: int | None = None,
                 compression_method: int | None = None, mem_level: int | None = None,
                 compression_strategy: int | None = None) -> None:
        self.compression_type = compression_name("TFRecordOptions", compression_type)
        if compression_level is not None and (
                isinstance(compression_level, bool) or not isinstance(compression_level, int)
                or not -1 <= compression_level <= 9):
            raise InvalidArgumentError(
                f"TFRecordOptions: compression_level must be an int from 0 to 9 (or -1 / None: "
                f"the default), got {compression_level!r}.")
        self.compression_level = -1 if compression_level is None else compression_level

    @classmethod
    def get_compression_type_string(cls, options: TFRecordOptions | str | int | None) -> str:
        """TF's helper: the compression type string ("", "ZLIB" or "GZIP") of ``options``."""
        if isinstance(options, TFRecordOptions):
            return options.compression_type
        return compression_name("TFRecordOptions", options)


def compression_name(where: str, value: object) -> str:
    """"" / "ZLIB" / "GZIP" from a compression_type as TF takes it."""
    if isinstance(value, int) and not isinstance(value, bool) and value in _BY_ENUM:
        return _BY_ENUM[value]
    if value is None:
        return ""
    if isinstance(value, str) and value in ("", "ZLIB", "GZIP"):
        return value
    raise InvalidArgumentError(
        f"{where}: compression_type must be None, '', 'ZLIB' or 'GZIP' (or a "
        f"TFRecordCompressionType value), got {value!r}.")


class TFRecordWriter:
    """``tf.io.TFRecordWriter``: writes records (bytes) to a TFRecord file at ``path``.
    ``options``: a ``TFRecordOptions``, or a compression type string ("", "ZLIB", "GZIP").
    A context manager; ``write(record)``, ``flush()``, ``close()``."""

    def __init__(self, path: str | os.PathLike[str], options: TFRecordOptions | str | int | None = None
                 ) -> None:
        if not isinstance(options, TFRecordOptions):
            options = TFRecordOptions(compression_type(options))
        self._path = os.fspath(path)
        self._raw: IO[bytes] = open(self._path, "wb")  # noqa: SIM115  # closed by close()
        level = options.compression_level
        self._gzip: gzip.GzipFile | None = None
        self._zlib: Any = None
        if options.compression_type == "GZIP":
            self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb",
                                       compresslevel=9 if level < 0 else level, mtime=0)
        elif options.compression_type == "ZLIB":
            self._zlib = zlib.compressobj(level)
        self._closed = False

    def write(self, record: bytes | bytearray | memoryview | str) -> None:
        """Append one record (bytes; a str is written as its UTF-8 bytes, as TF does)."""
        if self._closed:
            raise ValueError(f"TFRecordWriter: {self._path} is closed; open a new writer.")
        if isinstance(record, str):
            record = record.encode("utf-8")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"TFRecordWriter.write: a record is bytes (e.g. "
                            f"encode_example({{...}})), got {type(record).__name__}.")
        framed = frame_record(bytes(record))
        if self._gzip is not None:
            self._gzip.write(framed)
        elif self._zlib is not None:
            self._raw.write(self._zlib.compress(framed))
        else:
            self._raw.write(framed)

    def flush(self) -> None:
        if self._gzip is not None:
            self._gzip.flush()
        elif self._zlib is not None:
            self._raw.write(self._zlib.flush(zlib.Z_SYNC_FLUSH))
        self._raw.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._gzip is not None:
                self._gzip.close()
            elif self._zlib is not None:
                self._raw.write(self._zlib.flush())
        finally:
            self._raw.close()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def compression_type(value: object) -> str:
    return compression_name("TFRecordWriter", value)


def records_of(chunks: Iterable[bytes], path: str, reader: str = "TFRecordDataset",
               compressed: bool = False) -> Iterator[list[bytes]]:
    """The records of a TFRecord stream given as ``chunks`` of bytes (decompressed), in lists
    of records as they complete. Every CRC is checked; a bad CRC or a stream that ends inside
    a record is DataLossError naming ``path`` and the record's byte offset."""
    buf = b""
    pos = 0       # where in buf the next record starts
    offset = 0    # the stream offset of buf[0]
    where = " of the decompressed data" if compressed else ""
    header, footer = _HEADER.size, _FOOTER.size
    unpack_header = _HEADER.unpack_from
    unpack_footer = _FOOTER.unpack_from
    value = google_crc32c.value
    pending: list[bytes] = []  # chunks held back until a large record is whole
    need = 0  # bytes still missing from the record at buf[pos:]
    for chunk in chunks:
        if need > len(chunk):  # joined once when whole, not once per chunk
            pending.append(chunk)
            need -= len(chunk)
            continue
        if pending:
            chunk = b"".join(pending) + chunk
            pending = []
        need = 0
        buf = buf[pos:] + chunk if pos < len(buf) else chunk
        offset += pos
        pos = 0
        n = len(buf)
        out = []
        while n - pos >= header:
            length, length_crc = unpack_header(buf, pos)
            crc = value(buf[pos:pos + 8])
            if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                raise DataLossError(
                    f"{reader}: {path} is corrupted: the length of the record at byte offset "
                    f"{offset + pos}{where} fails its CRC check. Re-copy or re-write the file.")
            end = pos + header + length
            if end + footer > n:
                need = end + footer - n
                break
            data = buf[pos + header:end]
            crc = value(data)
            if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF != unpack_footer(buf, end)[0]:
                raise DataLossError(
                    f"{reader}: {path} is corrupted: the data of the record at byte offset "
                    f"{offset + pos}{where} ({length} bytes) fails its CRC check. Re-copy or "
                    "re-write the file.")
            out.append(data)
            pos = end + footer
        if out:
            yield out
    if pending:
        buf = buf[pos:] + b"".join(pending)
        offset += pos
        pos = 0
    if pos < len(buf):
        rest = len(buf) - pos
        if rest < header:
            why = f"{rest} bytes, too few for a record header ({header} bytes)"
        else:
            length = _LENGTH.unpack_from(buf, pos)[0]
            why = (f"a record of {length} data bytes, {header + length + footer} bytes framed, "
                   f"of which the file holds {rest}")
        raise DataLossError(
            f"{reader}: {path} is truncated: it ends at byte offset {offset + len(buf)}{where} "
            f"inside the record starting at byte offset {offset + pos} ({why}). Re-copy or "
            "re-write the file.")
