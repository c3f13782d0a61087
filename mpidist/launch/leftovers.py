"""What a killed MPI job leaves on a node, and clearing it: the shared-memory segments in
/dev/shm of the MPI library (MPICH's ``mpich_*``, UCX's ``ucx_*``).

MPICH names a job's segment after the job and step, so the same name comes back when Slurm
restarts a job (``scontrol requeue``, preemption, node failure): a rank of the new step then
attaches to the dead step's segment and fails in ``MPI_Init`` (UCX: "failed to unpack
address", "Invalid parameter", truncated messages), with nothing that points at the cause.
And MPICH removes a segment only at a clean ``MPI_Finalize``, so every killed job leaves one.

``mpidist.guard`` (each rank's parent in the documented scripts, ``mpidist run``, and
``srun ... python -m mpidist.guard``) uses this module twice: before it starts the program, it
removes leftovers that no live process maps and that are older than a grace period (a segment
a rank of the new job is creating right now is neither); after the program died, it removes
the segments the program had mapped once no live process maps them any more. Where the node's
other ranks still map them (mpiexec kills them only after this rank's guard has ended), a
detached cleaner (``python -m mpidist.launch.leftovers``) waits for them to go, up to
``LINGER_SECONDS``, and then clears; what even that misses, the next guard on the node clears.

The cleaner fails closed: it removes only this user's segments, and only when it could look at
every process of this user (each one's memory maps and open files: MPICH opens a segment
before it maps it), none of which has the segment's file (compared by inode, so a new job's
segment under a reused name is never taken for the dead one's); a segment other users may open
(its mode lets them) stays unless their processes could be seen too. Just before the unlink it
checks that the name still holds the inode it judged.

Where the launcher kills the guards with their ranks (Slurm after an ``MPI_Abort`` or a rank's
bad exit under ``--kill-on-bad-exit``), no guard is left to clear. The batch scripts in slurm/
then run ``python -m mpidist.launch.leftovers --stale`` once on every node of the job
(``clear_stale``): it prints what it removed, and exits 1, naming the files, if some could not
be removed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["SHM", "PREFIXES", "present", "segments_mapped_by", "mapped_segments", "usage",
           "Usage", "clear_stale", "clear_unused", "clear_when_unused", "Cleared"]

SHM = Path("/dev/shm")
PREFIXES = ("mpich_", "ucx_")
# A segment younger than this may be one a rank of a starting job has created and not yet
# mapped (microseconds apart in MPICH); a requeued job's predecessor is seconds older.
GRACE_SECONDS = 2.0
LINGER_SECONDS = 30.0  # how long a detached cleaner waits for a dead job's ranks to go
_MAPPING = re.compile(r"/dev/shm/(\S+)")
# a line of /proc/<pid>/maps: address perms offset dev inode path
_MAP_LINE = re.compile(r"^\S+ \S+ \S+ \S+ (\d+) +/dev/shm/(\S+)", re.MULTILINE)


def _ours(name: str) -> bool:
    return name.startswith(PREFIXES)


def segments_mapped_by(pid: int) -> set[str]:
    """The MPI segments in /dev/shm that process ``pid`` maps (empty once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {name for name in _MAPPING.findall(text) if _ours(name)}


@dataclasses.dataclass
class Usage:
    """Which files of /dev/shm the live processes of this machine have mapped or open.

    ``names`` and ``inodes`` (of /dev/shm's files) are what was seen; ``complete`` is False
    when a process of this (non-root) user could not be looked at, and ``others_hidden`` True
    when another user's could not (a non-root cleaner cannot read them; root is denied only
    what a security module hides)."""

    names: set[str] = dataclasses.field(default_factory=set)
    inodes: set[int] = dataclasses.field(default_factory=set)
    complete: bool = True
    others_hidden: bool = False

    def may_remove(self, name: str, st: os.stat_result) -> bool:
        """Whether the segment ``name`` (``st``: its stat) is surely unused."""
        if not self.complete or name in self.names or st.st_ino in self.inodes:
            return False
        # a segment other users may open: unused only if their processes were seen too
        return not (self.others_hidden and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def usage() -> Usage:
    """Every live process's mapped and open files in /dev/shm (``Usage``)."""
    found = Usage()
    me = os.geteuid()
    for proc in Path("/proc").glob("[0-9]*"):
        owner = me  # until known: a process we cannot even stat counts as ours (fail closed)
        try:
            owner = proc.stat().st_uid
            for inode, name in _MAP_LINE.findall((proc / "maps").read_text()):
                found.inodes.add(int(inode))
                found.names.add(name)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    found.names.add(target[len("/dev/shm/"):].removesuffix(" (deleted)"))
                    try:
                        found.inodes.add(fd.stat().st_ino)
                    except OSError:
                        pass  # closed since the readlink
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process ended: it uses nothing any more
        except OSError:
            if owner == me and me != 0:
                found.complete = False  # one of ours we cannot see into: fail closed
            else:
                # Another user's; or, for root, one a security module hides even from root
                # (a container's init): they cannot open a segment private to its owner.
                found.others_hidden = True
    return found


def mapped_segments() -> set[str]:
    """The MPI segments any live process of this machine maps or has open (that this user
    can see)."""
    return {name for name in usage().names if _ours(name)}


class Cleared:
    """What a clearing did: the segments removed, and those that could not be, with why."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.failed: list[tuple[str, str]] = []

    def message(self) -> str | None:
        """A line for the log, naming what could not be removed and the fix; None if all is
        well."""
        if not self.failed:
            return None
        listed = ", ".join(f"{path} ({why})" for path, why in self.failed)
        return (f"mpidist.guard: stale MPI shared memory from a killed job could not be "
                f"removed: {listed}. A rank that attaches to it fails in MPI_Init. Remove "
                "these files (as their owner or root), or run on another node.")


def _remove(path: Path, judged: os.stat_result, cleared: Cleared) -> None:
    """Unlink ``path`` if it is still the file ``judged`` was taken of, untouched since (a new
    job may have created a segment of the same name meanwhile; a filesystem may even reuse
    the inode number, not its change time)."""
    try:
        now = path.stat()
        if (now.st_ino, now.st_dev, now.st_ctime_ns) != \
                (judged.st_ino, judged.st_dev, judged.st_ctime_ns):
            return
        path.unlink()
        cleared.removed.append(str(path))
    except FileNotFoundError:
        pass  # another rank of this node removed it first
    except OSError as err:
        cleared.failed.append((str(path), err.strerror or str(err)))


def _candidates(names: Iterable[str], grace_seconds: float, now: float | None
                ) -> list[tuple[Path, os.stat_result]]:
    """This user's MPI segments among ``names`` not modified for ``grace_seconds`` (one a
    starting job has just created is not mapped yet), with their stat."""
    now = time.time() if now is None else now
    me = os.geteuid()
    found = []
    for name in names:
        path = SHM / name
        try:
            st = path.stat()
        except OSError:
            continue
        # another user's segment is theirs to clear, even for root
        if _ours(name) and st.st_uid == me and now - st.st_mtime >= grace_seconds:
            found.append((path, st))
    return found


def _clear(candidates: list[tuple[Path, os.stat_result]]) -> Cleared:
    cleared = Cleared()
    if candidates:
        seen = usage()
        for path, st in candidates:
            if seen.may_remove(path.name, st):
                _remove(path, st, cleared)
    return cleared


def clear_stale(grace_seconds: float = GRACE_SECONDS, now: float | None = None) -> Cleared:
    """Remove this user's MPI segments that no live process maps or has open and that were
    not modified for ``grace_seconds``."""
    if not SHM.is_dir():
        return Cleared()
    return _clear(_candidates([p.name for p in SHM.iterdir()], grace_seconds, now))


def present() -> set[str]:
    """The MPI segments in /dev/shm now (names)."""
    return {p.name for p in SHM.iterdir() if _ours(p.name)} if SHM.is_dir() else set()


def clear_unused(names: Iterable[str], grace_seconds: float = GRACE_SECONDS,
                 now: float | None = None) -> Cleared:
    """Remove the segments ``names`` (a dead program's) that no live process maps and that
    were not modified for ``grace_seconds`` (one a starting job has just created is not yet
    mapped): the last rank of a node to end clears what the node's ranks shared."""
    return _clear(_candidates(sorted(set(names)), grace_seconds, now))


def clear_when_unused(names: Iterable[str]) -> Cleared:
    """``clear_unused(names)`` now; the segments still there are left to a detached cleaner
    that clears them once their processes have gone. Returns what was cleared now."""
    cleared = clear_unused(names)
    left = [n for n in names if (SHM / n).exists()]
    if left:
        import subprocess  # noqa: PLC0415 - only after a program died with its segments mapped

        # This file run as a script, without site-packages: the cleaner imports nothing but
        # the standard library (not numpy, not mpidist), so many of them cost next to nothing.
        subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), *left],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return cleared


def _clear_later(names: Sequence[str], linger: float = LINGER_SECONDS, poll: float = 0.5) -> None:
    """The detached cleaner: ``clear_unused(names)`` every ``poll`` s until they are gone or
    ``linger`` s have passed (then the next guard on the node clears what is left)."""
    deadline = time.monotonic() + linger
    while True:
        clear_unused(names)
        if not any((SHM / n).exists() for n in names) or time.monotonic() > deadline:
            return
        time.sleep(poll)  # wait-ok: a detached cleaner with its own hard deadline (linger)


def _main(argv: Sequence[str]) -> int:
    """``--stale``: ``clear_stale()`` on this node, saying what it removed (the batch scripts'
    cleanup after a killed step); else the detached cleaner of the segments named."""
    if list(argv[:1]) != ["--stale"]:
        _clear_later([n for n in argv if _ours(n) and "/" not in n])
        return 0
    import socket  # noqa: PLC0415 - the detached cleaner needs none of this

    cleared = clear_stale()
    if cleared.removed:
        host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name for it
        print(f"mpidist.launch.leftovers: {host}: removed "
              f"{len(cleared.removed)} MPI shared-memory segment(s) that a killed job left "
              f"and no live process maps: {', '.join(sorted(cleared.removed))}", flush=True)
    message = cleared.message()
    if message:
        print(message, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
