"""The control messages between the chief and the workers (and a ps's heartbeat), each a frozen
dataclass with named fields, encoded and decoded here only (ps-design.md §3).

Each message type has its tag (``wire.Tag``): ``send(transport, dest, message)`` sends it on
the control channel under that tag, ``decode(tag, buffer)`` turns what arrived back into the
message. Fixed-size messages are packed int64s; a closure (``Work``) is pickled with its
arguments' arrays as raw frames (``serialization.dumps_payload``); a ``Result`` is a fixed header
the chief always reads, then the payload it unpickles separately, so a result it cannot unpickle
still fails its own closure instead of going missing.
"""

import dataclasses
import struct
from typing import Any, ClassVar

from mpidist.ps.serialization import dumps_payload, loads_payload, pack_frames, unpack_frames
from mpidist.ps.transport import CTRL, Transport
from mpidist.ps.wire import Outcome, Tag

__all__ = ["Work", "Result", "Hello", "Heartbeat", "Shutdown", "Bye", "ControlMessage", "encode",
           "decode", "send"]


@dataclasses.dataclass(frozen=True, slots=True)
class Work:
    """chief -> worker: run closure ``closure_id`` (its ``attempt``-th try)."""

    TAG: ClassVar[Tag] = Tag.WORK
    closure_id: int
    attempt: int
    function_id: int
    function: bytes | None   # the pickled function, the first time this worker gets it
    args: tuple[Any, ...]    # per-worker resources as worker.ResourceRef
    kwargs: dict[str, Any]
    resource_id: int         # not 0: keep the result on the worker as this resource
    is_dataset_fn: bool      # a per-worker dataset's dataset_fn (no variables made there)


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """worker -> chief: how closure ``closure_id``'s ``attempt``-th try ended."""

    TAG: ClassVar[Tag] = Tag.RESULT
    closure_id: int
    attempt: int
    outcome: Outcome
    payload: Any             # OK: the value's frames; else the error (serialization.dumps_error)


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """worker -> chief, once at start: ready, with its local GPU count."""

    TAG: ClassVar[Tag] = Tag.HELLO
    task_id: int
    gpus: int


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    """Alive: worker or ps -> chief, chief -> worker. Only its arrival counts."""

    TAG: ClassVar[Tag] = Tag.HEARTBEAT


@dataclasses.dataclass(frozen=True, slots=True)
class Shutdown:
    """chief -> worker: stop serving. ``finalize`` False: a rank of the job is lost, leave
    without MPI_Finalize (it would wait for the lost rank)."""

    TAG: ClassVar[Tag] = Tag.SHUTDOWN
    finalize: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Bye:
    """worker -> chief: stopped."""

    TAG: ClassVar[Tag] = Tag.BYE
    task_id: int


ControlMessage = Work | Result | Hello | Heartbeat | Shutdown | Bye

_RESULT = struct.Struct("<3q")
_HELLO = struct.Struct("<2q")
_ONE = struct.Struct("<q")
_HEARTBEAT = b""


def encode(message: ControlMessage) -> Any:
    """The bytes of ``message`` (contiguous, ready for ``Transport.send``)."""
    if isinstance(message, Heartbeat):
        return _HEARTBEAT
    if isinstance(message, Result):
        return b"".join((_RESULT.pack(message.closure_id, message.attempt, message.outcome),
                         message.payload))
    if isinstance(message, Hello):
        return _HELLO.pack(message.task_id, message.gpus)
    if isinstance(message, Shutdown):
        return _ONE.pack(int(message.finalize))
    if isinstance(message, Bye):
        return _ONE.pack(message.task_id)
    if isinstance(message, Work):
        return pack_frames(dumps_payload(message))
    raise TypeError(f"encode: {message!r} is not a control message of a parameter-server job; "
                    f"send one of {', '.join(__all__[:6])}.")


def decode(tag: int, buffer: Any) -> ControlMessage:
    """The message of ``tag`` that ``buffer`` holds (``encode``'s inverse); a Result's payload
    is a view of ``buffer``."""
    if tag == Tag.HEARTBEAT:
        return Heartbeat()
    if tag == Tag.RESULT:
        closure_id, attempt, outcome = _RESULT.unpack_from(buffer)
        return Result(closure_id, attempt, Outcome(outcome), memoryview(buffer)[_RESULT.size:])
    if tag == Tag.HELLO:
        return Hello(*_HELLO.unpack_from(buffer))
    if tag == Tag.SHUTDOWN:
        return Shutdown(bool(_ONE.unpack_from(buffer)[0]))
    if tag == Tag.BYE:
        return Bye(_ONE.unpack_from(buffer)[0])
    if tag == Tag.WORK:
        work = loads_payload(unpack_frames(buffer))
        if isinstance(work, Work):
            return work
        raise TypeError(f"decode: a WORK message holds {type(work).__name__}, not a Work.")
    raise ValueError(f"decode: tag {tag} is not a control-channel tag; expected one of "
                     f"{[int(t) for t in Tag]} (wire.Tag).")


def send(transport: Transport, dest: int, message: ControlMessage) -> None:
    """Send ``message`` to rank ``dest`` on the control channel, under its tag (never blocks)."""
    transport.send(CTRL, dest, message.TAG, encode(message))
