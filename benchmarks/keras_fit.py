"""A Keras model.fit step under MultiWorkerMirroredStrategy beside the same model's raw step in
JAX + mpi4py (and mpi4jax's where installed): ``mpidist bench keras`` (one implementation, in
mpidist/cli/bench_keras.py), launched at 2 ranks bound to cores.

    python benchmarks/keras_fit.py [--ranks N] [--steps 16] [--rounds 5] [--json]

Ranks are bound to cores (``mpiexec -bind-to core``): unbound, two JAX processes on two cores
and MPI's busy-polling wait fight over the cores, and the step times of every path (the raw one
as much as fit's) swing by 5x from round to round (docs/keras.md, "Speed").
"""

import argparse
import sys

from job import mpiexec, run_launched


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timeout", type=int, default=900, help="seconds for the launch")
    args = parser.parse_args(argv)
    cmd = [mpiexec(), "-bind-to", "core", "-n", str(args.ranks), sys.executable, "-m", "mpidist",
           "bench", "keras", "--steps", str(args.steps), "--rounds", str(args.rounds)]
    if args.json:
        cmd.append("--json")
    print(run_launched(cmd, " ".join(cmd[1:]), args.timeout), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
