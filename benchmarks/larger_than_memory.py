"""Training on a dataset larger than a rank's memory: every row once per epoch, RSS bounded by
the pipeline's buffers, not by the data.

    python benchmarks/larger_than_memory.py --write --dir /tmp/big --data-mb 1024
    mpiexec -n 2 python benchmarks/larger_than_memory.py --dir /tmp/big --cap-mb 256

The files hold float32 rows ``[id, features...]``. Each rank trains a linear model under
MultiWorkerMirroredStrategy from ``list_files(...).interleave(NpyDataset).shuffle(...).batch(...)
.prefetch(...)`` (AUTO sharding: each worker reads its own files) for one epoch, counts how
often it saw each row id, and measures its peak RSS over the epoch (VmHWM after resetting it
through /proc/self/clear_refs), and how much of it the epoch added. The counts are summed over
the ranks: every id must come out exactly 1. The cap (on the peak RSS of each rank, all of
it: Python, NumPy, MPI and the compiled kernels included) is checked on every rank; exit
status 1 if it or the exactly-once check fails.
"""

import argparse
import json
import os
import sys

import numpy as np

import mpidist
from mpidist.data import AUTOTUNE, Dataset, NpyDataset

FEATURES = 63  # + the id column: 256 bytes per row
BATCH = 1024


def write(directory, data_mb, files=16):
    """``files`` .npy files (of uneven sizes) of ``data_mb`` MiB in all, written in chunks
    (never the whole file in memory)."""
    os.makedirs(directory, exist_ok=True)
    total_rows = data_mb * (1 << 20) // (4 * (FEATURES + 1))
    weights = np.linspace(0.5, 1.5, files)
    counts = np.floor(weights / weights.sum() * total_rows).astype(int)
    counts[-1] += total_rows - counts.sum()
    start, rng = 0, np.random.default_rng(0)
    for i, n in enumerate(counts):
        out = np.lib.format.open_memmap(os.path.join(directory, f"part-{i:03d}.npy"), mode="w+",
                                        dtype=np.float32, shape=(int(n), FEATURES + 1))
        for a in range(0, n, 65536):
            b = min(n, a + 65536)
            out[a:b, 0] = np.arange(start + a, start + b)
            out[a:b, 1:] = rng.standard_normal((b - a, FEATURES), dtype=np.float32)
        out.flush()
        del out
        start += int(n)
    return start


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # MiB
    raise KeyError(field)


def train(directory, cap_mb):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    strategy = mpidist.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = mpidist.Variable(np.zeros(FEATURES, np.float32), name="w")
        optimizer = mpidist.optimizers.SGD(1e-3)
    files = Dataset.list_files(os.path.join(directory, "part-*.npy"))
    pipeline = files.interleave(NpyDataset, cycle_length=2).shuffle(8192).batch(BATCH) \
        .prefetch(AUTOTUNE)
    dist = strategy.experimental_distribute_dataset(pipeline)
    total_rows = sum(int(np.load(os.path.join(directory, f), mmap_mode="r").shape[0])
                     for f in os.listdir(directory) if f.endswith(".npy"))
    seen = np.zeros(total_rows, np.uint8)

    def step(batch):
        ids, x = batch[:, 0].astype(np.int64), batch[:, 1:]
        err = x @ w.read_value() - x[:, 0]  # learn to copy the first feature
        grad = x.T @ err / BATCH
        optimizer.apply_gradients([(grad, w)])
        return ids

    # One step on zeros first (gradient 0, w unchanged): the optimizer's kernels compile on
    # their first call, and the compiler's memory is not the pipeline's.
    strategy.run(step, args=(np.zeros((BATCH, FEATURES + 1), np.float32),))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM: the peak measured is this epoch's
    base = status("VmRSS")
    for batch in dist:
        ids = strategy.experimental_local_results(strategy.run(step, args=(batch,)))[0]
        np.add.at(seen, ids, 1)
    peak = status("VmHWM")
    comm.Allreduce(MPI.IN_PLACE, seen, op=MPI.SUM)
    growths = comm.gather(peak - base, root=0)
    bases = comm.gather(base, root=0)
    data_mb = total_rows * 4 * (FEATURES + 1) / (1 << 20)
    peaks = comm.gather(peak, root=0)
    ok = bool((seen == 1).all()) and max(comm.allgather(peak)) <= cap_mb
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "rows": total_rows, "data_mib": round(data_mb, 1),
                          "cap_mib": cap_mb, "peak_rss_mib": [round(p, 1) for p in peaks],
                          "rss_growth_mib": [round(g, 1) for g in growths],
                          "rss_base_mib": [round(b, 1) for b in bases],
                          "every_row_once": bool((seen == 1).all()),
                          "final_w0": float(w.numpy()[0]), "ok": ok}))
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--write", action="store_true", help="write the files and exit")
    parser.add_argument("--data-mb", type=int, default=1024)
    parser.add_argument("--cap-mb", type=float, default=256.0, help="peak RSS cap per rank")
    args = parser.parse_args(argv)
    if args.write:
        print(f"wrote {write(args.dir, args.data_mb)} rows to {args.dir}")
        return 0
    return 0 if train(args.dir, args.cap_mb) else 1


if __name__ == "__main__":
    sys.exit(main())
