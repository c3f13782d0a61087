"""``TFRecordDataset``: the records of TFRecord files (``mpidist.io.tfrecord`` has the format,
``mpidist.io`` the ``tf.train.Example`` parsing)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from mpidist.data.readers import StreamFileReader, decompressed_chunks
from mpidist.data.spec import TensorSpec

if TYPE_CHECKING:
    from mpidist.data.file_reader import BlockSizes
    from mpidist.data.element import Block, Structure

__all__ = ["TFRecordDataset"]

_BLOCK_RECORDS = 4096    # records per block at most (and about BLOCK_BYTES of them)
_BLOCK_BYTES = 1 << 20


class TFRecordDataset(StreamFileReader):
    """``tf.data.TFRecordDataset``: one element per record of the TFRecord files, in order.

    An element is the record's bytes, exactly, as a 0-d NumPy object array holding a Python
    ``bytes`` (TF: a tf.string scalar; NumPy's ``S`` dtype would drop trailing NUL bytes, which
    serialized protos often end with); batches are 1-d object arrays of bytes. ``x.item()``
    is the bytes; ``mpidist.io.parse_single_example`` / ``parse_example`` take them as they
    are. ``compression_type``: None or "" (plain), "GZIP" or "ZLIB"; a file whose first bytes
    contradict it is an error saying which to pass. ``buffer_size``: bytes read at a time
    (None or 0: 256 KiB). ``num_parallel_reads``: N > 1 (or AUTOTUNE) reads N files at a time,
    their records interleaved one each (``interleave(cycle_length=N)``, deterministic order).
    Every record's two CRCs are checked: a corrupted or truncated record is ``DataLossError``
    naming the file and the record's byte offset.
    """

    reader = "TFRecordDataset"

    def _spec_args(self) -> Hashable:
        return ()  # one bytes scalar per record, whatever the options

    def _file_spec(self, path: str) -> Structure:
        return TensorSpec((), np.dtype(object))

    # sizes: records vary, blocks are by bytes and count
    def _file_blocks(self, path: str, sizes: BlockSizes) -> Iterator[Block]:
        # imported here: mpidist.io brings protobuf, which `import mpidist` need not load
        from mpidist.io.tfrecord import records_of  # noqa: PLC0415

        chunks = decompressed_chunks(self.reader, path, self._compression, self._compression_arg,
                                     self._chunk)
        held: list[bytes] = []
        held_bytes = 0
        for records in records_of(chunks, path, self.reader, self._compression is not None):
            held.extend(records)
            held_bytes += sum(map(len, records))
            if len(held) >= _BLOCK_RECORDS or held_bytes >= _BLOCK_BYTES:
                yield _object_block(held)
                held, held_bytes = [], 0
        if held:
            yield _object_block(held)


def _object_block(records: list[bytes]) -> np.ndarray:
    block = np.empty(len(records), dtype=object)
    block[:] = records
    return block
