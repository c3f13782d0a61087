"""Placing arrays on devices and asking where they live.

A CPU device's values are ``numpy.ndarray``s (all virtual CPU devices share host memory); a GPU
device's values are ``cupy.ndarray``s on that GPU.
"""

import contextlib
from types import ModuleType

import numpy as np

from mpidist.backend import cupy_backend
from mpidist.core.devices import DeviceSpec, parse_device

__all__ = ["array_module", "as_array", "copy_to_device", "device_of", "device_context", "is_array",
           "num_gpus", "require_cupy"]


def num_gpus():
    """GPUs visible to this process (0 when CuPy or CUDA is missing)."""
    return cupy_backend.gpu_count()


def is_array(x):
    return isinstance(x, np.ndarray) or cupy_backend.is_cupy_array(x)


def array_module(x):
    """``numpy`` or ``cupy``, whichever owns ``x``."""
    if cupy_backend.is_cupy_array(x):
        return cupy_backend.get_cupy()
    return np


def device_of(x):
    """The DeviceSpec of a GPU array, else None (host memory, usable by every CPU device)."""
    if cupy_backend.is_cupy_array(x):
        return DeviceSpec("GPU", int(x.device.id))
    return None


def require_cupy(device: DeviceSpec) -> ModuleType:
    """The CuPy module, for work on GPU ``device``; RuntimeError saying why GPUs cannot be used
    where CuPy is missing or sees no GPU."""
    cupy = cupy_backend.get_cupy()
    if cupy is None or not cupy_backend.available():
        raise RuntimeError(
            f"Device {device} is a GPU but GPUs cannot be used: {cupy_backend.unavailable_reason()}."
        )
    return cupy


@contextlib.contextmanager
def device_context(device):
    """Make ``device`` CuPy's current device for the block (a no-op for CPU devices)."""
    device = parse_device(device) if device is not None else None
    if device is None or not device.is_gpu:
        yield
        return
    cupy = require_cupy(device)
    with cupy.cuda.Device(device.device_index):
        yield


def as_array(x, device=None):
    """``x`` as an array on ``device`` (host when None), copying only when it must move."""
    device = parse_device(device) if device is not None else None
    if device is not None and device.is_gpu:
        if cupy_backend.is_cupy_array(x) and int(x.device.id) == device.device_index:
            return x
        return copy_to_device(x, device)
    if cupy_backend.is_cupy_array(x):
        return x.get()
    return np.asarray(x)


def copy_to_device(x, device=None):
    """A new array holding ``x``'s data on ``device`` (host when None); never aliases ``x``."""
    device = parse_device(device) if device is not None else None
    if device is not None and device.is_gpu:
        cupy = require_cupy(device)
        with cupy.cuda.Device(device.device_index):
            if cupy_backend.is_cupy_array(x):
                return x.copy()  # CuPy copies onto the current device, peer to peer
            return cupy.array(x, copy=True)
    if cupy_backend.is_cupy_array(x):
        return x.get()
    return np.array(x, copy=True)
