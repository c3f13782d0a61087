"""DistributedValues and its two plain kinds: PerReplica (unsynchronised) and Mirrored (equal
on every replica).

These are explicit containers, one component per local replica, in replica order. A PerReplica
has no arithmetic: use it inside ``strategy.run`` (which hands each replica its component) or
reduce it. A Mirrored behaves like its component on the current device (else the primary), as
TensorFlow's does, so ``strategy.extended.broadcast_to(3., dest) + 1.`` is ``4.0``.
"""

from collections.abc import Callable, Iterable
from typing import Any, NoReturn, Self

import numpy as np
import numpy.typing as npt

from mpidist.backend import as_array
from mpidist.core import state
from mpidist.core.devices import DeviceSpec
from mpidist.core.signatures import accepts

__all__ = ["DistributedValues", "PerReplica", "Mirrored", "ValueContext"]


class DistributedValues:
    """Values of one logical tensor, one component per local replica.

    Args:
        values: The components, in replica order.
        devices: Optional device of each component (DeviceSpecs); strategies fill it in.
    """

    @accepts(devices=Iterable | None)  # devices: the body checks the count
    def __init__(self, values: Iterable[Any], devices: Iterable[DeviceSpec] | None = None
                 ) -> None:
        self._values = tuple(values)
        if not self._values:
            raise ValueError(f"{type(self).__name__} needs at least one component value.")
        if devices is not None:
            devices = tuple(devices)
            if len(devices) != len(self._values):
                raise ValueError(
                    f"{type(self).__name__} got {len(self._values)} values but {len(devices)} devices."
                )
        self._devices: tuple[DeviceSpec, ...] | None = devices

    @classmethod
    def unchecked(cls, values: tuple[Any, ...], devices: tuple[DeviceSpec, ...] | None) -> Self:
        """A container built without ``__init__``'s checks, for hot paths whose ``values``
        and ``devices`` are already tuples of the same, non-zero length."""
        obj = cls.__new__(cls)
        obj._values, obj._devices = values, devices
        return obj

    @property
    def values(self) -> tuple[Any, ...]:
        """The components, a tuple in replica order."""
        return self._values

    @property
    def _primary(self) -> Any:
        return self._values[0]

    @property
    def devices(self) -> tuple[DeviceSpec, ...] | None:
        """The component devices (DeviceSpecs), or None where they were never set."""
        return self._devices

    def _get_on_device_or_primary(self) -> Any:
        device = state.current_device()
        if device is not None and self._devices is not None:
            for value, value_device in zip(self._values, self._devices):
                if value_device == device:
                    return value
        return self._values[0]

    def __repr__(self) -> str:
        body = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"

    def __str__(self) -> str:
        body = ",\n".join(f"  {i}: {v!s}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"


class PerReplica(DistributedValues):
    """Holds one possibly different value per replica."""

    def __getattr__(self, name: str) -> NoReturn:
        # Only reached for names a PerReplica lacks: ``x.shape``, ``x.astype(...)``, ``x.sum()``
        # on a run's result. Say what a PerReplica is (still an AttributeError, so hasattr and
        # getattr with a default behave as Python's protocol says).
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"'PerReplica' object has no attribute {name!r}: it holds one value per replica "
            f"({len(self._values)} here), not an array. Combine them with "
            "strategy.reduce(...) or strategy.gather(...), take this worker's components with "
            "strategy.experimental_local_results(...), or use the value inside strategy.run.")

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> NoReturn:
        mode = state.current_mode()
        if mode.replica_context is not None and not mode.is_default and len(self._values) > 1:
            raise ValueError(
                "Flattening a PerReplica to components is not supported in replica context: inside "
                "strategy.run each replica already receives its own component as an argument."
            )
        raise ValueError(
            "It looks like you are using a PerReplica object while not inside a replica context, "
            "which is not supported. Try running your op or function inside a replica context by "
            "using `strategy.run`, or combine the components with `strategy.reduce` / "
            "`strategy.gather`."
        )


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: "Mirrored", *args: Any) -> Any:
        return getattr(self._get_on_device_or_primary(), name)(*args)

    method.__name__ = name
    return method


class Mirrored(DistributedValues):
    """Holds the same value on every replica; reads as the current device's component."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get_on_device_or_primary(), name)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(as_array(self._get_on_device_or_primary()), dtype=dtype)

    def __float__(self) -> float:
        return float(self._get_on_device_or_primary())

    def __int__(self) -> int:
        return int(self._get_on_device_or_primary())

    def __bool__(self) -> bool:
        return bool(self._get_on_device_or_primary())

    def __len__(self) -> int:
        return len(self._get_on_device_or_primary())


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul"):
    setattr(Mirrored, f"__{_op}__", _delegate(f"__{_op}__"))
    setattr(Mirrored, f"__r{_op}__", _delegate(f"__r{_op}__"))
for _op in ("neg", "pos", "abs", "lt", "le", "gt", "ge", "getitem"):
    setattr(Mirrored, f"__{_op}__", _delegate(f"__{_op}__"))
del _op


class ValueContext:
    """What ``experimental_distribute_values_from_function`` tells ``value_fn``: which replica."""

    __slots__ = ("_replica_id_in_sync_group", "_num_replicas_in_sync")

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self._replica_id_in_sync_group = replica_id_in_sync_group
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica_id_in_sync_group

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def __str__(self) -> str:
        return (
            f"mpidist.ValueContext(replica id {self._replica_id_in_sync_group},  "
            f"total replicas in sync: {self._num_replicas_in_sync})"
        )

    __repr__ = __str__
