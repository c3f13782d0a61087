"""Host-to-device uploads that run beside compute: one non-blocking CUDA stream per GPU.

The input prefetcher calls ``upload`` from its own thread. The copy is issued on a stream that
does not synchronise with the legacy default stream, so it overlaps kernels the training thread
is running; ``upload`` returns once the data has landed, so the consumer never waits on an event.
"""

import threading

from mpidist.backend.arrays import require_cupy
from mpidist.core.devices import parse_device

__all__ = ["Uploader"]


class Uploader:
    """Copies host arrays to GPU devices on per-device side streams (CPU devices: no copy)."""

    def __init__(self):
        self._streams = {}
        self._lock = threading.Lock()

    def _stream(self, cupy, index):
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                with cupy.cuda.Device(index):
                    stream = cupy.cuda.Stream(non_blocking=True)
                self._streams[index] = stream
            return stream

    def upload(self, arrays, device):
        """``arrays`` (a list of host arrays) as arrays on ``device``, copied and complete."""
        device = parse_device(device)
        if not device.is_gpu:
            return list(arrays)
        cupy = require_cupy(device)
        stream = self._stream(cupy, device.device_index)
        with cupy.cuda.Device(device.device_index), stream:
            out = [cupy.asarray(a) for a in arrays]
        stream.synchronize()
        return out
