"""MultiWorkerMirroredStrategy's all-reduce across MPI ranks, beside raw mpi4py in one job.

Run under MPI (every rank runs every case, in the same order):

    mpiexec -n 2 python benchmarks/multi_worker.py [--rounds 5] [--quick] [--sizes "4 MiB,32 MiB"]
    mpiexec -launcher fork -hosts n0,n1 -ppn 2 -n 4 python benchmarks/multi_worker.py  # 2 nodes

1. One float32 tensor, 4 KiB to 64 MiB: ``strategy.reduce(SUM, per_replica)`` (one replica
   per rank) against raw ``comm.Allreduce(send, recv)`` and ``Allreduce(IN_PLACE, buf)``; also
   ``Communicator.all_reduce``; mpidist forced onto the MPI library's Allreduce ("MPI path")
   and onto the shared-memory / hierarchical path ("shm path"), which give the crossover
   table in docs/multi_worker.md; and with the fingerprint check off, to show what it costs.
2. One buffer in 4 packs: ``Communicator.all_reduce_packs`` (one fingerprint agreement for
   all packs) against one ``all_reduce`` per pack and raw Allreduce per pack.
3. 100 x 1000 float32 in one ``batch_reduce_to`` against one raw Allreduce of a pre-packed
   buffer and against 100 separate raw Allreduce calls.

Times are the slowest rank's, medians over interleaved rounds; ratios are time / raw
``Allreduce(send, recv)`` time (below 1 is faster than raw MPI). TF 2.21 MWMS figures from
peer-baselines.md (measured on this kind of machine, not in this run) are shown alongside.
"""

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpidist
from job import per_call_us  # benchmarks/ is on sys.path when run as a script

SIZES = {"4 KiB": 4 << 10, "256 KiB": 256 << 10, "512 KiB": 512 << 10, "1 MiB": 1 << 20,
         "4 MiB": 4 << 20, "8 MiB": 8 << 20, "16 MiB": 16 << 20, "32 MiB": 32 << 20,
         "64 MiB": 64 << 20}
TF_MWMS_US = {"4 KiB": 3724, "256 KiB": 5319, "4 MiB": 36519, "64 MiB": 636079}  # strategy.reduce, n=2
TF_MWMS_BATCH_US = 10162  # all_reduce(SUM, [100 tensors]), n=2


def interleaved(cases, comm, rounds):
    samples = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(per_call_us(fn, comm))
    return {name: statistics.median(v) for name, v in samples.items()}


def with_settings(communicator, fn, algorithm=None, check=None):
    """``fn`` run with the communicator's all-reduce algorithm forced / check switched."""
    def call():
        saved = communicator.allreduce_algorithm, communicator.check_collectives
        if algorithm is not None:
            communicator.allreduce_algorithm = algorithm
        if check is not None:
            communicator.check_collectives = check
        try:
            return fn()
        finally:
            communicator.allreduce_algorithm, communicator.check_collectives = saved
    return call


def bench_single_tensor(strategy, comm, nbytes, rounds):
    n = nbytes // 4
    send = np.full(n, comm.rank + 1, np.float32)
    recv = np.empty_like(send)
    inplace = send.copy()
    value = strategy.experimental_distribute_values_from_function(lambda ctx: send)
    expected = comm.size * (comm.size + 1) / 2
    np.testing.assert_array_equal(strategy.reduce("SUM", value, axis=None), expected)
    communicator = strategy.extended.communicator
    reduce = lambda: strategy.reduce("SUM", value, axis=None)  # noqa: E731
    own = send.copy()
    all_reduce = lambda: communicator.all_reduce(own, send=send)  # noqa: E731
    cases = {
        "raw Allreduce": lambda: comm.Allreduce(send, recv, MPI.SUM),
        "raw IN_PLACE": lambda: comm.Allreduce(MPI.IN_PLACE, inplace, MPI.SUM),
        "mpidist": reduce,
        "Communicator.all_reduce": all_reduce,
        "mpidist, MPI": with_settings(communicator, reduce, algorithm="mpi"),
        "mpidist, shm": with_settings(communicator, reduce, algorithm="shm"),
        "mpidist, no check": with_settings(communicator, reduce, check=False),
    }
    if not communicator.has_shared_memory:
        del cases["mpidist, shm"]
    return interleaved(cases, comm, rounds)


def bench_packs(communicator, comm, nbytes, rounds, packs=4):
    """One buffer in ``packs`` packs: one agreement for all (``all_reduce_packs``) against one
    per pack, and against raw Allreduce of each pack."""
    buf = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(buf)
    bounds = [(buf.size * i // packs, buf.size * (i + 1) // packs) for i in range(packs)]

    def raw():
        for lo, hi in bounds:
            comm.Allreduce(buf[lo:hi], out[lo:hi], MPI.SUM)

    def separate():
        for lo, hi in bounds:
            communicator.all_reduce(buf[lo:hi])

    return interleaved({"raw Allreduce per pack": raw, "all_reduce per pack": separate,
                        "all_reduce_packs": lambda: communicator.all_reduce_packs(buf, bounds)},
                       comm, rounds)


def bench_batch(strategy, comm, rounds):
    shapes = [(1000,)] * 100
    values = [strategy.experimental_distribute_values_from_function(
        lambda ctx, i=i: np.full(s, comm.rank + i, np.float32)) for i, s in enumerate(shapes)]
    pairs = [(v, "/cpu:0") for v in values]
    out = strategy.extended.batch_reduce_to("SUM", pairs)
    for i, o in enumerate(out):
        np.testing.assert_array_equal(o, sum(r + i for r in range(comm.size)))
    packed = np.ones(100 * 1000, np.float32)
    packed_out = np.empty_like(packed)
    separate = [np.ones(1000, np.float32) for _ in shapes]
    separate_out = [np.empty_like(a) for a in separate]

    def hundred():
        for a, b in zip(separate, separate_out):
            comm.Allreduce(a, b, MPI.SUM)

    return interleaved({
        "raw pre-packed Allreduce": lambda: comm.Allreduce(packed, packed_out, MPI.SUM),
        "raw 100 Allreduce": hundred,
        "mpidist batch_reduce_to": lambda: strategy.extended.batch_reduce_to("SUM", pairs),
    }, comm, rounds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 KiB and 256 KiB only, 1 round")
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help=f"comma-separated subset of {', '.join(SIZES)}")
    parser.add_argument("--no-batch", action="store_true", help="skip the 100-tensor case")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    wanted = ("4 KiB", "256 KiB") if args.quick else [k.strip() for k in args.sizes.split(",")]
    sizes = {k: SIZES[k] for k in wanted}
    comm = MPI.COMM_WORLD
    strategy = mpidist.MultiWorkerMirroredStrategy()
    report = comm.rank == 0
    communicator = strategy.extended.communicator
    if report:
        print(f"{comm.size} ranks on {communicator.num_nodes} node(s), MPI: "
              f"{MPI.Get_library_version().splitlines()[0]}; thread level "
              f"{MPI.Query_thread()}; all-reduce algorithm {communicator.allreduce_algorithm}")
        print(f"{'size':>8} {'raw us':>9} {'IN_PLACE':>9} {'reduce':>9} {'ratio':>6} "
              f"{'comm.ar':>9} {'ratio':>6} {'MPI path':>9} {'shm path':>9} {'no check':>9} "
              f"{'TF MWMS (n=2)':>14}")
    results = {}
    for label, nbytes in sizes.items():
        t = bench_single_tensor(strategy, comm, nbytes, rounds)
        results[label] = t
        if report:
            raw = t["raw Allreduce"]
            shm = t.get("mpidist, shm")
            print(f"{label:>8} {raw:9.1f} {t['raw IN_PLACE']:9.1f} {t['mpidist']:9.1f} "
                  f"{t['mpidist'] / raw:6.2f} {t['Communicator.all_reduce']:9.1f} "
                  f"{t['Communicator.all_reduce'] / raw:6.2f} {t['mpidist, MPI']:9.1f} "
                  f"{'-' if shm is None else format(shm, '9.1f'):>9} "
                  f"{t['mpidist, no check']:9.1f} {TF_MWMS_US.get(label, '-'):>14}", flush=True)
    for label in ("4 KiB", "256 KiB"):
        p = bench_packs(communicator, comm, SIZES[label], rounds)
        if report:
            raw = p["raw Allreduce per pack"]
            print(f"{label} in 4 packs: raw {raw:.1f} us; one agreement per pack "
                  f"{p['all_reduce per pack']:.1f} us ({p['all_reduce per pack'] / raw:.2f}x); "
                  f"one for all (all_reduce_packs) {p['all_reduce_packs']:.1f} us "
                  f"({p['all_reduce_packs'] / raw:.2f}x)", flush=True)
    if args.no_batch:
        return results, None
    b = bench_batch(strategy, comm, rounds)
    if report:
        packed, hundred, ours = (b["raw pre-packed Allreduce"], b["raw 100 Allreduce"],
                                 b["mpidist batch_reduce_to"])
        print(f"100 x 1000 float32: batch_reduce_to {ours:.1f} us; raw pre-packed Allreduce "
              f"{packed:.1f} us ({ours / packed:.2f}x of it); 100 raw Allreduce {hundred:.1f} us "
              f"({hundred / ours:.1f}x slower than mpidist); TF MWMS (n=2) {TF_MWMS_BATCH_US} us")
    return results, b


if __name__ == "__main__":
    main()
