"""The all-reduce a user writes on a GPU beside raw NCCL: ``mpidist bench gpu`` (one
implementation, in mpidist/cli/bench_gpu.py), for running from the benchmarks folder.

    python benchmarks/gpu_all_reduce.py [--quick] [--sizes 4K,1M,64M] [--json]

``strategy.run`` + ``ReplicaContext.all_reduce`` on CuPy values on GPU 0 (default cross-device
ops, and NcclAllReduce) beside ``cupy.cuda.nccl`` ``allReduce`` and a raw device copy of the
same buffer; medians of interleaved rounds, the device synchronized around every sample,
ratio = time / raw NCCL time. Needs a GPU (exit 1 with the reason without one).
"""

import sys

from mpidist.cli.entry import run

if __name__ == "__main__":
    sys.exit(run(["bench", "gpu", *sys.argv[1:]]))
