"""Would carrying the collective check inside a small all-reduce pay? Raw mpi4py, both ways.

Every mpidist collective first agrees on a fingerprint (a 16-byte ``Iallreduce`` with MAX),
then moves the data. A small SUM all-reduce could instead carry the check in the same message:
the fingerprint split into k-bit chunks h, sent as (h, h²) pairs in extra float32 elements.
Sums of n·h and n·h² hold on a rank only if every rank sent the same h (equality in
Cauchy-Schwarz), and stay exact integers in float32 while n·(2^k - 1)² < 2^24. Every
collective would then have to start with an envelope of the same size, or mismatched ranks
would pair messages of different sizes, which MPI does not allow.

This times, at ``--bytes`` of float32 payload, the two-call protocol against the envelope with
its real costs (copy in, encode the sequence chunks, one all-reduce, compare, copy out):

    mpiexec -n 2 python benchmarks/fingerprint_carry.py [--bytes 4096]
"""

import argparse

import numpy as np
from mpi4py import MPI

from job import interleaved  # benchmarks/ is on sys.path when run as a script


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4096, help="float32 payload bytes")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.05,
                        help="seconds each timed sample lasts at least")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    size = comm.Get_size()
    n = args.bytes // 4
    bits = 11 if size <= 4 else 8  # n·(2^k - 1)² < 2^24
    chunks = 4  # 3 chunks of the call's CRC (cached per call kind) + 1 of the sequence number
    x = np.ones(n, np.float32)
    out = np.empty_like(x)
    send = np.zeros(n + 2 * chunks, np.float32)
    recv = np.empty_like(send)
    crc = np.array([5, 77, 1023], np.float32)
    send[n:n + 3], send[n + chunks:n + chunks + 3] = crc, crc * crc
    crc_sums = (np.concatenate([crc, crc * crc]) * size).astype(np.float32)
    fp_send, fp_recv = np.zeros(2, np.int64), np.zeros(2, np.int64)
    seq = [0]

    def two_calls():
        fp_send[0], fp_send[1] = 12345, -12345
        request = comm.Iallreduce(fp_send, fp_recv, MPI.MAX)
        while not request.Test():
            pass
        if fp_recv[0] != -fp_recv[1]:
            raise RuntimeError("mismatch")
        comm.Allreduce(x, out)

    def envelope():
        seq[0] += 1
        h = seq[0] & ((1 << bits) - 1)
        send[:n] = x
        send[n + 3], send[n + chunks + 3] = h, h * h
        comm.Allreduce(send, recv)
        if recv[n + 3] != size * h or recv[n + chunks + 3] != size * h * h \
                or recv[n:n + 3].tobytes() != crc_sums[:3].tobytes() \
                or recv[n + chunks:n + chunks + 3].tobytes() != crc_sums[3:].tobytes():
            raise RuntimeError("mismatch")
        out[:] = recv[:n]

    cases = {"agreement + Allreduce": two_calls, "envelope": envelope,
             "raw Allreduce": lambda: comm.Allreduce(x, out),
             "raw Allreduce of the envelope": lambda: comm.Allreduce(send, recv)}
    medians = interleaved(cases, args.rounds, comm, args.min_time)
    if comm.Get_rank() == 0:
        print(f"{size} ranks, {args.bytes} B float32 payload; µs per call (median of "
              f"{args.rounds}, slowest rank):")
        for name, median in medians.items():
            print(f"  {name:32s} {median:7.2f}")


if __name__ == "__main__":
    main()
