"""Layer 1: array backends. NumPy for CPU devices; CuPy for GPUs, imported only when used."""

from mpidist.backend.arrays import (
    array_module,
    as_array,
    copy_to_device,
    device_of,
    device_context,
    empty_like_on_device,
    is_array,
    num_gpus,
    on_device_of,
)

__all__ = ["array_module", "as_array", "copy_to_device", "device_of", "device_context", "is_array",
           "num_gpus", "empty_like_on_device", "on_device_of"]
