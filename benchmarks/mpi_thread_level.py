"""What the MPI thread level costs mpidist's own calls: raw mpi4py under each requested level.

The level is fixed when MPI starts (``mpi4py.rc.thread_level`` before ``from mpi4py import
MPI``), so each level is its own launch; the driver alternates the levels over several rounds
and reports medians:

    python benchmarks/mpi_thread_level.py [--ranks 2] [--rounds 5]

Measured per level, slowest rank, µs per call: blocking ``Allreduce`` (the data path) at 8 B,
4 KiB and 256 KiB; ``Iallreduce`` + ``Test`` polling of 16 bytes (the fingerprint agreement);
``Ibarrier`` + ``Test``; and ``Communicator.all_reduce`` of 4 KiB (the whole mpidist call).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from job import per_call_us  # benchmarks/ is on sys.path when run as a script

LEVELS = ("multiple", "serialized", "funneled", "single")
SIZES = {"8 B": 8, "4 KiB": 4 << 10, "256 KiB": 256 << 10}


def measure(level):
    """One launch: every case at ``level``; rank 0 prints one JSON line."""
    os.environ["MPIDIST_MPI_THREAD_LEVEL"] = level
    import numpy as np
    import mpi4py

    mpi4py.rc.thread_level = level
    from mpi4py import MPI

    from mpidist.comm.communicator import Communicator

    comm = MPI.COMM_WORLD
    out = {"provided": MPI.Query_thread()}
    for label, nbytes in SIZES.items():
        send = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(send)
        out[f"Allreduce {label}"] = per_call_us(lambda: comm.Allreduce(send, recv, MPI.SUM),
                                                comm)
    fp, fp_out = np.zeros(2, np.int64), np.zeros(2, np.int64)

    def poll(request):
        while not request.Test():
            pass

    out["Iallreduce+Test 16 B"] = per_call_us(
        lambda: poll(comm.Iallreduce(fp, fp_out, MPI.MAX)), comm)
    out["Ibarrier+Test"] = per_call_us(lambda: poll(comm.Ibarrier()), comm)
    communicator = Communicator()
    buf = np.ones(1024, np.float32)
    out["Communicator.all_reduce 4 KiB"] = per_call_us(lambda: communicator.all_reduce(buf),
                                                       comm)
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def drive(ranks, rounds, launcher):
    samples = {}
    provided = {}
    for _ in range(rounds):
        for level in LEVELS:
            cmd = [*launcher, "-n", str(ranks), sys.executable, __file__, "--level", level]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
            line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stdout}\n{run.stderr}")
            result = json.loads(line[len("RESULT "):])
            provided[level] = result.pop("provided")
            for case, us in result.items():
                samples.setdefault(case, {}).setdefault(level, []).append(us)
    print(f"{ranks} ranks, {rounds} interleaved rounds, µs per call (median); "
          f"provided levels: {provided}")
    print(f"{'case':>32} " + " ".join(f"{lv:>11}" for lv in LEVELS) + "   serialized/multiple")
    for case, by_level in samples.items():
        med = {lv: statistics.median(by_level[lv]) for lv in LEVELS}
        print(f"{case:>32} " + " ".join(f"{med[lv]:11.2f}" for lv in LEVELS)
              + f"   {med['serialized'] / med['multiple']:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", choices=LEVELS, help="(internal) measure at this level")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable),
                                                          "mpiexec"))
    args = parser.parse_args()
    if args.level:
        measure(args.level)
    else:
        drive(args.ranks, args.rounds, [args.mpiexec])


if __name__ == "__main__":
    main()
