"""Which twin runs an array (CPU or CUDA), and the array handling both twins share:
1-D views, allocation next to an input, the kernel-ready forms of CuPy and Numba arrays.

Nothing here imports Numba; ``cpu_kernels()`` / ``cuda_kernels()`` compile on first use.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, cast

import numpy as np

__all__ = ["KERNEL_DTYPES", "is_device_array", "cpu_kernels", "cuda_kernels", "flat_host",
           "flat_device", "empty_like_family", "is_c_contiguous", "check_out"]

# The dtypes the fused kernels are compiled for; others take NumPy/CuPy's own loops.
KERNEL_DTYPES = frozenset(np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64"))


_HALF = np.dtype(np.float16)


def is_device_array(x: Any) -> bool:
    """True for GPU arrays: CuPy, Numba device arrays (and the CUDA simulator's)."""
    if type(x) is np.ndarray:  # the common case, without hasattr's failed lookup (~0.3 us)
        return False
    return hasattr(x, "__cuda_array_interface__") or bool(getattr(x, "__cuda_ndarray__", False))


def cpu_kernels() -> ModuleType:
    from mpidist.kernels import cpu  # noqa: PLC0415 - imports Numba, so only when first needed

    return cast(ModuleType, cpu)


def cuda_kernels() -> ModuleType:
    from mpidist.kernels import cuda  # noqa: PLC0415 - imports numba.cuda, only on GPU paths

    return cast(ModuleType, cuda)


def _cupy_of(x: Any) -> Any:
    cupy = sys.modules.get("cupy")
    return cupy if cupy is not None and isinstance(x, cupy.ndarray) else None


def flat_host(x: Any) -> Any:
    """``x`` as a 1-D C-contiguous NumPy array (a view when it already is one), float16 as
    its uint16 bits (Numba's CPU target has no float16)."""
    a = x if type(x) is np.ndarray else np.asarray(x)
    if a.ndim != 1 or not a.flags.c_contiguous:
        a = a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)
    return a.view(np.uint16) if a.dtype == _HALF else a


def flat_device(x: Any, what: str = "array") -> Any:
    """``x`` as a 1-D contiguous device array that a Numba CUDA kernel accepts. For CuPy
    arrays call it inside ``kernels.cuda.on_device_of(x)`` (a copy lands on the current GPU)."""
    cupy = _cupy_of(x)
    if cupy is not None:
        from numba import cuda  # noqa: PLC0415

        # sync=False: Numba would otherwise synchronize the host with the array's stream, once
        # per tensor; the kernel runs on that same stream (kernels.cuda.on_device_of), in order.
        return cuda.as_cuda_array(cupy.ascontiguousarray(x).reshape(-1), sync=False)
    if not is_c_contiguous(x):
        raise ValueError(
            f"The {what} is a non-contiguous Numba device array (strides {x.strides}); "
            "pass a contiguous copy (e.g. cuda.to_device(a.copy_to_host()))."
        )
    return x.reshape(x.size) if x.ndim != 1 else x


def empty_like_family(like: Any, shape: Any, dtype: Any) -> Any:
    """An uninitialised array of ``shape``/``dtype`` where ``like`` lives (host or its GPU)."""
    if not is_device_array(like):
        return np.empty(shape, dtype)
    cupy = _cupy_of(like)
    if cupy is not None:
        with like.device:
            return cupy.empty(shape, dtype)
    from numba import cuda  # noqa: PLC0415

    return cuda.device_array(shape, dtype)


def is_c_contiguous(x: Any) -> bool:
    method = getattr(x, "is_c_contiguous", None)  # Numba device arrays
    return method() if callable(method) else bool(x.flags.c_contiguous)


def check_out(out: Any, shape: Any, dtype: Any, what: str = "out") -> None:
    """Raise ValueError unless ``out`` has ``shape`` and ``dtype`` and is C-contiguous."""
    if tuple(out.shape) != tuple(shape) or np.dtype(out.dtype) != np.dtype(dtype):
        raise ValueError(
            f"{what} must have shape {tuple(shape)} and dtype {np.dtype(dtype)}; got shape "
            f"{tuple(out.shape)} and dtype {np.dtype(out.dtype)}."
        )
    if not is_c_contiguous(out):
        raise ValueError(f"{what} must be C-contiguous (the kernels write it as one flat run).")
    flags = getattr(out, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise ValueError(f"{what} is read-only; pass a writeable array (or None for a new one).")
