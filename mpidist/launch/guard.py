"""The per-rank guard: ``python -m mpidist.guard [--] PROGRAM [ARGS...]``.

A launcher (mpiexec, srun) starts the guard in place of the rank's program. The guard does
not start MPI. It starts the program as its child with the same environment and the same open
files (the launcher's PMI_FD, Slurm's pmi2 and Open MPI's PMIx variables), so the program's
MPI_Init talks to the launcher as if the launcher had started it. Then it:

- makes the program die with it (Linux ``PR_SET_PDEATHSIG``): a launcher that kills the guard
  with SIGKILL leaves no orphan rank behind;
- forwards SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 (Slurm's time-limit signal);
- clears the MPI library's shared memory that killed jobs left in /dev/shm: stale segments
  before the program starts (a requeued job's MPI_Init would attach to its predecessor's),
  and the program's own once it died and no live process maps them
  (``mpidist.launch.leftovers``);
- waits, and when the program dies abnormally prints one report on stderr: rank, host, pid,
  exit status or signal, and the last collective the rank entered (from the rank-state file,
  ``mpidist.comm.rank_state``); then exits with the program's code, or 128 + the signal.

No report when the program exits 0, or after a forwarded signal (the job is being stopped, or
asked to back up, and the launcher says so). Exit status 1 (an uncaught exception, whose
traceback is already above) gets a one-line note instead of a report.

When ``MPIDIST_FINISHED_DIR`` names a directory (the batch scripts in slurm/ make one per run,
on a filesystem every node sees), a program that exits 0 leaves a completion record there,
``rank-<launcher rank>``. A step whose every rank left one finished; the launcher's exit status
alone cannot say so (srun returns 0 for a step that a node failure ended).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from mpidist.comm.rank_state import ENV_VARIABLE, RankState, create_state_file, read_state_file
from mpidist.launch import leftovers
from mpidist.launch.deaths import claim_first_death
from mpidist.launch.report import death_report, exit_code_of, later_death_note
from mpidist.launch.signals import forward_signals, stop_forwarding
from mpidist.launcher_env import announced_size, launcher_rank

__all__ = ["main", "run_guarded", "FINISHED_DIR_VARIABLE"]

FINISHED_DIR_VARIABLE = "MPIDIST_FINISHED_DIR"

USAGE = ("usage: python -m mpidist.guard [--report-dir DIR] [--survivable] [--] PROGRAM "
         "[ARGS...]\n"
         "  e.g. srun --mpi=pmi2 -n 4 python -m mpidist.guard -- python train.py\n"
         "  --survivable: the launcher keeps the other ranks running when one dies (Hydra's\n"
         "    -disable-auto-cleanup): end with 128 + the signal instead of the signal, since\n"
         "    Hydra kills the other ranks of a node where a rank was killed by a signal\n")
_PR_SET_PDEATHSIG = 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m mpidist.guard``: returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    report_dir, survivable = None, False
    while argv[:1] in (["--report-dir"], ["--survivable"]):
        if argv[0] == "--survivable":
            survivable, argv = True, argv[1:]
            continue
        if len(argv) < 2:  # set by `mpidist run`, which reads it after the job
            sys.stderr.write("mpidist.guard: --report-dir needs a directory\n" + USAGE)
            return 2
        report_dir, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE)
        return 0 if argv else 2
    return run_guarded(argv, report_dir, die_like_program=not survivable)


def run_guarded(command: Sequence[str], report_dir: str | None = None,
                die_like_program: bool = False) -> int:
    """Run ``command`` (a list) as the guarded program; its exit code, or 128 + signal. With
    ``die_like_program``, a program killed by a signal kills the guard with the same signal
    (after the report) instead of returning."""
    returncode = _run_and_report(command, report_dir)
    if returncode < 0 and die_like_program:
        die_by_signal(-returncode)
    return exit_code_of(returncode)


def die_by_signal(number: int) -> None:
    """End this process by signal ``number``, as a process without a handler for it would (no
    core file: the program's own, if any, is the one to read). Returns only if the signal
    does not end a process by default."""
    try:
        import resource  # noqa: PLC0415 - POSIX only

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    try:
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
    except (OSError, ValueError):
        return
    os.kill(os.getpid(), number)
    time.sleep(1)  # delivery is immediate for an unblocked signal; this is only a margin


def _run_and_report(command: Sequence[str], report_dir: str | None) -> int:
    """Run the guarded program; its ``subprocess`` returncode (negative: killed by a signal)."""
    # Before MPI starts: a killed predecessor's segment under the same name (a requeued Slurm
    # job's) would be attached to by this rank and fail MPI_Init (mpidist.launch.leftovers).
    _say(leftovers.clear_stale())
    before = leftovers.present()
    path, fd = _state_file()
    try:
        env = dict(os.environ)
        env[ENV_VARIABLE] = path
        try:
            child = subprocess.Popen(command, env=env, close_fds=False,
                                     preexec_fn=_die_with_parent())
        except OSError as err:
            # What a shell says and returns for a program that cannot run.
            code = 127 if isinstance(err, FileNotFoundError) else 126
            _write(f"mpidist.guard: cannot start {command[0]!r}: {err.strerror}. Give the "
                   f"program as it would run without the guard, e.g. `python train.py`.\n")
            return code
        received = forward_signals(child)
        returncode, segments = _wait_noting_segments(child)
        stop_forwarding()  # a late signal must not end the guard in place of its exit code
        if not segments:  # it died before the first look: those that appeared meanwhile
            # (clearing keeps any a live process maps or has open, another job's included)
            segments = leftovers.present() - before
        if returncode == 0:
            _record_finished()
        elif not received:  # after a forwarded signal the launcher speaks
            _report(returncode, read_state_file(path), child.pid, command, report_dir)
        _say(leftovers.clear_when_unused(segments))  # MPICH removes them at MPI_Finalize only
        return returncode
    finally:
        os.close(fd)
        if not path.startswith("/proc/"):
            os.unlink(path)


def _record_finished() -> None:
    """The program exited 0: leave this rank's completion record in ``$MPIDIST_FINISHED_DIR``,
    if set (the directory is its creator's to make and remove)."""
    directory = os.environ.get(FINISHED_DIR_VARIABLE)
    if not directory:
        return
    rank = launcher_rank()
    name = f"rank-{rank}" if rank is not None else f"pid-{socket.gethostname()}-{os.getpid()}"
    try:
        with open(os.path.join(directory, name), "w", encoding="utf-8") as record:
            record.write(f"{socket.gethostname()} {os.getpid()} exit 0\n")
    except OSError as err:
        _write(f"mpidist.guard: the program finished, but its completion record could not be "
               f"written to {directory} ({FINISHED_DIR_VARIABLE}): {err.strerror or err}\n")


def _wait_noting_segments(child: subprocess.Popen[bytes]) -> tuple[int, set[str]]:
    """Wait for ``child``; ``(returncode, the MPI shared-memory segments it mapped)``, read
    from /proc while it runs (after it died, /proc no longer says): often at first, where MPI
    starts, then every second. Only its own, where it lived to be looked at: not a segment
    another job on the node created meanwhile."""
    segments: set[str] = set()
    look = 0.05
    while True:
        try:
            return child.wait(timeout=look), segments  # wait-ok: lives as long as its program
        except subprocess.TimeoutExpired:
            segments |= leftovers.segments_mapped_by(child.pid)
            look = min(1.0, 2 * look)


def _say(cleared: leftovers.Cleared) -> None:
    message = cleared.message()
    if message:
        _write(message + "\n")


def _state_file() -> tuple[str, int]:
    """``(path for the program, fd)`` of a new rank-state file. On Linux the file is unlinked
    at once and the program opens it through /proc/<guard>/fd/<fd>: a guard killed with
    SIGKILL (as mpiexec ends the other ranks) leaves nothing behind in /dev/shm."""
    path = create_state_file()
    fd = os.open(path, os.O_RDWR)
    through_proc = f"/proc/{os.getpid()}/fd/{fd}"
    if os.path.exists(through_proc):
        os.unlink(path)
        return through_proc, fd
    return path, fd


def _report(returncode: int, state: RankState | None, pid: int, command: Sequence[str],
            report_dir: str | None) -> None:
    rank: int | None
    size: int | None
    if state is not None:  # MPI's own numbering, once the program had a communicator
        rank, size = state.rank, state.size
    else:
        announced = announced_size()
        rank = launcher_rank()
        size = None if announced is None else announced.value
    host = socket.gethostname()
    first = claim_first_death(report_dir, rank, exit_code_of(returncode))
    if first is None:
        _write(death_report(returncode, state, rank, size, host, pid, command))
    else:
        _write(later_death_note(returncode, rank, host, pid, first))


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the guard dies (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 - Linux only

    libc = ctypes.CDLL(None, use_errno=True)
    guard = os.getpid()

    def set_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != guard:  # the guard died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return set_death_signal


def _write(text: str) -> None:
    """One write: a report from one rank does not interleave with another rank's lines."""
    data = text.encode("utf-8", "replace")
    while data:
        data = data[os.write(2, data):]
