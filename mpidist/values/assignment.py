"""What may be written into a variable, or into a part of one: one check for ``assign``,
``assign_add`` and ``assign_sub`` of a whole variable (``Variable.prepare_assignment``) and of
a slice (``v[1:3].assign(...)``, ``mpidist.values.sliced``), so both refuse the same values with
the same messages."""

from typing import Any

import numpy as np

from mpidist.backend import as_array
from mpidist.backend.traced import traced_error, traced_kind
from mpidist.core.devices import DeviceSpec
from mpidist.core.messages import short_repr
from mpidist.types import Array
from mpidist.values.containers import PerReplica

__all__ = ["checked_update"]


def checked_update(value: Any, target: str, shape: tuple[int, ...], dtype: np.dtype,
                   device: DeviceSpec | None, casting: Any = "same_kind") -> Array:
    """``value`` as an array to write into ``target`` (``"variable 'w:0'"``, or a part of one)
    of ``shape`` and ``dtype`` on ``device``: the same shape exactly and a dtype that casts to
    ``dtype`` under ``casting``. Raises TypeError / ValueError naming ``target`` and the fix
    otherwise; writes nothing."""
    if traced_kind(value) is not None:
        raise traced_error(value, f"Assigning to {target}",
                           "assign after value_and_grad returns, from the values it "
                           "returns (has_aux=True gives back any extra output)")
    if isinstance(value, PerReplica):
        value.__array__()  # raises TF's message: use strategy.run / reduce
    try:
        arr = as_array(value, device)
    except ValueError:  # a ragged nested list has no array form
        raise ValueError(
            f"Cannot assign {short_repr(value)} to {target}: it is not an array "
            f"of shape {shape}; pass an array or a nested list of equal-length rows."
        ) from None
    kind, own = arr.dtype.kind, dtype.kind
    if (kind in "OSUV" or kind == "b") and kind != own:
        raise TypeError(
            f"Cannot assign {short_repr(value)} (dtype {arr.dtype}) to {target} "
            f"of dtype {dtype}: pass a numeric array of shape {shape}"
            + (" (booleans are not numbers here: cast with .astype first)." if kind == "b"
               else ".")
        )
    if tuple(arr.shape) != shape:
        raise ValueError(
            f"Cannot assign a value of shape {tuple(arr.shape)} to {target} of "
            f"shape {shape}: the shapes must match exactly."
        )
    if not np.can_cast(arr.dtype, dtype, casting=casting):
        raise TypeError(
            f"Cannot assign a value of dtype {arr.dtype} to {target} of dtype "
            f"{dtype}; cast it first (e.g. np.asarray(value, dtype={dtype.name!r}))."
        )
    return arr
