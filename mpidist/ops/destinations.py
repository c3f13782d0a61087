"""Where a reduction or broadcast result goes: resolving ``destinations`` to devices, and
placing one value on those devices."""

from typing import Any, TypeAlias

from mpidist.backend import copy_to_device, device_of, is_array
from mpidist.core.devices import DeviceSpec, parse_device
from mpidist.types import Array
from mpidist.values.containers import DistributedValues, Mirrored
from mpidist.values.variables import Variable

__all__ = ["HOST", "Destinations", "validate_destinations", "resolve_devices", "simple_broadcast"]

HOST = DeviceSpec("CPU", 0)

Destinations: TypeAlias = DistributedValues | Variable | DeviceSpec | str | Array
"""Where a result goes: the devices of a distributed value or variable, the device of an
array, or a device named by a DeviceSpec or a string such as ``"/gpu:0"``."""


def validate_destinations(destinations: Any) -> None:
    """Raise ValueError unless ``destinations`` is a distributed value, a variable, an array or
    a non-empty device string."""
    if isinstance(destinations, (DistributedValues, Variable, DeviceSpec)) or is_array(destinations):
        return
    if isinstance(destinations, str):
        if not destinations.strip():
            raise ValueError("destinations can not be empty: pass a device string such as '/cpu:0'.")
        try:
            parse_device(destinations)
        except ValueError as exc:  # name the argument the string came in
            raise ValueError(f"destinations: {exc}") from None
        return
    raise ValueError(
        "destinations must be one of a `DistributedValues` object, an `mpidist.Variable` object, "
        f"an array or a device string; got {type(destinations).__name__} {destinations!r}."
    )


def resolve_devices(destinations: Destinations) -> tuple[DeviceSpec, ...]:
    """The devices (a tuple of DeviceSpecs) that ``destinations`` stands for."""
    if isinstance(destinations, DistributedValues):
        if destinations.devices is not None:
            return destinations.devices
        found = []
        for i, v in enumerate(destinations.values):
            if is_array(v):
                d = device_of(v)
            else:
                d = v.device_spec if isinstance(v, Variable) else None
            found.append(d if d is not None else DeviceSpec("CPU", i))
        return tuple(found)
    if isinstance(destinations, Variable):
        device = destinations.device_spec
        return (device if device is not None else HOST,)
    if isinstance(destinations, (str, DeviceSpec)):
        return (parse_device(destinations),)
    if is_array(destinations):
        return (device_of(destinations) or HOST,)
    validate_destinations(destinations)
    raise AssertionError("unreachable")  # validate_destinations raised


def simple_broadcast(value: Any, destinations: Destinations, reuse: bool = False
                     ) -> Array | Mirrored:
    """``value`` copied to each destination device: an array for one device, else a Mirrored.

    Args:
        reuse: ``value`` is a fresh array the caller gives away; the first destination that
            shares its memory (host for CPU devices) takes it without a copy.
    """
    devices = resolve_devices(destinations)
    home = device_of(value) if is_array(value) else None
    copies = []
    for device in devices:
        same_memory = (home == device) if home is not None else (is_array(value) and device.is_cpu)
        if reuse and same_memory:
            copies.append(value)
            reuse = False
        else:
            copies.append(copy_to_device(value, device if device.is_gpu else None))
    if len(copies) == 1:
        return copies[0]
    return Mirrored(copies, devices)
