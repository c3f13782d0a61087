"""The streaming file readers (mpidist.data.readers): each reader's rows are the data written by
the format's own library, in blocks of any size; batch and interleave over a reader give what
they give over the same data in memory; bad files are errors naming them; memory stays bounded
by a block, not by the file."""

import gzip
import os
import sys
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpidist.data import (
    UNKNOWN_CARDINALITY,
    Dataset,
    HDF5Dataset,
    NpyDataset,
    NpzDataset,
    ParquetDataset,
    TensorSpec,
    TextLineDataset,
)
from mpidist.errors import DataLossError, InvalidArgumentError, NotFoundError

# The test extra brings both (pyproject.toml): a missing one is a broken test environment, and
# skipping the whole file would hide the .npy, .npz and text readers' tests with it.
import h5py
import pyarrow as pa
import pyarrow.parquet as pq

SHAPES_DTYPES = [((10,), np.float32), ((7, 3), np.int64), ((5, 2, 3), np.float64), ((9,), np.bool_),
                 ((6, 2), np.complex64), ((8,), "<U3"), ((4, 5), ">i4"), ((11, 1), np.uint8)]


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 1000, size=shape)
    if np.dtype(dtype).kind == "U":
        return x.astype(str).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return x % 2 == 0
    return (x / 7 if np.dtype(dtype).kind in "fc" else x).astype(dtype)


def same_dtype(a, b):
    """Equal dtypes; str scalars keep no width (np.str_), so any str width matches."""
    a, b = np.asarray(a).dtype, np.asarray(b).dtype
    return a == b or (a.kind == b.kind == "U")


def assert_rows(dataset, expected):
    """``dataset``'s elements are the rows of ``expected`` (an array or a dict / tuple of them)."""
    got = list(dataset)
    if isinstance(expected, dict):
        assert len(got) == len(next(iter(expected.values())))
        for i, element in enumerate(got):
            assert set(element) == set(expected)
            for k in expected:
                assert same_dtype(element[k], expected[k])
                np.testing.assert_array_equal(element[k], expected[k][i])
        return
    if isinstance(expected, tuple):
        assert len(got) == len(expected[0])
        for i, element in enumerate(got):
            for e, x in zip(element, expected):
                assert same_dtype(e, x)
                np.testing.assert_array_equal(e, x[i])
        return
    assert len(got) == len(expected)
    for row, want in zip(got, expected):
        assert same_dtype(row, expected)
        np.testing.assert_array_equal(row, want)


def assert_same_batches(a, b):
    got, want = list(a), list(b)
    assert len(got) == len(want)
    for x, y in zip(got, want):
        if isinstance(y, dict):
            assert set(x) == set(y)
            for k in y:
                assert x[k].dtype == y[k].dtype
                np.testing.assert_array_equal(x[k], y[k])
        else:
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


# -- .npy --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dtype", SHAPES_DTYPES)
@pytest.mark.parametrize("block_rows", [None, 1, 3])
def test_npy_rows_are_the_saved_array(tmp_path, shape, dtype, block_rows):
    x = make(shape, dtype)
    np.save(tmp_path / "a.npy", x)
    ds = NpyDataset(str(tmp_path / "a.npy"), block_rows=block_rows)
    assert ds.element_spec == TensorSpec(shape[1:], np.dtype(dtype))
    assert ds.cardinality() == shape[0]
    assert_rows(ds, x)


def test_npy_fortran_order_and_several_files(tmp_path):
    x = make((9, 4, 2), np.float32)
    np.save(tmp_path / "f.npy", np.asfortranarray(x))
    y = make((5, 4, 2), np.float32, seed=1)
    np.save(tmp_path / "g.npy", y)
    ds = NpyDataset([tmp_path / "f.npy", tmp_path / "g.npy"], block_rows=2)
    assert ds.cardinality() == 14
    assert_rows(ds, np.concatenate([x, y]))


class _BytesPath:
    """An os.PathLike whose __fspath__ gives bytes, as the protocol allows."""

    def __init__(self, path):
        self._path = os.fsencode(path)

    def __fspath__(self):
        return self._path


def test_every_spelling_of_a_file_name_reads_the_same_file(tmp_path):
    """str, bytes, pathlib.Path, a PathLike giving bytes, NumPy string scalars: each names the
    file (a bytes PathLike used to pass bytes on where a str is promised)."""
    x = make((6, 3), np.float64)
    path = tmp_path / "f.npy"
    np.save(path, x)
    for name in (str(path), os.fsencode(path), path, _BytesPath(path), np.str_(str(path)),
                 np.bytes_(os.fsencode(path))):
        ds = NpyDataset(name, block_rows=4)
        assert ds.cardinality() == 6, name
        assert_rows(ds, x)
    missing = tmp_path / "missing.npy"
    for name in (str(missing), os.fsencode(missing), missing, _BytesPath(missing)):
        with pytest.raises(NotFoundError, match=f"NpyDataset: {missing}: No such file"):
            NpyDataset(name).cardinality()
        with pytest.raises(NotFoundError, match=f"path {missing} does not exist"):
            Dataset.load(name)


def test_npy_default_block_spans_many_blocks(tmp_path):
    x = np.arange(700_001, dtype=np.float32)  # 2.8 MB: several default blocks, a short last one
    np.save(tmp_path / "a.npy", x)
    batches = list(NpyDataset(tmp_path / "a.npy").batch(100_000))
    np.testing.assert_array_equal(np.concatenate(batches), x)
    assert [len(b) for b in batches] == [100_000] * 7 + [1]


def test_npy_blocks_are_plain_owned_arrays(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(12.0).reshape(6, 2))
    for element in NpyDataset(tmp_path / "a.npy", block_rows=4):
        assert type(element) is np.ndarray
        base = element.base
        assert base is None or (type(base) is np.ndarray and base.base is None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.integers(0, 9), min_size=1, max_size=4), block_rows=st.integers(1, 4),
       batch=st.integers(1, 7), drop=st.booleans())
def test_npy_batch_equals_batch_in_memory(rows, block_rows, batch, drop):
    with tempfile.TemporaryDirectory() as d:
        data = [make((n, 3), np.int32, seed=i) for i, n in enumerate(rows)]
        paths = [os.path.join(d, f"{i}.npy") for i in range(len(rows))]
        for p, x in zip(paths, data):
            np.save(p, x)
        assert_same_batches(NpyDataset(paths, block_rows=block_rows).batch(batch, drop),
                            Dataset.from_tensor_slices(np.concatenate(data)).batch(batch, drop))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.integers(0, 8), min_size=1, max_size=5), block_rows=st.integers(1, 3),
       cycle=st.sampled_from([1, 2, 3]), block=st.sampled_from([1, 2, 5]), batch=st.integers(1, 6))
def test_interleave_of_readers_is_interleave_of_the_data(rows, block_rows, cycle, block, batch):
    with tempfile.TemporaryDirectory() as d:
        data = [make((n, 2), np.float32, seed=i) for i, n in enumerate(rows)]
        for i, x in enumerate(data):
            np.save(os.path.join(d, f"f{i:02d}.npy"), x)
        files = Dataset.list_files(os.path.join(d, "*.npy"), shuffle=False)
        read = files.interleave(lambda f: NpyDataset(f, block_rows=block_rows), cycle, block)
        memory = Dataset.range(len(rows)).interleave(
            lambda i: Dataset.from_tensor_slices(data[int(i)]), cycle, block)
        assert_same_batches(read, memory)
        assert_same_batches(read.batch(batch), memory.batch(batch))


def test_interleave_takes_the_reader_class_and_a_lambda(tmp_path):
    xs = [make((n, 2), np.float64, seed=n) for n in (5, 3, 4)]
    for i, x in enumerate(xs):
        np.save(tmp_path / f"{i}.npy", x)
    files = Dataset.list_files(str(tmp_path / "*.npy"), shuffle=False)
    memory = Dataset.range(3).interleave(lambda i: Dataset.from_tensor_slices(xs[int(i)]), 2)
    assert_same_batches(files.interleave(NpyDataset, cycle_length=2), memory)
    tables = [{"x": make((n,), np.int64, seed=n), "y": make((n,), np.float32, seed=n + 1),
               "z": make((n,), np.int8, seed=9)} for n in (4, 6)]
    for i, t in enumerate(tables):
        pq.write_table(pa.table(t), tmp_path / f"{i}.parquet")
    files = Dataset.list_files(str(tmp_path / "*.parquet"), shuffle=False)
    read = files.interleave(lambda f: ParquetDataset(f, columns=["x", "y"]), cycle_length=2,
                            block_length=2)
    memory = Dataset.range(2).interleave(
        lambda i: Dataset.from_tensor_slices({k: tables[int(i)][k] for k in ("x", "y")}), 2, 2)
    assert_same_batches(read, memory)
    assert_same_batches(read.batch(3), memory.batch(3))


def test_npy_files_that_differ_are_named(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 2), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((3, 2), np.float64))
    np.save(tmp_path / "c.npy", np.zeros((3, 4), np.float32))
    for odd in ("b.npy", "c.npy"):
        with pytest.raises(InvalidArgumentError, match=f"{odd}.*a.npy"):
            list(NpyDataset([tmp_path / "a.npy", tmp_path / odd]))


def test_truncated_npy_is_data_loss_before_any_row(tmp_path):
    x = np.arange(100, dtype=np.float64).reshape(25, 4)
    np.save(tmp_path / "a.npy", x)
    full = os.path.getsize(tmp_path / "a.npy")
    with open(tmp_path / "a.npy", "r+b") as f:
        f.truncate(full - 40)
    with pytest.raises(DataLossError, match=rf"a\.npy.*{full}.*{full - 40}"):
        _ = NpyDataset(tmp_path / "a.npy").element_spec
    it = iter(NpyDataset(tmp_path / "a.npy", block_rows=1))
    with pytest.raises(DataLossError, match=r"a\.npy is truncated"):
        next(it)


def test_npy_bad_files(tmp_path):
    (tmp_path / "junk.npy").write_bytes(b"not an array at all" * 10)
    with pytest.raises(DataLossError, match=r"junk\.npy is not a \.npy file"):
        list(NpyDataset(tmp_path / "junk.npy"))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(InvalidArgumentError, match=r"obj\.npy holds Python objects"):
        list(NpyDataset(tmp_path / "obj.npy"))
    np.save(tmp_path / "scalar.npy", np.float32(3))
    with pytest.raises(InvalidArgumentError, match="0-d array"):
        list(NpyDataset(tmp_path / "scalar.npy"))
    with pytest.raises(NotFoundError, match=r"nothere\.npy"):
        list(NpyDataset(tmp_path / "nothere.npy"))
    with pytest.raises(InvalidArgumentError, match="block_rows must be greater than zero"):
        NpyDataset(tmp_path / "scalar.npy", block_rows=0)


def test_npy_memory_stays_bounded_by_blocks(tmp_path):
    """A 200 MB file read through NpyDataset(...).batch(...) grows RSS by far less than the file."""
    path = tmp_path / "big.npy"
    rows, width = 200 * 1024, 256  # 1 KiB rows: 200 MiB
    with open(path, "wb") as f:  # row i is all i, written 4096 rows at a time
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (rows, width)})
        for start in range(0, rows, 4096):
            index = np.arange(start, start + 4096, dtype=np.float32)
            f.write(np.broadcast_to(index[:, np.newaxis], (4096, width)).tobytes())

    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    before, peak, seen = rss(), 0, 0
    for batch in NpyDataset(path).batch(4096):
        peak = max(peak, rss() - before)
        want = np.arange(seen, seen + len(batch), dtype=np.float32)
        np.testing.assert_array_equal(batch[:, 0], want)
        np.testing.assert_array_equal(batch[:, -1], want)
        seen += len(batch)
    assert seen == rows
    assert peak < 64 << 20, f"RSS grew {peak >> 20} MiB reading a 200 MiB file"


# -- .npz --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
@pytest.mark.parametrize("block_rows", [None, 1, 4])
def test_npz_rows_are_dicts_of_the_saved_arrays(tmp_path, save, block_rows):
    arrays = {"x": make((13, 3), np.float32), "y": make((13,), np.int64, seed=1),
              "img": make((13, 2, 2), np.uint8, seed=2), "other": make((4,), np.int16)}
    save(tmp_path / "a.npz", **arrays)
    chosen = {k: arrays[k] for k in ("x", "y", "img")}
    ds = NpzDataset(tmp_path / "a.npz", keys=["x", "y", "img"], block_rows=block_rows)
    assert ds.element_spec == {k: TensorSpec(v.shape[1:], v.dtype) for k, v in chosen.items()}
    assert ds.cardinality() == 13
    assert_rows(ds, chosen)
    assert_same_batches(ds.batch(5), Dataset.from_tensor_slices(chosen).batch(5))
    assert_rows(NpzDataset(tmp_path / "a.npz", keys="y", block_rows=block_rows), {"y": arrays["y"]})


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 2)), y=np.zeros(5))
    with pytest.raises(InvalidArgumentError, match=r"different numbers of rows.*x: 4, y: 5"):
        list(NpzDataset(tmp_path / "a.npz"))
    with pytest.raises(InvalidArgumentError, match=r"keys 'z' is not in .*a\.npz.*\['x', 'y'\]"):
        list(NpzDataset(tmp_path / "a.npz", keys=["x", "z"]))
    np.savez(tmp_path / "b.npz", x=np.zeros((4, 2), np.float32))
    with pytest.raises(InvalidArgumentError, match=r"b\.npz.*a\.npz"):
        list(NpzDataset([tmp_path / "a.npz", tmp_path / "b.npz"], keys="x"))
    data = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:len(data) // 2])
    with pytest.raises(DataLossError, match=r"cut\.npz"):
        list(NpzDataset(tmp_path / "cut.npz"))
    with pytest.raises(TypeError, match="keys must be a str or a non-empty list of str"):
        NpzDataset(tmp_path / "a.npz", keys=[1])


# -- Parquet -----------------------------------------------------------------------------------------
def _table(n, seed=0):
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n, 2, 3)).astype(np.float32)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(img.reshape(-1)), 3)
    columns = {
        "i": rng.integers(-50, 50, n).astype(np.int32), "f": rng.standard_normal(n),
        "b": rng.integers(0, 2, n).astype(bool), "u": rng.integers(0, 9, n).astype(np.uint16),
        "s": np.array([f"row{v}" for v in rng.integers(0, 1000, n)]),
        "vec": rng.standard_normal((n, 4)).astype(np.float32), "img": img,
    }
    arrow = {k: v for k, v in columns.items() if k not in ("vec", "img")}
    arrow["vec"] = pa.FixedSizeListArray.from_arrays(pa.array(columns["vec"].reshape(-1)), 4)
    arrow["img"] = pa.FixedSizeListArray.from_arrays(inner, 2)
    return columns, pa.table(arrow)


@pytest.mark.parametrize("batch_rows,group", [(None, None), (1, 5), (4, 7), (3, 100)])
def test_parquet_rows_are_the_written_table(tmp_path, batch_rows, group):
    columns, table = _table(17)
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=group)
    ds = ParquetDataset(tmp_path / "a.parquet", batch_rows=batch_rows)
    spec = ds.element_spec
    assert spec["img"] == TensorSpec((2, 3), np.float32) and spec["vec"] == TensorSpec((4,), np.float32)
    assert spec["i"] == TensorSpec((), np.int32) and spec["s"].dtype.kind == "U"
    assert ds.cardinality() == 17
    got = list(ds)
    for k, v in columns.items():
        np.testing.assert_array_equal(np.stack([e[k] for e in got]), v)
        assert got[0][k].dtype.kind == v.dtype.kind
    chosen = {k: columns[k] for k in ("img", "i")}
    assert_same_batches(ParquetDataset(tmp_path / "a.parquet", columns=["img", "i"],
                                       batch_rows=batch_rows).batch(5),
                        Dataset.from_tensor_slices(chosen).batch(5))


def test_parquet_errors(tmp_path):
    pq.write_table(pa.table({"x": [1, 2], "v": pa.array([[1], [2, 3]])}), tmp_path / "var.parquet")
    with pytest.raises(InvalidArgumentError, match=r"'v' of .*var\.parquet.*variable-length list"):
        list(ParquetDataset(tmp_path / "var.parquet"))
    assert [int(e["x"]) for e in ParquetDataset(tmp_path / "var.parquet", columns="x")] == [1, 2]
    for stats in (True, False):
        path = tmp_path / f"nulls{stats}.parquet"
        pq.write_table(pa.table({"x": [1, 2, 3], "y": [1.0, None, 3.0]}), path,
                       write_statistics=stats)
        with pytest.raises(InvalidArgumentError, match=r"column 'y' of .*nulls.*has nulls"):
            list(ParquetDataset(path))
    with pytest.raises(InvalidArgumentError, match=r"columns 'z' is not in .*\['v', 'x'\]"):
        list(ParquetDataset(tmp_path / "var.parquet", columns=["x", "z"]))
    pq.write_table(pa.table({"x": np.arange(3, dtype=np.int64)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": np.arange(3, dtype=np.int32)}), tmp_path / "b.parquet")
    with pytest.raises(InvalidArgumentError, match=r"b\.parquet.*a\.parquet"):
        list(ParquetDataset([tmp_path / "a.parquet", tmp_path / "b.parquet"]))
    (tmp_path / "junk.parquet").write_bytes(b"x" * 100)
    with pytest.raises(DataLossError, match=r"junk\.parquet is not a readable Parquet file"):
        list(ParquetDataset(tmp_path / "junk.parquet"))
    with pytest.raises(NotFoundError, match=r"gone\.parquet"):
        list(ParquetDataset(tmp_path / "gone.parquet"))


# -- HDF5 --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_rows", [None, 1, 4])
@pytest.mark.parametrize("chunks", [None, (3, 2)])
def test_hdf5_rows_of_the_datasets(tmp_path, block_rows, chunks):
    x, y = make((11, 2), np.float32), make((11,), np.int64, seed=1)
    words = np.array([f"w{i}" * (i % 3 + 1) for i in range(11)])
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("g/x", data=x, chunks=chunks)
        f["y"] = y
        f.create_dataset("s", data=words.astype(object), dtype=h5py.string_dtype())
    path = tmp_path / "a.h5"
    assert_rows(HDF5Dataset(path, "g/x", block_rows), x)
    assert_rows(HDF5Dataset(path, ("g/x", "y"), block_rows), (x, y))
    ds = HDF5Dataset(path, {"feat": "g/x", "label": "y", "word": "s"}, block_rows)
    assert ds.element_spec["feat"] == TensorSpec((2,), np.float32)
    assert ds.cardinality() == 11
    assert_rows(ds, {"feat": x, "label": y, "word": words})
    assert_same_batches(HDF5Dataset(path, "g/x", block_rows).batch(4),
                        Dataset.from_tensor_slices(x).batch(4))


def test_hdf5_errors(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"], f["g/y"], f["short"] = np.zeros((3, 2)), np.zeros(3), np.zeros(2)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.zeros((3, 2), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"key 'nope' is not in .*a\.h5.*\['g/y', 'short', 'x'\]"):
        list(HDF5Dataset(tmp_path / "a.h5", "nope"))
    with pytest.raises(InvalidArgumentError, match=r"different numbers of rows.*x: 3, short: 2"):
        list(HDF5Dataset(tmp_path / "a.h5", ["x", "short"]))
    with pytest.raises(InvalidArgumentError, match=r"b\.h5.*a\.h5"):
        list(HDF5Dataset([tmp_path / "a.h5", tmp_path / "b.h5"], "x"))
    (tmp_path / "junk.h5").write_bytes(b"\0" * 64)
    with pytest.raises(DataLossError, match=r"junk\.h5 is not a readable HDF5 file"):
        list(HDF5Dataset(tmp_path / "junk.h5", "x"))
    with pytest.raises(TypeError, match="key must be"):
        HDF5Dataset(tmp_path / "a.h5", ("x", 3))


@pytest.mark.parametrize("reader,module,extra", [
    (lambda p: ParquetDataset(p), "pyarrow", "parquet"),
    (lambda p: HDF5Dataset(p, "x"), "h5py", "hdf5")])
def test_missing_library_names_the_extra(monkeypatch, tmp_path, reader, module, extra):
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, f"{module}.parquet", None)
    with pytest.raises(ImportError, match=rf'needs {module}: pip install "mpidist\[{extra}\]"'):
        reader(tmp_path / "a")


# -- Text lines --------------------------------------------------------------------------------------
LINES = ["first", "", "caf\u00e9 \u2603", "x" * 50, "a\tb", "last"]


def _write(path, text, compression):
    data = text.encode("utf-8")
    if compression == "GZIP":
        data = gzip.compress(data)
    elif compression == "ZLIB":
        data = zlib.compress(data)
    path.write_bytes(data)


@pytest.mark.parametrize("compression", [None, "", "GZIP", "ZLIB"])
@pytest.mark.parametrize("buffer_size", [None, 1, 7])
@pytest.mark.parametrize("ending,final", [("\n", True), ("\r\n", True), ("\n", False)])
def test_text_lines(tmp_path, compression, buffer_size, ending, final):
    _write(tmp_path / "t", ending.join(LINES) + (ending if final else ""), compression)
    ds = TextLineDataset(str(tmp_path / "t"), compression_type=compression, buffer_size=buffer_size)
    assert ds.element_spec == TensorSpec((), np.str_)
    got = list(ds)
    assert got == LINES and all(isinstance(e, np.str_) for e in got)
    assert ds.cardinality() == UNKNOWN_CARDINALITY
    np.testing.assert_array_equal(np.concatenate(list(ds.batch(4))), np.array(LINES))


def test_text_lines_across_files_in_parallel_and_edges(tmp_path):
    (tmp_path / "a").write_text("a1\na2\na3\n")
    (tmp_path / "b").write_text("b1\n")
    (tmp_path / "c").write_text("")
    (tmp_path / "d").write_text("d1\nd2")
    files = [str(tmp_path / n) for n in "abcd"]
    assert list(TextLineDataset(files)) == ["a1", "a2", "a3", "b1", "d1", "d2"]
    # TF: num_parallel_reads=N interleaves the files one line each, N at a time.
    assert list(TextLineDataset(files, num_parallel_reads=2)) == ["a1", "b1", "a2", "a3", "d1", "d2"]
    assert list(TextLineDataset(files, num_parallel_reads=3)) == ["a1", "b1", "a2", "d1", "a3", "d2"]
    # One very long line among many short ones: blocks stay small, the lines exact.
    lines = ["y" * 300_000] + ["z"] * 5000
    (tmp_path / "long").write_text("\n".join(lines))
    assert list(TextLineDataset(str(tmp_path / "long"))) == lines


def test_text_errors(tmp_path):
    with pytest.raises(InvalidArgumentError, match="compression_type must be None, '', 'GZIP' or 'ZLIB'"):
        TextLineDataset("x", compression_type="gzip")
    (tmp_path / "bin").write_bytes(b"ok\n\xff\xfe bad\n")
    with pytest.raises(InvalidArgumentError, match=r"bin is not UTF-8 text \(byte 3"):
        list(TextLineDataset(str(tmp_path / "bin")))
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"line\n" * 1000)[:-20])
    with pytest.raises(DataLossError, match=r"cut\.gz is not a complete GZIP file"):
        list(TextLineDataset(str(tmp_path / "cut.gz"), "GZIP"))
    (tmp_path / "cut.z").write_bytes(zlib.compress(b"line\n" * 1000)[:-20])
    with pytest.raises(DataLossError, match=r"cut\.z is not a complete ZLIB file"):
        list(TextLineDataset(str(tmp_path / "cut.z"), "ZLIB"))
    with pytest.raises(NotFoundError, match="missing.txt"):
        list(TextLineDataset(str(tmp_path / "missing.txt")))
