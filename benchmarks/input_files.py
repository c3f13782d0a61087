"""Training data from files (issue 25): ``mpidist bench input`` (one implementation, in
mpidist/cli/bench_input.py) run from the benchmarks directory.

    python benchmarks/input_files.py [--quick] [--json]              # readers; OneDevice step
    mpiexec -n 2 python benchmarks/input_files.py [--quick] [--json] # readers on rank 0; MWMS step

Each reader (npy, npz, Parquet, HDF5) through ``list_files().interleave(Reader).batch(B)``
beside the raw library reading the same files into the same batches, and a 784-256-10 step fed
from prefetched .npy files beside the same step fed from memory. Every option of the command
applies (``--size 64M --files 8 --rounds 5 --dir DIR ...``; ``--help``).
"""

import sys

from mpidist import cli

if __name__ == "__main__":
    sys.exit(cli.run(["bench", "input"] + sys.argv[1:]))
