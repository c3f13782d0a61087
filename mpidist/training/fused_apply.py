"""The fused step of an optimizer: its variables and slots in arenas, one kernel per device.

``FusedPlan.build`` is called with the variables of an ``apply_gradients`` call once their slots
exist. Where every variable can live in an arena (float32/float64, one dtype, plain or mirrored,
one array per device, not in another arena) it moves each device's copies of the variables,
and of each slot, into one flat buffer per device, and keeps a gradient buffer of the same
layout. A later call with the same variables in the same order then costs one pack of the
gradients, the all-reduce of that buffer (by the caller) and one fused kernel per device,
whatever the number of variables; any other call takes the per-variable path, which stays
correct because the variables are views into the arenas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

from mpidist.backend import array_module, device_context, empty_like_on_device, on_device_of
from mpidist.core.devices import parse_device
from mpidist.kernels.layout import FusionLayout
from mpidist.values.arena import Arena, can_share_storage
from mpidist.values.containers import DistributedValues
from mpidist.values.distributed_variables import MirroredVariable
from mpidist.types import Array
from mpidist.values.variables import Variable

__all__ = ["FusedPlan", "HEAD", "components_of", "grads_of_device", "grads_per_device"]

HEAD = 2
"""Elements before each device's gradient buffer (``FusedPlan.grads_with_head``)."""

# Mean gradient size below which joining bytes packs faster than np.concatenate (docs/performance.md).
_JOIN_BELOW_BYTES_PER_GRADIENT = 3072


def components_of(var: object) -> tuple[Variable, ...] | None:
    """The plain per-device variables of ``var`` (itself when it is plain); None for any
    other kind (ON_READ copies may differ; subclasses may keep their value elsewhere)."""
    if type(var) is MirroredVariable:
        return tuple(var.values)
    return (var,) if type(var) is Variable else None


class FusedPlan:
    """Arenas of parameters and slots, per device, for one list of variables.

    Attributes:
        key: ``tuple(map(id, variables))``: the calls this plan serves.
        layout: The FusionLayout shared by every arena of the plan.
        grads: Per device, the gradient buffer (``layout``), the tail of ``grads_with_head``.
        grads_with_head: Per device, ``HEAD`` elements then the gradient buffer, laid out as
            ``layout_with_head``: what one all-reduce sums when values travel with the
            gradients.
        num_devices: How many copies each variable has (one arena group per copy).
    """

    def __init__(self, variables: Sequence[Any], slot_vars: Sequence[Mapping[str, Any]],
                 slot_names: Sequence[str]) -> None:
        self.variables = variables  # held (ids in `key` must stay valid); the checked tuple
        self.key = tuple(id(v) for v in variables)
        # build() made sure none is None
        comps: list[Any] = [components_of(v) for v in variables]
        self.num_devices = len(comps[0])
        self.devices = [parse_device(c.device) for c in comps[0]]
        self.params: list[Array] = []
        self.slots: list[list[Array]] = []
        self.grads: list[Array] = []
        self.grads_with_head: list[Array] = []
        for i in range(self.num_devices):
            params = Arena([c[i] for c in comps])
            self.params.append(params.flat)
            self.slots.append([Arena([components_of(s[name])[i]  # type: ignore[index]  # see build()
                                      for s in slot_vars]).flat
                               for name in slot_names])
            # A head of HEAD elements before the gradients, for values that travel with them
            # in one all-reduce (fit's loss totals: ``Optimizer.apply_mean_gradients``).
            with_head = empty_like_on_device(params.flat, shape=(params.layout.total + HEAD,))
            self.grads_with_head.append(with_head)
            self.grads.append(with_head[HEAD:])
        self.layout = params.layout
        self.layout_with_head = FusionLayout(((HEAD,),) + params.layout.shapes)
        self.dtype = self.params[0].dtype
        self._accepted: dict[bool, object] = {False: None, True: None}  # exact_dtype -> signature that passed
        # (signature, whether gradients of that signature pack by joining their bytes)
        self._joins: tuple[object, bool] = (None, False)

    @classmethod
    def build(cls, variables: Sequence[Any], slot_vars: Sequence[Mapping[str, Any]],
              slot_names: Sequence[str]) -> FusedPlan | None:
        """A plan for ``variables`` (with ``slot_vars[k][name]`` the slots of the k-th), or
        None where they cannot all move into arenas (they then stay where they are)."""
        # Any: tuples once the test below has passed (mypy cannot narrow through any())
        comps: list[Any] = [components_of(v) for v in variables]
        if not comps or any(c is None or len(c) != len(comps[0]) for c in comps):
            return None
        groups = []
        for i in range(len(comps[0])):
            groups.append([c[i] for c in comps])
            for name in slot_names:
                slot_comps: list[Any] = [components_of(s[name]) for s in slot_vars]
                if any(c is None or len(c) != len(comps[0]) for c in slot_comps):
                    return None
                groups.append([c[i] for c in slot_comps])
        if not all(can_share_storage(g) for g in groups):
            return None
        dtype = groups[0][0].storage.dtype
        if any(g[0].storage.dtype != dtype for g in groups):
            return None
        return cls(variables, slot_vars, slot_names)

    def pack(self, index: int, grads: Sequence[Array], exact_dtype: bool,
             signature: object = None) -> bool:
        """Copy the gradients of device ``index`` end to end into its gradient buffer; False
        (nothing else touched) when one is not an array of the buffer's kind, or, with
        ``exact_dtype``, not of its dtype (a reduction must run in the gradients' own dtype).

        ``signature`` (optional) is ``GradientChecks``'s ``(types, shapes, dtypes)`` of
        ``grads``: once gradients of that signature passed, later ones skip the per-gradient
        test (the repeating step)."""
        flat = self.grads[index]
        if signature is None or self._accepted[exact_dtype] is not signature:
            # C-level passes (map into a set), not a Python loop per gradient.
            if set(map(type, grads)) != {type(flat)} \
                    or (exact_dtype and set(map(_dtype, grads)) != {flat.dtype}):
                return False
            if signature is not None:
                self._accepted[exact_dtype] = signature
        if type(flat) is np.ndarray:
            if self._joinable(grads, flat, signature):
                try:
                    # bytes.join reads each C-contiguous array through the buffer protocol.
                    joined = b"".join(grads)  # type: ignore[arg-type]  # ndarrays are buffers
                except TypeError:  # a gradient that is not C-contiguous exports no flat buffer
                    joined = b""
                if len(joined) == flat.nbytes:
                    np.copyto(flat, np.frombuffer(joined, flat.dtype))
                    return True
            # One pass; the cast (where allowed) rounds as ``astype`` does per variable.
            # axis=None flattens each input in C order inside NumPy: no view per gradient.
            np.concatenate(grads, axis=None, out=flat, casting="unsafe")
        else:
            with on_device_of(flat):  # the kernel runs on the buffer's GPU, not the current one
                array_module(flat).concatenate([g.reshape(-1) for g in grads], out=flat,
                                               casting="unsafe")
        return True

    def _joinable(self, grads: Sequence[Array], flat: np.ndarray, signature: object) -> bool:
        """Whether to pack by joining the gradients' bytes: every gradient has the buffer's own
        dtype (its bytes then are the packed bytes) and they are small, so concatenate's cost
        per array (~95 ns) outweighs the join's second copy (the measured crossover sits near
        4 KiB per gradient; 3 KiB keeps a margin). Decided once per gradient signature."""
        if signature is not None and self._joins[0] is signature:
            return self._joins[1]
        joins = flat.nbytes < _JOIN_BELOW_BYTES_PER_GRADIENT * len(grads) \
            and set(map(_dtype, grads)) == {flat.dtype}
        if signature is not None:
            self._joins = (signature, joins)
        return joins

    def update(self, index: int, fused_update: Callable[..., None], lr: Any, step: Any) -> None:
        """Run the optimizer's fused kernel over device ``index``'s arenas."""
        device = self.devices[index]
        if device.is_gpu:
            with device_context(device):
                fused_update(self.params[index], self.grads[index], self.slots[index], lr, step)
        else:
            fused_update(self.params[index], self.grads[index], self.slots[index], lr, step)


def grads_of_device(grads: Sequence[Any], index: int) -> list[Any]:
    """Device ``index``'s gradients from the merged (cross-replica) gradient list."""
    return [g.values[index] if isinstance(g, DistributedValues) else g for g in grads]


def grads_per_device(grads: Sequence[Any], num_devices: int) -> Sequence[Sequence[Any]]:
    """Every device's gradients (a list per device) from the merged gradient list: one C-level
    transposition when every gradient is distributed (the all-reduced case)."""
    if all(map(isinstance, grads, repeat(DistributedValues))):
        per_device = list(zip(*map(_values, grads)))
        if len(per_device) == num_devices:
            return per_device
    return [grads_of_device(grads, i) for i in range(num_devices)]


_dtype, _values = attrgetter("dtype"), attrgetter("values")
