"""Arenas: flat storage shared by a group of variables of one dtype on one device.

An optimizer that updates the same variables every step moves them (and its slots) into one
flat buffer per device and dtype, each variable a view at its offset (``Variable.adopt_storage``),
so that one fused kernel updates them all and the gradients travel as one packed buffer laid out
the same way. Variables keep behaving exactly as before: every write is in place, into the view.
"""

from collections.abc import Sequence

from mpidist.backend import empty_like_on_device, on_device_of
from mpidist.kernels.layout import FusionLayout
from mpidist.kernels.optimizers import FUSED_DTYPES
from mpidist.types import Array
from mpidist.values.variables import Variable

__all__ = ["Arena", "can_share_storage"]


def can_share_storage(variables: Sequence[Variable]) -> bool:
    """Whether ``variables`` (plain, one device each) can move into one arena: a float dtype the
    fused kernels take, all the same, C-contiguous arrays of one kind on one device, none
    already living in a shared buffer."""
    if not variables:
        return False
    first = variables[0].storage
    kind, dtype = type(first), first.dtype
    device = getattr(first, "device", None)
    if dtype not in FUSED_DTYPES:
        return False
    for v in variables:
        a = v.storage
        if v.storage_adopted or type(a) is not kind or a.dtype != dtype \
                or not a.flags.c_contiguous or getattr(a, "device", None) != device:
            return False
    return True


class Arena:
    """One flat buffer holding ``variables`` end to end, in order (check them first with
    ``can_share_storage``). ``flat`` is the buffer, ``layout`` the offsets of each variable."""

    __slots__ = ("flat", "layout")

    def __init__(self, variables: Sequence[Variable]) -> None:
        first = variables[0].storage
        self.layout = FusionLayout([v.shape for v in variables])
        # Allocated like the first variable: same array kind, on its device (a GPU arena
        # allocated under another current device would land there); the copies in too.
        self.flat = empty_like_on_device(first, shape=(self.layout.total,))
        with on_device_of(first):
            for v, view in zip(variables, self.layout.views(self.flat)):
                v.adopt_storage(view)

    def empty_like(self) -> Array:
        """A new flat buffer of the arena's length, dtype and device (e.g. for gradients)."""
        return empty_like_on_device(self.flat)
