"""The MPI library: imported on first use, checked against the launcher, and made to end the
whole job when one rank fails.

Importing this module initialises nothing; ``mpi_module()`` imports mpi4py (which calls
MPI_Init_thread) the first time a communicator is needed, asking for the thread level that
mpidist's own threads need (``MPIDIST_MPI_THREAD_LEVEL``, default SERIALIZED: every MPI call
of mpidist is made under the communicator's lock, one thread at a time), never lower than a
level the program itself chose.
"""

import os
import signal
import sys
import time
import threading
from types import ModuleType, TracebackType
from collections.abc import Callable
from typing import NoReturn

from mpidist.comm.stop_report import install_term_report, report_interrupt
from mpidist.comm.user_traceback import format_user_traceback
from mpidist.config import get_config
from mpidist.launcher_env import Announced, Environ, announced_size, process_manager_agrees

__all__ = ["mpi_module", "THREAD_LEVELS", "check_launch", "launcher_world_size",
           "install_abort_on_exception", "on_abort", "abort_job", "rank_label",
           "ABORT_BACKSTOP_SECONDS"]

# mpi4py's names of MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE, lowest first.
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")

_lock = threading.Lock()
_hook_installed = False
ABORT_BACKSTOP_SECONDS = 10.0  # abort_job exits by itself if MPI_Abort has not ended it by then


def _request_thread_level() -> None:
    """Set ``mpi4py.rc.thread_level`` before MPI starts: mpidist's level, or the program's own
    choice where it made one (``mpi4py.rc.thread_level = ...`` or ``MPI4PY_RC_THREAD_LEVEL``)
    and it is higher. Once MPI runs, the level is fixed and this does nothing."""
    if "mpi4py.MPI" in sys.modules:
        return
    import mpi4py  # noqa: PLC0415 - the package only; MPI itself starts below

    ours = get_config().mpi_thread_level
    if ours is None:
        return  # MPIDIST_MPI_THREAD_LEVEL=default: leave mpi4py's choice alone
    theirs = vars(mpi4py.rc).get("thread_level")  # set on the instance only by the program
    env = os.environ.get("MPI4PY_RC_THREAD_LEVEL", "").strip().lower()
    for chosen in (theirs, env):
        if chosen in THREAD_LEVELS and THREAD_LEVELS.index(chosen) > THREAD_LEVELS.index(ours):
            ours = chosen
    mpi4py.rc.thread_level = ours
    if env:  # mpi4py lets the variable override rc; keep the two in agreement
        os.environ["MPI4PY_RC_THREAD_LEVEL"] = ours


def mpi_module() -> ModuleType:
    """``mpi4py.MPI``, imported now; a clear ImportError when mpi4py is missing."""
    try:
        _request_thread_level()
        from mpi4py import MPI  # noqa: PLC0415 - MPI starts only when a communicator is needed
    except ImportError as err:
        raise ImportError(
            "MultiWorkerMirroredStrategy needs mpi4py and an MPI library: pip install "
            "'mpidist[mpi]' (MPICH wheels), or build mpi4py against your cluster's MPI "
            f"(pip install mpi4py). Import failed with: {err}"
        ) from err
    return MPI


def launcher_world_size(environ: Environ | None = None) -> Announced | None:
    """``(variable, size)`` of the first launcher variable that announces a task count, else None.

    Under Slurm the step's own count wins over the job's (``srun -n 2`` in a 4-task job); the
    order is ``mpidist.launcher_env.SIZE_VARIABLES``.
    """
    return announced_size(environ)


def check_launch(size: int, environ: Environ | None = None) -> None:
    """Raise RuntimeError when the launcher started more tasks than MPI sees.

    The classic failure: ``srun`` without the right ``--mpi=`` plugin, or an ``mpiexec`` from
    another MPI than mpi4py's, starts N processes that each initialise MPI alone (size 1), so
    N copies of the job would train N separate models.
    """
    if process_manager_agrees(size, environ):
        return  # the process manager that started this rank agrees with MPI (e.g. mpiexec -n 2
        # inside a 4-task Slurm allocation)
    announced = announced_size(environ)
    if announced is None:
        return
    name, expected = announced
    if expected == size:
        return
    if name.startswith("SLURM") and size > 1 and expected < size:
        return  # an MPI launcher inside a Slurm allocation may start more ranks than the step
    mpi = "the MPI library mpi4py was built with"
    if size == 1:
        raise RuntimeError(
            f"The launcher started {expected} tasks ({name}={expected}) but MPI reports a world of "
            f"size 1 on this process: every task is running alone and would train its own model. "
            f"Fix: under Slurm use `srun --mpi=pmi2` for MPICH (the PyPI mpich wheel included) "
            f"or `srun --mpi=pmix` for Open MPI (see `srun --mpi=list`), or launch with the "
            f"`mpiexec` of {mpi}; outside Slurm, use the "
            f"`mpiexec` that belongs to {mpi} (compare `mpiexec --version` with "
            f"`python -c 'from mpi4py import MPI; print(MPI.Get_library_version())'`)."
        )
    raise RuntimeError(
        f"The launcher announced {expected} tasks ({name}={expected}) but MPI reports a world of "
        f"size {size}. Launch with the `mpiexec`/`srun --mpi=...` that matches {mpi}, or unset "
        f"{name} if it was inherited from another job."
    )


def rank_label() -> str:
    """``"rank R of N on HOST"`` for messages, without starting MPI if it is not running."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return "a process without MPI"
    world = mpi.COMM_WORLD
    return f"rank {world.Get_rank()} of {world.Get_size()} on {mpi.Get_processor_name()}"


# Called first thing when this rank ends with a report of its own (abort_job, a Ctrl-C or
# SIGTERM line): the watch of dead ranks tells its peers, so they do not report it as a
# silent death too.
_before_abort: list[Callable[[bool], None]] = []


def on_abort(callback: Callable[[bool], None]) -> None:
    """Have ``callback(stopped)`` run when this rank ends with its own report: ``abort_job``
    (``stopped`` False: MPI_Abort follows, ending every rank) or a stop line (True: a signal
    ends this rank alone). It must be quick and must not raise."""
    _before_abort.append(callback)


def _leaving_with_report(stopped: bool = False) -> None:
    for callback in list(_before_abort):
        try:
            callback(stopped)
        except Exception:  # noqa: BLE001 - ending the job must not fail on a courtesy
            pass


def _stopped() -> None:
    _leaving_with_report(stopped=True)


def abort_job(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` (prefixed with this rank; none if empty: it was said already) to
    stderr and end every rank of the job."""
    _leaving_with_report()
    try:  # the launcher interrupts the other ranks when one aborts; finish writing first
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread (the collective watchdog)
    if message:
        sys.stderr.write(f"[mpidist {rank_label()}] {message}\n")
        sys.stderr.flush()
    time.sleep(0.2)  # launchers forward output asynchronously; MPI_Abort would cut it short
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        # A wedged MPI library (MPI_Abort called while another thread is inside MPI) must not
        # keep this rank alive: it leaves by itself after a while.
        backstop = threading.Timer(ABORT_BACKSTOP_SECONDS, os._exit, (code,))
        backstop.daemon = True
        backstop.start()
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def install_abort_on_exception() -> None:
    """Make an uncaught exception on this rank end the whole job, with its traceback printed.

    Without it the other ranks wait forever in their next collective (mpi4py's own remedy is
    ``python -m mpi4py script.py``). Off with ``MPIDIST_ABORT_ON_EXCEPTION=0``.
    """
    global _hook_installed
    if not get_config().abort_on_exception:
        return
    with _lock:
        if _hook_installed:
            return
        previous = sys.excepthook

        def hook(exc_type: type[BaseException], exc: BaseException,
                 tb: TracebackType | None) -> None:
            if issubclass(exc_type, KeyboardInterrupt):  # a stop, not a failure: one line
                _stopped()
                report_interrupt(rank_label(), tb)
                return
            if issubclass(exc_type, SystemExit):
                previous(exc_type, exc, tb)
                return
            # The message once, after the user's frames (the traceback ends with it).
            text = format_user_traceback(exc_type, exc, tb, full=get_config().full_tracebacks)
            abort_job(f"uncaught exception; ending the job on every rank.\n{text}", code=1)

        sys.excepthook = hook
        install_term_report(rank_label, _stopped)
        _hook_installed = True
