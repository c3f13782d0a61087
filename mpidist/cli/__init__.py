"""The ``mpidist`` command (console script and ``python -m mpidist``).

    mpidist info [--json]
    mpidist bench allreduce [--sizes 8:64M] [--ops sum,max] [--dtype float32]
                            [--iters N | --min-time S] [--json | --csv] [--plot out.png]
    mpidist bench batch [--tensors 100] [--tensor-size 1000] [--json|--csv] [--plot out.png]
    mpidist bench step [--quick] [--paths allreduce,apply_gradients,fit] [--json|--markdown]
    mpidist bench input [--quick] [--parts readers,step] [--formats npy,npz,parquet,hdf5] [--json]
    mpidist run [-n N] [--launcher auto|mpiexec|srun] [LAUNCHER OPTIONS] -- PROGRAM [ARGS...]

Run alone, or under ``mpiexec`` / ``srun`` (every rank runs the command; rank 0 prints).
Exit status: 0 on success, 2 on bad arguments, 1 when something failed or ``info`` found an
error-level problem. Errors name the rank that saw them.

The modules, one concept each:

    entry              run() and main(): parse, dispatch, exit status
    arguments          the parser and the checks of option values
    errors             usage errors (printed once) and command errors (printed with the rank)
    commands           what each subcommand does with its arguments; rank 0 prints
    timing             the bench commands' timing settings, --quick, the Timer
    info               `mpidist info`: each rank's facts, the problems found, the report
    bench              `bench allreduce` / `bench batch`: cases, checks, Timer, tables, CSV
    bench_step         `bench step`: the step a user writes beside its raw baseline
    bench_step_report  `bench step`'s tables and the fit cost model
    bench_input        `bench input`: file readers beside the raw libraries, a step fed from
                       files beside memory
    plot               the figures of `--plot` (matplotlib, optional)
"""

from mpidist.cli.arguments import build_parser
from mpidist.cli.entry import main, run

__all__ = ["main", "run", "build_parser"]
