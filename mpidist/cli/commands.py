"""What each subcommand does with its parsed arguments: run on every rank, print on rank 0.

Each ``cmd_*`` returns the exit status. The modules that do the work (``info``, ``bench``,
``bench_step``, ``plot``) know nothing of argparse or of the output format chosen.
"""

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from mpidist.cli import bench, timing
from mpidist.cli.bench import Job, Row, Timer
from mpidist.cli.errors import CommandError, CommandParser, print_error, rank_before_mpi

__all__ = ["cmd_info", "cmd_bench_allreduce", "cmd_bench_batch", "cmd_bench_step", "cmd_bench_ps",
           "cmd_bench_keras",
           "cmd_bench_input", "cmd_bench_gpu", "cmd_selftest"]

Settings = dict[str, Any]  # the timing settings (``timing.settings_from``)


def cmd_info(args: argparse.Namespace) -> int:
    """``mpidist info``: 1 when a problem of the job is an error."""
    from mpidist.cli import info  # noqa: PLC0415

    report = info.collect()
    if report is None:
        return 0
    if args.json:
        print(json.dumps(report, indent=2, default=str), flush=True)
    else:
        print(info.render_report(report), flush=True)
    return 1 if any(p["severity"] == "error" for p in report["problems"]) else 0


def cmd_backup(args: argparse.Namespace) -> int:
    """``mpidist backup DIR``: one line on what the backup directory holds; always 0."""
    from mpidist.training.backup_status import describe_backup  # noqa: PLC0415

    print(describe_backup(args.directory), flush=True)
    return 0


def _prepare_plot(args: argparse.Namespace) -> None:
    """Fail before any timing when ``--plot`` cannot be honoured."""
    if not args.plot:
        return
    from mpidist.cli.plot import require_matplotlib  # noqa: PLC0415

    try:
        require_matplotlib()
    except ImportError as err:
        raise CommandError(str(err), report=rank_before_mpi() == 0) from None


def _run_bench(args: argparse.Namespace,
               run: Callable[[Timer, Settings], tuple[Job, list[Row]]],
               emit_table: Callable[[Job, list[Row], Settings], None]) -> int:
    """Shared shape of the bench commands: check, run on every rank, print on rank 0."""
    _prepare_plot(args)
    settings = timing.settings_from(args)
    timer = timing.make_timer(settings)
    try:
        job, rows = run(timer, settings)
    except bench.CheckFailed as err:
        rank = timer.control.Get_rank()
        if err.detail:
            print_error(f"wrong results on this rank: {err.detail}")
        raise CommandError(str(err), report=rank == 0) from None
    finally:
        timer.control.Free()
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    if mpi_module().COMM_WORLD.Get_rank() != 0:
        return 0
    plotted = None
    if args.plot:
        from mpidist.cli import plot as plots  # noqa: PLC0415

        plot = plots.plot_allreduce if args.benchmark == "allreduce" else plots.plot_batch
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
        sys.stdout.write(bench.to_csv(rows, extra))
        sys.stdout.flush()
    else:
        emit_table(job, rows, settings)
        if plotted:
            print(f"# plot: {plotted}", flush=True)
    return 0


def cmd_bench_allreduce(args: argparse.Namespace) -> int:
    """``mpidist bench allreduce``: the size sweep, its table printed row by row as it runs."""
    sizes = args.sizes or bench.parse_sizes(
        timing.QUICK["sizes"] if args.quick else timing.DEFAULTS["sizes"])
    itemsize = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}[args.dtype]
    bad = [s for s in sizes if s % itemsize]
    if bad:
        CommandParser(prog="mpidist bench allreduce").error(
            f"argument --sizes: {', '.join(map(str, bad))} byte(s) is not a whole number of "
            f"{args.dtype} elements ({itemsize} bytes each)")
    table = not (args.json or args.csv)
    printed = {"header": False}
    bar = {"tqdm": None}

    def on_row(job: Job, raw: Row | None, ours: Row, settings: Settings) -> None:
        if raw is None:
            return
        if bar["tqdm"] is not None:
            bar["tqdm"].update(1)
        if not table:
            return
        if not printed["header"]:
            print("\n".join(bench.allreduce_header(job, args.dtype, timing.describe(settings))),
                  flush=True)
            printed["header"] = True
        print(bench.allreduce_line(raw, ours), flush=True)

    def run(timer: Timer, settings: Settings) -> tuple[Job, list[Row]]:
        rank0 = timer.control.Get_rank() == 0
        if rank0 and not table and sys.stderr.isatty():
            # --json / --csv print at the end: show the sweep's progress on a terminal.
            from tqdm import tqdm  # noqa: PLC0415

            bar["tqdm"] = tqdm(total=len(sizes) * len(args.ops), desc="allreduce sweep",
                               unit="case", leave=False)
        try:
            return bench.run_allreduce(
                sizes, args.ops, args.dtype, timer,
                on_row=(lambda job, raw, ours: on_row(job, raw, ours, settings)) if rank0 else None)
        finally:
            if bar["tqdm"] is not None:
                bar["tqdm"].close()

    def emit(job: Job, rows: list[Row], settings: Settings) -> None:
        print("\n".join(bench.allreduce_summary(rows)), flush=True)

    return _run_bench(args, run, emit)


def cmd_bench_batch(args: argparse.Namespace) -> int:
    """``mpidist bench batch``: many small tensors in one call."""
    def run(timer: Timer, settings: Settings) -> tuple[Job, list[Row]]:
        return bench.run_batch(args.tensors, args.tensor_size, args.dtype, timer)

    def emit(job: Job, rows: list[Row], settings: Settings) -> None:
        print("\n".join(bench.batch_table(job, rows, timing.describe(settings))), flush=True)

    return _run_bench(args, run, emit)


def cmd_bench_step(args: argparse.Namespace) -> int:
    """``mpidist bench step``: the paths a training step takes, beside their baselines."""
    from mpidist.cli import bench_step, bench_step_report  # noqa: PLC0415

    settings = timing.settings_from(args)
    timer = timing.make_timer(settings)
    try:
        job, rows = bench_step.run_step_sweep(timer, quick=args.quick, paths=args.paths)
    except bench.CheckFailed as err:
        if err.detail:
            print_error(f"wrong results on this rank: {err.detail}")
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
        print(bench_step_report.render_markdown([{"job": job, "rows": rows}]), flush=True)
    else:
        print("\n".join(bench_step_report.step_table(job, rows, timing.describe(settings))),
              flush=True)
    return 0



def cmd_bench_keras(args: argparse.Namespace) -> int:
    """``mpidist bench keras``: a Keras model.fit step under MWMS beside raw JAX + mpi4py."""
    from mpidist.cli import bench_keras  # noqa: PLC0415
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    try:
        job, rows = bench_keras.run_keras_benchmark(steps=args.steps, rounds=args.rounds)
    except bench.CheckFailed as err:
        raise CommandError(str(err), report=mpi_module().COMM_WORLD.Get_rank() == 0) from None
    if mpi_module().COMM_WORLD.Get_rank() != 0:
        return 0
    if args.json:
        print(json.dumps({"benchmark": "keras", "job": job, "rows": rows}, indent=2), flush=True)
    else:
        print("\n".join(bench_keras.keras_table(job, rows)), flush=True)
    return 0


def cmd_bench_ps(args: argparse.Namespace) -> int:
    """``mpidist bench ps``: ParameterServerStrategy's costs, beside raw MPI."""
    from mpidist.cli import bench_ps  # noqa: PLC0415

    try:
        report = bench_ps.run_ps_benchmark(quick=args.quick, rounds=args.rounds)
    except ValueError as err:
        raise CommandError(str(err)) from None
    if report is None:
        return 0
    if args.json:
        print(json.dumps({"benchmark": "ps", "report": report}, indent=2), flush=True)
    else:
        print("\n".join(bench_ps.ps_table(report)), flush=True)
    return 0


def cmd_bench_input(args: argparse.Namespace) -> int:
    """``mpidist bench input``: the readers beside the raw libraries, the step fed from files
    beside memory."""
    from mpidist.cli import bench_input  # noqa: PLC0415
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    try:
        job, rows, settings = bench_input.run_input_benchmark(
            parts=args.parts, formats=args.formats, quick=args.quick, size=args.size,
            files=args.files, batch=args.batch, steps=args.steps,
            global_batch=args.global_batch, rounds=args.rounds, directory=args.dir)
    except bench.CheckFailed as err:
        if err.detail:
            print_error(f"wrong results on this rank: {err.detail}")
        raise CommandError(str(err), report=mpi_module().COMM_WORLD.Get_rank() == 0) from None
    if mpi_module().COMM_WORLD.Get_rank() != 0:
        return 0
    if args.json:
        print(json.dumps({"benchmark": "input", "job": job, "settings": settings, "rows": rows},
                         indent=2), flush=True)
    else:
        print("\n".join(bench_input.input_table(job, rows, settings)), flush=True)
    return 0


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    """``mpidist bench gpu``: the public all-reduce on one GPU beside raw NCCL and a copy."""
    from mpidist.cli import bench_gpu  # noqa: PLC0415

    try:
        target = bench_gpu.target_for(args.stand_in != "cpu")
        job, rows = bench_gpu.run_gpu_allreduce(target, sizes=args.sizes, quick=args.quick,
                                                rounds=args.rounds, min_time=args.min_time,
                                                warmup=args.warmup)
    except (RuntimeError, bench.CheckFailed) as err:
        raise CommandError(str(err)) from None
    if args.json:
        print(json.dumps({"benchmark": "gpu", "job": job, "rows": rows}, indent=2), flush=True)
    else:
        print("\n".join(bench_gpu.table(job, rows)), flush=True)
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    """``mpidist selftest --gpu``: 0 all passed, 1 a step failed, 3 no GPU (dry run)."""
    from mpidist.cli import selftest  # noqa: PLC0415

    steps = [s for s in selftest.STEPS if not args.steps or s.name in args.steps]

    def on_step(entry: dict[str, Any]) -> None:
        if entry["seconds"]:  # progress of the steps that ran (a dry run's run none)
            print("selftest: " + selftest.step_line(entry), file=sys.stderr, flush=True)

    report = selftest.run_selftest(steps, budget_s=args.budget, stand_in=args.stand_in,
                                   on_step=on_step)
    path = selftest.write_report(report, args.report)
    print(selftest.render(report, path), flush=True)
    return int(report["exit_code"])
