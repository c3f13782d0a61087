"""First-hour data-layer mistakes that used to hang or mislead, each refused up front with an
error naming the value, what is wrong and the fix.

1. Consuming a dataset with no end: every operation that needs the end of the data
   (``Dataset.save``, ``len()``, ``skip(-1)``) asks the cardinality first, through one helper
   (``mpidist.data.finite.require_finite``); ``ds.repeat().save(path)`` used to write forever.
2. A file whose first bytes contradict ``compression_type``: a gzip file read as plain text
   used to say "convert the file to UTF-8", a plain file read as GZIP gave a zlib internal
   error. Every reader with a ``compression_type`` vets the file's first bytes through one
   function (``mpidist.data.file_kinds.vet_compression``), and the other readers name the
   kind of file they were given when they cannot open it (``with_kind_hint``).
"""

import bz2
import gzip
import lzma
import os
import re
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import h5py
import pyarrow as pa
import pyarrow.parquet as pq

from mpidist.data import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    HDF5Dataset,
    NpyDataset,
    NpzDataset,
    Options,
    ParquetDataset,
    TensorSpec,
    TextLineDataset,
)
from mpidist.data import finite
from mpidist.data.file_kinds import HEAD_BYTES, sniff
from mpidist.data.finite import require_finite
from mpidist.errors import DataLossError, InvalidArgumentError

FAST = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def ints(ds):
    return [int(x) for x in ds]


# -- 1. Cardinality checked before consuming ------------------------------------------------------
def _npy_source(directory):
    path = os.path.join(directory, "rows.npy")
    np.save(path, np.arange(6, dtype=np.int64))
    return NpyDataset(path)


SOURCES = {
    "range": lambda d: Dataset.range(5),
    "from_tensor_slices": lambda d: Dataset.from_tensor_slices(np.arange(4.0)),
    "from_tensors": lambda d: Dataset.from_tensors(np.arange(3)),
    "NpyDataset": _npy_source,  # blocks of file rows: save's other path
}
# Steps that keep an infinite dataset infinite.
STEPS = {
    "map": lambda ds: ds.map(lambda x: x),
    "batch": lambda ds: ds.batch(2),
    "shuffle": lambda ds: ds.shuffle(4, seed=1),
    "shard": lambda ds: ds.shard(2, 1),
    "skip": lambda ds: ds.skip(3),
    "take_all": lambda ds: ds.take(-1),
    "prefetch": lambda ds: ds.prefetch(2),
    "with_options": lambda ds: ds.with_options(Options()),
}
REPEATS = [lambda ds: ds.repeat(), lambda ds: ds.repeat(None), lambda ds: ds.repeat(-1)]


def _infinite(directory, source, repeat, before, after):
    ds = SOURCES[source](directory)
    for step in before:
        ds = STEPS[step](ds)
    ds = REPEATS[repeat](ds)
    for step in after:
        ds = STEPS[step](ds)
    return ds


def _assert_infinite_message(message, api):
    for part in ("The dataset is infinite", api, "cardinality INFINITE",
                 "a repeat() with no count", ".take(n)", "repeat(n)", "-> repeat"):
        assert part in message, (part, message)


infinite_chains = st.tuples(
    st.sampled_from(sorted(SOURCES)), st.integers(0, len(REPEATS) - 1),
    st.lists(st.sampled_from(["map", "shuffle", "take_all", "with_options"]), max_size=2),
    st.lists(st.sampled_from(sorted(STEPS)), max_size=3))


@FAST
@given(chain=infinite_chains)
def test_save_of_an_infinite_dataset_is_refused_before_anything_is_written(chain):
    with tempfile.TemporaryDirectory() as d:
        ds = _infinite(d, *chain)
        assert ds.cardinality() == INFINITE_CARDINALITY
        path = os.path.join(d, "saved")
        with pytest.raises(InvalidArgumentError) as e:
            ds.save(path)
        _assert_infinite_message(str(e.value), "Dataset.save")
        assert not os.path.exists(path)  # no directory made, no file written
        # The dataset is unchanged and the fix works: take(n) saves and loads back.
        first = [np.asarray(x).tolist() for x in ds.take(3)]
        ds.take(3).save(path)
        assert [np.asarray(x).tolist() for x in Dataset.load(path)] == first


@FAST
@given(chain=infinite_chains)
def test_len_of_an_infinite_dataset_is_tf_s_type_error_with_the_fix(chain):
    with tempfile.TemporaryDirectory() as d:
        ds = _infinite(d, *chain)
        with pytest.raises(TypeError) as e:
            len(ds)
        _assert_infinite_message(str(e.value), "len()")
        assert len(ds.take(4)) == 4


@FAST
@given(chain=infinite_chains, batch=st.booleans())
def test_skip_all_of_an_infinite_dataset_is_refused_instead_of_spinning(chain, batch):
    with tempfile.TemporaryDirectory() as d:
        ds = _infinite(d, *chain).skip(-1)
        assert ds.cardinality() == INFINITE_CARDINALITY  # as TF: built lazily, refused on use
        ds = ds.batch(2) if batch else ds  # batch reads rows, indices or file blocks
        with pytest.raises(InvalidArgumentError) as e:
            next(iter(ds))
        _assert_infinite_message(str(e.value), "skip(-1)")


def test_save_refused_leaves_the_saved_dataset_at_path_whole(tmp_path):
    path = str(tmp_path / "saved")
    Dataset.range(4).save(path)
    before = sorted(os.listdir(path))
    with pytest.raises(InvalidArgumentError, match=re.escape("Dataset.save")):
        Dataset.range(2).repeat().save(path)
    assert sorted(os.listdir(path)) == before
    assert ints(Dataset.load(path)) == [0, 1, 2, 3]


def test_the_message_names_the_chain_and_what_made_it_infinite(tmp_path):
    ds = Dataset.from_tensor_slices(np.arange(4)).map(lambda x: x * 2).repeat().batch(2)
    with pytest.raises(InvalidArgumentError) as e:
        ds.save(str(tmp_path / "s"))
    assert "The dataset: from_tensor_slices -> map -> repeat -> batch." in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("ds", [
    Dataset.range(3).repeat(2),  # finite
    Dataset.range(3).repeat().take(7),  # bounded
    Dataset.range(0).repeat(),  # empty: repeating nothing ends (cardinality 0)
    Dataset.from_generator(lambda: iter(range(3)), output_signature=TensorSpec((), np.int64)),
    Dataset.from_generator(lambda: iter(range(3)),
                           output_signature=TensorSpec((), np.int64)).repeat(2),
], ids=["repeat-count", "take", "empty-repeat", "generator", "generator-repeat"])
def test_finite_and_unknown_datasets_are_consumed_as_before(tmp_path, ds):
    want = ints(ds)
    ds.save(str(tmp_path / "s"))
    assert ints(Dataset.load(str(tmp_path / "s"))) == want
    assert ints(ds.skip(-1)) == []
    if ds.cardinality() == UNKNOWN_CARDINALITY:
        with pytest.raises(TypeError, match="The dataset length is unknown"):
            len(ds)
    else:
        assert len(ds) == len(want)


def test_a_new_consumer_gets_the_check_with_one_call():
    ds = Dataset.range(2).repeat()
    with pytest.raises(RuntimeError, match=r"The dataset is infinite: my_consumer\(\) needs"):
        require_finite(ds._chain_from_source(), "my_consumer()", RuntimeError)
    with pytest.raises(InvalidArgumentError, match="cardinality INFINITE"):
        require_finite(ds._chain_from_source(), "my_consumer()")
    assert require_finite(Dataset.range(5)._chain_from_source(), "x") == 5  # the cardinality, computed once
    assert finite._INFINITE == INFINITE_CARDINALITY


# -- 2. Files vetted against compression_type before they are decoded -----------------------------
COMPRESS = {"GZIP": gzip.compress, "ZLIB": zlib.compress}
# No NUL: a NumPy str drops trailing NULs ('\x00' reads back as ''), whatever the file says.
lines_st = st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                          blacklist_characters="\r\n\x00"),
                            max_size=40), min_size=1, max_size=30)


def _write(directory, name, data):
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _compressed(kind, text, level):
    data = text.encode("utf-8")
    return gzip.compress(data, level) if kind == "GZIP" else zlib.compress(data, level)


@FAST
@given(lines=lines_st, kind=st.sampled_from(["GZIP", "ZLIB"]), level=st.integers(0, 9),
       given_type=st.sampled_from([None, ""]), parallel=st.sampled_from([None, 2]),
       buffer_size=st.sampled_from([None, 1, 5]))
def test_a_compressed_file_read_as_plain_names_the_compression_type_to_pass(
        lines, kind, level, given_type, parallel, buffer_size):
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "part-0.txt", _compressed(kind, "\n".join(lines) + "\n", level))
        with pytest.raises(InvalidArgumentError) as e:
            list(TextLineDataset([path], compression_type=given_type, buffer_size=buffer_size,
                                 num_parallel_reads=parallel))
        message = str(e.value)
        magic = "gzip magic bytes 1f 8b" if kind == "GZIP" else "zlib header 78"
        for part in (path, f"looks {kind}-compressed", magic,
                     f"but compression_type is {given_type!r}",
                     f"pass compression_type={kind!r}"):
            assert part in message, (part, message)
        assert "UTF-8" not in message
        # The fix reads the lines.
        got = list(TextLineDataset(path, compression_type=kind, buffer_size=buffer_size,
                                   num_parallel_reads=parallel))
        assert got == lines


@FAST
@given(lines=lines_st, source=st.sampled_from([None, "GZIP", "ZLIB"]),
       asked=st.sampled_from(["GZIP", "ZLIB"]), level=st.integers(1, 9))
def test_a_compression_type_the_file_does_not_have_names_the_file_and_the_right_one(
        lines, source, asked, level):
    assume(source != asked)
    text = "\n".join(lines) + "\n"
    data = text.encode("utf-8") if source is None else _compressed(source, text, level)
    assume(source is not None or sniff(data) is None)  # text that starts like zlib: see below
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "data.txt", data)
        with pytest.raises(DataLossError) as e:
            list(TextLineDataset(path, compression_type=asked))
        message = str(e.value)
        fix = "pass compression_type=None" if source is None else \
            f"pass compression_type={source!r}"
        for part in (path, f"is not {asked} data", fix):
            assert part in message, (part, message)
        assert "Error -3" not in message and "incorrect header check" not in message


@FAST
@given(body=st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=0, max_size=800),
       prefix=st.sampled_from(["x^", "x\x01", "xڀ", "BZh9", "PAR1", ""]))
def test_plain_text_that_starts_like_a_magic_number_is_read_as_text(body, prefix):
    # "x^" and "x\x01" are zlib headers, "PAR1" Parquet's magic: text may start with them.
    text = prefix + body
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "t.txt", (text + "\n").encode("utf-8"))
        assert list(TextLineDataset(path)) == text.split("\n")


def test_a_short_zlib_file_read_as_plain_is_caught_though_its_bytes_are_valid_utf8(tmp_path):
    # zlib.compress(b"", 1) is b"x\x01\x03\x00\x00\x00\x00\x01": valid UTF-8, so a check made
    # only where decoding fails would read it as one line of garbage.
    path = _write(tmp_path, "empty.z", zlib.compress(b"", 1))
    with pytest.raises(InvalidArgumentError, match="pass compression_type='ZLIB'"):
        list(TextLineDataset(path))
    assert list(TextLineDataset(path, "ZLIB")) == []


def test_an_empty_file_is_no_evidence_either_way(tmp_path):
    path = _write(tmp_path, "empty", b"")
    assert list(TextLineDataset(path)) == []
    assert list(TextLineDataset(path, "GZIP")) == []


def test_the_error_comes_at_the_bad_file_after_the_good_ones(tmp_path):
    good = _write(tmp_path, "a.txt", b"a1\na2\n")
    bad = _write(tmp_path, "b.txt.gz", gzip.compress(b"b1\n"))
    it = iter(TextLineDataset([good, bad]))
    assert [next(it), next(it)] == ["a1", "a2"]
    with pytest.raises(InvalidArgumentError, match=re.escape(bad)):
        next(it)


@pytest.mark.parametrize("make,looks,fix", [
    (lambda: bz2.compress(b"a\nb\n"), "looks BZIP2-compressed", "bunzip2"),
    (lambda: lzma.compress(b"a\nb\n"), "looks XZ-compressed", "unxz"),
    (lambda: b"\x28\xb5\x2f\xfd" + bytes(20), "looks Zstandard-compressed", "unzstd"),
    (lambda: _npy_bytes(), "looks like a NumPy .npy file", "read it with NpyDataset"),
    (lambda: _zip_bytes(), "looks like a zip archive", "NpzDataset"),
    (lambda: b"\x89HDF\r\n\x1a\n" + bytes(40), "looks like an HDF5 file", "HDF5Dataset"),
], ids=["bzip2", "xz", "zstd", "npy", "zip", "hdf5"])
def test_a_file_text_reading_cannot_decode_is_named_with_what_it_is(tmp_path, make, looks, fix):
    path = _write(tmp_path, "data.bin", make())
    with pytest.raises(InvalidArgumentError) as e:
        list(TextLineDataset(path))
    for part in (path, looks, fix, "'GZIP' / 'ZLIB'"):
        assert part in str(e.value), (part, str(e.value))
    with pytest.raises(DataLossError, match=re.escape(looks)):
        list(TextLineDataset(path, "GZIP"))


def _npy_bytes():
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "x.npy"), np.arange(4))
        with open(os.path.join(d, "x.npy"), "rb") as f:
            return f.read()


def _zip_bytes():
    with tempfile.TemporaryDirectory() as d:
        np.savez(os.path.join(d, "x.npz"), a=np.arange(3))
        with open(os.path.join(d, "x.npz"), "rb") as f:
            return f.read()


def _parquet(path):
    pq.write_table(pa.table({"a": [1, 2, 3]}), path)


def _hdf5(path):
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)


# The readers without compression_type: a file of another kind is named with the reader to use.
OTHER_KINDS = {
    "gzip": (lambda p: _write(os.path.dirname(p), os.path.basename(p), gzip.compress(_npy_bytes())),
             "looks GZIP-compressed", "gunzip"),
    "npy": (lambda p: np.save(p, np.arange(3)), "looks like a NumPy .npy file", "NpyDataset"),
    "npz": (lambda p: _write(os.path.dirname(p), os.path.basename(p), _zip_bytes()),
            "looks like a zip archive", "NpzDataset"),
    "parquet": (_parquet, "looks like a Parquet file", "ParquetDataset"),
    "hdf5": (_hdf5, "looks like an HDF5 file", "HDF5Dataset"),
}
READERS = {
    "NpyDataset": NpyDataset,
    "NpzDataset": NpzDataset,
    "ParquetDataset": ParquetDataset,
    "HDF5Dataset": lambda p: HDF5Dataset(p, key="x"),
}
_CASES = [(reader, kind) for reader in READERS for kind in OTHER_KINDS
          if OTHER_KINDS[kind][2] != reader]


@pytest.mark.parametrize("reader,kind", _CASES)
def test_a_reader_given_another_kind_of_file_says_what_it_is(tmp_path, reader, kind):
    path = str(tmp_path / "data.bin")
    write, looks, fix = OTHER_KINDS[kind]
    write(path)
    if kind == "npy":
        os.replace(path + ".npy", path)  # np.save adds the suffix
    with pytest.raises(DataLossError) as e:
        list(READERS[reader](path))
    for part in (reader, path, looks, fix):
        assert part in str(e.value), (part, str(e.value))


def test_a_damaged_file_of_the_reader_s_own_kind_gets_no_misleading_hint(tmp_path):
    path = str(tmp_path / "cut.npy")
    np.save(path, np.arange(100))
    with open(path, "r+b") as f:
        f.truncate(8)  # the magic, then nothing
    with pytest.raises(DataLossError) as e:
        list(NpyDataset(path))
    assert "It looks" not in str(e.value)


def test_sniff_reads_only_the_first_bytes():
    big = gzip.compress(os.urandom(4 * HEAD_BYTES))
    assert sniff(big[:HEAD_BYTES]).name == "GZIP"
    assert sniff(zlib.compress(os.urandom(4 * HEAD_BYTES))[:HEAD_BYTES]).name == "ZLIB"
    assert sniff(b"hello world\n" * 100) is None
