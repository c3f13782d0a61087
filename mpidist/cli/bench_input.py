"""``mpidist bench input``: training data read from files, beside the raw library and beside
memory, in one job (issue 25).

Two parts:

- ``readers`` (rank 0; the other ranks wait without spinning): for each format, the same rows
  (``x`` float32 [rows, 64], ``y`` int64; .npy files hold ``x`` alone) written as several files,
  read whole into batches of B rows by mpidist's pipeline,
  ``Dataset.list_files(pattern, shuffle=False).interleave(Reader, cycle_length=1).batch(B)``,
  and by the library itself: ``np.load(mmap_mode="r")`` with each batch copied out of the
  mapping (.npy); ``np.load(path)[key]``, which NumPy loads whole, cut into copied batches
  (.npz); ``ParquetFile.iter_batches`` to NumPy, the faster of ``batch_size=B`` and pyarrow's
  default batches cut into B-row copies (Parquet); ``dset[a:b]`` row ranges (HDF5). Both give
  the same batches, checked equal before timing. MB/s counts the array bytes delivered; the
  files are warm in the page cache (read once before timing).
- ``step`` (every rank): one training step of a 784-256-10 MLP (tanh, softmax cross-entropy,
  gradients by hand, ``optimizer.apply_gradients``) run by ``strategy.run`` over
  ``experimental_distribute_dataset``, fed (a) from memory,
  ``Dataset.from_tensor_slices((x, y)).batch(G)``, and (b) from .npy files holding the same
  rows (x and the label as one float32 matrix), ``list_files(...).interleave(NpyDataset)
  .batch(G).map(split).prefetch(AUTOTUNE)``: AUTO sharding reads each worker's own files.
  MultiWorkerMirroredStrategy with one CPU replica per rank under a launcher,
  OneDeviceStrategy alone. Both feeds are checked to cover every row once before timing.

Method: rounds interleave the cases (order flipped every round); a sample is one full pass;
reader samples are rank 0's, step samples the slowest rank's mean step; the figures are the
medians of the rounds. The files go to a temporary directory (under ``--dir`` if given), one
per rank so that no filesystem need be shared, removed at the end.
"""

# wait-ok-file: the timing barriers and reductions of the benchmark run on its own control
# communicator, as bench.Timer's do; bounding them would change what is measured.

import functools
import importlib
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpidist.cli import bench
from mpidist.comm.mpi import mpi_module

if TYPE_CHECKING:
    from mpidist.data import Dataset
    from mpidist.strategies.strategy import Strategy

__all__ = ["PARTS", "FORMATS", "DEFAULTS", "QUICK", "TARGETS", "run_input_benchmark",
           "input_table"]

PARTS = ("readers", "step")
FORMATS = ("npy", "npz", "parquet", "hdf5")
FEATURES = 64                       # readers: float32 values per row of x
STEP_WIDTHS = (784, 256, 10)        # the step's MLP: an MNIST-sized input, as realistic compute
DEFAULTS: dict[str, Any] = {"size": 64 << 20, "files": 8, "batch": 1024, "steps": 32,
                            "global_batch": 256, "rounds": 5}
QUICK: dict[str, Any] = {"size": 4 << 20, "files": 4, "batch": 1024, "steps": 8,
                         "global_batch": 256, "rounds": 3}
TARGETS = {"readers": 0.8, "step": 1.10}  # issue 25: readers >= 0.8x raw; step within 10%
_EXTRAS = {"parquet": ("pyarrow.parquet", "parquet"), "hdf5": ("h5py", "hdf5")}
_WAIT_S = 3600.0  # how long idle ranks wait for rank 0's reader part before giving up


# -- writing the files ----------------------------------------------------------------------------
def _missing_library(fmt: str) -> str | None:
    """Why ``fmt`` cannot be measured here (its library is missing), else None."""
    if fmt not in _EXTRAS:
        return None
    module, extra = _EXTRAS[fmt]
    try:
        importlib.import_module(module)
    except ImportError as err:
        return f"{module.split('.')[0]} is not installed (pip install 'mpidist[{extra}]'): {err}"
    return None


def _split_rows(rows: int, files: int, multiple: int) -> list[int]:
    """Rows per file: ``files`` parts of about ``rows / files``, each a multiple of
    ``multiple`` (at least one), so that both sides cut the same batches from each file."""
    per = max(1, round(rows / files / multiple)) * multiple
    return [per] * files


def _write_reader_files(directory: str, fmt: str, counts: Sequence[int]) -> int:
    """Write ``fmt`` files of ``counts`` rows each into ``directory``; the bytes of the arrays
    a full read delivers."""
    rng = np.random.default_rng(0)
    total = 0
    for i, n in enumerate(counts):
        x = rng.standard_normal((n, FEATURES), dtype=np.float32)
        y = rng.integers(0, 10, n, dtype=np.int64)
        path = os.path.join(directory, f"part-{i:04d}.{fmt}")
        if fmt == "npy":
            np.save(path, x)
            total += x.nbytes
            continue
        total += x.nbytes + y.nbytes
        if fmt == "npz":
            np.savez(path, x=x, y=y)
        elif fmt == "parquet":
            import pyarrow as pa  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra
            import pyarrow.parquet as pq  # type: ignore[import-untyped]  # noqa: PLC0415

            column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES)
            pq.write_table(pa.table({"x": column, "y": y}), path)
        else:
            import h5py  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra

            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=x)
                f.create_dataset("y", data=y)
    return total


# -- the two sides of each format -------------------------------------------------------------------
def _ours(fmt: str, pattern: str, batch: int) -> "Dataset":
    from mpidist.data import (  # noqa: PLC0415
        Dataset,
        HDF5Dataset,
        NpyDataset,
        NpzDataset,
        ParquetDataset,
    )

    readers: dict[str, Callable[[str], Dataset]] = {
        "npy": NpyDataset,
        "npz": lambda f: NpzDataset(f, keys=["x", "y"]),
        "parquet": lambda f: ParquetDataset(f, columns=["x", "y"]),
        "hdf5": lambda f: HDF5Dataset(f, key={"x": "x", "y": "y"}),
    }
    files = Dataset.list_files(pattern, shuffle=False)
    return files.interleave(readers[fmt], cycle_length=1).batch(batch)


def _raw_npy(paths: Sequence[str], batch: int) -> Iterator[Any]:
    for p in paths:
        mapped = np.load(p, mmap_mode="r")
        for i in range(0, len(mapped), batch):
            yield np.array(mapped[i:i + batch])
        del mapped


def _raw_npz(paths: Sequence[str], batch: int) -> Iterator[Any]:
    for p in paths:
        with np.load(p) as archive:
            x, y = archive["x"], archive["y"]
        for i in range(0, len(x), batch):
            yield {"x": x[i:i + batch].copy(), "y": y[i:i + batch].copy()}


def _arrow_columns(record_batch: Any) -> dict[str, np.ndarray]:
    x = record_batch.column("x")
    return {"x": x.flatten().to_numpy().reshape(len(x), FEATURES),
            "y": record_batch.column("y").to_numpy()}


def _raw_parquet(paths: Sequence[str], batch: int) -> Iterator[Any]:
    import pyarrow.parquet as pq  # noqa: PLC0415 - optional extra

    for p in paths:
        for b in pq.ParquetFile(p).iter_batches(batch_size=batch, columns=["x", "y"]):
            yield _arrow_columns(b)


def _raw_parquet_cut(paths: Sequence[str], batch: int) -> Iterator[Any]:
    import pyarrow.parquet as pq  # noqa: PLC0415 - optional extra

    for p in paths:
        for b in pq.ParquetFile(p).iter_batches(columns=["x", "y"]):
            cols = _arrow_columns(b)
            for i in range(0, len(cols["x"]), batch):
                yield {k: v[i:i + batch].copy() for k, v in cols.items()}


def _raw_hdf5(paths: Sequence[str], batch: int) -> Iterator[Any]:
    import h5py  # noqa: PLC0415 - optional extra

    for p in paths:
        with h5py.File(p, "r") as f:
            x, y = f["x"], f["y"]
            for i in range(0, x.shape[0], batch):
                yield {"x": x[i:i + batch], "y": y[i:i + batch]}


# format -> (what ours is, [(what raw is, raw reader)])
_SIDES: dict[str, tuple[str, list[tuple[str, Callable[[Sequence[str], int], Iterator[Any]]]]]] = {
    "npy": ("NpyDataset", [("np.load(mmap_mode='r'), slices copied", _raw_npy)]),
    "npz": ("NpzDataset(keys=[x, y])", [("np.load(f)[key], slices copied", _raw_npz)]),
    "parquet": ("ParquetDataset(columns=[x, y])", [
        ("ParquetFile.iter_batches(batch_size=B)", _raw_parquet),
        ("ParquetFile.iter_batches(), cut into copies", _raw_parquet_cut)]),
    "hdf5": ("HDF5Dataset(key={x, y})", [("h5py dset[a:b] row ranges", _raw_hdf5)]),
}


def _same_batches(ours: Iterable[Any], raw: Iterable[Any]) -> str | None:
    """Why the two streams of batches differ, or None when they are equal batch by batch."""
    from mpidist.core import nest  # noqa: PLC0415

    sentinel = object()
    mine, theirs = iter(ours), iter(raw)
    for i in itertools.count():
        a, b = next(mine, sentinel), next(theirs, sentinel)
        if a is sentinel or b is sentinel:
            return None if a is b else f"batch {i}: one side ended, the other did not"
        for x, y in zip(nest.flatten(a), nest.flatten(b)):
            if x.shape != y.shape or not np.array_equal(x, y):
                return f"batch {i}: shapes {x.shape} vs {y.shape} or values differ"
    return None


def _one_pass(batches: Iterable[Any]) -> float:
    start = time.perf_counter()
    for _ in batches:
        pass
    return time.perf_counter() - start


def _reader_rows(directory: str, formats: Sequence[str], size: int, files: int, batch: int,
                 rounds: int) -> list[bench.Row]:
    """The readers part on this process: one row per format (a note where it is skipped)."""
    rows: list[bench.Row] = []
    row_bytes = FEATURES * 4 + 8
    counts = _split_rows(max(1, size // row_bytes), files, batch)
    cases: dict[str, dict[str, Callable[[], Iterable[Any]]]] = {}
    meta: dict[str, bench.Row] = {}
    for fmt in formats:
        missing = _missing_library(fmt)
        if missing:
            rows.append({"part": "readers", "format": fmt, "skipped": missing})
            continue
        where = os.path.join(directory, fmt)
        os.makedirs(where)
        nbytes = _write_reader_files(where, fmt, counts)
        pattern = os.path.join(where, f"*.{fmt}")
        paths = sorted(os.path.join(where, n) for n in os.listdir(where))
        ours_name, raws = _SIDES[fmt]
        fmt_cases: dict[str, Callable[[], Iterable[Any]]] = {
            "ours": functools.partial(_ours, fmt, pattern, batch)}
        for label, raw in raws:
            fmt_cases[label] = functools.partial(raw, paths, batch)
        for label in list(fmt_cases)[1:]:
            wrong = _same_batches(fmt_cases["ours"](), fmt_cases[label]())  # also warms the cache
            if wrong:
                raise bench.CheckFailed(f"bench input: {fmt}: mpidist's batches differ from "
                                        f"{label}'s: {wrong}", detail=wrong)
        cases[fmt] = fmt_cases
        meta[fmt] = {"part": "readers", "format": fmt, "files": files, "rows": sum(counts),
                     "bytes": nbytes, "batch": batch,
                     "ours": f"list_files(shuffle=False).interleave({ours_name}, "
                             f"cycle_length=1).batch({batch})"}
    samples: dict[str, dict[str, list[float]]] = {
        fmt: {name: [] for name in c} for fmt, c in cases.items()}
    for r in range(rounds):
        for fmt, fmt_cases in cases.items():
            names = list(fmt_cases) if r % 2 == 0 else list(fmt_cases)[::-1]
            for name in names:
                samples[fmt][name].append(_one_pass(fmt_cases[name]()))
    for fmt in cases:
        row = meta[fmt]
        medians = {name: statistics.median(s) for name, s in samples[fmt].items()}
        raw_name = min((n for n in medians if n != "ours"), key=lambda n: medians[n])
        mb = row["bytes"] / 1e6
        row.update({"ours_s": medians["ours"], "raw_s": medians[raw_name], "raw": raw_name,
                    "ours_mb_s": mb / medians["ours"], "raw_mb_s": mb / medians[raw_name],
                    "ratio": medians[raw_name] / medians["ours"],
                    "samples_s": samples[fmt]})
        rows.append(row)
    return rows


# -- the step fed from files vs memory --------------------------------------------------------------
class _MLP:
    """784 -> 256 (tanh) -> 10, softmax cross-entropy, gradients by hand (float32)."""

    def __init__(self, widths: Sequence[int]) -> None:
        import mpidist  # noqa: PLC0415

        rng = np.random.default_rng(0)
        n_in, hidden, n_out = widths
        f32 = np.float32
        self.variables = [
            mpidist.Variable(rng.normal(0, 1 / np.sqrt(n_in), (n_in, hidden)).astype(f32), name="w1"),
            mpidist.Variable(np.zeros(hidden, f32), name="b1"),
            mpidist.Variable(rng.normal(0, 1 / np.sqrt(hidden), (hidden, n_out)).astype(f32),
                             name="w2"),
            mpidist.Variable(np.zeros(n_out, f32), name="b2")]

    def gradients(self, x: np.ndarray, y: np.ndarray, global_batch: int) -> list[np.ndarray]:
        """Gradients of this replica's share of the mean loss over the global batch."""
        w1, b1, w2, b2 = (v.read_value() for v in self.variables)
        h = np.tanh(x @ w1 + b1)
        logits = h @ w2 + b2
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
        probs[np.arange(len(y)), y] -= 1.0
        d_logits = probs / np.float32(global_batch)
        d_h = (d_logits @ w2.T) * (1.0 - h * h)
        return [x.T @ d_h, d_h.sum(axis=0), h.T @ d_logits, d_logits.sum(axis=0)]


def _strategy(size: int) -> tuple[str, "Strategy"]:
    import mpidist  # noqa: PLC0415 - the strategy layer
    from mpidist.cluster_resolver import MPIClusterResolver  # noqa: PLC0415

    if size == 1:
        return "OneDevice", mpidist.OneDeviceStrategy("/cpu:0")
    resolver = MPIClusterResolver(local_devices=["/cpu:0"])
    return f"MWMS {size}x1", mpidist.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


def _step_data(steps: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
    rows = steps * global_batch
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, STEP_WIDTHS[0]), dtype=np.float32)
    y = rng.integers(0, STEP_WIDTHS[-1], rows, dtype=np.int64)
    return x, y


def _write_step_files(directory: str, x: np.ndarray, y: np.ndarray, files: int) -> str:
    """The rows as ``files`` .npy files of [x | label] float32 rows; the glob pattern."""
    table = np.empty((len(x), x.shape[1] + 1), np.float32)
    table[:, :-1] = x
    table[:, -1] = y
    for i, part in enumerate(np.array_split(table, files)):
        np.save(os.path.join(directory, f"step-{i:04d}.npy"), part)
    return os.path.join(directory, "step-*.npy")


def _split_label(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # contiguous, as the in-memory feed is (a strided x slows the matmul); copied in the
    # prefetch thread, off the step
    return np.ascontiguousarray(rows[:, :-1]), rows[:, -1].astype(np.int64)


def _coverage(strategy: "Strategy", dist: Any, control: Any, mpi: Any) -> np.ndarray:
    """[rows, label sum, feature sum] over one pass of ``dist``, summed over the job."""
    seen = np.zeros(3)
    for x, y in dist:
        for xs, ys in zip(strategy.experimental_local_results(x),
                          strategy.experimental_local_results(y)):
            seen += [len(ys), np.sum(ys), np.sum(xs, dtype=np.float64)]
    total = np.empty_like(seen)
    control.Allreduce(seen, total, mpi.SUM)
    return total


def _step_rows(directory: str, steps: int, global_batch: int, files: int, rounds: int,
               control: Any, mpi: Any) -> list[bench.Row]:
    import mpidist  # noqa: PLC0415
    from mpidist.data import AUTOTUNE, Dataset, NpyDataset  # noqa: PLC0415

    size = control.Get_size()
    label, strategy = _strategy(size)
    files = max(files, size)  # FILE sharding needs a file per worker
    x, y = _step_data(steps, global_batch)
    pattern = _write_step_files(directory, x, y, files)
    feeds = {
        "memory": Dataset.from_tensor_slices((x, y)).batch(global_batch),
        "files": Dataset.list_files(pattern, shuffle=False).interleave(NpyDataset, cycle_length=1)
        .batch(global_batch).map(_split_label).prefetch(AUTOTUNE),
    }
    dists = {k: strategy.experimental_distribute_dataset(d) for k, d in feeds.items()}
    want = np.array([len(y), y.sum(), x.sum(dtype=np.float64)])
    for name, dist in dists.items():
        got = _coverage(strategy, dist, control, mpi)
        wrong = None if np.allclose(got, want, rtol=1e-9) else \
            f"{name}: rows, label sum, feature sum {got.tolist()}, expected {want.tolist()}"
        bench.agree_on_check(control, wrong, f"bench input step ({name}): every row once")
    with strategy.scope():
        model = _MLP(STEP_WIDTHS)
        optimizer = mpidist.optimizers.SGD(0.01)

    def step(xs: np.ndarray, ys: np.ndarray) -> None:
        grads = model.gradients(xs, ys, global_batch)
        optimizer.apply_gradients(zip(grads, model.variables))

    def epoch(dist: Any, train: bool = True) -> float:
        """The slowest rank's mean time per step over one pass (``train=False``: the input
        alone, each step's batch taken and dropped)."""
        control.Barrier()
        start = time.perf_counter()
        count = 0
        for xs, ys in dist:
            if train:
                strategy.run(step, args=(xs, ys))
            count += 1
        elapsed = time.perf_counter() - start
        return cast(float, control.allreduce(elapsed, op=mpi.MAX)) / max(1, count)

    cases = {name: functools.partial(epoch, dist) for name, dist in dists.items()}
    cases.update({f"{name} input": functools.partial(epoch, dist, False)
                  for name, dist in dists.items()})
    for case in cases.values():  # warm-up: caches, BLAS, the optimizer's slots
        case()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            samples[name].append(cases[name]())
    med = {name: statistics.median(v) * 1e3 for name, v in samples.items()}
    return [{"part": "step", "strategy": label, "ranks": size,
             "replicas": strategy.num_replicas_in_sync,
             "model": "-".join(map(str, STEP_WIDTHS)), "global_batch": global_batch,
             "steps": steps, "files": files, "rows": len(y),
             "memory": "from_tensor_slices((x, y)).batch(G)",
             "files_pipeline": "list_files(shuffle=False).interleave(NpyDataset, cycle_length=1)"
                               ".batch(G).map(split x/y).prefetch(AUTOTUNE)",
             "memory_ms": med["memory"], "files_ms": med["files"],
             "ratio": med["files"] / med["memory"],
             "memory_input_ms": med["memory input"], "files_input_ms": med["files input"],
             "samples_ms": {k: [s * 1e3 for s in v] for k, v in samples.items()}}]


# -- the run -------------------------------------------------------------------------------------
def _idle_until_rank0(control: Any) -> None:
    """Every rank leaves when rank 0 arrives; the others sleep meanwhile (a spinning rank
    would take a core from the one that measures)."""
    from mpidist.core.waiting import wait_until  # noqa: PLC0415

    request = control.Ibarrier()
    wait_until(request.Test, "rank 0's reader measurements", "rank 0", timeout=_WAIT_S)


def run_input_benchmark(parts: Sequence[str] = PARTS, formats: Sequence[str] = FORMATS,
                        quick: bool = False, size: int | None = None, files: int | None = None,
                        batch: int | None = None, steps: int | None = None,
                        global_batch: int | None = None, rounds: int | None = None,
                        directory: str | None = None) -> tuple[bench.Job, list[bench.Row],
                                                               dict[str, Any]]:
    """Run the parts on this job: ``(job, rows, settings)`` on every rank (reader rows only on
    rank 0). Options left None take ``QUICK``'s or ``DEFAULTS``' value."""
    from mpidist.comm.communicator import world_communicator  # noqa: PLC0415 - starts MPI

    base = QUICK if quick else DEFAULTS
    given = {"size": size, "files": files, "batch": batch, "steps": steps,
             "global_batch": global_batch, "rounds": rounds}
    settings = {k: (v if v is not None else base[k]) for k, v in given.items()}
    settings.update(parts=list(parts), formats=list(formats), quick=quick)
    mpi = mpi_module()
    comm = world_communicator()
    job = bench.job_facts(comm, mpi)
    control = mpi.COMM_WORLD.Dup()  # barriers and timing reductions, off mpidist's communicator
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    mine = tempfile.mkdtemp(prefix=f"mpidist-bench-input-r{control.Get_rank()}-", dir=directory)
    settings["dir"] = os.path.dirname(mine)
    rows: list[bench.Row] = []
    try:
        if "readers" in parts:
            failure: str | None = None
            if control.Get_rank() == 0:
                try:
                    rows += _reader_rows(mine, formats, settings["size"], settings["files"],
                                         settings["batch"], settings["rounds"])
                except Exception as err:  # noqa: BLE001 - every rank must learn of it
                    failure = f"{type(err).__name__}: {err}"
            _idle_until_rank0(control)
            bench.agree_on_check(control, failure, "bench input readers")
        if "step" in parts:
            rows += _step_rows(mine, settings["steps"], settings["global_batch"],
                               settings["files"], settings["rounds"], control, mpi)
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        control.Free()
    return job, rows, settings


# -- the table ----------------------------------------------------------------------------------
def input_table(job: bench.Job, rows: Sequence[bench.Row], settings: dict[str, Any]) -> list[str]:
    """The report rank 0 prints."""
    out = [f"# mpidist bench input: {job['ranks']} rank(s) on {job['nodes']} node(s), "
           f"{job['mpi_library']}; medians of {settings['rounds']} interleaved rounds"]
    readers = [r for r in rows if r["part"] == "readers"]
    if readers:
        done = next((r for r in readers if "skipped" not in r), None)
        if done:
            out.append(f"# readers (rank 0, one process): {done['bytes'] / 2**20:.1f} MiB "
                       f"in {done['files']} files per format, batches of {done['batch']} rows, "
                       "files in the page cache; MB/s of array data; target ours/raw >= "
                       f"{TARGETS['readers']}")
        out.append(f"{'format':8} {'ours MB/s':>10} {'raw MB/s':>10} {'ours/raw':>9}  raw")
        for r in readers:
            if "skipped" in r:
                out.append(f"{r['format']:8} skipped: {r['skipped']}")
                continue
            out.append(f"{r['format']:8} {r['ours_mb_s']:10.0f} {r['raw_mb_s']:10.0f} "
                       f"{r['ratio']:9.2f}  {r['raw']}")
        out.append("# ours: Dataset.list_files(pattern, shuffle=False).interleave(Reader, "
                   "cycle_length=1).batch(B)")
    for r in (r for r in rows if r["part"] == "step"):
        out.append(f"# step: {r['strategy']}, {r['model']} MLP, global batch {r['global_batch']}, "
                   f"{r['steps']} steps per pass, {r['files']} .npy files; slowest rank's ms per "
                   f"step; target files/memory <= {TARGETS['step']:.2f}")
        out.append(f"{'strategy':12} {'memory ms':>10} {'files ms':>10} {'files/memory':>13} "
                   f"{'input alone: memory ms':>23} {'files ms':>9}")
        out.append(f"{r['strategy']:12} {r['memory_ms']:10.2f} {r['files_ms']:10.2f} "
                   f"{r['ratio']:13.2f} {r['memory_input_ms']:23.3f} {r['files_input_ms']:9.3f}")
        out.append(f"# memory: {r['memory']}; files: {r['files_pipeline']}")
    return out
