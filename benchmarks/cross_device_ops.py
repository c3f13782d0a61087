"""The CrossDeviceOps and their fused kernels, each beside its baseline in the same run.

1. Fused reduce kernel bandwidth against the copy bandwidth of the same device, measured in
   the same run: NumPy ``copyto`` on the host, a CuPy copy on a GPU (when one is present).
   Bandwidth counts bytes read plus bytes written: 2S for a copy, (N+1)S for an N-way reduce.
2. ``strategy.reduce(SUM, per_replica)`` over 2 and 4 virtual CPU devices, with TF 2.21's
   MirroredStrategy figures from peer-baselines.md alongside (measured there, not here).
3. ``batch_reduce_to`` of 100 x 1000 float32 (fused) against 100 separate ``reduce_to`` calls.

    python benchmarks/cross_device_ops.py [--rounds 7] [--replicas 2 4] [--quick]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

import mpidist
from mpidist import kernels
from mpidist.backend import num_gpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core_overhead import SIZES, bench_reduce, interleaved  # shared helpers

TF_MIRRORED_US = {"4 KiB": "350-549", "256 KiB": "636-699", "4 MiB": "1425-1781",
                  "64 MiB": "11144-18543"}


def bench_kernel_bandwidth(n, nbytes, rounds):
    count = nbytes // 4
    bufs = [np.full(count, i + 1, np.float32) for i in range(n)]
    out = np.empty(count, np.float32)
    np.testing.assert_array_equal(kernels.reduce_n(bufs, out=out), n * (n + 1) / 2)
    t = interleaved({"copy": lambda: np.copyto(out, bufs[0]),
                     "reduce": lambda: kernels.reduce_n(bufs, out=out)}, rounds)
    copy_gbs = 2 * nbytes / t["copy"] / 1e3
    reduce_gbs = (n + 1) * nbytes / t["reduce"] / 1e3
    return copy_gbs, reduce_gbs


def bench_gpu_kernel_bandwidth(n, nbytes, rounds):
    import cupy  # only when a GPU is present

    count = nbytes // 4
    bufs = [cupy.full(count, i + 1, cupy.float32) for i in range(n)]
    out = cupy.empty(count, cupy.float32)
    assert float(kernels.reduce_n(bufs, out=out)[0]) == n * (n + 1) / 2

    def synced(fn):
        def run():
            fn()
            cupy.cuda.get_current_stream().synchronize()
        return run

    t = interleaved({"copy": synced(lambda: cupy.copyto(out, bufs[0])),
                     "reduce": synced(lambda: kernels.reduce_n(bufs, out=out))}, rounds)
    return 2 * nbytes / t["copy"] / 1e3, (n + 1) * nbytes / t["reduce"] / 1e3


def per_replica_values(strategy, fn):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: fn(ctx.replica_id_in_sync_group))


def bench_batch(strategy, rounds, tensors=100, elements=1000):
    n = strategy.num_replicas_in_sync
    values = [per_replica_values(strategy, lambda i, k=k: np.full(elements, i + k, np.float32))
              for k in range(tensors)]
    pairs = [(v, v) for v in values]
    ext = strategy.extended
    fused = ext.batch_reduce_to("SUM", pairs)
    for k in (0, tensors - 1):
        np.testing.assert_array_equal(fused[k].values[-1], n * k + n * (n - 1) / 2)
    return interleaved({"separate": lambda: [ext.reduce_to("SUM", v, d) for v, d in pairs],
                        "batch": lambda: ext.batch_reduce_to("SUM", pairs)}, rounds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    args = parser.parse_args(argv)
    sizes = ["4 KiB", "256 KiB"] if args.quick else list(SIZES)
    big = ["256 KiB"] if args.quick else ["4 MiB", "64 MiB"]
    rows = []

    print("## Fused reduce kernel vs host copy bandwidth (GB/s, read+written; same run)")
    print("| N | size | NumPy copy | fused reduce | reduce / copy |")
    print("|---|---|---|---|---|")
    for n in args.replicas:
        for label in big:
            copy_gbs, reduce_gbs = bench_kernel_bandwidth(n, SIZES[label], args.rounds)
            print(f"| {n} | {label} | {copy_gbs:.1f} | {reduce_gbs:.1f} | {reduce_gbs / copy_gbs:.2f} |")
            rows.append(("kernel", n, label, copy_gbs, reduce_gbs))
    if num_gpus():
        print("\n## GPU: fused reduce kernel vs CuPy copy bandwidth (GB/s; same run)")
        print("| N | size | CuPy copy | fused reduce | reduce / copy |")
        print("|---|---|---|---|---|")
        for n in args.replicas:
            for label in big:
                copy_gbs, reduce_gbs = bench_gpu_kernel_bandwidth(n, SIZES[label], args.rounds)
                print(f"| {n} | {label} | {copy_gbs:.0f} | {reduce_gbs:.0f} | {reduce_gbs / copy_gbs:.2f} |")
                rows.append(("gpu-kernel", n, label, copy_gbs, reduce_gbs))

    print("\n## strategy.reduce(SUM) float32, virtual CPU devices (µs per call)")
    print("| replicas | size | NumPy sum | mpidist | mpidist / NumPy | TF 2.21 Mirrored (peer-baselines) |")
    print("|---|---|---|---|---|---|")
    for n in args.replicas:
        strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        for label in sizes:
            t = bench_reduce(strategy, SIZES[label], args.rounds)
            print(f"| {n} | {label} | {t['numpy']:.1f} | {t['mpidist']:.1f} | "
                  f"{t['mpidist'] / t['numpy']:.2f}x | {TF_MIRRORED_US[label]} |")
            rows.append(("reduce", n, label, t))

    print("\n## 100 x 1000 float32: batch_reduce_to (fused) vs 100 reduce_to (µs per call)")
    print("| replicas | 100 x reduce_to | batch_reduce_to | speed-up |")
    print("|---|---|---|---|")
    for n in args.replicas:
        strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        t = bench_batch(strategy, args.rounds)
        print(f"| {n} | {t['separate']:.0f} | {t['batch']:.0f} | {t['separate'] / t['batch']:.1f}x |")
        rows.append(("batch", n, t))
    return rows


if __name__ == "__main__":
    main()
