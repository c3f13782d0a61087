"""One live owner per backup directory.

Two runs backing up into one directory would resume from, prune and delete each other's
backups: an array job's tasks continuing each other's models, a second submission of a job
restarting from step 0 when the first deletes the directory at its end. So the writer of a
``BackupAndRestore`` directory claims it for as long as it trains:

- it holds an exclusive ``flock`` on ``DIR/owner.lock`` (the kernel drops it when the process
  ends, however it ends, so a dead owner never blocks anyone), and
- it records who it is in ``DIR/owner.json``: Slurm job id and array task, host, pid, start
  time, so that a refused run can name the live one.

A second live run is refused, naming the owner and the fix. A run of the same Slurm job (a
requeue: same job id) waits up to ``REQUEUE_WAIT_SECONDS`` for its predecessor's ranks to
end. Where the filesystem has no ``flock`` (some Lustre mounts), the record decides: its
owner is live if its process runs on this host, or if Slurm (``squeue``) still runs its job.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from typing import Any

from mpidist.core.durable import make_directories, named_error, write_file

__all__ = ["BackupInUseError", "claim", "release", "describe_owner", "OWNER_FILE", "LOCK_FILE"]

OWNER_FILE = "owner.json"
LOCK_FILE = "owner.lock"
REQUEUE_WAIT_SECONDS = 60.0
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)

# The claims this process holds: real path of the directory -> the locked file descriptor.
_held: dict[str, int] = {}


class BackupInUseError(RuntimeError):
    """Another live run owns the backup directory."""


def _me() -> dict[str, Any]:
    env = os.environ
    return {"job_id": env.get("SLURM_JOB_ID"), "array_job_id": env.get("SLURM_ARRAY_JOB_ID"),
            "array_task_id": env.get("SLURM_ARRAY_TASK_ID"),
            "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}


def describe_owner(record: dict[str, Any]) -> str:
    """``Slurm job 123 (array task 1) on host h, pid 42, since 2026-11-29 01:02:03``."""
    parts = []
    if record.get("job_id"):
        task = record.get("array_task_id")
        parts.append(f"Slurm job {record['job_id']}" + (f" (array task {task})" if task else ""))
    else:
        parts.append("a run outside Slurm")
    parts.append(f"on host {record.get('host', '?')}, pid {record.get('pid', '?')}")
    started = record.get("started")
    if isinstance(started, (int, float)):
        parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)))
    return " ".join(parts[:1]) + " " + ", ".join(parts[1:])


def _read_record(directory: str) -> dict[str, Any]:
    try:
        with open(os.path.join(directory, OWNER_FILE), encoding="utf-8") as f:
            record = json.load(f)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def _refusal(directory: str, record: dict[str, Any]) -> BackupInUseError:
    return BackupInUseError(
        f"BackupAndRestore: the backup directory {directory!r} is in use by another live run: "
        f"{describe_owner(record) if record else 'its owner record is unreadable'}. Two runs "
        "backing up into one directory would resume from and delete each other's backups. "
        "Wait for that run to end, or give this run its own directory "
        "(BackupAndRestore(backup_dir=...); the batch scripts take MPIDIST_BACKUP_DIR).")


def _record_alive(record: dict[str, Any]) -> bool:
    """Without locks: whether the recorded owner still runs (its pid on this host, or its
    Slurm job per squeue)."""
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        return record["pid"] != os.getpid() and os.path.exists(f"/proc/{record['pid']}")
    job = record.get("job_id")
    squeue = shutil.which("squeue")
    if not job or squeue is None:
        return False  # nothing can tell: taking it over is what a restart needs
    try:
        out = subprocess.run([squeue, "-h", "-j", str(job), "-o", "%T"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return out.strip() in {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"}


def _same_job(record: dict[str, Any], me: dict[str, Any]) -> bool:
    return bool(me["job_id"]) and record.get("job_id") == me["job_id"]


def claim(directory: str) -> None:
    """Make this process the live owner of ``directory`` (created if needed), or raise
    BackupInUseError naming the live one. Claiming a directory this process holds is a no-op."""
    real = os.path.realpath(directory)
    if real in _held:
        return
    me = _me()
    try:
        make_directories(directory)
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise named_error(exc, f"BackupAndRestore: claiming the backup directory {directory!r}",
                          "Nothing was written.", "open",
                          os.path.join(directory, LOCK_FILE)) from None
    try:
        if not _lock(fd, directory, me):
            raise _refusal(directory, _read_record(directory))
        write_file(os.path.join(directory, OWNER_FILE),
                   lambda f: f.write((json.dumps(me) + "\n").encode()),
                   f"Recording the owner of the backup directory {directory!r}")
    except BaseException:
        os.close(fd)
        raise
    _held[real] = fd


def _lock(fd: int, directory: str, me: dict[str, Any]) -> bool:
    """Whether this process got the directory: the flock, or where there are no locks, a
    record whose owner is gone."""
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in _NO_LOCKS:
                record = _read_record(directory)
                return not record or _same_job(record, me) or not _record_alive(record)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        record = _read_record(directory)
        if not _same_job(record, me):
            return False
        # A requeue of this job: the predecessor's ranks may still be ending.
        if deadline is None:
            deadline = time.monotonic() + REQUEUE_WAIT_SECONDS
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)  # wait-ok: bounded by REQUEUE_WAIT_SECONDS above


def release(directory: str) -> None:
    """Give up this process's claim on ``directory`` (its files may already be deleted)."""
    fd = _held.pop(os.path.realpath(directory), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
