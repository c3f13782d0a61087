"""What crosses the wire between the chief, workers and parameter servers.

Three kinds of message body:

- **Functions** (``dumps_function`` / ``loads_function``): an ``mpidist.function`` travels *by
  name* (a pickle reference: module + qualified name; the receiver imports the same code) when
  it can, otherwise *by value* with cloudpickle (lambdas, nested functions, closures, code in
  ``__main__``). The bytes are cached on the ``Function``: it is pickled once, however often it
  is scheduled. ``MPIDIST_PS_PICKLE=by_name`` refuses by-value functions.
- **Payloads** (``dumps_payload`` / ``loads_payload``): arguments and results, pickle protocol 5
  with contiguous NumPy arrays as out-of-band buffers (DESIGN section 4: arrays are never copied
  into the pickle stream); ``pack_frames`` / ``unpack_frames`` join the frames into one message.
- **Errors** (``dumps_error`` / ``loads_error``): an exception raised on a worker, rebuilt on the
  chief with its type, message and the remote traceback as a note.

Unpickling runs code: these bodies are only ever exchanged between the ranks of one MPI job,
i.e. the user's own program (docs/ps.md, "Security").
"""

import builtins
import io
import pickle
import struct
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any, cast

import cloudpickle  # type: ignore[import-untyped]

import mpidist.errors as errors
from mpidist.config import get_config
from mpidist.core.function import Function, is_function
from mpidist.values.variables import Variable

__all__ = [
    "dumps_function",
    "loads_function",
    "function_payload_kind",
    "dumps_payload",
    "loads_payload",
    "pack_frames",
    "unpack_frames",
    "dumps_error",
    "loads_error",
]

_PROTOCOL = 5
# Function payloads start with one tag byte saying how the rest was pickled.
_BY_NAME = b"N"
_BY_VALUE = b"V"
# Frames inside a packed message start at multiples of this (cache line; any dtype's alignment).
_FRAME_ALIGN = 64
_INT64 = struct.Struct("q")

# What plain pickle raises for objects it cannot pickle by reference ("Can't pickle local
# object" is an AttributeError, unpicklable types a TypeError).
_PICKLE_FAILURES = (pickle.PicklingError, TypeError, AttributeError)


class _NeedsByValue(pickle.PicklingError):
    """Plain pickle would store a reference the receiving process cannot resolve."""


def _registered_by_value(module: str, registry: set[str]) -> bool:
    """Whether cloudpickle was told to pickle ``module`` (or a parent package) by value."""
    parts = module.split(".")
    return any(".".join(parts[:i]) in registry for i in range(1, len(parts) + 1))


def _refuse_local_variable(obj: object) -> None:
    """A variable that is not on a parameter server must not travel: each worker would update
    its own copy and the coordinator's would never change (a silent wrong answer)."""
    if isinstance(obj, Variable) and getattr(obj, "handle", None) is None:
        raise TypeError(
            f"Variable {obj.name!r} is used by a scheduled function but was created outside the "
            "ParameterServerStrategy's scope: it lives in the coordinator's memory, and each "
            "worker would update a copy of its own. Create it inside `with strategy.scope():`.")


class _CloudPickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle ships no types
    """cloudpickle (functions by value), refusing local variables."""

    def reducer_override(self, obj: object) -> Any:
        _refuse_local_variable(obj)
        return super().reducer_override(obj)


def _dumps_by_value(obj: object, buffers: list[pickle.PickleBuffer] | None = None) -> bytes:
    file = io.BytesIO()
    _CloudPickler(file, _PROTOCOL,
                  buffer_callback=None if buffers is None else buffers.append).dump(obj)
    return file.getvalue()


class _ByNamePickler(pickle.Pickler):
    """Plain pickle: every function and class by reference, none from ``__main__`` (the receiver's
    ``__main__`` is not the sender's module) or from modules registered with
    ``cloudpickle.register_pickle_by_value``."""

    def reducer_override(self, obj: object) -> Any:
        _refuse_local_variable(obj)
        if isinstance(obj, (type, types.FunctionType)):
            module = getattr(obj, "__module__", None) or ""
            registry = cloudpickle.list_registry_pickle_by_value()
            if module == "__main__" or (registry and _registered_by_value(module, registry)):
                raise _NeedsByValue(f"{obj!r} is defined in {module!r}, which another process "
                                    "cannot import by name")
        return NotImplemented


def _dumps_by_name(obj: object, buffers: list[pickle.PickleBuffer] | None = None) -> bytes:
    file = io.BytesIO()
    # No __init__ of our own: a Python-level constructor costs ~0.3 us per payload.
    _ByNamePickler(file, _PROTOCOL, buffer_callback=None if buffers is None else buffers.append
                   ).dump(obj)
    return file.getvalue()


# -- functions ----------------------------------------------------------------------------------

def dumps_function(fn: Function[..., Any]) -> bytes:
    """The wire form of an ``mpidist.function``, computed once and cached on it.

    By name when ``fn`` (or its Python function) is reachable as ``module.qualname`` in a module
    other than ``__main__``; otherwise by value with cloudpickle, closure cells captured now. With
    ``MPIDIST_PS_PICKLE=by_name``, a function that needs by-value raises ``ValueError``.
    """
    if not is_function(fn):
        raise TypeError(f"dumps_function expects a function decorated with @mpidist.function, got "
                        f"{fn!r} of type {type(fn).__name__}.")
    cached = fn.cached_payload
    if cached is not None:
        return cached
    try:
        payload = _BY_NAME + _dumps_by_name(fn)
    except _PICKLE_FAILURES as why:
        if get_config().ps_pickle == "by_name":
            module = getattr(fn, "__module__", None)
            raise ValueError(
                f"mpidist.function {getattr(fn, '__qualname__', fn)!r} of module {module!r} cannot "
                f"be sent to workers by name ({why}), and MPIDIST_PS_PICKLE=by_name forbids "
                "sending it by value. Define it at the top level of an importable module (not "
                "__main__, not inside another function), or unset MPIDIST_PS_PICKLE.") from None
        payload = _BY_VALUE + _dumps_by_value(fn)
    fn.cached_payload = payload
    return payload


def function_payload_kind(data: bytes | memoryview) -> str:
    """``"by_name"`` or ``"by_value"``: how ``dumps_function`` pickled this payload."""
    tag = bytes(data[:1])
    if tag == _BY_NAME:
        return "by_name"
    if tag == _BY_VALUE:
        return "by_value"
    raise ValueError(f"not a function payload made by dumps_function (starts with {tag!r}).")


def loads_function(data: bytes | memoryview) -> Callable[..., Any]:
    """The callable ``dumps_function`` serialized (an ``mpidist.function``).

    A rank whose ``MPIDIST_PS_PICKLE`` is ``by_name`` refuses by-value payloads.
    """
    kind = function_payload_kind(data)
    if kind == "by_value" and get_config().ps_pickle == "by_name":
        raise ValueError("received a function pickled by value, but MPIDIST_PS_PICKLE=by_name on "
                         "this rank only accepts importable functions. Set the same "
                         "MPIDIST_PS_PICKLE on every rank.")
    fn = pickle.loads(memoryview(data)[1:])
    if not callable(fn):
        raise TypeError(f"function payload unpickled to a non-callable {type(fn).__name__}.")
    return cast(Callable[..., Any], fn)


# -- payloads -----------------------------------------------------------------------------------

def dumps_payload(obj: object) -> list[bytes | pickle.PickleBuffer]:
    """``obj`` as frames: frame 0 the pickle stream, frames 1.. the raw buffers of its contiguous
    NumPy arrays (out of band, not copied). Lambdas and local functions inside ``obj`` travel by
    value (cloudpickle); everything else as plain pickle does it (the fast path)."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        data = _dumps_by_name(obj, buffers)
    except _PICKLE_FAILURES:
        buffers = []
        try:
            data = _dumps_by_value(obj, buffers)
        except Exception as error:
            error.add_note("mpidist: arguments and results of a scheduled function cross processes "
                           "by pickle; pass picklable values (arrays, numbers, containers) or "
                           "create the object inside the function.")
            raise
    return [data, *buffers]


def loads_payload(frames: Sequence[Any]) -> Any:
    """The object ``dumps_payload`` made ``frames`` of. Arrays are views of frames 1..
    (zero-copy): writable when those frames are writable memory."""
    if not frames:
        raise ValueError("loads_payload needs at least the pickle frame (frame 0); got no frames.")
    return pickle.loads(frames[0], buffers=frames[1:])


def _raw(frame: Any) -> memoryview:
    """A flat byte view of any contiguous buffer (C- or Fortran-ordered)."""
    buffer: pickle.PickleBuffer = frame if type(frame) is pickle.PickleBuffer else pickle.PickleBuffer(frame)
    return buffer.raw()


def _first_offset(count: int) -> int:
    """Where frame 0 starts: after the header (count + lengths), aligned."""
    return (_INT64.size * (1 + count) + _FRAME_ALIGN - 1) & -_FRAME_ALIGN


def pack_frames(frames: Sequence[Any]) -> bytearray:
    """One contiguous message: int64 frame count, int64 length of each frame, then the frames,
    each starting at a multiple of 64 bytes, so a transport sends a single buffer."""
    views = [_raw(frame) for frame in frames]
    lengths = [view.nbytes for view in views]
    offsets = []
    end = offset = _first_offset(len(lengths))
    for length in lengths:
        offsets.append(offset)
        end = offset + length
        offset = (end + _FRAME_ALIGN - 1) & -_FRAME_ALIGN
    message = bytearray(end)
    struct.pack_into(f"{1 + len(lengths)}q", message, 0, len(lengths), *lengths)
    for view, offset, length in zip(views, offsets, lengths):
        message[offset:offset + length] = view
    return message


def unpack_frames(message: Any) -> list[memoryview]:
    """The frames of a ``pack_frames`` message, as views into it (no copy)."""
    view = _raw(message)
    size = view.nbytes
    if size < _INT64.size:
        raise ValueError(f"a packed message has at least an 8-byte header; got {size} bytes.")
    (count,) = _INT64.unpack_from(view, 0)
    if count < 0 or _INT64.size * (1 + count) > size:
        raise ValueError(f"corrupt packed message: header says {count} frames, but the message "
                         f"has only {size} bytes.")
    frames: list[memoryview] = []
    offset = _first_offset(count)
    for length in struct.unpack_from(f"{count}q", view, _INT64.size):
        end = offset + length
        if length < 0 or end > size:
            raise ValueError(f"corrupt packed message: frame {len(frames)} of {length} bytes at "
                             f"offset {offset} does not fit in {size} bytes.")
        frames.append(view[offset:end])
        offset = (end + _FRAME_ALIGN - 1) & -_FRAME_ALIGN
    return frames


# -- errors -------------------------------------------------------------------------------------

def _rebuildable_class(module: str, qualname: str) -> type[BaseException] | None:
    """The builtin or ``mpidist.errors`` exception class of that name (rebuilt by class)."""
    if module == "builtins":
        cls = getattr(builtins, qualname, None)
    elif module == errors.__name__:
        cls = getattr(errors, qualname, None)
    else:
        return None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls
    return None


def _try_pickle(obj: object) -> bytes | None:
    """``obj`` pickled (plain pickle, then cloudpickle), or None when neither can."""
    for dumps in (pickle.dumps, cloudpickle.dumps):
        try:
            return dumps(obj, protocol=_PROTOCOL)
        except Exception:  # noqa: BLE001 - any failure of a user object's pickling means "cannot"
            continue
    return None


def _safe_str(obj: object) -> str:
    try:
        return str(obj)
    except Exception as error:  # noqa: BLE001 - a broken __str__ must not lose the error itself
        return f"<str() failed: {type(error).__name__}>"


def _traceback_text(exc: BaseException, where: str) -> str:
    located = f"Traceback on {where} (most recent call last):"
    try:
        report = traceback.TracebackException.from_exception(exc)
        report.__notes__ = None  # the notes travel on their own (dumps_error)
        text = "".join(report.format()).rstrip("\n")
    except Exception:  # noqa: BLE001 - fall back to the message alone
        text = f"{type(exc).__qualname__}: {_safe_str(exc)}"
    header = "Traceback (most recent call last):"
    if header in text:
        return text.replace(header, located)
    return f"{located}\n{text}"


def dumps_error(exc: BaseException, where: str) -> bytes:
    """An exception raised on this rank, for ``loads_error`` on another.

    ``where`` names this rank in the traceback note, e.g.
    ``"/job:worker/replica:0/task:1 (rank 3 on host n0)"``. Never raises for the exception's sake:
    an exception that cannot be pickled travels as its type name, message and traceback.
    """
    cls = type(exc)
    module, qualname = cls.__module__, cls.__qualname__
    by_class = _rebuildable_class(module, qualname) is cls
    notes = getattr(exc, "__notes__", None)
    record = {
        "module": module,
        "qualname": qualname,
        "message": _safe_str(exc),
        "args": _try_pickle(exc.args) if by_class else None,
        "pickled": None if by_class else _try_pickle(exc),
        "notes": [_safe_str(note) for note in notes] if isinstance(notes, list) else [],
        "traceback": _traceback_text(exc, where),
        "where": where,
    }
    return pickle.dumps(record, protocol=_PROTOCOL)


def _rebuild(record: dict[str, Any]) -> tuple[BaseException, bool]:
    """The exception, and whether its notes must be added (False: they came back with it)."""
    module, qualname, message = record["module"], record["qualname"], record["message"]
    cls = _rebuildable_class(module, qualname)
    if cls is not None:
        attempts: list[tuple[Any, ...]] = [(message,)]
        if record["args"] is not None:
            try:
                attempts.insert(0, tuple(pickle.loads(record["args"])))
            except Exception:  # noqa: BLE001 - args that do not unpickle here: use the message
                pass
        for args in attempts:
            try:
                return cls(*args), True
            except Exception:  # noqa: BLE001 - a constructor that wants other arguments
                continue
    elif record["pickled"] is not None:
        try:
            exc = pickle.loads(record["pickled"])
        except Exception:  # noqa: BLE001 - e.g. its class is not importable on this rank
            exc = None
        if isinstance(exc, BaseException):
            return exc, False
    return RuntimeError(f"{module}.{qualname}: {message}"), True


def loads_error(data: bytes) -> BaseException:
    """The exception ``dumps_error`` serialized: builtins and ``mpidist.errors`` types rebuilt by
    class (same message and args), others unpickled when possible, else
    ``RuntimeError("<module.Type>: <message>")``. The remote traceback is the last note."""
    record = pickle.loads(data)
    exc, add_notes = _rebuild(record)
    if add_notes:
        for note in record["notes"]:
            exc.add_note(note)
    exc.add_note(record["traceback"])
    return exc
