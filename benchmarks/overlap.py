"""What overlapping gradient all-reduces with the rest of the backward pass gains here.

A backward pass produces its gradients bucket by bucket (last layer first). Reducing a bucket
while later buckets are still computed is the overlap of DDP and Horovod. This measures, with
raw mpi4py (the best any API over it could do), one step of ``--buckets`` buckets, each made
by ``--work`` µs of NumPy compute (matrix products, as a backward pass does) and then summed
across ranks, in three schedules, interleaved over ``--rounds`` rounds (medians):

- ``sequential``: compute every bucket, then one blocking ``Allreduce`` per bucket;
- ``overlap``: start an ``Iallreduce`` as each bucket is ready, wait for all at the end;
- ``overlap+poll``: the same, testing the pending requests between buckets (MPICH progresses
  non-blocking collectives only inside MPI calls, unless an asynchronous progress thread runs).

    mpiexec -n 2 python benchmarks/overlap.py [--bucket-kib 256] [--buckets 8] [--work 300]

Every schedule's sums are checked against the sequential one's before timing.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from job import interleaved  # benchmarks/ is on sys.path when run as a script


def _compute_kernel(work_us):
    """A matrix product sized to take about ``work_us`` µs on this machine (calibrated once)."""
    n = 64
    while True:
        a = np.random.default_rng(0).random((n, n))
        start = time.perf_counter()
        for _ in range(20):
            a @ a
        each = (time.perf_counter() - start) / 20 * 1e6
        if each >= work_us or n >= 2048:
            return lambda: a @ a
        n = int(n * 1.25)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket-kib", type=int, default=256, help="bytes per bucket (KiB)")
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--work", type=float, default=300.0, help="µs of compute per bucket")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--min-time", type=float, default=0.05,
                        help="seconds each timed sample lasts at least")
    args = parser.parse_args(argv)
    # One BLAS thread per rank, as mpidist runs a CPU replica: ranks share the cores.
    threadpool_limits(1)
    comm = MPI.COMM_WORLD.Dup()
    size, rank = comm.Get_size(), comm.Get_rank()
    elements = args.bucket_kib * 1024 // 4
    rng = np.random.default_rng(rank)
    grads = [rng.random(elements, dtype=np.float32) for _ in range(args.buckets)]
    sums = [np.empty_like(g) for g in grads]
    compute = _compute_kernel(args.work)

    def sequential():
        for _ in grads:
            compute()
        for g, s in zip(grads, sums):
            comm.Allreduce(g, s)

    def overlap(poll):
        pending = []
        for g, s in zip(grads, sums):
            compute()
            pending.append(comm.Iallreduce(g, s))
            if poll:
                MPI.Request.Testall(pending)
        MPI.Request.Waitall(pending)

    def compute_only():
        for _ in grads:
            compute()

    def comm_only():
        for g, s in zip(grads, sums):
            comm.Allreduce(g, s)

    schedules = {"sequential": sequential, "overlap": lambda: overlap(False),
                 "overlap+poll": lambda: overlap(True), "compute only": compute_only,
                 "all-reduce only": comm_only}
    sequential()
    want = [s.copy() for s in sums]
    for name in ("overlap", "overlap+poll"):
        schedules[name]()
        if not all(np.array_equal(a, b) for a, b in zip(sums, want)):
            raise SystemExit(f"{name}: sums differ from the sequential schedule's")
    medians = interleaved(schedules, args.rounds, comm, args.min_time)
    if rank == 0:
        base = medians["sequential"]
        print(f"{size} ranks, {args.buckets} buckets of {args.bucket_kib} KiB, "
              f"~{args.work:g} µs of compute per bucket; µs per step (median of {args.rounds}), "
              "ratio to sequential:")
        for name, med in medians.items():
            print(f"  {name:16s} {med:9.0f} µs  {med / base:5.2f}x")


if __name__ == "__main__":
    main()
