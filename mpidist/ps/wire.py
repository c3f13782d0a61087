"""The wire of a parameter-server job: its enums (``Op``, ``Tag``, ``Outcome``, ``Status``) and the
request/reply format between a rank and a parameter server (ps-design.md §2.4). The control
messages between the chief and the workers are in ``messages``.

A request is one buffer: an int64[8] header, then ``n_params`` float64 parameters (learning
rate, betas...), ``n_ids`` int64 ids (a shape, rows, slot variable ids), then the data bytes.
Data larger than ``INLINE_BYTES`` travels as a second message on the same (rank, tag), which
MPI keeps in order, so a 4 MiB array is never copied into a combined buffer. A reply is an
int64[4] header (status, nbytes, inline, spare) and the data the same way. Arrays are raw
bytes, never pickled; the receiver knows the dtype and shape of what it asked for.
"""

import dataclasses
import enum
import struct
from typing import Any

import numpy as np

__all__ = ["Op", "Tag", "Outcome", "Status", "INLINE_BYTES", "REQUEST_TAG", "Request", "Reply",
           "encode_request", "decode_request", "encode_reply", "decode_reply", "pack_dtype",
           "unpack_dtype"]

INLINE_BYTES = 16 * 1024  # measured: packing helps at 4 KiB, costs a copy at 4 MiB
REQUEST_TAG = 1           # requests to a parameter server; replies use the requester's own tag

_REQUEST = struct.Struct("<8q")
_REPLY = struct.Struct("<4q")


class Op(enum.IntEnum):
    CREATE = 1
    READ = 2
    ASSIGN = 3
    ASSIGN_ADD = 4
    ASSIGN_SUB = 5
    GATHER = 6
    SCATTER_ADD = 7
    SCATTER_SUB = 8
    SCATTER_UPDATE = 9
    APPLY_SGD = 10
    APPLY_MOMENTUM = 11
    APPLY_ADAM = 12
    FENCE = 13
    STATS = 14
    SHUTDOWN = 15
    DELETE = 16
    READ_MANY = 17   # ids: variable ids; the reply: their values' bytes, one after another
    PING = 18        # the chief's heartbeat to a ps (posted, no reply)


class Tag(enum.IntEnum):
    """Tags of the control channel (chief <-> workers; a ps's heartbeat to the chief)."""

    WORK = 1       # chief -> worker: a closure to run (messages.Work)
    RESULT = 2     # worker -> chief: its result or error (messages.Result)
    HEARTBEAT = 3  # worker or ps -> chief, chief -> worker: alive (messages.Heartbeat)
    HELLO = 4      # worker -> chief, once: ready, with its local device count (messages.Hello)
    SHUTDOWN = 5   # chief -> worker: stop serving (messages.Shutdown)
    BYE = 6        # worker -> chief: stopped (messages.Bye)


class Outcome(enum.IntEnum):
    """How a closure ended, as its RESULT message says."""

    OK = 0
    ERROR = 1
    PREEMPTED = 2  # a worker failure: the chief runs the closure again elsewhere
    STUCK = 3      # past MPIDIST_PS_CLOSURE_TIMEOUT: the closure fails, its worker is abandoned


class Status(enum.IntEnum):
    """How a parameter server answers a request, as its reply's header says."""

    OK = 0
    ERROR = 1      # the data is the error, for serialization.loads_error


_STATUSES = tuple(Status)  # indexed by value: cheaper than Status(value) on every reply


# Request and Reply are decoded on every request's path (a 4 KiB read takes 12 µs), so they
# are slotted dataclasses that nothing changes, not frozen ones: a frozen __init__ costs
# 1.1 µs for Request's 8 fields against 0.45 slotted and 0.27 for a NamedTuple (measured).
@dataclasses.dataclass(slots=True)
class Request:
    """A request to a parameter server, as the server decodes it (read-only by convention)."""

    op: int          # an Op
    var_id: int
    reply_tag: int   # 0: posted, no reply
    params: Any      # float64 array
    ids: Any         # int64 array
    data: Any        # memoryview of the inline data, or None when it follows
    nbytes: int
    extra: int


@dataclasses.dataclass(slots=True)
class Reply:
    """A parameter server's answer, as the requester decodes it (read-only by convention)."""

    status: Status
    nbytes: int
    data: Any        # memoryview of the inline data, or None when it follows (nbytes of it)


def pack_dtype(dtype: np.dtype) -> int:
    """A dtype as one int64 (its ``str``, at most 8 ASCII characters)."""
    text = np.dtype(dtype).str.encode("ascii")
    if len(text) > 8:
        raise TypeError(f"dtype {dtype} cannot live on a parameter server.")
    return int.from_bytes(text.ljust(8, b"\0"), "little", signed=True)


def unpack_dtype(code: int) -> np.dtype:
    return np.dtype(code.to_bytes(8, "little", signed=True).rstrip(b"\0").decode("ascii"))


def encode_request(op: int, var_id: int, reply_tag: int = 0, params: tuple[Any, ...] = (),
                   ids: Any = None, data: Any = None, extra: int = 0) -> tuple[Any, Any]:
    """(first message, second message or None)."""
    id_bytes = b"" if ids is None else np.ascontiguousarray(ids, dtype=np.int64).tobytes()
    n_ids = len(id_bytes) // 8
    view = None if data is None else memoryview(data).cast("B")
    nbytes = 0 if view is None else view.nbytes
    inline = nbytes <= INLINE_BYTES
    header = _REQUEST.pack(op, var_id, reply_tag, len(params), n_ids, nbytes, int(inline), extra)
    parts: list[Any] = [header, struct.pack(f"<{len(params)}d", *params) if params else b"", id_bytes]
    if inline and view is not None:
        parts.append(view)
    return b"".join(parts), (None if inline else view)


_NO_PARAMS = np.empty(0, np.float64)
_NO_IDS = np.empty(0, np.int64)


def decode_request(buffer: Any) -> Request:
    op, var_id, reply_tag, n_params, n_ids, nbytes, inline, extra = _REQUEST.unpack_from(buffer)
    offset = _REQUEST.size
    params = np.frombuffer(buffer, np.float64, n_params, offset) if n_params else _NO_PARAMS
    offset += 8 * n_params
    ids = np.frombuffer(buffer, np.int64, n_ids, offset) if n_ids else _NO_IDS
    offset += 8 * n_ids
    data = memoryview(buffer)[offset:offset + nbytes] if inline else None
    return Request(op, var_id, reply_tag, params, ids, data, nbytes, extra)


def encode_reply(status: Status, data: Any = None) -> tuple[Any, Any]:
    view = None if data is None else memoryview(data).cast("B")
    nbytes = 0 if view is None else view.nbytes
    inline = nbytes <= INLINE_BYTES
    header = _REPLY.pack(status, nbytes, int(inline), 0)
    if view is None:
        return header, None
    if inline:
        return b"".join((header, view)), None
    return header, view


def decode_reply(buffer: Any) -> Reply:
    status, nbytes, inline, _ = _REPLY.unpack_from(buffer)
    data = memoryview(buffer)[_REPLY.size:_REPLY.size + nbytes] if inline else None
    return Reply(_STATUSES[status], nbytes, data)
