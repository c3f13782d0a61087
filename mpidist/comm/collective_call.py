"""CollectiveCall: what one rank asked a collective to do, and the fingerprint of it that the
ranks compare.

A call names its operation, the fields that every rank must give alike (dtype, shape, reduce
op, root, ...) and the chain of the user's public calls that issued it (``core.user_calls``).
Its fingerprint packs the collective's sequence number with a CRC of all three into one
integer, so one small all-reduce tells whether every rank is at the same call.
"""

from __future__ import annotations

import zlib
from typing import Any, TypeAlias

import numpy as np

from mpidist.core.user_calls import current_calls, describe_calls

__all__ = ["CollectiveCall", "Fields", "Calls", "dtype_name"]

Fields: TypeAlias = tuple[tuple[str, Any], ...]
"""A call's fields, ``((name, value), ...)`` in the order they were given."""

Calls: TypeAlias = tuple[tuple[str, Fields], ...]
"""A chain of the user's public calls (``core.user_calls.current_calls``), outermost first."""

_CRC_CACHE: dict[tuple[str, Fields, Calls], int] = {}
_CRC_CACHE_LIMIT = 4096  # a program has a few fixed collectives; bound the cache anyway


class CollectiveCall:
    """What one rank asked for: the operation, the fields that every rank must agree on, and
    the chain of the user's public calls that issued it (``core.user_calls``), whose names and
    arguments (the user's reduce op, axis, ...) are agreed on too."""

    __slots__ = ("operation", "fields", "calls")

    def __init__(self, operation: str, **fields: Any) -> None:
        self.operation = operation
        self.fields: Fields = tuple(fields.items())
        self.calls: Calls = current_calls()

    def describe(self) -> str:
        inner = ", ".join(f"{k}={_show(v)}" for k, v in self.fields)
        text = f"{self.operation}({inner})"
        if self.operation == "finalize":
            return text + " at the end of the program"
        return f"{text} in {describe_calls(self.calls)}" if self.calls else text

    @classmethod
    def from_parts(cls, operation: str, fields: Fields, calls: Calls) -> CollectiveCall:
        """A call as another rank described it (``operation``, ``fields``, ``calls``)."""
        call = cls(operation, **dict(fields))
        call.calls = calls
        return call

    def fingerprint(self, seq: int) -> int:
        """``seq`` in the high bits, the CRC of the call in the low 32."""
        key = (self.operation, self.fields, self.calls)
        crc = _CRC_CACHE.get(key)
        if crc is None:
            if len(_CRC_CACHE) > _CRC_CACHE_LIMIT:
                _CRC_CACHE.clear()
            crc = _CRC_CACHE[key] = zlib.crc32(repr(key).encode())
        return (seq << 32) | crc


def dtype_name(dtype: np.dtype[Any], _names: dict[np.dtype[Any], str] = {}) -> str:  # noqa: B006
    """``dtype.name``, cached (a deliberate process-wide default): NumPy builds the name string
    on every access (~1 us)."""
    name = _names.get(dtype)
    if name is None:
        name = _names[dtype] = dtype.name
    return name


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)
