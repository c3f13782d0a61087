"""Device buffers handed to MPI: on their own GPU, with their own GPU's work finished.

A CuPy array belongs to one GPU (``array.device.id``), and the current device of the calling
thread may be another one. Everything done with a buffer on its way to or from MPI (waiting
for the kernels that write it, copying it to and from host memory) runs under the buffer's
own device, so the wait is for the right GPU's stream and the copies land on its memory.
Imported only on GPU paths: host buffers never reach this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpidist.backend import on_device_of

__all__ = ["device_id", "synchronize_stream_of", "through_host"]


def device_id(buf: Any) -> int | None:
    """The GPU that ``buf`` lives on (CuPy's ``buf.device.id``), None where it does not say
    (host arrays, Numba device arrays)."""
    index = getattr(getattr(buf, "device", None), "id", None)
    return index if isinstance(index, int) else None


def synchronize_stream_of(buf: Any) -> None:
    """Wait for the work queued on the current stream of ``buf``'s GPU (the kernels that
    write it): MPI reads device memory outside CUDA's stream order."""
    import cupy  # noqa: PLC0415 - only with GPU arrays

    with on_device_of(buf):
        cupy.cuda.get_current_stream().synchronize()


def through_host(buf: Any, collective: Callable[[Any], object], send: Any = None) -> Any:
    """Run ``collective`` on a host copy of ``buf`` (or of ``send``, then left as it is), and
    copy the result back into ``buf``: both copies on ``buf``'s GPU (``get`` waits for the
    stream that writes the buffer)."""
    with on_device_of(buf):
        host = (buf if send is None else send).get()
    collective(host)
    with on_device_of(buf):
        buf.set(host)
    return buf
