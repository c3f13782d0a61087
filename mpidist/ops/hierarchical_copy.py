"""Hierarchical copy all-reduce: the DGX-1 scheme of TF's HierarchicalCopyAllReduce, with the
odd-device-count bug fixed.

Devices split into a low half ``[0, n//2)`` and a high half ``[n//2, n)`` (the high half takes
the extra device when n is odd; TF's leaves it out and drops its contribution). Each half sums
on its main device, the two partial sums meet on the first main device, and the total flows
back: to the other main device, then from each main to the rest of its half. The main devices
rotate with the pack index, spreading the work.
"""

from collections.abc import Sequence
from typing import Any

from mpidist.backend import copy_to_device, device_context
from mpidist.core.devices import DeviceSpec
from mpidist.kernels import reduce_n
from mpidist.types import Array

__all__ = ["main_devices", "hierarchical_copy_sum"]


def main_devices(index: int, n: int) -> tuple[list[int], list[int], int, int]:
    """``(group0, group1, g0_main, g1_main)`` for pack ``index`` over ``n`` devices.

    For even n this is TF's choice: ``g0_main = index % n``, ``g1_main = (g0_main + n//2) % n``.
    """
    half = n // 2
    low, high = list(range(half)), list(range(half, n))
    g0_main = index % n
    group0, group1 = (low, high) if g0_main < half else (high, low)
    position = g0_main - group0[0]
    g1_main = group1[position % len(group1)]
    return group0, group1, g0_main, g1_main


def _place(x: Array, device: DeviceSpec) -> Array:
    return copy_to_device(x, device if device.is_gpu else None)


def _sum_on(device: DeviceSpec, arrays: Sequence[Array], devices: Sequence[DeviceSpec],
            members: list[int]) -> Array:
    """The sum of ``arrays[m]`` for m in ``members``, computed on ``device``."""
    with device_context(device):
        parts = [arrays[m] if devices[m] == device else _place(arrays[m], device) for m in members]
        return reduce_n(parts)


def hierarchical_copy_sum(index: int, arrays: Sequence[Array], devices: Sequence[DeviceSpec]
                          ) -> list[Array]:
    """Every device's copy of ``sum(arrays)``: ``arrays[j]`` lives on ``devices[j]``.

    Returns:
        A list of fresh arrays, one per device, on that device (never an input).
    """
    n = len(arrays)
    if n == 1:
        return [_place(arrays[0], devices[0])]
    group0, group1, g0_main, g1_main = main_devices(index, n)
    partial0 = _sum_on(devices[g0_main], arrays, devices, group0)
    partial1 = _sum_on(devices[g1_main], arrays, devices, group1)
    with device_context(devices[g0_main]):
        total = reduce_n([partial0, _place(partial1, devices[g0_main])], out=partial0)
    results: list[Any] = [None] * n  # every slot is filled below
    results[g0_main] = total
    results[g1_main] = _place(total, devices[g1_main])
    for group, main in ((group0, g0_main), (group1, g1_main)):
        for j in group:
            if j != main:
                results[j] = _place(results[main], devices[j])
    return results
