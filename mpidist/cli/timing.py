"""The timing settings of the ``mpidist bench`` commands: defaults, ``--quick``, the options
that override them, and the Timer and the one-line description built from the result."""

import argparse
from typing import Any

from mpidist.cli import bench

__all__ = ["QUICK", "DEFAULTS", "settings_from", "make_timer", "describe"]

QUICK: dict[str, Any] = {"sizes": bench.QUICK_SIZES, "rounds": 3, "warmup": 1,
                         "min_time": 0.002}
DEFAULTS: dict[str, Any] = {"sizes": bench.DEFAULT_SIZES, "rounds": 5, "warmup": 5,
                            "min_time": 0.02}


def settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """``{"rounds", "warmup", "min_time", "iters"}``: the options given, else ``--quick``'s
    values or the defaults. ``--iters`` replaces ``min_time`` (None then)."""
    base = QUICK if args.quick else DEFAULTS
    pick = {k: (getattr(args, k, None) if getattr(args, k, None) is not None else base[k])
            for k in ("rounds", "warmup", "min_time")}
    if args.iters:
        pick["min_time"] = None
    pick["iters"] = args.iters
    return pick


def make_timer(settings: dict[str, Any]) -> bench.Timer:
    """A Timer on its own duplicate of COMM_WORLD (starts MPI); the caller frees
    ``timer.control``."""
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    mpi = mpi_module()
    control = mpi.COMM_WORLD.Dup()  # barriers and timing reductions, off the measured comms
    return bench.Timer(control, mpi, iters=settings["iters"], min_time=settings["min_time"],
                       warmup=settings["warmup"], rounds=settings["rounds"])


def describe(settings: dict[str, Any]) -> str:
    """How the reported times were taken, for the reports' headers."""
    calls = (f"{settings['iters']} calls per sample" if settings["iters"] else
             f"calls per sample agreed by all ranks to last >= {settings['min_time'] * 1e3:g} ms")
    return (f"time = median over {settings['rounds']} interleaved rounds of the slowest rank's "
            f"time per call; {calls}; {settings['warmup']} warm-up call(s); results checked first")
