"""Whether values cross ranks through NCCL: one decision, the same on every rank.

NCCL needs one GPU per rank: two ranks of one communicator on one GPU fail inside NCCL
(``ncclInvalidUsage``, "Duplicate GPU detected"), and a rank without NCCL never joins. So each
rank describes itself (``rank_facts``: its replicas' kind, whether NCCL loads, the identity of
the GPU NCCL would drive), the ranks gather those descriptions in the strategy's configuration
agreement, and ``choose_nccl`` decides from the gathered list. Every rank holds the same list,
so every rank decides alike, and where NCCL was asked for and cannot run every rank raises the
same error.

A GPU is named by its UUID (unique across machines), else its PCI bus id on its node, else its
index among the node's GPUs as ``CUDA_VISIBLE_DEVICES`` maps it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from mpidist.backend import cupy_backend
from mpidist.comm.options import CommunicationImplementation
from mpidist.comm.roll_call import describe_ranks
from mpidist.errors import InvalidArgumentError

__all__ = ["gpu_identity", "rank_facts", "choose_nccl", "shared_gpus"]

GpuIdentity = tuple[str, str]
"""``(where, name)``: where is "" for a UUID (unique everywhere), else the node's name."""


def gpu_identity(device_index: int, node: str,
                 environ: Mapping[str, str] | None = None) -> GpuIdentity:
    """The identity of this process's GPU ``device_index`` on ``node`` (see the module)."""
    cupy = cupy_backend.get_cupy()
    if cupy is not None:
        try:
            uuid = cupy.cuda.runtime.getDeviceProperties(device_index).get("uuid")
            if uuid:
                return "", _uuid_text(uuid)
        except Exception:  # noqa: BLE001 - an older CuPy without the field, or no driver
            pass
        try:
            bus_id = cupy.cuda.Device(device_index).pci_bus_id
            if bus_id:
                return node, f"PCI {bus_id}"
        except Exception:  # noqa: BLE001 - no driver: fall back to the visible index
            pass
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if visible.strip() and device_index < len(entries):
        return node, f"GPU {entries[device_index]} (CUDA_VISIBLE_DEVICES={visible})"
    return node, f"GPU {device_index}"


def _uuid_text(uuid: Any) -> str:
    if isinstance(uuid, bytes | bytearray):
        h = bytes(uuid).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return str(uuid)


def rank_facts(all_gpu: bool, nccl_loads: bool, identity: GpuIdentity | None
               ) -> dict[str, Any]:
    """What one rank tells the others for the NCCL decision (``local`` facts of ``agree``)."""
    return {"gpu replicas": all_gpu, "nccl loads": nccl_loads, "nccl gpu": identity}


def shared_gpus(everyone: Sequence[Mapping[str, Any]]) -> dict[GpuIdentity, list[int]]:
    """The GPUs that two ranks or more would drive, with those ranks."""
    users: dict[GpuIdentity, list[int]] = {}
    for rank, facts in enumerate(everyone):
        identity = facts.get("nccl gpu")
        if identity is not None:
            users.setdefault((identity[0], identity[1]), []).append(rank)
    return {gpu: ranks for gpu, ranks in users.items() if len(ranks) > 1}


def _describe_gpu(gpu: GpuIdentity) -> str:
    where, name = gpu
    return f"{name} on {where}" if where else name


def choose_nccl(what: str, implementation: CommunicationImplementation,
                everyone: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """``(use NCCL, why)`` from every rank's ``rank_facts`` (rank order). The same on every
    rank; InvalidArgumentError (on every rank) where NCCL was asked for and cannot run."""
    if len(everyone) == 1:
        return False, "one rank: nothing crosses ranks"
    if implementation is CommunicationImplementation.RING:
        return False, "CommunicationImplementation.RING"
    cpu = [r for r, f in enumerate(everyone) if not f.get("gpu replicas")]
    if cpu:  # TF falls back to RING for CPU values, even when NCCL was asked for
        return False, f"{describe_ranks(cpu)} {'has' if len(cpu) == 1 else 'have'} CPU replicas"
    requested = implementation is CommunicationImplementation.NCCL
    missing = [r for r, f in enumerate(everyone) if not f.get("nccl loads")]
    if missing:
        why = f"NCCL cannot be loaded on {describe_ranks(missing)}"
        if requested:
            raise InvalidArgumentError(
                f"{what}: CommunicationImplementation.NCCL was requested but {why}. Install "
                "NCCL for CuPy on every node (pip install 'mpidist[cuda12]' or '[cuda13]'; "
                "`mpidist info` says what is missing), or use CommunicationImplementation.RING "
                "or AUTO (MPI between the ranks).")
        return False, why
    shared = shared_gpus(everyone)
    if shared:
        why = "; ".join(f"{describe_ranks(ranks)} share {_describe_gpu(gpu)}"
                        for gpu, ranks in shared.items())
        if requested:
            raise InvalidArgumentError(
                f"{what}: CommunicationImplementation.NCCL needs one GPU per rank, but {why}. "
                "NCCL cannot run two ranks on one GPU (ncclInvalidUsage: duplicate GPU). Use "
                "CommunicationImplementation.RING or AUTO (MPI between the ranks), or give each "
                "rank its own GPU: start at most as many ranks per node as it has GPUs, or set "
                "CUDA_VISIBLE_DEVICES per local rank (e.g. srun --gpus-per-task=1).")
        return False, why
    return True, "every rank drives its own GPU and loads NCCL"
