"""Host-to-device uploads that run beside compute: one non-blocking CUDA stream per GPU.

The input prefetcher calls ``upload`` from its own thread. The copy is issued on a stream that
does not synchronise with the legacy default stream, so it overlaps kernels the training thread
is running; ``upload`` returns once the data has landed, so the consumer never waits on an event.

Who owns a batch's memory: CuPy's pool is stream-ordered. A block goes back, when its last
array is dropped, to the free list of the stream that was current when it was allocated, and
the next allocation on that stream reuses it at once, trusting stream order alone. A batch
allocated on the side stream would return there when the training thread drops it, although
the default stream may still be reading it, and the next upload would overwrite it. So each
batch is allocated on the consumer's stream (the device's legacy default stream, which the
training thread's kernels run on, or are ordered with when they use a blocking stream of
their own), and the side stream waits for an event recorded there after the allocation
before it writes: every read of that memory the consumer queued before dropping it comes
first. The price is that an upload's copy also waits for the default-stream work already
queued when it starts; the host-side work of the prefetcher still overlaps.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.backend.arrays import as_array, require_cupy
from mpidist.backend.cupy_backend import is_cupy_array
from mpidist.core.devices import parse_device

if TYPE_CHECKING:
    from mpidist.core.devices import DeviceSpec
    from mpidist.types import Array

__all__ = ["Uploader"]


class Uploader:
    """Copies host arrays to GPU devices on per-device side streams (CPU devices: no copy)."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _stream(self, cupy: ModuleType, index: int) -> Any:
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                with cupy.cuda.Device(index):
                    stream = cupy.cuda.Stream(non_blocking=True)
                self._streams[index] = stream
            return stream

    def upload(self, arrays: Sequence[Any], device: str | DeviceSpec) -> list[Array]:
        """``arrays`` (a list of host arrays) as arrays on ``device``, copied and complete."""
        device = parse_device(device)
        if not device.is_gpu:
            return list(arrays)
        cupy = require_cupy(device)
        stream = self._stream(cupy, device.device_index)
        hosts = {i: np.asarray(a, order="C") for i, a in enumerate(arrays) if not is_cupy_array(a)}
        out: list[Any] = [None if i in hosts else as_array(a, device) for i, a in enumerate(arrays)]
        with cupy.cuda.Device(device.device_index):
            consumer = cupy.cuda.Stream.null
            with consumer:  # the pool's free list of the consumer's stream (see above)
                for i, a in hosts.items():
                    out[i] = cupy.empty(a.shape, a.dtype)
                allocated = consumer.record()
            stream.wait_event(allocated)
            for i, a in hosts.items():
                out[i].set(a, stream=stream)
        stream.synchronize()
        return out
