"""Is the input path a bottleneck? Per-step cost of the distributed iterator, beside its baseline.

    python benchmarks/input_pipeline.py [--rounds 5] [--quick]            # MirroredStrategy
    mpiexec -n 2 python benchmarks/input_pipeline.py [--rounds 5]          # MultiWorkerMirrored

1. CPU: ``from_tensor_slices((x, y)).batch(G)`` (x float32 [rows, 64], y int64) iterated on its own
   (the baseline) and through ``strategy.experimental_distribute_dataset`` with R local
   replicas. The difference per step is what distribution adds: cutting the batch into views
   and the PerReplica wrapping. Across ranks a third column forces the end-of-data agreement
   on (one 4-byte MAX all-reduce per step), which DATA sharding of this in-memory dataset skips
   but FILE / OFF, generator sources and distribute_datasets_from_function pay. Times are per
   step, medians over interleaved rounds, slowest rank.
   The setup table times what is paid once per distributed dataset and once per pass:
   ``experimental_distribute_dataset(dataset)`` (across ranks: one small all-reduce that agrees
   the shuffle seed and checks that every rank has the same number of steps) and
   ``iter(dist)`` (no collective), in µs per call.
2. GPU (where CuPy sees a GPU): a step of fixed compute (matrix products on the replica's
   device) fed 8 MiB batches through the distributed iterator with the device prefetcher off
   (``experimental_per_replica_buffer_size=0``: the copy runs in line) and on (buffer 1: the copy
   runs on a side stream ahead of use), against the compute alone on resident data. The hidden
   fraction is how much of the in-line copy time the prefetcher takes off the step.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import mpidist
from mpidist.backend import cupy_backend
from mpidist.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job import slowest, world

FEATURES = 64


def make_strategy(replicas, comm, gpus=False):
    kind = "gpu" if gpus else "cpu"
    devices = [f"/{kind}:{i}" for i in range(replicas)]
    if comm is None:
        return mpidist.MirroredStrategy(devices) if replicas > 1 or gpus else \
            mpidist.OneDeviceStrategy(devices[0])
    resolver = mpidist.cluster_resolver.MPIClusterResolver(local_devices=devices)
    return mpidist.MultiWorkerMirroredStrategy(resolver)


def per_step_us(iterable_factory, comm):
    """µs per step over one pass, on the slowest rank."""
    if comm is not None:
        comm.Barrier()
    start = time.perf_counter()
    steps = 0
    for _ in iterable_factory():
        steps += 1
    elapsed = slowest(comm, time.perf_counter() - start)
    return elapsed / max(steps, 1) * 1e6


def check_exactly_once(strategy, dist, y, comm):
    """Before timing: one pass hands every example to exactly one replica of one rank."""
    seen = np.zeros(len(y), dtype=np.int64)
    for _, labels in dist:
        for part in strategy.experimental_local_results(labels):
            np.add.at(seen, part, 1)
    if comm is not None:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, seen, op=MPI.SUM)
    if not np.array_equal(seen, np.ones(len(y), dtype=np.int64)):
        raise AssertionError("the distributed dataset did not see every example exactly once")


def cpu_table(comm, rounds, rows, batches, replica_counts):
    rng = np.random.default_rng(0)
    x = rng.random((rows, FEATURES), dtype=np.float32)
    y = np.arange(rows, dtype=np.int64)
    table = []
    for global_batch in batches:
        dataset = Dataset.from_tensor_slices((x, y)).batch(global_batch)
        for replicas in replica_counts:
            strategy = make_strategy(replicas, comm)
            dist = strategy.experimental_distribute_dataset(dataset)
            check_exactly_once(strategy, dist, y, comm)
            agreed = strategy.experimental_distribute_dataset(dataset)
            agreed._agree_end = comm is not None  # what the other input paths pay per step
            samples = {"dataset": [], "distributed": [], "agreed": []}
            for _ in range(rounds):
                samples["dataset"].append(per_step_us(lambda: dataset, comm))
                samples["distributed"].append(per_step_us(lambda: dist, comm))
                samples["agreed"].append(per_step_us(lambda: agreed, comm))
            table.append((global_batch, replicas) + tuple(
                statistics.median(samples[k]) for k in ("dataset", "distributed", "agreed")))
    return table


def gpu_table(rounds, replicas, batch_mib=8, compute_iters=20):
    cupy = cupy_backend.get_cupy()
    rows = (batch_mib << 20) // (4 * 1024)
    x = np.random.default_rng(0).random((rows * replicas * 16, 1024), dtype=np.float32)
    strategy = make_strategy(replicas, None, gpus=True)
    weights = [cupy.asarray(np.eye(1024, dtype=np.float32)) for _ in range(replicas)]

    def step(batch):
        w = weights[int(mpidist.get_replica_context().replica_id_in_sync_group)]
        h = batch[:1024]
        for _ in range(compute_iters):
            h = h @ w
        return h.sum()

    def run_epoch(buffer_size):
        options = mpidist.InputOptions(experimental_per_replica_buffer_size=buffer_size)
        dist = strategy.experimental_distribute_dataset(
            Dataset.from_tensor_slices(x).batch(rows * replicas), options)
        for batch in dist:
            strategy.run(step, args=(batch,))
        cupy.cuda.Device(0).synchronize()

    resident = strategy.experimental_distribute_values_from_function(
        lambda ctx: cupy.asarray(x[:rows]))

    def compute_only():
        for _ in range(16):
            strategy.run(step, args=(resident,))
        cupy.cuda.Device(0).synchronize()

    cases = {"compute only": compute_only, "copy in line": lambda: run_epoch(0),
             "prefetched": lambda: run_epoch(1)}
    samples = {k: [] for k in cases}
    for fn in cases.values():
        fn()  # warm up
    for _ in range(rounds):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) / 16 * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def setup_table(comm, rounds, repeats=200):
    """µs per ``experimental_distribute_dataset`` call and per ``iter()`` of the result, slowest
    rank, medians over ``rounds``."""
    rng = np.random.default_rng(0)
    x = rng.random((4096, FEATURES), dtype=np.float32)
    dataset = Dataset.from_tensor_slices((x, np.arange(4096))).batch(256)
    strategy = make_strategy(1, comm)
    dist = strategy.experimental_distribute_dataset(dataset)

    def create():
        for _ in range(repeats):
            strategy.experimental_distribute_dataset(dataset)

    def iterate():
        for _ in range(repeats):
            iter(dist)

    samples = {"create": [], "iter": []}
    for _ in range(rounds):
        for name, fn in (("create", create), ("iter", iterate)):
            if comm is not None:
                comm.Barrier()
            start = time.perf_counter()
            fn()
            samples[name].append(slowest(comm, time.perf_counter() - start) / repeats * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (smoke test)")
    parser.add_argument("--json", help="also write the tables to this file (rank 0)")
    args = parser.parse_args(argv)
    comm = world()
    rank = 0 if comm is None else comm.Get_rank()
    ranks = 1 if comm is None else comm.Get_size()
    rounds = 1 if args.quick else args.rounds
    rows = 4096 if args.quick else 65536
    replica_counts = (1, 2) if args.quick else (1, 2, 4)
    table = cpu_table(comm, rounds, rows, (32, 256), replica_counts)
    setup = setup_table(comm, rounds)
    if rank == 0:
        kind = "MultiWorkerMirroredStrategy" if comm is not None else "Mirrored/OneDevice"
        print(f"CPU input path, {kind}, {ranks} rank(s); us per step (median of {rounds})")
        print(f"{'global batch':>12} {'replicas/rank':>13} {'dataset':>9} {'distributed':>12} "
              f"{'added':>8} {'ratio':>6} {'agreed end':>11} {'added':>8}")
        for global_batch, replicas, base, dist_us, agreed_us in table:
            print(f"{global_batch:>12} {replicas:>13} {base:>9.1f} {dist_us:>12.1f} "
                  f"{dist_us - base:>+8.1f} {dist_us / base:>6.2f} {agreed_us:>11.1f} "
                  f"{agreed_us - base:>+8.1f}")
        print(f"setup, us per call (median of {rounds}): experimental_distribute_dataset "
              f"{setup['create']:.1f}, iter() {setup['iter']:.1f}")
        if args.json:
            import json

            Path(args.json).write_text(json.dumps({"per_step": table, "setup": setup}))
    if comm is None and cupy_backend.available():
        replicas = min(cupy_backend.gpu_count(), 2)
        t = gpu_table(rounds, replicas)
        inline = t["copy in line"] - t["compute only"]
        hidden = (t["copy in line"] - t["prefetched"]) / inline if inline > 0 else float("nan")
        print(f"GPU input path, {replicas} GPU replica(s), 8 MiB per replica per step; ms per step")
        for name, ms in t.items():
            print(f"{name:>14} {ms:8.3f}")
        print(f"copy hidden behind compute: {hidden:.0%} of the in-line copy time")
    return table


if __name__ == "__main__":
    main()
