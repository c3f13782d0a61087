"""The ``mpidist`` command's entry points: parse, run the subcommand, turn what it raised into
an exit status (and, in a job of several ranks, end the job on an unexpected error)."""

import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn, cast

from mpidist.cli.arguments import build_parser
from mpidist.cli.errors import CommandError, print_error
from mpidist.config import get_config

__all__ = ["run", "main"]


def _world_size() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return cast(int, mpi.COMM_WORLD.Get_size())


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (argument errors raise SystemExit(2))."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:  # its arguments end with the user's program: not for argparse
        from mpidist.launch.runner import main as run_main  # noqa: PLC0415

        return run_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return cast(int, args.func(args))
    except CommandError as err:
        if err.report:
            print_error(str(err))
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - report any failure with the rank, then end the job
        text = f"{type(err).__name__}: {err}"
        if _world_size() > 1:
            # The other ranks may be waiting in a collective this rank will never join.
            from mpidist.comm.mpi import abort_job  # noqa: PLC0415

            abort_job(f"mpidist: error: {text}\n{traceback.format_exc()}", code=1)
        print_error(text)
        if get_config().log_level == "debug":
            traceback.print_exc()
        return 1


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console-script entry point: exits with ``run``'s status."""
    sys.exit(run(argv))
