"""The ``mpidist`` command (console script and ``python -m mpidist``).

    mpidist info [--json]
    mpidist bench allreduce [--sizes 8:64M] [--ops sum,max] [--dtype float32]
                            [--iters N | --min-time S] [--json | --csv] [--plot out.png]
    mpidist bench batch [--tensors 100] [--tensor-size 1000] [--json|--csv] [--plot out.png]
    mpidist bench step [--quick] [--paths allreduce,apply_gradients,fit] [--json|--markdown]
    mpidist run [-n N] [--launcher auto|mpiexec|srun] [LAUNCHER OPTIONS] -- PROGRAM [ARGS...]

Run alone, or under ``mpiexec`` / ``srun`` (every rank runs the command; rank 0 prints).
Exit status: 0 on success, 2 on bad arguments, 1 when something failed or ``info`` found an
error-level problem. Errors name the rank that saw them.
"""

import argparse
import json
import os
import sys
import traceback

from mpidist import cli_bench
from mpidist.logs import LAUNCHER_RANK_VARIABLES, launcher_rank

__all__ = ["main", "run", "build_parser"]

QUICK = {"sizes": cli_bench.QUICK_SIZES, "rounds": 3, "warmup": 1, "min_time": 0.002}
DEFAULTS = {"sizes": cli_bench.DEFAULT_SIZES, "rounds": 5, "warmup": 5, "min_time": 0.02}


class CommandError(RuntimeError):
    """A failure the command reports on the ranks that saw it (exit status 1)."""

    def __init__(self, message, report=True):
        super().__init__(message)
        self.report = report


def _launcher_rank():
    # Known before MPI starts: lets argument errors print once, not once per rank.
    return launcher_rank() or 0  # a process started alone is rank 0


class _Parser(argparse.ArgumentParser):
    """argparse, but under a launcher only the first rank prints usage errors (exit 2)."""

    def error(self, message):
        if _launcher_rank() == 0:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _sizes(text):
    try:
        return cli_bench.parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _ops(text):
    ops = [o.strip().lower() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in cli_bench.OPS]
    if not ops or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: ops are a comma-separated list of {', '.join(cli_bench.OPS)}")
    return list(dict.fromkeys(ops))


def _positive(kind, what):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be a positive {what}")
        return value
    return parse


def _non_negative_int(text):
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def _timing_options(p):
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


def build_parser():
    from mpidist import __version__  # noqa: PLC0415

    parser = _Parser(prog="mpidist", description="mpidist's command line: look at a job, "
                     "benchmark its collectives. Run alone or under mpiexec / srun.")
    parser.add_argument("--version", action="version", version=f"mpidist {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{info,bench,run}",
                                     parser_class=_Parser)
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

    bench = commands.add_parser("bench", help="all-reduce benchmarks beside raw mpi4py",
                                description="Benchmarks of mpidist's collectives beside raw "
                                            "mpi4py in the same job.")
    kinds = bench.add_subparsers(dest="benchmark", metavar="{allreduce,batch,step}",
                                 parser_class=_Parser)
    kinds.required = True

    allreduce = kinds.add_parser(
        "allreduce", help="size sweep of one all-reduce (nccl-tests style)",
        description="Size sweep of mpidist's Communicator.all_reduce against raw mpi4py "
                    "comm.Allreduce: time, algbw, busbw per size and op, and the time ratio.")
    allreduce.add_argument("--sizes", type=_sizes, metavar="SPEC",
                           help="MIN:MAX (powers of 2), MIN:MAX:FACTOR, or a list 8,4K,1M; binary "
                                f"units (default {DEFAULTS['sizes']})")
    allreduce.add_argument("--ops", type=_ops, default=["sum"], metavar="OPS",
                           help=f"comma-separated reduce ops of {','.join(cli_bench.OPS)} "
                                "(default sum)")
    allreduce.add_argument("--dtype", choices=cli_bench.DTYPES, default="float32",
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
    batch.add_argument("--dtype", choices=cli_bench.DTYPES, default="float32",
                       help="element type (default float32)")
    _timing_options(batch)
    batch.set_defaults(func=cmd_bench_batch)
    _add_step_parser(kinds)
    return parser


def _paths(text):
    from mpidist.cli_bench_step import PATHS  # noqa: PLC0415

    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if not paths or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: paths are a comma-separated list of {', '.join(PATHS)}")
    return list(dict.fromkeys(paths))


def _add_step_parser(kinds):
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


# -- commands -------------------------------------------------------------------------------
def cmd_info(args):
    from mpidist import cli_info  # noqa: PLC0415

    report = cli_info.collect()
    if report is None:
        return 0
    if args.json:
        print(json.dumps(report, indent=2, default=str), flush=True)
    else:
        print(cli_info.render_report(report), flush=True)
    return 1 if any(p["severity"] == "error" for p in report["problems"]) else 0


def _settings(args):
    base = QUICK if args.quick else DEFAULTS
    pick = {k: (getattr(args, k, None) if getattr(args, k, None) is not None else base[k])
            for k in ("rounds", "warmup", "min_time")}
    if args.iters:
        pick["min_time"] = None
    pick["iters"] = args.iters
    return pick


def _timer(settings):
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    mpi = mpi_module()
    control = mpi.COMM_WORLD.Dup()  # barriers and timing reductions, off the measured comms
    return cli_bench.Timer(control, mpi, iters=settings["iters"], min_time=settings["min_time"],
                           warmup=settings["warmup"], rounds=settings["rounds"])


def _timer_text(settings):
    calls = (f"{settings['iters']} calls per sample" if settings["iters"] else
             f"calls per sample agreed by all ranks to last >= {settings['min_time'] * 1e3:g} ms")
    return (f"time = median over {settings['rounds']} interleaved rounds of the slowest rank's "
            f"time per call; {calls}; {settings['warmup']} warm-up call(s); results checked first")


def _prepare_plot(args):
    if not args.plot:
        return
    from mpidist.cli_plot import require_matplotlib  # noqa: PLC0415

    try:
        require_matplotlib()
    except ImportError as err:
        raise CommandError(str(err), report=_launcher_rank() == 0) from None


def _run_bench(args, run, emit_table):
    """Shared shape of the bench commands: check, run on every rank, print on rank 0."""
    _prepare_plot(args)
    settings = _settings(args)
    timer = _timer(settings)
    try:
        job, rows = run(timer, settings)
    except cli_bench.CheckFailed as err:
        rank = timer.control.Get_rank()
        if err.detail:
            _print_error(f"wrong results on this rank: {err.detail}")
        raise CommandError(str(err), report=rank == 0) from None
    finally:
        timer.control.Free()
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    if mpi_module().COMM_WORLD.Get_rank() != 0:
        return 0
    plotted = None
    if args.plot:
        from mpidist import cli_plot  # noqa: PLC0415

        plot = cli_plot.plot_allreduce if args.benchmark == "allreduce" else cli_plot.plot_batch
        plot(job, rows, args.plot)
        plotted = os.path.abspath(args.plot)
    if args.json:
        settings_out = dict(settings, **{k: v for k, v in vars(args).items()
                                         if k in ("ops", "dtype", "tensors", "tensor_size")})
        if args.benchmark == "allreduce":
            settings_out["sizes"] = sorted({r["size_bytes"] for r in rows})
        print(json.dumps({"benchmark": args.benchmark, "job": job, "settings": settings_out,
                          "rows": rows, "plot": plotted}, indent=2), flush=True)
    elif args.csv:
        batch = args.benchmark == "batch"
        extra = ("tensors", "tensor_size", "time_per_tensor_us") if batch else ()
        sys.stdout.write(cli_bench.to_csv(rows, extra))
        sys.stdout.flush()
    else:
        emit_table(job, rows, settings)
        if plotted:
            print(f"# plot: {plotted}", flush=True)
    return 0


def cmd_bench_allreduce(args):
    sizes = args.sizes or cli_bench.parse_sizes(QUICK["sizes"] if args.quick else DEFAULTS["sizes"])
    itemsize = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}[args.dtype]
    bad = [s for s in sizes if s % itemsize]
    if bad:
        _Parser(prog="mpidist bench allreduce").error(
            f"argument --sizes: {', '.join(map(str, bad))} byte(s) is not a whole number of "
            f"{args.dtype} elements ({itemsize} bytes each)")
    table = not (args.json or args.csv)
    printed = {"header": False}
    bar = {"tqdm": None}

    def on_row(job, raw, ours, settings):
        if raw is None:
            return
        if bar["tqdm"] is not None:
            bar["tqdm"].update(1)
        if not table:
            return
        if not printed["header"]:
            print("\n".join(cli_bench.allreduce_header(job, args.dtype, _timer_text(settings))),
                  flush=True)
            printed["header"] = True
        print(cli_bench.allreduce_line(raw, ours), flush=True)

    def run(timer, settings):
        rank0 = timer.control.Get_rank() == 0
        if rank0 and not table and sys.stderr.isatty():
            # --json / --csv print at the end: show the sweep's progress on a terminal.
            from tqdm import tqdm  # noqa: PLC0415

            bar["tqdm"] = tqdm(total=len(sizes) * len(args.ops), desc="allreduce sweep",
                               unit="case", leave=False)
        try:
            return cli_bench.run_allreduce(
                sizes, args.ops, args.dtype, timer,
                on_row=(lambda job, raw, ours: on_row(job, raw, ours, settings)) if rank0 else None)
        finally:
            if bar["tqdm"] is not None:
                bar["tqdm"].close()

    def emit(job, rows, settings):
        print("\n".join(cli_bench.allreduce_summary(rows)), flush=True)

    return _run_bench(args, run, emit)


def cmd_bench_batch(args):
    def run(timer, settings):
        return cli_bench.run_batch(args.tensors, args.tensor_size, args.dtype, timer)

    def emit(job, rows, settings):
        print("\n".join(cli_bench.batch_table(job, rows, _timer_text(settings))), flush=True)

    return _run_bench(args, run, emit)


def cmd_bench_step(args):
    from mpidist import cli_bench_step, cli_bench_step_report  # noqa: PLC0415

    settings = _settings(args)
    timer = _timer(settings)
    try:
        job, rows = cli_bench_step.run_step_sweep(timer, quick=args.quick, paths=args.paths)
    except cli_bench.CheckFailed as err:
        if err.detail:
            _print_error(f"wrong results on this rank: {err.detail}")
        raise CommandError(str(err), report=timer.control.Get_rank() == 0) from None
    finally:
        rank = timer.control.Get_rank()
        timer.control.Free()
    if rank != 0:
        return 0
    if args.json:
        print(json.dumps({"benchmark": "step", "job": job, "settings": dict(
            settings, quick=args.quick, paths=args.paths), "rows": rows}, indent=2), flush=True)
    elif args.markdown:
        print(cli_bench_step_report.render_markdown([{"job": job, "rows": rows}]), flush=True)
    else:
        print("\n".join(cli_bench_step_report.step_table(job, rows, _timer_text(settings))),
              flush=True)
    return 0


# -- entry points ---------------------------------------------------------------------------
def _where():
    """``rank R of N on HOST`` once MPI runs; before, the rank the launcher gave this process."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        from mpidist.comm.mpi import rank_label  # noqa: PLC0415

        return rank_label()
    for name in LAUNCHER_RANK_VARIABLES:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return f"rank {raw} ({name}; before MPI started)"
    return "rank 0 (no launcher; before MPI started)"


def _print_error(message):
    sys.stderr.write(f"mpidist: error on {_where()}: {message}\n")
    sys.stderr.flush()


def _world_size():
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()


def run(argv=None):
    """Run the command; returns the exit status (argument errors raise SystemExit(2))."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:  # its arguments end with the user's program: not for argparse
        from mpidist.launch.runner import main as run_main  # noqa: PLC0415

        return run_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CommandError as err:
        if err.report:
            _print_error(str(err))
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - report any failure with the rank, then end the job
        text = f"{type(err).__name__}: {err}"
        if _world_size() > 1:
            # The other ranks may be waiting in a collective this rank will never join.
            from mpidist.comm.mpi import abort_job  # noqa: PLC0415

            abort_job(f"mpidist: error: {text}\n{traceback.format_exc()}", code=1)
        _print_error(text)
        if os.environ.get("MPIDIST_LOG", "").strip().lower() == "debug":
            traceback.print_exc()
        return 1


def main(argv=None):
    """Console-script entry point: exits with ``run``'s status."""
    sys.exit(run(argv))
