"""``mpidist run [-n N] [--launcher auto|mpiexec|srun] [LAUNCHER OPTIONS] -- PROGRAM [ARGS]``.

Builds ``mpiexec -n N ... python -m mpidist.guard --report-dir DIR -- PROGRAM ARGS`` (or
``srun --mpi=pmi2 --kill-on-bad-exit=1 ...`` inside a Slurm allocation) and runs it, passing
signals on. Each rank runs under a guard that reports it if it dies (mpidist.launch.guard).
The exit code is the first dead rank's (the guards record it in DIR, mpidist.launch.deaths),
else the launcher's: mpiexec's own is a race between the dead rank's code and the signal it
killed the others with.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import NoReturn

from mpidist.launch.deaths import first_death
from mpidist.launch.report import exit_code_of
from mpidist.launch.signals import forward_signals, stop_forwarding
from mpidist.launcher_env import in_slurm_allocation

__all__ = ["main", "build_command", "find_mpiexec", "split_arguments", "OWN_OPTIONS"]

USAGE_EXAMPLE = "mpidist run -n 4 -- python train.py --epochs 3"


SURVIVABLE_OPTION = "-disable-auto-cleanup"  # Hydra: the other ranks outlive a dead one
# mpidist run's own options, each with whether it takes a value; every other word before the
# `--` is the launcher's.
OWN_OPTIONS = {"-n": True, "-np": True, "--nprocs": True, "--launcher": True, "--mpiexec": True,
               "--dry-run": False, "-h": False, "--help": False}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mpidist run", allow_abbrev=False, usage="mpidist run [-n N] [--launcher {auto,mpiexec,srun}] "
        "[--mpiexec PATH] [--dry-run] [LAUNCHER OPTIONS] -- PROGRAM [ARGS...]",
        description="Start PROGRAM on N MPI ranks, each under a guard (python -m mpidist.guard) "
                    "that prints a report naming the rank, host, pid, exit status or signal and "
                    "last collective if the rank dies. Every other option before the -- goes "
                    "to the launcher unchanged, in order: Hydra's -hosts, -ppn, -launcher, "
                    "-disable-auto-cleanup, -genv ..., srun's --mpi=..., ...",
        epilog=f"example: {USAGE_EXAMPLE}")
    parser.add_argument("-n", "-np", "--nprocs", type=_positive_int, metavar="N", dest="nprocs",
                        help="number of ranks (default: the launcher's, e.g. the Slurm "
                             "allocation's tasks)")
    parser.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto",
                        help="auto (default): srun inside a Slurm allocation (SLURM_JOB_ID set "
                             "and srun on PATH), else mpiexec")
    parser.add_argument("--mpiexec", metavar="PATH",
                        help="the mpiexec to use (default: the one next to this Python, else the "
                             "first on PATH)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the launcher's command line instead of running it")
    return parser


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of ranks")
    return int(text)


def find_mpiexec() -> str | None:
    """The mpiexec next to this interpreter (the mpich wheel's), else the first on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpiexec")


def build_command(args: argparse.Namespace, launcher_options: Sequence[str], program: Sequence[str],
                  report_dir: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The launcher's argv for parsed ``args``; raises ValueError saying what is missing."""
    launcher = args.launcher
    if launcher == "auto":
        in_slurm = in_slurm_allocation(environ)
        launcher = "srun" if in_slurm and shutil.which("srun") else "mpiexec"
    # Under Hydra's fault-tolerant mode the guard must not die by its program's signal: the
    # proxy would kill the node's other ranks (mpidist.launch.guard).
    survivable = ["--survivable"] if SURVIVABLE_OPTION in launcher_options else []
    guard = [sys.executable, "-m", "mpidist.guard", "--report-dir", report_dir, *survivable, "--",
             *program]
    count = [] if args.nprocs is None else ["-n", str(args.nprocs)]
    if launcher == "srun":
        srun = shutil.which("srun")
        if srun is None:
            raise ValueError("--launcher srun: there is no srun on PATH; run inside a Slurm "
                             "allocation, or use --launcher mpiexec.")
        mine = []
        if not any(o.startswith("--mpi") for o in launcher_options):
            mine.append("--mpi=pmi2")  # the MPICH wheels' plugin; --mpi=pmix for Open MPI
        if not any(o == "-K" or o.startswith("--kill-on-bad-exit") for o in launcher_options):
            mine.append("--kill-on-bad-exit=1")  # one dead rank ends the step
        return [srun, *mine, *count, *launcher_options, *guard]
    mpiexec = args.mpiexec or find_mpiexec()
    if mpiexec is None or (args.mpiexec and shutil.which(args.mpiexec) is None):
        raise ValueError(f"no mpiexec found{f' at {args.mpiexec!r}' if args.mpiexec else ''}: "
                         "install the MPI extra (pip install 'mpidist[mpi]'), put your MPI's "
                         "mpiexec on PATH, or give its path with --mpiexec.")
    return [mpiexec, *count, *launcher_options, *guard]


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(own, launcher_options)``: the words before the ``--`` that are ``mpidist run``'s own
    options (:data:`OWN_OPTIONS`, matched exactly, never by prefix), and every other word, in
    order, for the launcher.

    argparse alone would misread the launcher's options: it takes Hydra's single-dash long
    options apart (``-hosts`` as ``-h osts``, ``-nameserver`` as ``-n ameserver``) and
    completes prefixes (srun's ``--mpi=pmi2`` as ``--mpiexec=pmi2``).
    """
    own: list[str] = []
    launcher_options: list[str] = []
    words = iter(argv)
    for word in words:
        name = word.split("=", 1)[0] if word.startswith("--") else word
        if name not in OWN_OPTIONS:
            launcher_options.append(word)
            continue
        own.append(word)
        if OWN_OPTIONS[name] and "=" not in word:  # the option's value is the next word
            value = next(words, None)
            if value is not None:
                own.append(value)
    return own, launcher_options


def main(argv: Sequence[str]) -> int:
    """``mpidist run``: runs the launcher in place of this process (returns only on errors,
    or with ``--dry-run``)."""
    argv = list(argv)
    parser = build_parser()
    split = argv.index("--") if "--" in argv else len(argv)
    own, launcher_options = split_arguments(argv[:split])
    if any(word in ("-h", "--help") for word in own):
        parser.print_help()
        return 0
    if split == len(argv):
        parser.error(f"put the program after '--', e.g. `{USAGE_EXAMPLE}`")
    program = argv[split + 1:]
    args = parser.parse_args(own)
    if not program:
        parser.error(f"no program after '--', e.g. `{USAGE_EXAMPLE}`")
    if os.sep not in program[0] and shutil.which(program[0]) is None:
        parser.error(f"program {program[0]!r} is not on PATH")
    with tempfile.TemporaryDirectory(prefix="mpidist-run-") as report_dir:
        try:
            command = build_command(args, launcher_options, program, report_dir)
        except ValueError as err:
            sys.stderr.write(f"mpidist run: error: {err}\n")
            return 1
        if args.dry_run:
            print(shlex.join(command), flush=True)
            return 0
        try:
            launcher = subprocess.Popen(command)
        except OSError as err:
            sys.stderr.write(f"mpidist run: error: cannot run {command[0]!r}: {err.strerror}\n")
            return 1
        forward_signals(launcher)
        returncode = launcher.wait()  # wait-ok: mpidist run lasts as long as its job
        stop_forwarding()  # a late signal must not replace the job's exit code
        first = first_death(report_dir)
    if first is None:
        return exit_code_of(returncode)
    rank, code = first
    if code != exit_code_of(returncode):  # e.g. mpiexec's "EXIT CODE: 9" of a rank it killed
        who = "a rank" if rank is None else f"rank {rank}"
        sys.stderr.write(f"mpidist run: exit code {code}, that of {who}, the first rank that "
                         "died (its report is above); the launcher killed the others.\n")
    return code
