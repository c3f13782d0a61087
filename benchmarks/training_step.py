"""Step time of ``mpidist.fit`` under each strategy, and the share of it spent communicating.

    python benchmarks/training_step.py [--rounds 3] [--quick]        # OneDevice, Mirrored 2 and 4
    mpiexec -n 2 python benchmarks/training_step.py [--rounds 3]      # MultiWorkerMirrored 2x1, 2x2

The model is the digits example's MLP (64 -> hidden -> 10, float64, hand-written backward)
on synthetic data, global batch 256, SGD with momentum. ``hidden`` is 32 (2.4k parameters, 19
KiB of gradients: latency-bound) and 1024 (77k parameters, 600 KiB: more compute and bytes).
"Communicating" is the wall time inside the step's one fused all-reduce (loss, count and every
gradient), measured as ``mpidist bench step`` measures it (``ReductionClock``: the time inside
the strategy's reduction plan, summed over the replica threads and divided by their number).
On one process that is the replicas' reduction in shared memory, the wait for each other at
the merge included. Across ranks it also covers MPI and the wait for the slowest rank. Medians
over rounds of one epoch each; slowest rank.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import mpidist
from mpidist.cli.bench_step import ReductionClock
from mpidist.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import digits_mlp
from job import slowest, world

GLOBAL_BATCH = 256


def measure(label, strategy, hidden, rows, rounds, comm):
    rng = np.random.default_rng(0)
    x = rng.random((rows, 64))
    y = rng.integers(0, 10, rows)
    dataset = Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
    steps = rows // GLOBAL_BATCH
    with strategy.scope():
        model = digits_mlp.MLP(hidden=hidden)
        optimizer = mpidist.optimizers.SGD(0.01, momentum=0.9)
    mpidist.fit(model, dataset, epochs=1, optimizer=optimizer, strategy=strategy, verbose=0)
    with ReductionClock(strategy) as clock:
        step_ms, comm_ms = _rounds(model, dataset, optimizer, strategy, steps, rounds, comm, clock)
    step, communicating = statistics.median(step_ms), statistics.median(comm_ms)
    return (label, hidden, step, communicating, GLOBAL_BATCH / step * 1e3)


def _rounds(model, dataset, optimizer, strategy, steps, rounds, comm, clock):
    local = len(strategy.extended.worker_devices)  # the clock sums every replica thread
    step_ms, comm_ms = [], []
    for _ in range(rounds):
        clock.take()
        if comm is not None:
            comm.Barrier()
        start = time.perf_counter()
        mpidist.fit(model, dataset, epochs=1, optimizer=optimizer, strategy=strategy, verbose=0)
        elapsed = slowest(comm, time.perf_counter() - start)
        spent = slowest(comm, clock.take() / local)
        step_ms.append(elapsed / steps * 1e3)
        comm_ms.append(spent / steps * 1e3)
    return step_ms, comm_ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (smoke test)")
    args = parser.parse_args(argv)
    comm = world()
    rounds = 1 if args.quick else args.rounds
    rows = 2048 if args.quick else 16384
    hiddens = (32,) if args.quick else (32, 1024)
    if comm is None:
        setups = [("OneDevice", lambda: mpidist.OneDeviceStrategy("/cpu:0"))]
        setups += [(f"Mirrored x{n}", lambda n=n: digits_mlp.make_strategy("mirrored", n))
                   for n in ((2,) if args.quick else (2, 4))]
    else:
        size = comm.Get_size()
        setups = [(f"MWMS {size}x{r}", lambda r=r: digits_mlp.make_strategy("multi-worker", r))
                  for r in ((1,) if args.quick else (1, 2))]
    rows_out = [measure(label, make(), hidden, rows, rounds, comm)
                for hidden in hiddens for label, make in setups]
    if comm is None or comm.Get_rank() == 0:
        print(f"fit step, global batch {GLOBAL_BATCH}, ms per step (median of {rounds})")
        print(f"{'strategy':>14} {'hidden':>6} {'step ms':>8} {'comm ms':>8} {'comm %':>7} "
              f"{'samples/s':>10}")
        for label, hidden, step, communicating, rate in rows_out:
            print(f"{label:>14} {hidden:>6} {step:>8.3f} {communicating:>8.3f} "
                  f"{100 * communicating / step:>6.1f}% {rate:>10.0f}")
    return rows_out


if __name__ == "__main__":
    main()
