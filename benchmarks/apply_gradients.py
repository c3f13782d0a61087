"""``optimizer.apply_gradients`` inside ``strategy.run`` beside its raw baseline, one job.

    python benchmarks/apply_gradients.py [--rounds 7] [--strategies one_device,mirrored2]
    mpiexec -n 2 python benchmarks/apply_gradients.py [--rounds 7]     # MultiWorkerMirrored

Models: ``V`` float32 variables at equal total bytes (100,000 elements = 400 KB), V in 10, 100,
1000; optimizers SGD(momentum=0.9) and Adam. The baseline is what the step cannot avoid: one
raw mpi4py ``Allreduce`` of the packed gradients (only with several ranks) plus the update as
in-place NumPy over the same flat bytes (the best single pass NumPy does). Rounds interleave
the mpidist step and the baseline; medians over rounds of the slowest rank. Run the same
script with ``PYTHONPATH`` pointing at an older checkout to compare versions.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import mpidist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job import slowest, world

TOTAL = 100_000


def _optimizer(kind):
    if kind == "sgd":
        return mpidist.optimizers.SGD(0.01, momentum=0.9)
    return mpidist.optimizers.Adam(0.001)


def _baseline(kind, comm, steps):
    """Seconds per step: raw packed Allreduce (with ranks) + in-place NumPy update."""
    rng = np.random.default_rng(1)
    w = rng.random(TOTAL, dtype=np.float32)
    g = rng.random(TOTAL, dtype=np.float32)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    red = np.empty_like(g)
    tmp = np.empty_like(g)
    if comm is not None:
        from mpi4py import MPI
    start = time.perf_counter()
    for _step in range(1, steps + 1):
        if comm is not None:
            comm.Allreduce(g, red, op=MPI.SUM)
        else:
            red = g
        if kind == "sgd":
            m *= np.float32(0.9)
            np.multiply(red, np.float32(0.01), out=tmp)
            m -= tmp
            w += m
        else:
            np.subtract(red, m, out=tmp)
            tmp *= np.float32(0.1)
            m += tmp
            np.multiply(red, red, out=tmp)
            tmp -= v
            tmp *= np.float32(0.001)
            v += tmp
            np.sqrt(v, out=tmp)
            tmp += np.float32(1e-7)
            np.divide(m, tmp, out=tmp)
            tmp *= np.float32(0.001)
            w -= tmp
    return (time.perf_counter() - start) / steps


def _make(strategy, kind, nvars):
    size = TOTAL // nvars
    rng = np.random.default_rng(0)
    with strategy.scope():
        variables = [mpidist.Variable(rng.random(size, dtype=np.float32), name=f"w{i}")
                     for i in range(nvars)]
        opt = _optimizer(kind)
    grads = [rng.random(size, dtype=np.float32) for _ in range(nvars)]

    def step():
        opt.apply_gradients(zip(grads, variables))

    strategy.run(step)  # builds slots (and whatever the first step builds)
    return step


def _mpidist(strategy, step, steps):
    start = time.perf_counter()
    for _ in range(steps):
        strategy.run(step)
    return (time.perf_counter() - start) / steps


def _strategies(names, comm):
    if comm is not None:
        return [("mwms", mpidist.MultiWorkerMirroredStrategy())]
    made = []
    for name in names:
        if name == "one_device":
            made.append((name, mpidist.OneDeviceStrategy("/cpu:0")))
        elif name == "mirrored2":
            made.append((name, mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])))
        elif name == "mwms1":
            made.append((name, mpidist.MultiWorkerMirroredStrategy()))
    return made


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--strategies", default="one_device,mirrored2")
    parser.add_argument("--vars", default="10,100,1000")
    parser.add_argument("--optimizers", default="sgd,adam")
    args = parser.parse_args()
    comm = world()
    ranks = 1 if comm is None else comm.Get_size()
    rank0 = comm is None or comm.Get_rank() == 0
    rows = []
    for label, strategy in _strategies(args.strategies.split(","), comm):
        for kind in args.optimizers.split(","):
            for nvars in (int(v) for v in args.vars.split(",")):
                step = _make(strategy, kind, nvars)
                ours, base = [], []
                for _ in range(args.rounds):
                    ours.append(slowest(comm, _mpidist(strategy, step, args.steps)))
                    base.append(slowest(comm, _baseline(kind, comm, args.steps)))
                o, b = statistics.median(ours), statistics.median(base)
                rows.append((label, ranks, kind, nvars, o, b))
    if rank0:
        print("| strategy | ranks | optimizer | variables | apply_gradients | baseline | ratio |")
        print("|---|---|---|---|---|---|---|")
        for label, ranks, kind, nvars, o, b in rows:
            print(f"| {label} | {ranks} | {kind} | {nvars} | {o * 1e6:.0f} us | "
                  f"{b * 1e6:.0f} us | {o / b:.1f}x |")


if __name__ == "__main__":
    main()
