"""Keeping the ranks of one node from oversubscribing its cores with BLAS / OpenMP threads.

NumPy's BLAS starts one thread per core in every process. With several ranks on a node each
rank's matrix products then fight the others' for the same cores (and spin while waiting):
measured here, a 600 KiB-gradient MLP step went from 2.3 ms to 41 ms at 2 ranks on 2 cores.
torchrun sets OMP_NUM_THREADS=1 for the same reason; mpidist gives each rank its share.
Replica threads are the same story inside one process: a MirroredStrategy on two CPU devices
runs two replicas' matrix products at once, each asking BLAS for every core (measured here, a
20-layer MLP fit step: 31 ms with two BLAS threads per replica on 2 cores, 14 ms with one), so
the share is divided by the CPU replicas of each rank as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpidist.core.devices import DeviceSpec

__all__ = ["threads_per_rank", "cap_cpu_threads"]

_USER_SETTINGS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def threads_per_rank(ranks_on_node: int, setting: int | str | None,
                     environ: Mapping[str, str] = os.environ, cpu_replicas: int = 1) -> int | None:
    """How many BLAS / OpenMP threads this rank should use, or None to leave them alone.

    ``setting`` is ``Config.cpu_threads``: ``"auto"``, an int, or None (off). With ``"auto"``:
    nothing when the user set one of OMP/OPENBLAS/MKL_NUM_THREADS; the rank's cores when the
    launcher bound it to fewer than the node has; else the node's cores divided among its ranks
    (nothing to do for a lone rank). ``cpu_replicas`` (replica threads of this rank that run on
    CPU devices, at the same time) divides that share once more.
    """
    if setting is None:
        return None
    if setting != "auto":
        return int(setting)
    if any(environ.get(name, "").strip() for name in _USER_SETTINGS):
        return None
    replicas = max(1, cpu_replicas)
    total = os.cpu_count() or 1
    bound = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    if bound < total:
        return max(1, bound // replicas)
    if ranks_on_node * replicas <= 1:
        return None
    return max(1, total // (ranks_on_node * replicas))


def cap_cpu_threads(ranks_on_node: int, setting: int | str | None,
                    cpu_replicas: int = 1) -> int | None:
    """Apply ``threads_per_rank`` to the process's thread pools; returns the cap (or None).
    Applied on every call: a pool loaded since the last one (SciPy's BLAS) needs it too."""
    limit = threads_per_rank(ranks_on_node, setting, cpu_replicas=cpu_replicas)
    if limit is not None:
        from threadpoolctl import threadpool_limits  # noqa: PLC0415 - only for multi-rank jobs

        threadpool_limits(limits=limit)
    return limit


def cap_replica_threads(devices: Iterable[DeviceSpec], setting: int | str | None) -> int | None:
    """MirroredStrategy's hook: with several CPU replicas in this process, give each its share
    of the cores (a lone CPU replica, or GPU replicas, leave the pools alone). Returns the cap."""
    cpu = sum(1 for d in devices if d.is_cpu)
    return cap_cpu_threads(1, setting, cpu_replicas=cpu) if cpu > 1 else None
