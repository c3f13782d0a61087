"""Durable saves: the one commit primitive behind everything mpidist writes.

Every save (a checkpoint file, a CheckpointManager's state file, a backup, a saved dataset)
follows one order: write the new bytes where no reader looks (an unnamed file, or files that
no published pointer names yet), fsync them, publish with one atomic rename (of the file
itself, or of the pointer that names the new files: the checkpoint state file, a saved
dataset's metadata), fsync the directory, and only then delete what the new copy replaced. A
writer killed between any two of these operations leaves the last published copy complete
and loadable; a reader never sees a mix.

Every file operation of a save goes through :func:`_operation`, the injection seam: a test
installs a hook with :func:`inject` that kills the writer or raises ENOSPC / EIO at the n-th
operation, and checks that the last published save still loads. Every OSError leaves this
module as the same OSError subclass and errno, with a message naming the path, the
operation, what became of the last published copy, and the fix (:func:`named_error`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

__all__ = ["OPERATIONS", "inject", "named_error", "StagedFile", "open_staged", "write_file",
           "staged_write",
           "fsync_directory", "make_directories", "remove_file", "writer_token",
           "dead_writer"]

# What a hook may see: ``hook(operation, path)`` runs before each of them.
OPERATIONS = ("mkdir", "open", "write", "fsync", "link", "close", "rename", "fsync_dir",
              "unlink")

_hook: Callable[[str, str], None] | None = None
_hook_lock = threading.Lock()


@contextlib.contextmanager
def inject(hook: Callable[[str, str], None]) -> Iterator[None]:
    """Run ``hook(operation, path)`` before every file operation of every save in this block:
    the tests' seam to kill a writer, or make an operation fail, at a chosen point."""
    global _hook
    with _hook_lock:
        previous, _hook = _hook, hook
    try:
        yield
    finally:
        with _hook_lock:
            _hook = previous


@contextlib.contextmanager
def _operation(name: str, path: str, hooked: bool = True) -> Iterator[None]:
    """One file operation: the hook runs first (unless not ``hooked``: the rest of an
    operation already seen); an OSError raised inside is marked with the operation and path
    (for :func:`named_error`)."""
    try:
        hook = _hook
        if hook is not None and hooked:
            hook(name, path)
        yield
    except OSError as exc:
        if not hasattr(exc, "durable_operation"):
            exc.durable_operation = (name, path)  # type: ignore[attr-defined]
        raise


# -- Errors -------------------------------------------------------------------------------------
def _fix(code: int | None, directory: str) -> str:
    if code == errno.ENOSPC:
        return (f"The filesystem holding {directory!r} is full: free space there (`df -h "
                f"{directory}` shows it) or save to another filesystem.")
    if code == errno.EDQUOT:
        return (f"Your disk quota on the filesystem holding {directory!r} is used up: free "
                "space (`quota -s` shows it) or save to another filesystem.")
    if code == errno.EIO:
        return ("The storage reported an I/O error: check the disk or the network filesystem "
                "(dmesg, the site's status page), then save again or save elsewhere.")
    if code == errno.EROFS:
        return f"{directory!r} is on a read-only filesystem: save to a writable one."
    if code in (errno.EACCES, errno.EPERM):
        return f"This user may not write in {directory!r}: make it writable or save elsewhere."
    if code in (errno.ENOENT, errno.ENOTDIR, errno.EEXIST):
        return (f"A part of {directory!r} is missing or is a file: pass a path in a directory "
                "this process can create and write.")
    return "Check the path and the filesystem, then save again."


def named_error(exc: OSError, what: str, kept: str, operation: str = "write",
                path: str = "") -> OSError:
    """``exc`` (same class, same errno) with a message that names ``what`` was being saved,
    the operation and path that failed (as :class:`StagedFile` marked them, else
    ``operation`` on ``path``), ``kept`` (what became of the last published copy) and the
    fix."""
    if getattr(exc, "durable_named", False):
        return exc  # named by an inner save step already
    operation, path = getattr(exc, "durable_operation", (operation, path))
    reason = exc.strerror or str(exc)
    directory = os.path.dirname(os.path.abspath(path))
    message = f"{what}: {reason} ({operation} of {path!r}). {kept} {_fix(exc.errno, directory)}"
    named = type(exc)(message) if exc.errno is None else type(exc)(exc.errno, message)
    named.durable_named = True  # type: ignore[attr-defined]
    return named


# -- Writers ------------------------------------------------------------------------------------
def writer_token() -> str:
    """A name part unique to this writer: host, pid and a random suffix. Leftovers of a
    killed writer are recognised by it (:func:`dead_writer`)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def dead_writer(token: str) -> bool:
    """Whether ``token`` (from :func:`writer_token`) names a process of this host that is
    gone. A writer on another host is never declared dead: its files are left alone."""
    parts = token.rsplit("-", 2)  # a host name may hold '-'; the pid and suffix do not
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    return not os.path.exists(f"/proc/{parts[1]}")


class StagedFile:
    """A file being written, each operation through the seam; the errors of those operations
    are named by the caller (:func:`write_file`, a saved dataset's shard writer)."""

    def __init__(self, f: IO[bytes], path: str) -> None:
        self._f = f
        self.path = path

    def write(self, data: Any) -> int:
        with _operation("write", self.path):
            return self._f.write(data)

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def seekable(self) -> bool:
        return self._f.seekable()

    def flush(self) -> None:
        with _operation("write", self.path, hooked=False):  # buffered writes reach the disk
            self._f.flush()

    def fileno(self) -> int:
        return self._f.fileno()

    def sync(self) -> None:
        """Flush and fsync: the bytes are on the disk when this returns."""
        self.flush()
        with _operation("fsync", self.path):
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            with _operation("close", self.path):
                self._f.close()

    def discard(self) -> None:
        """Close without the seam and without raising (cleanup after a failure)."""
        with contextlib.suppress(OSError):
            self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed


def open_staged(path: str, mode: str = "xb") -> StagedFile:
    """Open ``path`` (a file no published pointer names yet) for writing through the seam."""
    with _operation("open", path):
        return StagedFile(open(path, mode), path)


def make_directories(directory: str) -> None:
    with _operation("mkdir", directory):
        os.makedirs(directory, exist_ok=True)


def fsync_directory(directory: str) -> None:
    """fsync a directory, so that the names created or renamed in it are on the disk too."""
    with _operation("fsync_dir", directory):
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return  # e.g. a platform where directories cannot be opened
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise
        finally:
            os.close(fd)


def remove_file(path: str) -> None:
    """Delete a file a published save no longer names (gone already is fine)."""
    with contextlib.suppress(FileNotFoundError), _operation("unlink", path):
        os.unlink(path)


def write_file(path: str, write_fn: Callable[[StagedFile], object], what: str) -> None:
    """Publish ``path`` with the bytes ``write_fn(file)`` writes: complete, or not at all
    (:func:`staged_write`)."""
    with staged_write(path, what) as staged:
        write_fn(staged)


@contextlib.contextmanager
def staged_write(path: str, what: str) -> Iterator[StagedFile]:
    """Publish ``path`` with the bytes written to the yielded file in the ``with`` body:
    complete when the body ends normally, not at all when it raises (a writer that streams,
    such as ``Dataset.cache``, whose body is a whole pass over a dataset).

    The bytes go to an unnamed file in the same directory (Linux ``O_TMPFILE``), fsynced, then
    named and renamed over ``path`` in one step: a writer killed before that leaves nothing
    behind. Where the filesystem has no unnamed files, a named temporary (``.NAME.tmp-`` and
    :func:`writer_token`) stands in, and the next write there removes those of dead writers.
    An OSError names ``what``, the failed operation and the fix, and says the last published
    ``path`` is unchanged."""
    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.tmp-"
    tmp = os.path.join(directory, prefix + writer_token())
    kept = (f"Nothing was published: {path!r} holds the last save, unchanged."
            if os.path.lexists(path) else f"Nothing was written at {path!r}.")
    staged: StagedFile | None = None
    named = False
    try:
        make_directories(directory)
        staged, named = _open_temporary(path, directory, prefix, tmp)
        yield staged
        staged.sync()
        if not named:
            with _operation("link", tmp):
                _name_unnamed(staged.fileno(), tmp)
            named = True
        staged.close()
        with _operation("rename", path):
            os.replace(tmp, path)
        named = False  # published: nothing left to clean up
    except BaseException as exc:
        if staged is not None:
            staged.discard()
        if named:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise named_error(exc, what, kept, "write", path) from None
        raise
    try:
        fsync_directory(directory)
    except OSError as exc:
        raise named_error(exc, what, f"The new {path!r} is in place, but the filesystem did "
                          "not confirm that its name is on the disk.") from None


def _open_temporary(path: str, directory: str, prefix: str, tmp: str) -> tuple[StagedFile, bool]:
    """An unnamed file in ``directory`` (False), else the named temporary ``tmp`` (True)."""
    with _operation("open", path):
        fd = _open_unnamed(directory)
        named = fd is None
        if fd is None:
            _remove_dead_temporaries(directory, prefix)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return StagedFile(os.fdopen(fd, "wb"), path), named


def _open_unnamed(directory: str) -> int | None:
    """An unnamed file in ``directory`` open for writing, or None where the platform or the
    filesystem has none (not Linux, NFS, ...)."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(directory, flag | os.O_WRONLY, 0o666)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None
        raise


def _name_unnamed(fd: int, path: str) -> None:
    """Give the unnamed file ``fd`` the name ``path``: linkat(AT_SYMLINK_FOLLOW) through
    /proc/self/fd (a plain link(2) would link the /proc entry itself and fail with EXDEV)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY)
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _remove_dead_temporaries(directory: str, prefix: str) -> None:
    """Named temporaries of one file that writers on this host left when they were killed."""
    for name in os.listdir(directory):
        if name.startswith(prefix) and dead_writer(name[len(prefix):]):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
