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

``measure(...)`` returns the rows for ``mpidist bench input``.
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from mpidist.data import HDF5Dataset, NpyDataset, NpzDataset, ParquetDataset, TextLineDataset

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


READERS = {
    "npy": (lambda paths: NpyDataset(paths), [raw_npy]),
    "npz": (lambda paths: NpzDataset(paths, keys=["x", "y"]), [raw_npz]),
    "parquet": (lambda paths: ParquetDataset(paths, columns=["x", "y"]),
                [raw_parquet_exact, raw_parquet_cut]),
    "hdf5": (lambda paths: HDF5Dataset(paths, "x"), [raw_hdf5]),
    "text": (lambda paths: TextLineDataset(paths), [raw_text]),
}


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
        times = {"reader": []} | {r.__name__: [] for r in raws}
        runs = [("reader", lambda: iter(make_reader(paths).batch(batch)))]
        runs += [(r.__name__, lambda r=r: r(paths, batch)) for r in raws]
        for _, run in runs:  # warm: page cache, imports
            _seconds(run)
        for _ in range(rounds):
            for name, run in runs:
                times[name].append(_seconds(run))
        mb = nbytes / 1e6
        reader = mb / statistics.median(times["reader"])
        best = max((r.__name__ for r in raws), key=lambda n: mb / statistics.median(times[n]))
        results[fmt] = (reader, mb / statistics.median(times[best]), best)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=32, help="MB per file")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--formats", default="npy,npz,parquet,hdf5,text")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        files = write_files(directory, args.files, args.mb, args.formats.split(","))
        results = measure(files, args.batch, args.rounds)
    print(f"{args.files} files x {args.mb} MB, batch {args.batch}, median of {args.rounds} rounds "
          "(MB/s of data)")
    print(f"{'format':8} {'reader':>9} {'raw':>9} {'ratio':>6}  raw variant")
    for fmt, (reader, raw, name) in results.items():
        print(f"{fmt:8} {reader:9.0f} {raw:9.0f} {reader / raw:6.2f}  {name}")


if __name__ == "__main__":
    main()
