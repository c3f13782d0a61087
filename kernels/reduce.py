"""N-way element-wise reduction of equally shaped buffers, in one pass over memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpidist.kernels.arrays import (
    KERNEL_DTYPES,
    check_out,
    cpu_kernels,
    cuda_kernels,
    empty_like_family,
    flat_device,
    flat_host,
    is_device_array,
)

__all__ = ["reduce_n"]


def _check_buffers(buffers: Any) -> None:
    if not buffers:
        raise ValueError("reduce_n needs at least one buffer to reduce.")
    first = buffers[0]
    for i, b in enumerate(buffers[1:], start=1):
        if tuple(b.shape) != tuple(first.shape):
            raise ValueError(
                f"reduce_n: buffer {i} has shape {tuple(b.shape)} but buffer 0 has shape "
                f"{tuple(first.shape)}; all buffers must have one shape."
            )
        if np.dtype(b.dtype) != np.dtype(first.dtype):
            raise ValueError(
                f"reduce_n: buffer {i} has dtype {np.dtype(b.dtype)} but buffer 0 has dtype "
                f"{np.dtype(first.dtype)}; cast them to one dtype first."
            )
    on_device = [is_device_array(b) for b in buffers]
    if any(on_device) and not all(on_device):
        raise ValueError(
            "reduce_n: some buffers are GPU arrays and some host arrays; copy them to one "
            "device first."
        )
    devices = {int(b.device.id) for b in buffers if hasattr(b, "device") and hasattr(b.device, "id")}
    if len(devices) > 1:
        raise ValueError(
            f"reduce_n: the buffers are on GPUs {sorted(devices)}; copy them to one GPU first."
        )


def _uniform_host(flats: Any) -> Any:
    # A Numba tuple must hold one array type; read-only views differ in type from writable ones.
    if all(f.flags.writeable for f in flats) or not any(f.flags.writeable for f in flats):
        return tuple(flats)
    views = []
    for f in flats:
        v = f.view()
        v.flags.writeable = False
        views.append(v)
    return tuple(views)


def reduce_n(buffers: Any, out: Any = None, divisor: Any = None, xp: Any = None) -> Any:
    """Sum ``buffers`` element-wise into ``out``, divided by ``divisor`` if given (MEAN).

    Runs the fused Numba kernel of the buffers' device (CPU ``njit``, parallel for large
    buffers; CUDA ``cuda.jit`` for GPU arrays) for float16/32/64 and int32/64; other dtypes use
    the array library's own loops. Integer sums wrap like NumPy's; an integer sum divided by
    ``divisor`` is true division into float64, as TF and NumPy do. float16 sums are exact in
    float64 and rounded once.

    Args:
        buffers: Non-empty sequence of arrays of one shape and dtype, all on the host or all on
            one GPU. Non-contiguous host arrays are copied first.
        out: Result array (C-contiguous, the result's shape and dtype), or None to allocate it.
            It may be ``buffers[0]`` but no other buffer.
        divisor: Positive count to divide the sum by, or None.
        xp: Accepted for callers that know the array module; the device is read off the arrays.

    Returns:
        ``out``, or the new result array.
    """
    del xp  # the arrays say where they live
    buffers = list(buffers)
    _check_buffers(buffers)
    if divisor is not None and (isinstance(divisor, (bool, np.bool_)) or not divisor > 0):
        raise ValueError(f"divisor must be a positive count or None, got {divisor!r}.")
    first = buffers[0]
    dtype = np.dtype(first.dtype)
    integer_mean = divisor is not None and dtype.kind in "iub"
    result_dtype = np.dtype(np.float64) if integer_mean else dtype
    if out is not None:
        check_out(out, first.shape, result_dtype)
        if any(b is out or _overlaps(b, out) for b in buffers[1:]):
            raise ValueError("reduce_n: out may alias buffers[0] only; it overlaps a later buffer.")
    if dtype not in KERNEL_DTYPES:
        return _reduce_library(buffers, out, divisor)
    summed = out if (out is not None and not integer_mean) else empty_like_family(
        first, first.shape, dtype)
    kernel_divisor = 0 if (divisor is None or integer_mean) else divisor
    if is_device_array(first):
        _reduce_device(summed, buffers, kernel_divisor, dtype)
    else:
        cpu = cpu_kernels()
        flats = _uniform_host([flat_host(b) for b in buffers])
        if dtype == np.float16:
            cpu.reduce_half_into(summed.reshape(-1).view(np.uint16), flats, kernel_divisor)
        else:
            cpu.reduce_into(summed.reshape(-1), flats, kernel_divisor)
    if not integer_mean:
        return summed
    xp = _array_module(summed)
    if out is None:  # into an array: true_divide of a 0-d array alone would give a scalar
        out = xp.empty(summed.shape, np.float64)
    xp.true_divide(summed, divisor, out=out)
    return out


def _overlaps(buffer: Any, out: Any) -> bool:
    """Whether host arrays share memory (a view of a later buffer would be read after being
    overwritten). Device arrays are only checked for identity."""
    if isinstance(buffer, np.ndarray) and isinstance(out, np.ndarray):
        return np.may_share_memory(buffer, out)
    return False


def _reduce_device(summed: Any, buffers: Any, divisor: Any, dtype: Any) -> None:
    cuda = cuda_kernels()
    with cuda.on_device_of(buffers[0]) as stream:
        flats = tuple(flat_device(b, "buffer") for b in buffers)
        target = flat_device(summed, "out")
        if dtype == np.float16:
            cuda.reduce_half_into(target, flats, divisor, stream)
        else:
            cuda.reduce_into(target, flats, divisor, stream)


def _array_module(x: Any) -> Any:
    if is_device_array(x) and not isinstance(x, np.ndarray):
        import sys  # noqa: PLC0415

        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(x, cupy.ndarray):
            return cupy
        raise ValueError("Integer MEAN on Numba device arrays is not supported; use CuPy arrays.")
    return np


def _reduce_library(buffers: Any, out: Any, divisor: Any) -> Any:
    """The array library's loops, for dtypes the kernels are not compiled for."""
    xp = _array_module(buffers[0])
    first = buffers[0]
    acc = xp.array(first, copy=True) if out is None or first.dtype.kind in "iub" and divisor \
        else out
    if acc is out and out is not first:
        xp.copyto(out, first)
    for b in buffers[1:]:
        xp.add(acc, b, out=acc)
    if divisor is None:
        return acc
    if acc.dtype.kind in "iub":
        if out is None:
            out = xp.empty(acc.shape, np.float64)
        xp.true_divide(acc, divisor, out=out)
        return out
    xp.true_divide(acc, divisor, out=acc)
    return acc
