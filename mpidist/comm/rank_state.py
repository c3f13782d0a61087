"""The rank-state file: the last collective a rank entered, readable after the rank died.

``mpidist.guard`` (the per-rank guard process) creates a small file, names it in
``MPIDIST_RANK_STATE`` for the program it starts, and reads it once the program has died. The
program's Communicator maps the file and writes into the mapping on every collective: plain
memory stores, no system call. The kernel keeps the pages of a shared file mapping after the
process dies however it dies (os._exit, SIGKILL, a segfault), so the guard can still name the
collective the rank was in.

Layout (native int64 words; the writer and the reader share a machine)::

    word 0 magic, 1 version, 2 pid of the writer, 3 rank, 4 size, 5 completed seq
    slot k (k = seq % 2): one word, the slot's seq (stamped last), then
                          ``operation\\0description\\0label`` padded with NULs

Each collective writes the slot that the previous one did not use and stamps the slot's number
after its text, so a rank killed in the middle of a write leaves the previous collective's slot
intact, and the reader never shows a half-written description (at worst, for a death within
that microsecond, the collective before the last).
"""

from __future__ import annotations

import mmap
import os
import struct
import warnings
from typing import TYPE_CHECKING, NamedTuple

# No NumPy here: the guard reads these files beside every rank and loads nothing it need not.
from mpidist.core.user_calls import current_calls, describe_calls

if TYPE_CHECKING:
    from mpidist.comm.collective_call import Calls, CollectiveCall, Fields

__all__ = ["RankState", "RankStateWriter", "create_state_file", "read_state_file",
           "ENV_VARIABLE"]

ENV_VARIABLE = "MPIDIST_RANK_STATE"
_MAGIC = 0x3154_5352_4450_4D  # "MPDRST1" as an integer: tells our files from anything else
_VERSION = 1
_PID, _RANK, _SIZE, _COMPLETED = 2, 3, 4, 5
_HEADER_WORDS = 6
_TEXT_BYTES = 504  # operation, description and label; longer text is cut
_SLOT_WORDS = 1 + _TEXT_BYTES // 8
_SLOTS = (_HEADER_WORDS, _HEADER_WORDS + _SLOT_WORDS)  # word index of each slot's seq
FILE_BYTES = 8 * (_HEADER_WORDS + 2 * _SLOT_WORDS)
_CACHE_LIMIT = 4096  # a program has a few fixed collectives; bound the cache anyway
_claimed = False  # one writer per process: the first Communicator's sequence numbers


class RankState(NamedTuple):
    """What a rank's file says. ``entered`` is 0 when the rank entered no collective."""

    pid: int
    rank: int
    size: int
    entered: int
    completed: int
    operation: str
    description: str
    label: str

    @property
    def inside(self) -> bool:
        """True when the rank died between entering its last collective and finishing it."""
        return self.entered > self.completed


def create_state_file(directory: str | None = None) -> str:
    """A new, zeroed rank-state file (in /dev/shm when it is there); returns its path."""
    import tempfile  # noqa: PLC0415 - only the guard creates files

    if directory is None:
        directory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="mpidist-rank-state-", dir=directory)
    try:
        data = bytearray(FILE_BYTES)
        struct.pack_into("=qq", data, 0, _MAGIC, _VERSION)
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def read_state_file(path: str) -> RankState | None:
    """The RankState in ``path``, or None when no process claimed it (or it is not one)."""
    try:
        with open(path, "rb") as f:
            data = f.read(FILE_BYTES)
    except OSError:
        return None
    if len(data) < FILE_BYTES:
        return None
    words = memoryview(data).cast("q")
    if words[0] != _MAGIC or words[1] != _VERSION or words[_PID] == 0:
        return None
    seq, text = 0, ("", "", "")
    for at in _SLOTS:  # the newer of the two stamped slots
        if words[at] > seq:
            raw = data[8 * (at + 1):8 * (at + _SLOT_WORDS)].rstrip(b"\0")
            parts = raw.decode("utf-8", "replace").split("\0") + ["", ""]
            seq, text = int(words[at]), (parts[0], parts[1], parts[2])
    return RankState(int(words[_PID]), int(words[_RANK]), int(words[_SIZE]), seq,
                     int(words[_COMPLETED]), *text)


class RankStateWriter:
    """Writes this rank's last entered and completed collective into the mapped file.

    Create it with ``attach``; ``enter`` and ``complete`` are the per-collective hooks.
    """

    __slots__ = ("_map", "_words", "_cache", "_texts")

    def __init__(self, mapping: mmap.mmap, rank: int, size: int) -> None:
        self._map = mapping
        self._words = memoryview(mapping).cast("q")  # cheaper item stores than NumPy scalars
        self._cache: dict[tuple[str, Fields, Calls], bytes] = {}
        self._texts: list[bytes | None] = [None, None]  # the cached text each slot holds now
        self._words[_RANK], self._words[_SIZE] = rank, size
        self._words[_PID] = os.getpid()

    @classmethod
    def attach(cls, path: str | None, rank: int, size: int) -> RankStateWriter | None:
        """The writer for the file ``path``, or None: no path, another process of this rank
        claimed the file first, or it is not a rank-state file (a warning says so)."""
        global _claimed
        if not path or _claimed:
            return None
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as err:
            _warn(path, f"it cannot be opened ({err.strerror})")
            return None
        try:
            if os.fstat(fd).st_size < FILE_BYTES:
                _warn(path, f"it is smaller than {FILE_BYTES} bytes")
                return None
            mapping = mmap.mmap(fd, FILE_BYTES)
        finally:
            os.close(fd)  # the mapping keeps the file open
        magic, version, owner = struct.unpack_from("=qqq", mapping, 0)
        if magic != _MAGIC or version != _VERSION:
            mapping.close()
            _warn(path, "it is not an mpidist rank-state file")
            return None
        if owner and owner != os.getpid() and _alive(owner):
            mapping.close()  # e.g. a child process of the rank that made a Communicator too
            return None
        _claimed = True
        return cls(mapping, rank, size)

    def enter(self, seq: int, call: CollectiveCall) -> None:
        """Record that this rank entered collective ``seq`` (``call``: its CollectiveCall)."""
        calls = current_calls()
        key = (call.operation, call.fields, calls)
        text = self._cache.get(key)
        if text is None:
            text = self._encode(key, call, calls)
        slot = seq & 1
        at = _SLOTS[slot]
        if self._texts[slot] is not text:  # a loop repeats its collectives: mostly skipped
            self._words[at] = 0  # being written: a reader takes the other slot
            self._map[8 * (at + 1):8 * (at + _SLOT_WORDS)] = text
            self._texts[slot] = text
        self._words[at] = seq

    def complete(self, seq: int) -> None:
        """Record that this rank finished collective ``seq``."""
        self._words[_COMPLETED] = seq

    def _encode(self, key: tuple[str, Fields, Calls], call: CollectiveCall, calls: Calls
                ) -> bytes:
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        label = describe_calls(calls, with_fields=False)
        raw = "\0".join((call.operation, call.describe(), label)).encode("utf-8", "replace")
        text = raw[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0")
        self._cache[key] = text
        return text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _warn(path: str, why: str) -> None:
    warnings.warn(f"{ENV_VARIABLE}={path!r} is ignored: {why}. The variable is set by "
                  "`python -m mpidist.guard` for the program it starts; unset it if you set it "
                  "yourself.", RuntimeWarning, stacklevel=3)
