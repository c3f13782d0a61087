"""The lean ``run`` of a worker with one local replica (MWMS with one device per rank,
MirroredStrategy on one device, OneDeviceStrategy); ``single_replica`` is the other case, one
replica in the whole job.

The replica runs on the calling thread. Its arguments are walked for distributed values only
when some top-level argument could hold one; arrays and numbers cannot.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mpidist.backend import device_context
from mpidist.core import state
from mpidist.core.devices import DeviceSpec
from mpidist.strategies.replica_context import ReplicaContext
from mpidist.values.regroup import select_replica

__all__ = ["PLAIN_TYPES", "is_plain", "call_one_replica"]

# Values that are never distributed nor a variable's component.
PLAIN_TYPES = frozenset((np.ndarray, int, float, complex, bool, str, type(None), np.float16,
                         np.float32, np.float64, np.int32, np.int64))


def is_plain(args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> bool:
    """Whether no argument can hold a distributed value (so none needs unwrapping)."""
    for v in args:
        if type(v) not in PLAIN_TYPES:
            return False
    if kwargs:
        for v in kwargs.values():
            if type(v) not in PLAIN_TYPES:
                return False
    return True


def call_one_replica(ctx: ReplicaContext, device: DeviceSpec | None, fn: Callable[..., Any],
                     args: Sequence[Any], kwargs: dict[str, Any], plain: bool | None = None
                     ) -> Any:
    """``fn(*args, **kwargs)`` as the one local replica: under ``ctx`` (its ReplicaContext),
    placed on ``device``, with distributed arguments replaced by their one component.
    ``plain``: ``is_plain(args, kwargs)`` where the caller has it already."""
    if not (is_plain(args, kwargs) if plain is None else plain):
        args, kwargs = select_replica(0, args), select_replica(0, kwargs)
    with ctx, state.device_scope(device):
        if device is not None and device.is_gpu:
            with device_context(device):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)
