"""NCCL between the GPUs of one process, through CuPy's binding.

One communicator per GPU, created together (``NcclCommunicator.initAll``) the first time a set
of devices all-reduces, and kept: creating them costs milliseconds to seconds. Each GPU's
NCCL calls run on a dedicated stream that waits for the caller's stream (inputs ready) and
that the caller's stream then waits for (outputs ready), so no host synchronisation is needed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from mpidist.backend import cupy_backend
from mpidist.comm.device_buffers import device_id
from mpidist.core.waiting import Wait, wait_until

if TYPE_CHECKING:
    from mpidist.comm.communicator import Communicator

__all__ = ["nccl_module", "nccl_unavailable_reason", "nccl_dtype", "nccl_can_reduce", "nccl_version",
           "LocalNcclGroup", "local_group", "RankNcclGroup"]

# The one dtype table of both groups. NCCL sums these natively; complex travels as its float
# components (a view: twice the count, componentwise sums, exact). Anything else (bool, 16-bit
# integers, ...) has no NCCL type: ``nccl_dtype`` refuses it by name.
_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int32": "NCCL_INT32", "int64": "NCCL_INT64", "uint8": "NCCL_UINT8",
               "int8": "NCCL_INT8", "uint32": "NCCL_UINT32", "uint64": "NCCL_UINT64"}
_AS_COMPONENTS = {"complex64": "float32", "complex128": "float64"}


def nccl_dtype(dtype: Any) -> tuple[str, int]:
    """``(name of the NCCL type constant, elements per array element)`` for summing arrays
    of ``dtype`` with NCCL: ``("NCCL_FLOAT32", 2)`` for complex64 (its float components).

    Raises:
        TypeError: for a dtype NCCL cannot sum, naming it and what to do instead.
    """
    name = np.dtype(dtype).name
    components = _AS_COMPONENTS.get(name)
    if components is not None:
        return _NCCL_TYPES[components], 2
    nccl_type = _NCCL_TYPES.get(name)
    if nccl_type is None:
        raise TypeError(
            f"NCCL cannot all-reduce arrays of dtype {name}: it sums only "
            f"{', '.join(sorted(set(_NCCL_TYPES) | set(_AS_COMPONENTS)))}. Cast the values "
            "first (e.g. x.astype(np.int32) to count booleans or to sum 16-bit integers), or "
            "reduce them over MPI (CommunicationImplementation.RING, or "
            "mpidist.HierarchicalCopyAllReduce() between local GPUs).")
    return nccl_type, 1


def nccl_can_reduce(dtype: Any) -> bool:
    """Whether NCCL can sum arrays of ``dtype`` (see ``nccl_dtype``)."""
    name = np.dtype(dtype).name
    return name in _NCCL_TYPES or name in _AS_COMPONENTS


def nccl_version() -> str | None:
    """NCCL's version as ``"2.21.5"``, or None when NCCL cannot be loaded."""
    nccl = nccl_module()
    if nccl is None:
        return None
    try:
        code = int(nccl.get_version())
    except Exception:  # noqa: BLE001 - an old binding without get_version
        return "unknown"
    # NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older ones major*1000 + minor*100.
    major, rest = divmod(code, 10000) if code >= 10000 else divmod(code, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


DeviceArray: TypeAlias = Any
"""A ``cupy.ndarray`` (CuPy is imported only when GPUs are used, so not named here)."""

_state: dict[str, Any] = {"module": None, "error": None, "checked": False}
_groups: dict[tuple[int, ...], LocalNcclGroup] = {}
_groups_lock = threading.Lock()


def nccl_module() -> Any:
    """CuPy's ``cupy.cuda.nccl`` module when NCCL can be loaded, else None."""
    if not _state["checked"]:
        _state["checked"] = True
        if cupy_backend.get_cupy() is None:
            _state["error"] = cupy_backend.unavailable_reason()
        else:
            try:
                from cupy.cuda import nccl  # noqa: PLC0415 - loads libnccl

                if getattr(nccl, "available", True):
                    _state["module"] = nccl
                else:
                    _state["error"] = "CuPy was built without NCCL support"
            except Exception as exc:  # noqa: BLE001 - ImportError when libnccl is missing
                _state["error"] = f"{type(exc).__name__}: {exc}"
    return _state["module"]


def nccl_unavailable_reason() -> str:
    nccl_module()
    return _state["error"] or "NCCL is available"


class LocalNcclGroup:
    """NCCL communicators over the given local GPUs (one process drives them all)."""

    def __init__(self, device_indices: Iterable[int]) -> None:
        nccl = nccl_module()
        if nccl is None:
            raise RuntimeError(
                f"NCCL cannot be used: {nccl_unavailable_reason()}. Install NCCL for CuPy "
                "(pip install nvidia-nccl-cu12) or use mpidist.HierarchicalCopyAllReduce()."
            )
        cupy = cupy_backend.get_cupy()
        self._nccl = nccl
        self.device_indices = tuple(device_indices)
        self._comms = nccl.NcclCommunicator.initAll(list(self.device_indices))
        self._streams: list[Any] = []
        for d in self.device_indices:
            with cupy.cuda.Device(d):
                self._streams.append(cupy.cuda.Stream(non_blocking=True))

    def all_reduce_sum(self, sends: Sequence[DeviceArray], recvs: Sequence[DeviceArray]
                       ) -> None:
        """``recvs[j] = sum(sends)`` on every GPU j; arrays are contiguous, one per GPU."""
        cupy = cupy_backend.get_cupy()
        nccl = self._nccl
        type_name, per_element = nccl_dtype(sends[0].dtype)  # before any stream is touched
        code = getattr(nccl, type_name)
        callers = []
        for d, stream in zip(self.device_indices, self._streams):
            with cupy.cuda.Device(d):
                caller = cupy.cuda.get_current_stream()
                stream.wait_event(caller.record())
                callers.append(caller)
        nccl.groupStart()
        try:
            for comm, d, stream, send, recv in zip(self._comms, self.device_indices, self._streams,
                                                   sends, recvs):
                with cupy.cuda.Device(d):
                    comm.allReduce(send.data.ptr, recv.data.ptr, send.size * per_element, code,
                                   nccl.NCCL_SUM,
                                   stream.ptr)
        finally:
            nccl.groupEnd()
        for d, stream, caller in zip(self.device_indices, self._streams, callers):
            with cupy.cuda.Device(d):
                caller.wait_event(stream.record())


def local_group(device_indices: Iterable[int]) -> LocalNcclGroup:
    """The cached LocalNcclGroup for these GPUs, created on first use."""
    key = tuple(device_indices)
    with _groups_lock:
        group = _groups.get(key)
        if group is None:
            group = _groups[key] = LocalNcclGroup(key)
        return group


class RankNcclGroup:
    """NCCL across MPI ranks: one GPU per rank, the communicator bootstrapped over MPI.

    Rank 0 creates the NCCL unique id and the MPI communicator hands it to every rank, which
    then joins with its own GPU. ``all_reduce_sum`` enqueues on the caller's current stream;
    a ``timeout`` polls that stream and aborts the NCCL communicator when it passes, raising
    DeadlineExceededError instead of leaving a kernel spinning forever.

    Args:
        communicator: The ``comm.communicator.Communicator`` of the ranks.
        device_index: This rank's GPU.
    """

    def __init__(self, communicator: Communicator, device_index: int) -> None:
        nccl = nccl_module()
        if nccl is None:
            raise RuntimeError(
                "CommunicationImplementation.NCCL was requested but NCCL cannot be used: "
                f"{nccl_unavailable_reason()}. Use CommunicationImplementation.RING (MPI) or "
                "install CuPy with NCCL (pip install 'mpidist[cuda12]')."
            )
        cupy = cupy_backend.get_cupy()
        self._nccl = nccl
        self._cupy = cupy
        self.device_index = device_index
        uid = nccl.get_unique_id() if communicator.rank == 0 else None
        uid = communicator.all_gather_object(uid)[0]
        with cupy.cuda.Device(device_index):
            self._comm = nccl.NcclCommunicator(communicator.size, uid, communicator.rank)

    def all_reduce_sum(self, buf: DeviceArray, timeout: float | None = None
                       ) -> DeviceArray:
        """Sum the CuPy array ``buf`` over all ranks, in place, on the current stream."""
        from mpidist.errors import DeadlineExceededError  # noqa: PLC0415

        nccl = self._nccl
        type_name, per_element = nccl_dtype(buf.dtype)
        code = getattr(nccl, type_name)
        where = device_id(buf)
        if where is not None and where != self.device_index:
            raise ValueError(
                f"RankNcclGroup.all_reduce_sum: buf is on GPU {where}, but this rank's NCCL "
                f"communicator drives GPU {self.device_index}. Reduce the value onto GPU "
                f"{self.device_index} first, or use CommunicationImplementation.RING.")
        with self._cupy.cuda.Device(self.device_index):
            stream = self._cupy.cuda.get_current_stream()
            self._comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size * per_element, code,
                                 nccl.NCCL_SUM, stream.ptr)
            if timeout is None:
                return buf
            def expire(wait: Wait, now: float) -> None:
                self._comm.abort()
                raise DeadlineExceededError(
                    f"Collective has timed out during execution: NCCL all-reduce of "
                    f"{buf.dtype}[{buf.size}] on GPU {self.device_index} did not complete "
                    f"within {timeout:g} s; the NCCL communicator was aborted."
                )

            wait_until(lambda: stream.done, f"NCCL all-reduce of {buf.dtype}[{buf.size}]",
                       "the other ranks' GPUs", timeout=timeout, poll=1e-3, on_expiry=expire)
        return buf
