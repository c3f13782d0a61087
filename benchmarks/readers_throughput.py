"""Throughput of mpidist's file readers beside the raw library reading the same files into the
same batches (issue 25: a reader must reach 0.8x the raw library).

For each format, ``Reader(files).batch(B)`` iterated fully against the library by hand:
``np.load(mmap_mode="r")`` slices copied (.npy), ``np.load(...)[key]`` sliced (.npz, which
NumPy can only load whole), ``ParquetFile.iter_batches`` to NumPy (the faster of
``batch_size=B`` and pyarrow's default batches cut into B-row copies), ``dset[a:b]`` row
ranges (HDF5) and a Python loop over lines (text). Rounds alternate reader and raw; the table
gives medians in MB/s of file data (the array bytes; text: the file bytes), files warm in the
page cache (read once before timing).

    python benchmarks/readers_throughput.py [--mb 32] [--files 4] [--rounds 5] [--batch 256]

TFRecord (``--formats tfrecord``): files of tf.train.Example records (``x``: 16 float32,
``y``: one int64, 100 bytes each), ``TFRecordDataset(files).batch(B).map(parse_example)``
against TensorFlow's own ``tf.data.TFRecordDataset(files).batch(B).map(tf.io.parse_example)``
(if TensorFlow imports; ``--extra-path DIR`` appends a folder where it is installed to
sys.path, after NumPy's). MB/s of record bytes. Rows "tfrecord-read" time the records alone
(no parsing) against TF's reading alone.
CSV (``--formats csv``): files of 16 float columns and an int label, ``CsvDataset(files,
defaults).batch(B)`` against ``pyarrow.csv.read_csv`` (whole file, cut into B-row column
batches) and ``pandas.read_csv`` (same; if pandas imports). MB/s of file bytes.

``measure(...)`` returns the rows for ``mpidist bench input``.
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from mpidist.data import (
    HDF5Dataset,
    NpyDataset,
    NpzDataset,
    ParquetDataset,
    TextLineDataset,
    TFRecordDataset,
)
from mpidist.data.experimental import CsvDataset

ROW = 64  # float32 values per row: 256-byte rows


def write_files(directory, files, mb, formats):
    """Files of ``mb`` MB each in ``directory``: {format: (paths, data bytes)}."""
    rows = (mb << 20) // (ROW * 4)
    rng = np.random.default_rng(0)
    out = {}
    arrays = [rng.standard_normal((rows, ROW), dtype=np.float32) for _ in range(files)]
    labels = [rng.integers(0, 10, rows).astype(np.int64) for _ in range(files)]
    data_bytes = sum(a.nbytes for a in arrays)
    if "npy" in formats:
        paths = [os.path.join(directory, f"x{i}.npy") for i in range(files)]
        for p, a in zip(paths, arrays):
            np.save(p, a)
        out["npy"] = (paths, data_bytes)
    if "npz" in formats:
        paths = [os.path.join(directory, f"x{i}.npz") for i in range(files)]
        for p, a, y in zip(paths, arrays, labels):
            np.savez(p, x=a, y=y)
        out["npz"] = (paths, data_bytes + sum(y.nbytes for y in labels))
    if "parquet" in formats:
        import pyarrow as pa
        import pyarrow.parquet as pq
        paths = [os.path.join(directory, f"x{i}.parquet") for i in range(files)]
        for p, a, y in zip(paths, arrays, labels):
            x = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), ROW)
            pq.write_table(pa.table({"x": x, "y": y}), p)
        out["parquet"] = (paths, data_bytes + sum(y.nbytes for y in labels))
    if "hdf5" in formats:
        import h5py
        paths = [os.path.join(directory, f"x{i}.h5") for i in range(files)]
        for p, a in zip(paths, arrays):
            with h5py.File(p, "w") as f:
                f.create_dataset("x", data=a)
        out["hdf5"] = (paths, data_bytes)
    if "tfrecord" in formats or "tfrecord-read" in formats:
        from mpidist.io import TFRecordWriter, encode_example
        paths = [os.path.join(directory, f"x{i}.tfrecord") for i in range(files)]
        n = (mb << 20) // 100
        for k, p in enumerate(paths):
            xs = rng.standard_normal((n, 16), dtype=np.float32)
            with TFRecordWriter(p) as w:
                for i in range(n):
                    w.write(encode_example({"x": xs[i], "y": (i + k) % 10}))
        for fmt in ("tfrecord", "tfrecord-read"):
            if fmt in formats:
                out[fmt] = (paths, sum(os.path.getsize(p) for p in paths))
    if "csv" in formats:
        paths = [os.path.join(directory, f"x{i}.csv") for i in range(files)]
        n = (mb << 20) // 160
        for p in paths:
            xs = rng.standard_normal((n, 16)).astype(np.float32)
            ys = rng.integers(0, 10, n)
            with open(p, "w") as f:
                f.write(",".join([f"f{j}" for j in range(16)] + ["label"]) + "\n")
                for row, y in zip(xs, ys):
                    f.write(",".join(f"{v:.5g}" for v in row) + f",{y}\n")
        out["csv"] = (paths, sum(os.path.getsize(p) for p in paths))
    if "text" in formats:
        paths = [os.path.join(directory, f"x{i}.txt") for i in range(files)]
        for p, y in zip(paths, labels):
            with open(p, "w") as f:
                f.write("\n".join(f"line {v} of some text data" for v in y) + "\n")
        out["text"] = (paths, sum(os.path.getsize(p) for p in paths))
    return out


def raw_npy(paths, batch):
    for p in paths:
        mm = np.load(p, mmap_mode="r")
        for i in range(0, len(mm), batch):
            yield np.array(mm[i:i + batch])
        del mm


def raw_npz(paths, batch):
    for p in paths:
        with np.load(p) as z:
            x, y = z["x"], z["y"]
        for i in range(0, len(x), batch):
            yield {"x": x[i:i + batch].copy(), "y": y[i:i + batch].copy()}


def _arrow_numpy(column):
    import pyarrow as pa
    if pa.types.is_fixed_size_list(column.type):
        return column.flatten().to_numpy().reshape(len(column), column.type.list_size)
    return column.to_numpy()


def raw_parquet_exact(paths, batch):
    import pyarrow.parquet as pq
    for p in paths:
        for b in pq.ParquetFile(p).iter_batches(batch_size=batch, columns=["x", "y"]):
            yield {"x": _arrow_numpy(b.column("x")), "y": _arrow_numpy(b.column("y"))}


def raw_parquet_cut(paths, batch):
    import pyarrow.parquet as pq
    for p in paths:
        for b in pq.ParquetFile(p).iter_batches(columns=["x", "y"]):
            x, y = _arrow_numpy(b.column("x")), _arrow_numpy(b.column("y"))
            for i in range(0, len(x), batch):
                yield {"x": x[i:i + batch].copy(), "y": y[i:i + batch].copy()}


def raw_hdf5(paths, batch):
    import h5py
    for p in paths:
        with h5py.File(p, "r") as f:
            d = f["x"]
            for i in range(0, d.shape[0], batch):
                yield d[i:i + batch]


def raw_text(paths, batch):
    for p in paths:
        with open(p, encoding="utf-8") as f:
            lines = []
            for line in f:
                lines.append(line.rstrip("\n"))
                if len(lines) == batch:
                    yield np.array(lines)
                    lines = []
            if lines:
                yield np.array(lines)


TF_SPEC = None


def _tf():
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


def raw_tensorflow(paths, batch):
    tf = _tf()
    spec = {"x": tf.io.FixedLenFeature([16], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(paths).batch(batch).map(lambda s: tf.io.parse_example(s, spec))
    for b in ds:
        yield {k: v.numpy() for k, v in b.items()}


def raw_tensorflow_read(paths, batch):
    tf = _tf()
    for b in tf.data.TFRecordDataset(paths).batch(batch):
        yield b.numpy()


def _ours_tfrecord(paths):
    from mpidist.io import FixedLenFeature, parse_example
    spec = {"x": FixedLenFeature([16], np.float32), "y": FixedLenFeature([], np.int64)}
    return TFRecordDataset(paths).batch(_BATCH[0]).map(lambda s: parse_example(s, spec))


_BATCH = [256]
CSV_DEFAULTS = [[0.0]] * 16 + [[0]]


def raw_pyarrow_csv(paths, batch):
    import pyarrow.csv as pacsv
    for p in paths:
        table = pacsv.read_csv(p)
        cols = [c.to_numpy() for c in table.columns]
        for i in range(0, table.num_rows, batch):
            yield tuple(c[i:i + batch].copy() for c in cols)


def raw_pandas(paths, batch):
    import pandas as pd
    for p in paths:
        frame = pd.read_csv(p)
        cols = [frame[c].to_numpy() for c in frame.columns]
        for i in range(0, len(frame), batch):
            yield tuple(c[i:i + batch].copy() for c in cols)


def _has(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


READERS = {
    "npy": (lambda paths: NpyDataset(paths), [raw_npy]),
    "npz": (lambda paths: NpzDataset(paths, keys=["x", "y"]), [raw_npz]),
    "parquet": (lambda paths: ParquetDataset(paths, columns=["x", "y"]),
                [raw_parquet_exact, raw_parquet_cut]),
    "hdf5": (lambda paths: HDF5Dataset(paths, "x"), [raw_hdf5]),
    "text": (lambda paths: TextLineDataset(paths), [raw_text]),
    # TFRecord and CSV: the raw library's variants that import here (TF, pandas are optional)
    "tfrecord": (lambda paths: _ours_tfrecord(paths), [raw_tensorflow]),
    "tfrecord-read": (lambda paths: TFRecordDataset(paths), [raw_tensorflow_read]),
    "csv": (lambda paths: CsvDataset(paths, CSV_DEFAULTS, header=True), [raw_pyarrow_csv, raw_pandas]),
}
_PREBATCHED = {"tfrecord"}
_NEEDS = {raw_tensorflow: "tensorflow", raw_tensorflow_read: "tensorflow", raw_pandas: "pandas"}


def _seconds(make_batches):
    start = time.perf_counter()
    for _ in make_batches():
        pass
    return time.perf_counter() - start


def measure(files, batch=256, rounds=5):
    """{format: (reader MB/s, raw MB/s, raw variant name)} over ``files`` (write_files')."""
    results = {}
    for fmt, (paths, nbytes) in files.items():
        make_reader, raws = READERS[fmt]
        raws = [r for r in raws if r not in _NEEDS or _has(_NEEDS[r])]
        times = {"reader": []} | {r.__name__: [] for r in raws}
        if fmt in _PREBATCHED:  # batch then parse, as TF pipelines of Examples do
            runs = [("reader", lambda: iter(make_reader(paths)))]
        else:
            runs = [("reader", lambda: iter(make_reader(paths).batch(batch)))]
        runs += [(r.__name__, lambda r=r: r(paths, batch)) for r in raws]
        for _, run in runs:  # warm: page cache, imports
            _seconds(run)
        for _ in range(rounds):
            for name, run in runs:
                times[name].append(_seconds(run))
        mb = nbytes / 1e6
        reader = mb / statistics.median(times["reader"])
        if not raws:
            results[fmt] = (mb / statistics.median(times["reader"]), float("nan"), "(none installed)", {})
            continue
        best = max((r.__name__ for r in raws), key=lambda n: mb / statistics.median(times[n]))
        others = {n: mb / statistics.median(times[n]) for n in times if n not in ("reader", best)}
        results[fmt] = (reader, mb / statistics.median(times[best]), best, others)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=32, help="MB per file")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--formats", default="npy,npz,parquet,hdf5,text")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="a folder appended to sys.path (e.g. where tensorflow or pandas is installed)")
    args = parser.parse_args()
    import sys
    sys.path.extend(args.extra_path)
    _BATCH[0] = args.batch
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        files = write_files(directory, args.files, args.mb, args.formats.split(","))
        results = measure(files, args.batch, args.rounds)
    print(f"{args.files} files x {args.mb} MB, batch {args.batch}, median of {args.rounds} rounds "
          "(MB/s of data)")
    print(f"{'format':13} {'reader':>9} {'raw':>9} {'ratio':>6}  raw variant")
    for fmt, (reader, raw, name, others) in results.items():
        print(f"{fmt:13} {reader:9.0f} {raw:9.0f} {reader / raw:6.2f}  {name}")
        for other, rate in others.items():
            print(f"{'':13} {'':9} {rate:9.0f} {reader / rate:6.2f}  {other}")


if __name__ == "__main__":
    main()
