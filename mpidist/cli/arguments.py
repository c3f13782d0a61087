"""The ``mpidist`` command's arguments: the parser of every subcommand but ``run`` (which
parses its own, ``mpidist.launch.runner``), and the types that check option values.

A value that does not parse is a usage error (exit status 2), printed once under a launcher
(``CommandParser``) and before MPI starts.
"""

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from mpidist.cli import bench
from mpidist.cli.commands import (
    cmd_backup,
    cmd_bench_allreduce,
    cmd_bench_batch,
    cmd_bench_input,
    cmd_bench_gpu,
    cmd_bench_keras,
    cmd_bench_ps,
    cmd_bench_step,
    cmd_info,
    cmd_selftest,
)
from mpidist.cli.errors import CommandParser
from mpidist.cli.timing import DEFAULTS, QUICK

__all__ = ["build_parser"]

_Number = TypeVar("_Number", int, float)


def _sizes(text: str) -> list[int]:
    try:
        return bench.parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _ops(text: str) -> list[str]:
    ops = [o.strip().lower() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in bench.OPS]
    if not ops or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: ops are a comma-separated list of {', '.join(bench.OPS)}")
    return list(dict.fromkeys(ops))


def _positive(kind: Callable[[str], _Number], what: str) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be a positive {what}")
        return value
    return parse


def _non_negative_int(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def _paths(text: str) -> list[str]:
    from mpidist.cli.bench_step import PATHS  # noqa: PLC0415

    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if not paths or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: paths are a comma-separated list of {', '.join(PATHS)}")
    return list(dict.fromkeys(paths))


def _timing_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("timing")
    count = g.add_mutually_exclusive_group()
    count.add_argument("--iters", type=_positive(int, "integer"), metavar="N",
                       help="calls per timed sample (default: as many as last --min-time)")
    count.add_argument("--min-time", type=_positive(float, "number of seconds"), metavar="S",
                       help="seconds each timed sample lasts at least; the call count is "
                            f"calibrated on raw MPI and agreed by all ranks "
                            f"(default {DEFAULTS['min_time']})")
    g.add_argument("--warmup", type=_non_negative_int, metavar="K",
                   help="untimed calls of each implementation per case "
                        f"(default {DEFAULTS['warmup']})")
    g.add_argument("--rounds", type=_positive(int, "integer"), metavar="R",
                   help="interleaved timed rounds; the median is reported "
                        f"(default {DEFAULTS['rounds']})")
    g.add_argument("--quick", action="store_true",
                   help=f"a tiny run for smoke tests: {QUICK['rounds']} rounds, "
                        f"{QUICK['warmup']} warm-up call, {QUICK['min_time'] * 1e3:g} ms samples "
                        f"(allreduce: sizes {QUICK['sizes']})")
    out = p.add_argument_group("output (rank 0)")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="one JSON object: job facts, settings, rows")
    fmt.add_argument("--csv", action="store_true", help="CSV rows with a header line")
    out.add_argument("--plot", metavar="OUT.png",
                     help="also write a figure (needs matplotlib: pip install 'mpidist[plot]')")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``mpidist``; each subcommand's ``func`` default is its ``cmd_*``."""
    from mpidist import __version__  # noqa: PLC0415

    parser = CommandParser(prog="mpidist", description="mpidist's command line: look at a job, "
                           "benchmark its collectives. Run alone or under mpiexec / srun.")
    parser.add_argument("--version", action="version", version=f"mpidist {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{info,bench,run,selftest,backup}",
                                     parser_class=CommandParser)
    commands.required = True
    # `run` parses its own arguments (mpidist.launch.runner): listed here for --help only.
    commands.add_parser("run", add_help=False,
                        help="start a program on N ranks, each guarded: a rank that dies is "
                             "reported (rank, host, signal, last collective)")

    info = commands.add_parser(
        "info", help="the job as mpidist sees it, and launch problems",
        description="Print the job as mpidist sees it (ranks, nodes, devices, libraries) and "
                    "the problems it detects. Exit status 1 if a problem is an error.")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=cmd_info)

    backup = commands.add_parser(
        "backup", help="one line on a BackupAndRestore directory: DIR (step K)",
        description="Print one line saying what a BackupAndRestore directory holds: 'DIR "
                    "(step K)', K the training step a restart resumes after; 'DIR (no backup)'; "
                    "or 'DIR (a backup of unknown step)' where it cannot be read. Changes "
                    "nothing; exit status 0. The batch scripts log it when a job ends "
                    "without finishing.")
    backup.add_argument("directory", help="the backup directory (MPIDIST_BACKUP_DIR)")
    backup.set_defaults(func=cmd_backup)

    benchmarks = commands.add_parser("bench", help="all-reduce benchmarks beside raw mpi4py",
                                     description="Benchmarks of mpidist's collectives beside "
                                                 "raw mpi4py in the same job.")
    kinds = benchmarks.add_subparsers(dest="benchmark",
                                      metavar="{allreduce,batch,step,keras,ps,input,gpu}",
                                      parser_class=CommandParser)
    kinds.required = True

    allreduce = kinds.add_parser(
        "allreduce", help="size sweep of one all-reduce (nccl-tests style)",
        description="Size sweep of mpidist's Communicator.all_reduce against raw mpi4py "
                    "comm.Allreduce: time, algbw, busbw per size and op, and the time ratio.")
    allreduce.add_argument("--sizes", type=_sizes, metavar="SPEC",
                           help="MIN:MAX (powers of 2), MIN:MAX:FACTOR, or a list 8,4K,1M; binary "
                                f"units (default {DEFAULTS['sizes']})")
    allreduce.add_argument("--ops", type=_ops, default=["sum"], metavar="OPS",
                           help=f"comma-separated reduce ops of {','.join(bench.OPS)} "
                                "(default sum)")
    allreduce.add_argument("--dtype", choices=bench.DTYPES, default="float32",
                           help="element type (default float32)")
    _timing_options(allreduce)
    allreduce.set_defaults(func=cmd_bench_allreduce)

    batch = kinds.add_parser(
        "batch", help="many small tensors in one call",
        description="Many small tensors: MultiWorkerMirroredStrategy.extended.batch_reduce_to "
                    "against one raw Allreduce per tensor, concatenate + Allreduce + split, and "
                    "one Allreduce of a pre-packed buffer.")
    batch.add_argument("--tensors", type=_positive(int, "integer"), default=100, metavar="T",
                       help="tensors per call (default 100)")
    batch.add_argument("--tensor-size", type=_positive(int, "integer"), default=1000, metavar="E",
                       help="elements per tensor (default 1000)")
    batch.add_argument("--dtype", choices=bench.DTYPES, default="float32",
                       help="element type (default float32)")
    _timing_options(batch)
    batch.set_defaults(func=cmd_bench_batch)
    _add_step_parser(kinds)
    keras = kinds.add_parser(
        "keras", help="a Keras model.fit step under MWMS beside raw JAX + mpi4py",
        description="A Keras 3 model.fit step (MLP 784-1024-10, small CNN) under "
                    "MultiWorkerMirroredStrategy beside the same model's raw step in JAX + "
                    "mpi4py (jitted gradient, one Allreduce, jitted update), and mpi4jax's "
                    "in-jit all-reduce where installed. Needs Keras (pip install "
                    "'mpidist[keras]').")
    keras.add_argument("--steps", type=_positive(int, "integer"), default=16, metavar="N",
                       help="steps per timed epoch (default 16)")
    keras.add_argument("--rounds", type=_positive(int, "integer"), default=5, metavar="R",
                       help="interleaved rounds; medians are reported (default 5)")
    keras.add_argument("--json", action="store_true", help="one JSON object (rank 0)")
    keras.set_defaults(func=cmd_bench_keras)
    ps = kinds.add_parser(
        "ps", help="ParameterServerStrategy: variable requests, scheduling, idle cost",
        description="ParameterServerStrategy's costs beside raw MPI ping-pong in the same job: "
                    "variable reads and updates, posted updates/s, schedule(), closures/s, the "
                    "idle server's CPU share, the fused Adam update. Needs >= 3 ranks "
                    "(mpiexec -n 4 mpidist bench ps).")
    ps.add_argument("--quick", action="store_true", help="fewer calls and 3 rounds")
    ps.add_argument("--rounds", type=_positive(int, "integer"), metavar="R",
                    help="interleaved rounds; medians are reported (default 7)")
    ps.add_argument("--json", action="store_true", help="one JSON object (rank 0)")
    ps.set_defaults(func=cmd_bench_ps)
    _add_input_parser(kinds)
    _add_gpu_bench_parser(kinds)
    _add_selftest_parser(commands)
    return parser


def _add_gpu_bench_parser(kinds: Any) -> None:  # what add_subparsers returned
    from mpidist.cli.bench_gpu import DEFAULT_SIZES, QUICK_SIZES  # noqa: PLC0415

    gpu = kinds.add_parser(
        "gpu", help="the all-reduce on one GPU (strategy.run + all_reduce) beside raw NCCL",
        description="strategy.run + ReplicaContext.all_reduce on CuPy values on GPU 0 (default "
                    "cross-device ops and NcclAllReduce) beside raw cupy.cuda.nccl allReduce and "
                    "a raw device copy, in one process; medians of interleaved rounds, ratio to "
                    "raw NCCL. Needs a GPU.")
    gpu.add_argument("--sizes", type=_sizes, metavar="SPEC",
                     help=f"sizes as for bench allreduce (default {DEFAULT_SIZES}, --quick "
                          f"{QUICK_SIZES})")
    gpu.add_argument("--rounds", type=_positive(int, "integer"), metavar="R",
                     help="interleaved timed rounds; the median is reported (default 7)")
    gpu.add_argument("--min-time", type=_positive(float, "number of seconds"), metavar="S",
                     help="seconds each timed sample lasts at least (default 0.02)")
    gpu.add_argument("--warmup", type=_non_negative_int, metavar="K",
                     help="untimed calls of each implementation per size (default 5)")
    gpu.add_argument("--quick", action="store_true",
                     help="sizes 4K and 1M, 3 rounds of 5 ms samples")
    gpu.add_argument("--json", action="store_true", help="one JSON object: job facts, rows")
    gpu.add_argument("--stand-in", choices=["cpu"], default=None,
                     help="rehearse on the CPU with NumPy (no GPU numbers; for tests)")
    gpu.set_defaults(func=cmd_bench_gpu)


def _add_selftest_parser(commands: Any) -> None:  # what add_subparsers returned
    from mpidist.cli.selftest import BUDGET_S, DEFAULT_REPORT, STEPS  # noqa: PLC0415

    names = tuple(s.name for s in STEPS)
    selftest = commands.add_parser(
        "selftest", help="run every GPU path once on one GPU and write a JSON report",
        description="Every GPU path of mpidist on one GPU, each step in a process of its own "
                    "under its own timeout, within a budget: the environment, then pass / fail "
                    "/ skip, seconds and detail per step, printed as a table and written as "
                    "JSON. Without a GPU: a dry run that says so. Exit status 0 all passed (or "
                    "skipped for a missing library), 1 a step failed, 3 no GPU (dry run), "
                    "2 usage error.")
    selftest.add_argument("--gpu", action="store_true", required=True,
                          help="the GPU suite (the only one)")
    selftest.add_argument("--report", default=DEFAULT_REPORT, metavar="PATH",
                          help=f"where the JSON report goes (default ./{DEFAULT_REPORT})")
    selftest.add_argument("--steps", type=_choices(names, "steps"), metavar="STEPS",
                          help=f"comma-separated subset of {','.join(names)} (default all)")
    selftest.add_argument("--budget", type=_positive(float, "number of seconds"),
                          default=BUDGET_S, metavar="S",
                          help=f"seconds for the whole run; a step gets at most what is left "
                               f"(default {BUDGET_S:g})")
    selftest.add_argument("--stand-in", choices=["cpu"], default=None,
                          help="rehearse the steps with NumPy on the CPU and the kernels in "
                               "Numba's simulator (tests the steps; nothing runs on a GPU)")
    selftest.set_defaults(func=cmd_selftest)


def _add_step_parser(kinds: Any) -> None:  # what add_subparsers returned
    step = kinds.add_parser(
        "step", help="the step a user writes (run + all_reduce, apply_gradients, fit)",
        description="The paths a training step takes, each beside its raw baseline in the same "
                    "job: strategy.run + ReplicaContext.all_reduce vs comm.Allreduce; "
                    "apply_gradients with 10/100/1000 variables vs one packed Allreduce + a "
                    "fused NumPy update; an mpidist.fit step with its communication share.")
    step.add_argument("--paths", type=_paths, metavar="PATHS",
                      default=["allreduce", "apply_gradients", "fit"],
                      help="comma-separated subset of allreduce,apply_gradients,fit (default all)")
    g = step.add_argument_group("timing")
    g.add_argument("--min-time", type=_positive(float, "number of seconds"), metavar="S",
                   help=f"seconds each timed sample lasts at least (default {DEFAULTS['min_time']})")
    g.add_argument("--warmup", type=_non_negative_int, metavar="K",
                   help=f"untimed calls of each case (default {DEFAULTS['warmup']})")
    g.add_argument("--rounds", type=_positive(int, "integer"), metavar="R",
                   help=f"interleaved timed rounds; the median is reported "
                        f"(default {DEFAULTS['rounds']})")
    g.add_argument("--quick", action="store_true",
                   help="a small sweep for smoke tests: all-reduce at 4K and 256K, 10 and 100 "
                        f"variables, 4 fit steps, {QUICK['rounds']} rounds of "
                        f"{QUICK['min_time'] * 1e3:g} ms")
    fmt = step.add_argument_group("output (rank 0)").add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object: job facts, rows")
    fmt.add_argument("--markdown", action="store_true",
                     help="docs/performance.md's tables (and cost model) for this job")
    step.set_defaults(func=cmd_bench_step, iters=None)


def _choices(names: tuple[str, ...], what: str) -> Callable[[str], list[str]]:
    """A comma-separated subset of ``names``, in the order given, each once."""
    def parse(text: str) -> list[str]:
        picked = [p.strip().lower() for p in text.split(",") if p.strip()]
        bad = [p for p in picked if p not in names]
        if not picked or bad:
            raise argparse.ArgumentTypeError(
                f"{text!r}: {what} are a comma-separated list of {', '.join(names)}")
        return list(dict.fromkeys(picked))
    return parse


def _size(text: str) -> int:
    try:
        return bench.parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _add_input_parser(kinds: Any) -> None:  # what add_subparsers returned
    from mpidist.cli.bench_input import DEFAULTS as D  # noqa: PLC0415
    from mpidist.cli.bench_input import FORMATS, PARTS, QUICK  # noqa: PLC0415

    step = kinds.add_parser(
        "input", help="training data from files: readers beside the raw library, a step fed "
                      "from files beside memory",
        description="Each file reader (npy, npz, Parquet, HDF5) reading the same files as the "
                    "raw library into the same batches (MB/s, rank 0), and a training step fed "
                    "from .npy files beside the same step fed from memory (every rank; "
                    "MultiWorkerMirroredStrategy under a launcher). Files go to a temporary "
                    "directory, removed afterwards.")
    step.add_argument("--parts", type=_choices(PARTS, "parts"), default=list(PARTS),
                      metavar="PARTS", help="comma-separated subset of readers,step (default both)")
    step.add_argument("--formats", type=_choices(FORMATS, "formats"), default=list(FORMATS),
                      metavar="FORMATS",
                      help="readers to measure, of npy,npz,parquet,hdf5 (default all; one whose "
                           "library is missing is skipped with a note)")
    step.add_argument("--size", type=_size, metavar="SIZE",
                      help="bytes of data per reader format, e.g. 64M "
                           f"(default {bench.human_size(D['size'])}, --quick "
                           f"{bench.human_size(QUICK['size'])})")
    step.add_argument("--files", type=_positive(int, "integer"), metavar="N",
                      help=f"files the data is split into (default {D['files']}, --quick "
                           f"{QUICK['files']}; the step uses at least one per rank)")
    step.add_argument("--batch", type=_positive(int, "integer"), metavar="B",
                      help=f"rows per batch of the reader part (default {D['batch']})")
    step.add_argument("--steps", type=_positive(int, "integer"), metavar="S",
                      help=f"steps per pass of the step part (default {D['steps']}, --quick "
                           f"{QUICK['steps']})")
    step.add_argument("--global-batch", type=_positive(int, "integer"), metavar="G",
                      help=f"the step's global batch (default {D['global_batch']})")
    step.add_argument("--rounds", type=_positive(int, "integer"), metavar="R",
                      help=f"interleaved rounds; medians are reported (default {D['rounds']}, "
                           f"--quick {QUICK['rounds']})")
    step.add_argument("--dir", metavar="DIR",
                      help="where the temporary files go (default: the system's temporary "
                           "directory); removed afterwards")
    step.add_argument("--quick", action="store_true",
                      help="a small run for smoke tests (4 MiB per format, 8 steps, 3 rounds)")
    step.add_argument("--json", action="store_true", help="one JSON object (rank 0)")
    step.set_defaults(func=cmd_bench_input)
