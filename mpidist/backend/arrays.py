"""Placing arrays on devices and asking where they live.

A CPU device's values are ``numpy.ndarray``s (all virtual CPU devices share host memory); a GPU
device's values are ``cupy.ndarray``s on that GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpidist.backend import cupy_backend
from mpidist.core.devices import DeviceSpec, parse_device

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from mpidist.types import Array

__all__ = ["array_module", "as_array", "copy_to_device", "device_of", "device_context", "is_array",
           "num_gpus", "require_cupy", "empty_like_on_device", "on_device_of"]

# CuPy allocates and launches on the *current* device, whatever device the operands live on, and
# orders work only within one stream. So every GPU allocation "like x" goes through
# ``empty_like_on_device``, every launch on an existing array through ``on_device_of``, and every
# copy between GPUs through ``copy_to_device`` (which orders the two devices' streams). Host
# arrays take a NumPy fast path with no context and no event.

_NO_CONTEXT = contextlib.nullcontext()


def num_gpus() -> int:
    """GPUs visible to this process (0 when CuPy or CUDA is missing)."""
    return cupy_backend.gpu_count()


def is_array(x: object) -> bool:
    return isinstance(x, np.ndarray) or cupy_backend.is_cupy_array(x)


def array_module(x: Array) -> ModuleType:
    """``numpy`` or ``cupy``, whichever owns ``x``."""
    if cupy_backend.is_cupy_array(x):
        return cast(ModuleType, cupy_backend.get_cupy())
    return np


def device_of(x: Array) -> DeviceSpec | None:
    """The DeviceSpec of a GPU array, else None (host memory, usable by every CPU device)."""
    if cupy_backend.is_cupy_array(x):
        return DeviceSpec("GPU", int(x.device.id))
    return None


def on_device_of(x: Array) -> contextlib.AbstractContextManager[Any]:
    """A context making ``x``'s GPU the current device (reusable no-op for host arrays): wrap
    every CuPy launch or allocation that touches ``x``."""
    if cupy_backend.is_cupy_array(x):
        return cast(contextlib.AbstractContextManager[Any], x.device)
    return _NO_CONTEXT


def empty_like_on_device(x: Array, shape: int | tuple[int, ...] | None = None,
                         dtype: DTypeLike | None = None) -> Array:
    """An uninitialised C-ordered array of ``x``'s kind (and, by default, shape and dtype), on
    ``x``'s device: host memory for NumPy, ``x``'s GPU for CuPy (not the current one)."""
    if cupy_backend.is_cupy_array(x):
        with x.device:
            return cupy_backend.get_cupy().empty_like(x, dtype=dtype, shape=shape, order="C")
    return np.empty_like(x, dtype=dtype, shape=shape, order="C")


def require_cupy(device: DeviceSpec) -> ModuleType:
    """The CuPy module, for work on GPU ``device``; RuntimeError saying why GPUs cannot be used
    where CuPy is missing or sees no GPU."""
    cupy = cupy_backend.get_cupy()
    if cupy is None or not cupy_backend.available():
        raise RuntimeError(
            f"Device {device} is a GPU but GPUs cannot be used: {cupy_backend.unavailable_reason()}."
        )
    return cast(ModuleType, cupy)


@contextlib.contextmanager
def device_context(device: str | DeviceSpec | None) -> Iterator[None]:
    """Make ``device`` CuPy's current device for the block (a no-op for CPU devices)."""
    device = parse_device(device) if device is not None else None
    if device is None or not device.is_gpu:
        yield
        return
    cupy = require_cupy(device)
    with cupy.cuda.Device(device.device_index):
        yield


def as_array(x: Any, device: str | DeviceSpec | None = None) -> Array:
    """``x`` as an array on ``device`` (host when None), copying only when it must move."""
    device = parse_device(device) if device is not None else None
    if device is not None and device.is_gpu:
        if cupy_backend.is_cupy_array(x) and int(x.device.id) == device.device_index:
            return x
        return copy_to_device(x, device)
    if cupy_backend.is_cupy_array(x):
        return x.get()
    return np.asarray(x)


def copy_to_device(x: Any, device: str | DeviceSpec | None = None) -> Array:
    """A new array holding ``x``'s data on ``device`` (host when None); never aliases ``x``."""
    device = parse_device(device) if device is not None else None
    if device is not None and device.is_gpu:
        cupy = require_cupy(device)
        if cupy_backend.is_cupy_array(x) and int(x.device.id) != device.device_index:
            return _peer_copy(cupy, x, device.device_index)
        with cupy.cuda.Device(device.device_index):
            if cupy_backend.is_cupy_array(x):
                return x.copy()  # same device: in stream order on its current stream
            return cupy.array(x, copy=True)
    if cupy_backend.is_cupy_array(x):
        return x.get()
    return np.array(x, copy=True)


def _peer_copy(cupy: ModuleType, x: Any, index: int) -> Array:  # x: a cupy.ndarray
    """``x`` copied onto GPU ``index`` from its own GPU, ordered with both devices' current
    streams. CuPy's peer copy runs on the destination's stream, which knows nothing of the
    source's: without the first event it may read ``x`` before the kernel producing it ran;
    without the second, the source's stream may overwrite ``x`` (a pooled buffer), or its pool
    hand ``x``'s memory out again once it is dropped, while the copy still reads it."""
    with x.device:
        source = cupy.cuda.get_current_stream()
        x = cupy.ascontiguousarray(x)  # a strided source is made contiguous on its own device
        produced = source.record()
    with cupy.cuda.Device(index):
        target = cupy.cuda.get_current_stream()
        target.wait_event(produced)
        out = x.copy()
        copied = target.record()
    with x.device:
        source.wait_event(copied)
    return out
