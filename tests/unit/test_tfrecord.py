"""TFRecord files (mpidist.io.tfrecord, mpidist.data.TFRecordDataset): the framing against the
format's specification computed here by hand (an independent bitwise CRC-32C checked against
its published test vectors) and against bytes TensorFlow wrote; round trips in every
compression; corrupted and truncated files are DataLossError naming the file and the offset;
FILE auto-sharding splits a list of TFRecord files by file."""

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpidist.data import Dataset, TFRecordDataset
from mpidist.data.dataset import file_shard_units, find_file_reader
from mpidist.errors import DataLossError, InvalidArgumentError
from mpidist.io import TFRecordOptions, TFRecordWriter, encode_example
from mpidist.io.tfrecord import crc32c, frame_record, masked_crc32c


def crc32c_bitwise(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def framed_by_hand(data):
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(crc32c_bitwise(length))) + data
            + struct.pack("<I", masked(crc32c_bitwise(data))))


# (data, CRC-32C): the check value of the CRC catalogue and RFC 3720's (iSCSI) vectors
VECTORS = [(b"", 0x00000000), (b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA),
           (b"\xff" * 32, 0x62A8AB43), (bytes(range(32)), 0x46DD794E),
           (bytes(range(31, -1, -1)), 0x113FDB5C)]

# Written by TensorFlow 2.21 (tf.io.TFRecordWriter): an empty record, then the Example
# {"a": int64_list [0]}, whose serialization ends with a NUL byte.
TF_GOLDEN = bytes.fromhex("000000000000000029039807d8ea82a20e00000000000000c5e5693f"
                          "0a0c0a0a0a016112051a030a01008e04754e")
TF_GOLDEN_RECORDS = [b"", bytes.fromhex("0a0c0a0a0a016112051a030a0100")]


def write(path, records, compression=None):
    with TFRecordWriter(str(path), compression) as w:
        for r in records:
            w.write(r)
    return str(path)


def read(path, compression=None, **kw):
    names = [str(p) for p in path] if isinstance(path, list) else str(path)
    got = [x.item() for x in TFRecordDataset(names, compression, **kw)]
    assert all(type(g) is bytes for g in got)
    return got


@pytest.mark.parametrize("data, crc", VECTORS)
def test_crc32c_matches_the_published_vectors(data, crc):
    assert crc32c_bitwise(data) == crc
    assert crc32c(data) == crc
    assert masked_crc32c(data) == masked(crc)


def test_masked_crc_of_nothing_is_the_mask_delta():
    assert masked_crc32c(b"") == 0xA282EAD8


@pytest.mark.parametrize("data", [b"", b"a", b"hello world", bytes(range(256)) * 3, b"\x00" * 7])
def test_framing_is_the_specified_bytes(data):
    assert frame_record(data) == framed_by_hand(data)


def test_writer_writes_what_tensorflow_wrote_and_reader_reads_it(tmp_path):
    path = write(tmp_path / "ours.tfr", TF_GOLDEN_RECORDS)
    assert Path(path).read_bytes() == TF_GOLDEN
    golden = tmp_path / "tf.tfr"
    golden.write_bytes(TF_GOLDEN)
    assert read(golden) == TF_GOLDEN_RECORDS  # the trailing NUL kept


@pytest.mark.parametrize("compression", [None, "", "GZIP", "ZLIB"])
@pytest.mark.parametrize("buffer_size", [None, 1, 7, 1 << 16])
def test_round_trip_in_every_compression(tmp_path, compression, buffer_size):
    records = [b"", b"\x00", b"x" * 1000, b"a\x00\x00", bytes(range(256))] + [
        b"record %d" % i for i in range(300)]
    path = write(tmp_path / "r.tfr", records, compression)
    raw = Path(path).read_bytes()
    plain = b"".join(framed_by_hand(r) for r in records)
    if compression == "GZIP":
        assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw) == plain
    elif compression == "ZLIB":
        assert zlib.decompress(raw) == plain
    else:
        assert raw == plain
    assert read(path, compression, buffer_size=buffer_size) == records


def test_options_object_and_enum(tmp_path):
    path = write(tmp_path / "o.tfr", [b"a", b"b"], TFRecordOptions(compression_type="ZLIB"))
    assert zlib.decompress(Path(path).read_bytes()) == framed_by_hand(b"a") + framed_by_hand(b"b")
    assert TFRecordOptions.get_compression_type_string(TFRecordOptions(2)) == "GZIP"
    with pytest.raises(InvalidArgumentError, match="compression_type"):
        TFRecordWriter(str(tmp_path / "x.tfr"), "BZIP2")
    with pytest.raises(InvalidArgumentError, match="compression_level"):
        TFRecordOptions("GZIP", compression_level=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.binary(max_size=300), max_size=40),
       compression=st.sampled_from([None, "GZIP", "ZLIB"]), buffer_size=st.integers(1, 600))
def test_round_trip_of_random_records(tmp_path, records, compression, buffer_size):
    path = write(tmp_path / "h.tfr", records, compression)
    assert read(path, compression, buffer_size=buffer_size) == records


def test_big_record_across_many_small_reads(tmp_path):
    big = bytes(range(256)) * 40000  # 10 MB, read 4 KiB at a time
    path = write(tmp_path / "big.tfr", [big, b"end"])
    assert read(path, buffer_size=4096) == [big, b"end"]


def test_batches_are_object_arrays_of_exact_bytes(tmp_path):
    records = [b"a\x00", b"", b"bc"]
    path = write(tmp_path / "b.tfr", records)
    ds = TFRecordDataset(path)
    assert ds.element_spec.dtype == object and ds.element_spec.shape == ()
    (batch,) = list(ds.batch(3))
    assert batch.dtype == object and batch.tolist() == records
    shuffled = [x.item() for x in ds.shuffle(3, seed=1)]
    assert sorted(shuffled) == sorted(records)
    assert [x.item() for x in ds.map(lambda x: x).repeat(2)] == records * 2
    assert list(ds.map(lambda x: np.int64(len(x.item())))) == [2, 0, 2]


def test_several_files_in_order_and_in_parallel(tmp_path):
    a = write(tmp_path / "a.tfr", [b"a0", b"a1", b"a2"])
    b = write(tmp_path / "b.tfr", [b"b0", b"b1"], "GZIP")
    c = write(tmp_path / "c.tfr", [b"c0", b"c1"])
    assert read([a, c]) == [b"a0", b"a1", b"a2", b"c0", b"c1"]
    got = [x.item() for x in TFRecordDataset([a, c], num_parallel_reads=2)]
    assert got == [b"a0", b"c0", b"a1", b"c1", b"a2"]
    assert [x.item() for x in TFRecordDataset(b, "GZIP")] == [b"b0", b"b1"]
    files = Dataset.list_files(str(tmp_path / "[ac].tfr"), shuffle=False)
    assert [x.item() for x in files.interleave(TFRecordDataset, cycle_length=2)] == got


def test_file_sharding_splits_by_file(tmp_path):
    names = [write(tmp_path / f"p{i}.tfr", [b"%d-%d" % (i, j) for j in range(3)]) for i in range(4)]
    ds = TFRecordDataset(names).map(lambda x: x)
    assert file_shard_units(find_file_reader(ds)) == tuple(names)
    listed = Dataset.list_files(str(tmp_path / "p*.tfr"), shuffle=False).interleave(TFRecordDataset)
    assert file_shard_units(find_file_reader(listed)) == tuple(sorted(names))
    # worker 1 of 2 under FILE sharding reads files 1 and 3, whole
    assert [x.item() for x in TFRecordDataset(names).shard(2, 1)] == [
        b"0-1", b"1-0", b"1-2", b"2-1", b"3-0", b"3-2"]  # shard() itself is by element


def test_corrupted_data_crc_names_file_and_offset(tmp_path):
    path = write(tmp_path / "c.tfr", [b"first", b"second", b"third"])
    raw = bytearray(Path(path).read_bytes())
    second = len(framed_by_hand(b"first"))
    raw[second + 12 + 2] ^= 0xFF  # a byte of "second"
    Path(path).write_bytes(bytes(raw))
    it = iter(TFRecordDataset(path))
    with pytest.raises(DataLossError, match=rf"c\.tfr is corrupted: the data of the record at byte offset {second} "):
        next(it)


def test_corrupted_length_crc_names_file_and_offset(tmp_path):
    path = write(tmp_path / "l.tfr", [b"first", b"second"])
    raw = bytearray(Path(path).read_bytes())
    second = len(framed_by_hand(b"first"))
    raw[second] ^= 0x01  # the length of the second record
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(DataLossError, match=rf"l\.tfr is corrupted: the length of the record at byte offset {second} "):
        list(TFRecordDataset(path))


@pytest.mark.parametrize("cut", [1, 4, 9, 13])
def test_truncated_file_names_file_and_offset(tmp_path, cut):
    path = write(tmp_path / "t.tfr", [b"first", b"second record"])
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[:-cut])
    second = len(framed_by_hand(b"first"))
    with pytest.raises(DataLossError, match=rf"t\.tfr is truncated: it ends at byte offset {len(raw) - cut} "
                                            rf"inside the record starting at byte offset {second}"):
        list(TFRecordDataset(path))


def test_truncated_gzip_is_data_loss(tmp_path):
    path = write(tmp_path / "g.tfr", [b"x" * 5000, b"y"], "GZIP")
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[:len(raw) // 2])
    with pytest.raises(DataLossError, match="g.tfr"):
        list(TFRecordDataset(path, "GZIP"))


def test_compressed_file_without_compression_type_says_which_to_pass(tmp_path):
    path = write(tmp_path / "z.tfr", [b"abc"] * 100, "GZIP")
    with pytest.raises(InvalidArgumentError, match=r"z\.tfr looks GZIP-compressed .* pass compression_type='GZIP'"):
        list(TFRecordDataset(path))
    path = write(tmp_path / "p.tfr", [b"abc"] * 100)
    with pytest.raises(DataLossError, match=r"p\.tfr is not ZLIB data"):
        list(TFRecordDataset(path, "ZLIB"))


def test_argument_errors(tmp_path):
    path = write(tmp_path / "a.tfr", [b"a"])
    with pytest.raises(InvalidArgumentError, match="compression_type must be"):
        TFRecordDataset(path, "gzip")
    with pytest.raises(InvalidArgumentError, match="buffer_size must be >= 0"):
        TFRecordDataset(path, buffer_size=-1)
    with pytest.raises(TypeError, match="num_parallel_reads"):
        TFRecordDataset(path, num_parallel_reads=1.5)
    with pytest.raises(FileNotFoundError, match="missing.tfr"):
        list(TFRecordDataset(str(tmp_path / "missing.tfr")))
    with pytest.raises(TypeError, match="encode_example"):
        TFRecordWriter(str(tmp_path / "w.tfr")).write(12)


def test_example_records_through_a_pipeline(tmp_path):
    from mpidist.io import FixedLenFeature, parse_example, parse_single_example
    path = write(tmp_path / "e.tfr", [encode_example({"x": [float(i), 0.0], "y": i % 2}) for i in range(10)])
    spec = {"x": FixedLenFeature([2], np.float32), "y": FixedLenFeature([], np.int64)}
    ds = TFRecordDataset(path).map(lambda s: parse_single_example(s, spec)).batch(4)
    got = list(ds)
    assert [len(b["y"]) for b in got] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b["y"] for b in got]), np.arange(10) % 2)
    batched = list(TFRecordDataset(path).batch(5).map(lambda s: parse_example(s, spec)))
    np.testing.assert_array_equal(batched[1]["x"][:, 0], np.arange(5, 10, dtype=np.float32))
    assert batched[0]["x"].dtype == np.float32 and batched[0]["y"].dtype == np.int64
