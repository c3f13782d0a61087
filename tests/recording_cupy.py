"""A recording stand-in for the parts of CuPy that mpidist's GPU paths use, for testing OUR
placement and ordering logic on a machine without a GPU. Nothing here runs on a GPU, and a
test that passes with it says nothing about hardware: only that our code entered the right
device, used the right streams and ordered them with events as CUDA requires.

What it models (and checks, raising at once on a violation):
- Devices: ``cupy.cuda.Device(i)`` as a per-thread context; every array remembers the device
  it was allocated on (the current one). A kernel (``concatenate``, ``true_divide``,
  ``__setitem__``, ``copy`` on one device, ``launch``) whose operands are not on the current
  device raises ``WrongDeviceError``, as CuPy does.
- Streams: one legacy default (null) stream per device, ``Stream(non_blocking=...)``, a
  per-thread per-device current stream (``with stream:``, ``get_current_stream``), events
  (``record``/``wait_event``/``Event``) and host synchronisation. Ordering is tracked with
  vector clocks; the null stream orders itself with the device's blocking streams.
- Memory: CuPy's stream-aware pool. A block allocated while stream S is current returns,
  once its last array is gone, to S's free list, and the next allocation of that size on S
  gets it again. Every read and write of a block is logged with its stream; an access that is
  not ordered after an earlier conflicting access from another stream (write/read, read/write,
  write/write) raises ``RaceError``. That is how a copy that does not wait for its producer,
  or a pool block reused while another stream still reads it, shows up here.
- Cross-device copies: ``x.copy()`` under another device reads ``x``'s block on the
  destination's current stream (CuPy's peer copy); each is logged in ``copies``.

Install with the ``stand_in`` fixture (two devices; import it into the test module, or wrap it
in a fixture of your own), ``with installed(num_devices) as cupy:``, or
``install(monkeypatch, num_devices)`` followed by ``cupy_backend.reset()`` at teardown
(returns the module object, also in ``sys.modules["cupy"]``; monkeypatch takes it out). The module object carries the
recorder as ``cupy.recording`` (``.log``, ``.copies``, ``.launch(...)``).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import types
import weakref
from dataclasses import dataclass, field

import numpy as np
import pytest

__all__ = ["install", "installed", "stand_in", "reduce_n", "RaceError", "WrongDeviceError", "Recording"]


class RaceError(AssertionError):
    """Two accesses to one block from different streams with no ordering between them."""


class WrongDeviceError(ValueError):
    """A kernel launched on a device other than its operands' (CuPy raises too)."""


# -- streams and events ------------------------------------------------------------------------

class Stream:
    """A CUDA stream of one device. ``Stream.null`` is the current device's legacy stream."""

    _recording: Recording  # set by install()

    def __init__(self, null=False, non_blocking=False, ptr=0, *, _device=None):
        rec = self._recording
        self.device_id = rec.current_device() if _device is None else _device
        self.is_null = null
        self.non_blocking = non_blocking
        self.ptr = 0 if null else next(rec.ptrs)
        self.clock: dict[Stream, int] = {}  # ops of other streams this stream is ordered after
        self.last = -1  # seq of this stream's last op
        if not null:
            rec.streams.append(self)

    def __repr__(self):
        kind = "null" if self.is_null else ("non-blocking" if self.non_blocking else "blocking")
        return f"<Stream {kind} dev={self.device_id} ptr={self.ptr}>"

    def __enter__(self):
        rec = self._recording
        if self.device_id != rec.current_device():
            raise WrongDeviceError(
                f"stream of device {self.device_id} made current on device {rec.current_device()}")
        rec.push_stream(self)
        return self

    def __exit__(self, *exc):
        self._recording.pop_stream(self)

    def use(self):
        self._recording.set_stream(self)
        return self

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        rec = self._recording
        if event.stream is None:
            return  # an event never recorded is complete
        rec.log.append(Op(next(rec.seq), "wait", self, note=f"event {event.id}"))
        _merge(self.clock, event.clock)
        self.waited.append(event)

    @property
    def waited(self):
        return self.__dict__.setdefault("_waited", [])

    def synchronize(self):
        self._recording.host_sync(self)

    @property
    def done(self):
        return True


def _merge(into, clock):
    for s, seq in clock.items():
        if into.get(s, -1) < seq:
            into[s] = seq


class _NullStream:
    def __get__(self, obj, cls):
        rec = cls._recording
        return rec.null_stream(rec.current_device())


class Event:
    """A CUDA event: what its stream had enqueued when recorded (a vector clock)."""

    _recording: Recording

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.id = next(self._recording.event_ids)
        self.stream: Stream | None = None
        self.clock: dict[Stream, int] = {}
        self.seq = -1

    def record(self, stream=None):
        rec = self._recording
        stream = rec.current_stream() if stream is None else stream
        self.stream = stream
        self.seq = next(rec.seq)
        rec.log.append(Op(self.seq, "record", stream, note=f"event {self.id}"))
        self.clock = dict(stream.clock)
        self.clock[stream] = stream.last

    def synchronize(self):
        if self.stream is not None:
            self._recording.host_sync(self.stream, upto=self.clock)

    @property
    def done(self):
        return True


# -- memory --------------------------------------------------------------------------------------

@dataclass(eq=False)
class Block:
    """One pool allocation: its device, the stream its arena belongs to, and its accesses."""

    id: int
    device: int
    nbytes: int
    stream: Stream
    accesses: list = field(default_factory=list)  # (seq, stream, "read"|"write", what)
    free: bool = False


@dataclass(eq=False)
class Op:
    seq: int
    kind: str
    stream: Stream
    reads: tuple = ()
    writes: tuple = ()
    note: str = ""


@dataclass
class Copy:
    """A cross-device copy: ``stream`` (the destination's) read ``src`` of ``src_device``."""

    src_device: int
    dst_device: int
    stream: Stream
    seq: int
    waited: tuple  # the events ``stream`` had waited on before the copy


class _Flags:
    def __init__(self, a):
        self.c_contiguous = a.flags.c_contiguous
        self.f_contiguous = a.flags.f_contiguous
        self.writeable = True


class _MemoryPointer:
    def __init__(self, arr):
        self.ptr = arr._a.__array_interface__["data"][0]
        self.device_id = arr._block.device


class Device:
    """``cupy.cuda.Device(i)``: a context manager making device ``i`` current (per thread)."""

    _recording: Recording

    def __init__(self, device=None):
        rec = self._recording
        self.id = rec.current_device() if device is None else int(device)
        if not 0 <= self.id < rec.num_devices:
            raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} of {rec.num_devices}")

    def __enter__(self):
        self._recording.push_device(self.id)
        return self

    def __exit__(self, *exc):
        self._recording.pop_device()

    def use(self):
        self._recording.local().devices[0] = self.id

    def synchronize(self):
        rec = self._recording
        for s in [rec.null_stream(self.id), *rec.streams]:
            if s.device_id == self.id:
                rec.host_sync(s)

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("Device", self.id))

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class ndarray:  # noqa: N801 - CuPy's name
    """A device array backed by NumPy memory of a pool block on one device."""

    _recording: Recording

    def __init__(self, a, block, base=None):
        self._a = a
        self._block = block
        self._base = base  # keeps the root array (and so the block) alive

    # -- attributes CuPy arrays have
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))
    data = property(lambda self: _MemoryPointer(self))

    @property
    def device(self):
        return Device(self._block.device)

    def __len__(self):
        return len(self._a)

    @property
    def __cuda_array_interface__(self):
        # Present as on CuPy arrays (code tells device arrays apart by it); Numba cannot use
        # it without a GPU, so kernels on these arrays must be replaced in the test (reduce_n).
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3, "strides": None
                if self._a.flags.c_contiguous else self.strides, "data": (self.data.ptr, False)}

    @property
    def T(self):
        return self._view(self._a.T)

    def __repr__(self):
        return f"recording_cupy.ndarray(dev={self._block.device}, {self._a!r})"

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def _view(self, a):
        return ndarray(a, self._block, self._base if self._base is not None else self)

    def reshape(self, *shape, order="C"):
        a = self._a.reshape(*shape, order=order)
        if not np.shares_memory(a, self._a):
            return self._recording.kernel("reshape-copy", reads=(self,), out_like=a)
        return self._view(a)

    def ravel(self):
        return self.reshape(-1)

    def view(self, dtype=None):
        return self._view(self._a.view(dtype))

    def __getitem__(self, key):
        return self._view(self._a[key])

    def __setitem__(self, key, value):
        rec = self._recording
        reads = (value,) if isinstance(value, ndarray) else ()
        rec.launch("setitem", reads=reads, writes=(self,))
        self._a[key] = value._a if isinstance(value, ndarray) else value

    def copy(self, order="C"):
        rec = self._recording
        dst = rec.current_device()
        if self._block.device == dst:
            return rec.kernel("copy", reads=(self,), out_like=np.array(self._a, order=order))
        return rec.peer_copy(self, dst)

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return self._recording.kernel("astype", reads=(self,), out_like=self._a.astype(dtype))

    def get(self, stream=None, order="C", out=None):
        rec = self._recording
        with Device(self._block.device):
            s = rec.current_stream() if stream is None else stream
            rec.access(s, reads=(self,), note="device-to-host")
            s.synchronize()
        return np.array(self._a, order=order)

    def set(self, arr, stream=None):
        rec = self._recording
        with Device(self._block.device):
            s = rec.current_stream() if stream is None else stream
            rec.access(s, writes=(self,), note="host-to-device")
        self._a[...] = arr

    # arithmetic: each a kernel on the current device
    def _binary(self, other, fn, name):
        rec = self._recording
        reads = (self, other) if isinstance(other, ndarray) else (self,)
        b = other._a if isinstance(other, ndarray) else other
        return rec.kernel(name, reads=reads, out_like=fn(self._a, b))

    def __add__(self, o):
        return self._binary(o, np.add, "add")

    def __sub__(self, o):
        return self._binary(o, np.subtract, "subtract")

    def __mul__(self, o):
        return self._binary(o, np.multiply, "multiply")

    def __truediv__(self, o):
        return self._binary(o, np.true_divide, "true_divide")

    __radd__ = __add__
    __rmul__ = __mul__

    def _inplace(self, other, fn, name):
        rec = self._recording
        reads = (self, other) if isinstance(other, ndarray) else (self,)
        rec.launch(name, reads=reads, writes=(self,))
        fn(self._a, other._a if isinstance(other, ndarray) else other, out=self._a)
        return self

    def __iadd__(self, o):
        return self._inplace(o, np.add, "iadd")

    def __imul__(self, o):
        return self._inplace(o, np.multiply, "imul")

    def fill(self, value):
        self._recording.launch("fill", writes=(self,))
        self._a[...] = value


# -- the recorder --------------------------------------------------------------------------------

class Recording:
    """The stand-in's state: devices, streams, pool, and the log every test reads."""

    def __init__(self, num_devices):
        self.num_devices = num_devices
        self.seq = itertools.count()
        self.ptrs = itertools.count(0x1000, 0x100)
        self.event_ids = itertools.count(1)
        self.block_ids = itertools.count(1)
        self.log: list[Op] = []
        self.copies: list[Copy] = []
        self.streams: list[Stream] = []
        self._null: dict[int, Stream] = {}
        self._arenas: dict[tuple[int, Stream], list[Block]] = {}
        self._local = threading.local()
        self._lock = threading.RLock()
        self.allocations: list[Block] = []

    # devices and current streams (per thread, as in CuPy)
    def local(self):
        loc = self._local
        if not hasattr(loc, "devices"):
            loc.devices = [0]
            loc.streams = {}  # device -> stack of streams made current
        return loc

    def current_device(self):
        return self.local().devices[-1]

    def push_device(self, index):
        self.local().devices.append(index)

    def pop_device(self):
        self.local().devices.pop()

    def null_stream(self, device):
        s = self._null.get(device)
        if s is None:
            s = self._null[device] = Stream(null=True, _device=device)
        return s

    def current_stream(self, device=None):
        device = self.current_device() if device is None or device < 0 else device
        stack = self.local().streams.get(device)
        return stack[-1] if stack else self.null_stream(device)

    def push_stream(self, stream):
        self.local().streams.setdefault(stream.device_id, []).append(stream)

    def pop_stream(self, stream):
        self.local().streams[stream.device_id].pop()

    def set_stream(self, stream):
        stack = self.local().streams.setdefault(stream.device_id, [])
        if stack:
            stack[-1] = stream
        else:
            stack.append(stream)

    def host_sync(self, stream, upto=None):
        """The host waited for ``stream`` (everything it is ordered after is complete too):
        every later op, on any stream, is ordered after those."""
        done = dict(stream.clock)
        done[stream] = stream.last
        if upto is not None:
            done = upto
        _merge(self.done, done)

    @property
    def done(self):
        return self.__dict__.setdefault("_done", {})

    # memory
    def allocate(self, a):
        """A new array holding NumPy array ``a``'s copy on the current device, from the pool
        arena of the current stream."""
        with self._lock:
            device, stream = self.current_device(), self.current_stream()
            arena = self._arenas.setdefault((device, stream), [])
            block = next((b for b in arena if b.nbytes == a.nbytes), None)
            if block is not None:
                arena.remove(block)
                block.free = False
            else:
                block = Block(next(self.block_ids), device, a.nbytes, stream)
            self.allocations.append(block)
        arr = ndarray(np.array(a, order="C"), block)
        weakref.finalize(arr, self._release, block)
        return arr

    def _release(self, block):
        with self._lock:
            block.free = True
            self._arenas.setdefault((block.device, block.stream), []).append(block)

    # accesses and their ordering
    def _ordered(self, stream, prev_seq, prev_stream):
        if prev_stream is stream or prev_seq <= self.done.get(prev_stream, -1):
            return True
        return prev_seq <= stream.clock.get(prev_stream, -1)

    def access(self, stream, reads=(), writes=(), note=""):
        """Log an op on ``stream`` reading and writing arrays; RaceError if it conflicts with
        an unordered access from another stream."""
        with self._lock:
            self._implicit_sync(stream)
            seq = next(self.seq)
            for arr, kind in [(a, "read") for a in reads] + [(a, "write") for a in writes]:
                block = arr._block
                if block.free:
                    raise RaceError(f"{note}: {kind} of block {block.id} after it was freed")
                for prev_seq, prev_stream, prev_kind, prev_note in block.accesses:
                    if "write" not in (kind, prev_kind):
                        continue
                    if not self._ordered(stream, prev_seq, prev_stream):
                        raise RaceError(
                            f"{note} ({kind} of block {block.id}, device {block.device}) on "
                            f"{stream} is not ordered after {prev_note} ({prev_kind}, op "
                            f"{prev_seq}) on {prev_stream}")
                block.accesses.append((seq, stream, kind, note))
            stream.last = seq
            # blocks, not arrays: the log must not keep arrays (and so their blocks) alive
            self.log.append(Op(seq, note or "op", stream, tuple(a._block for a in reads),
                               tuple(a._block for a in writes), note))
            return seq

    def _implicit_sync(self, stream):
        """The legacy default stream waits for, and is waited for by, the device's blocking
        streams."""
        null = self.null_stream(stream.device_id)
        if stream is null:
            for s in self.streams:
                if s.device_id == stream.device_id and not s.non_blocking:
                    _merge(stream.clock, {**s.clock, s: s.last})
        elif not stream.non_blocking:
            _merge(stream.clock, {**null.clock, null: null.last})

    def check_device(self, name, arrays):
        here = self.current_device()
        for a in arrays:
            if isinstance(a, ndarray) and a._block.device != here:
                raise WrongDeviceError(
                    f"{name}: an operand is on device {a._block.device}, the current device is "
                    f"{here} (CuPy: 'Array device must be same as the current device')")

    def launch(self, name, reads=(), writes=()):
        """A kernel on the current device's current stream reading/writing these arrays."""
        self.check_device(name, (*reads, *writes))
        return self.access(self.current_stream(), reads=reads, writes=writes, note=name)

    def kernel(self, name, reads, out_like):
        """A kernel writing a new array (of ``out_like``'s values) on the current device."""
        self.check_device(name, reads)
        out = self.allocate(np.empty(out_like.shape, out_like.dtype))
        self.launch(name, reads=reads, writes=(out,))
        out._a[...] = out_like
        return out

    def peer_copy(self, x, dst):
        """CuPy's copy of ``x`` onto device ``dst``: a memcpy on ``dst``'s current stream."""
        stream = self.current_stream(dst)
        out = self.allocate(np.empty(x.shape, x.dtype))
        seq = self.access(stream, reads=(x,), writes=(out,), note=f"peer copy {x._block.device}->{dst}")
        self.copies.append(Copy(x._block.device, dst, stream, seq, tuple(stream.waited)))
        out._a[...] = x._a
        return out


def reduce_n(buffers, out=None, divisor=None, xp=None):
    """A stand-in for ``mpidist.kernels.reduce_n`` on stand-in arrays (patch it in where the
    code under test calls the kernel): one kernel on the current device and stream, reading
    every buffer and writing the sum (WrongDeviceError if a buffer is elsewhere)."""
    rec = buffers[0]._recording
    total = np.sum([b._a for b in buffers], axis=0, dtype=buffers[0].dtype)
    if divisor is not None:
        total = (total / divisor).astype(buffers[0].dtype)
    if out is None:
        return rec.kernel("reduce_n", reads=tuple(buffers), out_like=total)
    rec.launch("reduce_n", reads=tuple(buffers), writes=(out,))
    out._a[...] = total
    return out


# -- the module ----------------------------------------------------------------------------------

def _host(x):
    return x._a if isinstance(x, ndarray) else np.asarray(x)


def _make_module(rec):
    cupy = types.ModuleType("cupy")
    cupy.__dict__["__recording_stand_in__"] = True
    cupy.recording = rec
    cupy.ndarray = ndarray
    for cls in (Stream, Event, Device, ndarray):
        cls._recording = rec
    Stream.null = _NullStream()

    def asarray(a, dtype=None, order=None):
        if isinstance(a, ndarray) and a._block.device == rec.current_device() and (
                dtype is None or np.dtype(dtype) == a.dtype):
            return a
        return array(a, dtype=dtype)

    def array(a, dtype=None, copy=True, order="K", ndmin=0):
        if isinstance(a, ndarray):
            out = a.copy() if a._block.device != rec.current_device() else a.copy()
            return out if dtype is None else out.astype(dtype)
        host = np.array(a, dtype=dtype)
        out = rec.allocate(np.empty(host.shape, host.dtype))
        rec.access(rec.current_stream(), writes=(out,), note="host-to-device")
        out._a[...] = host
        return out

    def empty(shape, dtype=float, order="C"):
        return rec.allocate(np.empty(shape, dtype))

    def zeros(shape, dtype=float, order="C"):
        out = empty(shape, dtype)
        rec.launch("zeros", writes=(out,))
        out._a[...] = 0
        return out

    def full(shape, fill_value, dtype=None, order="C"):
        out = empty(shape, np.result_type(fill_value) if dtype is None else dtype)
        out.fill(fill_value)
        return out

    def empty_like(a, dtype=None, order="K", subok=None, shape=None):
        shape = a.shape if shape is None else shape
        return empty(shape, a.dtype if dtype is None else dtype)

    def ascontiguousarray(a, dtype=None):
        if isinstance(a, ndarray) and a.flags.c_contiguous and dtype is None:
            return a
        return rec.kernel("ascontiguousarray", reads=(a,), out_like=np.ascontiguousarray(
            _host(a), dtype=dtype))

    def concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
        values = np.concatenate([_host(a) for a in arrays], axis=axis, casting=casting,
                                dtype=dtype if out is None else None)
        if out is None:
            return rec.kernel("concatenate", reads=tuple(arrays), out_like=values)
        rec.launch("concatenate", reads=tuple(arrays), writes=(out,))
        out._a[...] = values.astype(out.dtype, casting="unsafe")
        return out

    def copyto(dst, src, casting="same_kind"):
        reads = (src,) if isinstance(src, ndarray) else ()
        rec.launch("copyto", reads=reads, writes=(dst,))
        np.copyto(dst._a, _host(src), casting=casting)

    def true_divide(a, b, out=None):
        reads = tuple(x for x in (a, b) if isinstance(x, ndarray))
        values = np.true_divide(_host(a), _host(b))
        if out is None:
            return rec.kernel("true_divide", reads=reads, out_like=values)
        rec.launch("true_divide", reads=reads, writes=(out,))
        out._a[...] = values
        return out

    def get_array_module(*args):
        return cupy if any(isinstance(a, ndarray) for a in args) else np

    def asnumpy(a, stream=None):
        return a.get(stream=stream) if isinstance(a, ndarray) else np.asarray(a)

    for fn in (asarray, array, empty, zeros, full, empty_like, ascontiguousarray, concatenate,
               copyto, true_divide, get_array_module, asnumpy):
        setattr(cupy, fn.__name__, fn)
    for name in ("float16", "float32", "float64", "int32", "int64", "uint8", "bool_"):
        setattr(cupy, name, getattr(np, name))
    cupy.dtype = np.dtype

    cuda = types.ModuleType("cupy.cuda")
    cuda.Device = Device
    cuda.Stream = Stream
    cuda.Event = Event
    cuda.get_current_stream = rec.current_stream

    def get_device_id():
        return rec.current_device()

    cuda.get_device_id = get_device_id
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: rec.num_devices,
        getDevice=rec.current_device,
        deviceCanAccessPeer=lambda a, b: 1,
    )
    cuda.runtime = runtime
    cupy.cuda = cuda
    return cupy


def install(monkeypatch, num_devices=2):
    """Put a fresh stand-in in ``sys.modules["cupy"]`` (monkeypatch takes it out again) and
    clear mpidist's cached CuPy state so that it sees the stand-in. Returns the module; its
    recorder is ``module.recording``. Pair it with ``cupy_backend.reset()`` at teardown, or use
    the ``stand_in`` fixture, which does both."""
    from mpidist.backend import cupy_backend

    module = _make_module(Recording(num_devices))
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setitem(sys.modules, "cupy.cuda", module.cuda)
    cupy_backend.reset()
    return module


@contextlib.contextmanager
def installed(num_devices=2):
    """``install`` for the length of a ``with`` block (e.g. inside a Hypothesis test, where a
    function-scoped fixture would be shared between examples); yields the module."""
    from mpidist.backend import cupy_backend

    mp = pytest.MonkeyPatch()
    try:
        yield install(mp, num_devices=num_devices)
    finally:
        mp.undo()
        cupy_backend.reset()


@pytest.fixture
def stand_in(monkeypatch):
    """The stand-in with two devices for one test; mpidist's CuPy cache is reset after it, so
    later tests see the real CuPy (or none) again. Import it into a test module to use it."""
    from mpidist.backend import cupy_backend

    yield install(monkeypatch, num_devices=2)
    cupy_backend.reset()
