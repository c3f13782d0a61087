"""TensorFlow device strings, parsed into immutable DeviceSpec objects.

Accepted forms (case-insensitive device type):
``/cpu:0``, ``/gpu:1``, ``CPU:0``, ``/device:GPU:0``,
``/job:worker/replica:0/task:1/device:GPU:0`` and any prefix of the job/replica/task parts.
"""

import dataclasses
import functools
import re
from typing import Any

__all__ = ["DeviceSpec", "parse_device", "canonical_device", "DEVICE_TYPES"]

DEVICE_TYPES = ("CPU", "GPU")

_PART = re.compile(r"^(job|replica|task|device):(.+)$", re.IGNORECASE)
_TYPE_INDEX = re.compile(r"^([A-Za-z]+):(\d+|\*)$")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One device: ``device_type`` ``"CPU"`` or ``"GPU"`` and its index on its worker."""

    device_type: str
    device_index: int = 0
    job: str = "localhost"
    replica: int = 0
    task: int = 0
    # Set once by __post_init__; not an argument, not compared, not shown.
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Specs key dicts on hot paths (fusion buckets); hash the fields once.
        object.__setattr__(self, "_hash", hash((self.device_type, self.device_index, self.job,
                                                self.replica, self.task)))

    def __hash__(self) -> int:
        return self._hash

    # Rebuild through __init__: string hashes differ between processes.
    def __reduce__(self) -> tuple[type["DeviceSpec"], tuple[str, int, str, int, int]]:
        return (DeviceSpec, (self.device_type, self.device_index, self.job, self.replica, self.task))

    @property
    def is_gpu(self) -> bool:
        return self.device_type == "GPU"

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "CPU"

    def to_string(self) -> str:
        """The fully qualified TF name, e.g. ``/job:localhost/replica:0/task:0/device:CPU:0``."""
        return (
            f"/job:{self.job}/replica:{self.replica}/task:{self.task}"
            f"/device:{self.device_type}:{self.device_index}"
        )

    def __str__(self) -> str:
        return self.to_string()

    def with_task(self, job: str, task: int) -> "DeviceSpec":
        return dataclasses.replace(self, job=job, task=task)


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(
        f"Cannot parse device string {spec!r}: {why}. Use a TensorFlow device name such as "
        "'/cpu:0', '/gpu:1' or '/job:worker/replica:0/task:1/device:GPU:0'."
    )


def parse_device(spec: str | DeviceSpec) -> DeviceSpec:
    """Parse a device string (or return a DeviceSpec unchanged).

    Raises:
        ValueError: the string is empty, malformed or names an unknown device type.
        TypeError: ``spec`` is neither a string nor a DeviceSpec.
    """
    if isinstance(spec, DeviceSpec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"A device must be a string such as '/cpu:0', got {type(spec).__name__} {spec!r}.")
    return _parse_string(spec)


@functools.lru_cache(maxsize=1024)
def _parse_string(spec: str) -> DeviceSpec:
    # Destinations arrive as strings on every reduce; DeviceSpecs are immutable, so share them.
    text = spec.strip()
    if not text:
        raise _bad(spec, "it is empty")
    fields: dict[str, Any] = {"job": "localhost", "replica": 0, "task": 0}
    device_type: str | None = None
    device_index = 0
    parts = [p for p in text.split("/") if p]
    i = 0
    while i < len(parts):
        part = parts[i]
        m = _PART.match(part)
        if m and m.group(1).lower() != "device":
            key, val = m.group(1).lower(), m.group(2)
            if key == "job":
                fields["job"] = val
            else:
                if not val.isdigit():
                    raise _bad(spec, f"{key} must be a non-negative integer, got {val!r}")
                fields[key] = int(val)
            i += 1
            continue
        if m:  # device:TYPE:INDEX
            part = m.group(2)
        tm = _TYPE_INDEX.match(part)
        if tm is None:
            if part.upper() in DEVICE_TYPES:
                device_type, device_index = part.upper(), 0
                i += 1
                continue
            raise _bad(spec, f"unrecognised part {part!r}")
        dtype = tm.group(1).upper()
        if dtype not in DEVICE_TYPES:
            raise _bad(spec, f"unknown device type {tm.group(1)!r} (known: {', '.join(DEVICE_TYPES)})")
        if tm.group(2) == "*":
            raise _bad(spec, "a wildcard index names no single device")
        device_type, device_index = dtype, int(tm.group(2))
        i += 1
    if device_type is None:
        raise _bad(spec, "it names no device type")
    return DeviceSpec(device_type, device_index, fields["job"], fields["replica"], fields["task"])


def canonical_device(spec: str | DeviceSpec) -> str:
    """The fully qualified name of ``spec`` (string or DeviceSpec)."""
    return parse_device(spec).to_string()
