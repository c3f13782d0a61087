"""Communicator: buffer collectives across MPI ranks that never hang silently.

A Communicator puts three pieces together: the Topology of its ranks (``topology``), the
CollectiveGuard that numbers, checks and watches every collective (``collective_guard``:
fingerprint agreement, deadlines, the progress board, the reports of mismatches and missing
ranks), and the data paths. The data moves as buffers (never pickled) through the MPI
library's collectives, or through the shared-memory all-reduce for large SUMs inside a node
(hierarchical across nodes), polled against the deadline.

After a timeout the communicator is broken (an MPI request is left pending): further calls
raise UnavailableError, and at exit the rank aborts the job so that no peer waits forever.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from mpidist.backend import on_device_of
from mpidist.comm.arrival import private_duplicate
from mpidist.comm.collective_call import CollectiveCall, dtype_name
from mpidist.comm.collective_guard import CollectiveGuard
from mpidist.comm.cuda_aware import cuda_aware_mpi, describe
from mpidist.comm.device_buffers import synchronize_stream_of, through_host
from mpidist.comm.exit_sequence import at_exit
from mpidist.comm.gather import all_gather_bytes, all_gather_varying
from mpidist.comm.mpi import abort_job, check_launch, install_abort_on_exception, mpi_module
from mpidist.comm.peer_watch import watch_peers
from mpidist.comm.shared_memory import SharedMemoryAllReduce
from mpidist.comm.topology import Topology
from mpidist.config import get_config
from mpidist.errors import DeadlineExceededError, InvalidArgumentError
from mpidist.kernels.arrays import is_device_array
from mpidist.logs import get_logger, set_rank

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpidist.comm.deadlines import Waiter
    from mpidist.config import Config

__all__ = ["Communicator", "CollectiveCall", "world_communicator"]

log = get_logger("mpidist.comm")

Buffer: TypeAlias = Any
"""A C-contiguous array in host memory (``numpy.ndarray``) or on a GPU (CuPy)."""

_REDUCE_OPS = ("sum", "max", "min", "prod")
# A device buffer handed to MPI says so in its fingerprint: a rank reducing host memory (which
# may take the shared-memory path) beside it is a mismatch error, not a hang.
_DEVICE_MEMORY = (("memory", "device"),)
_world: Communicator | None = None
_world_lock = threading.Lock()


def world_communicator() -> Communicator:
    """The process-wide Communicator over MPI_COMM_WORLD (created on first use, collectively)."""
    global _world
    with _world_lock:
        if _world is None:
            _world = Communicator()
        return _world


class Communicator:
    """Collectives over an MPI communicator, with topology, checks and deadlines.

    Creating one is collective over ``comm`` (it is duplicated, so mpidist's traffic never
    matches the application's own MPI calls).

    Args:
        comm: An ``mpi4py.MPI.Comm``; COMM_WORLD when None.

    Attributes:
        rank, size, local_rank, local_size, hosts, node_index, num_nodes: Where this rank
            runs (see ``topology.Topology``).
        topology: The Topology of the ranks.
        guard: The CollectiveGuard that every collective passes.
        check_collectives: Whether the ranks agree on a fingerprint of each collective before
            moving data (``MPIDIST_CHECK_COLLECTIVES``).
        shm_min_bytes: SUM all-reduces of at least this many bytes take the shared-memory
            path (hierarchical across nodes): the measured crossover for this topology
            (``MPIDIST_SHM_MIN_BYTES_ONE_NODE`` / ``_ACROSS_NODES``), None for never.
        allreduce_algorithm: ``"auto"`` (by size, as above), ``"mpi"`` (always the MPI
            library's Allreduce) or ``"shm"`` (always shared memory where available); for
            benchmarks and tests.
        thread_level: ``MPI.Query_thread()``, the thread level MPI provides.
    """

    def __init__(self, comm: MPI.Comm | None = None) -> None:
        mpi = mpi_module()
        self._mpi = mpi
        self._mpi_ops = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN, "prod": mpi.PROD}
        base = mpi.COMM_WORLD if comm is None else comm
        if comm is None:
            check_launch(base.Get_size())
        # Bounded: a rank that never builds the communicator must not hang the others.
        self._comm = private_duplicate(base, "mpidist's communicator (a strategy across ranks)")
        self._control = self._comm.Dup()  # board exchange after a timeout, off the data path
        topology = self.topology = Topology(mpi, self._comm)
        # Copied, not delegated: the collectives read them on every call.
        self.rank, self.size = topology.rank, topology.size
        self.local_rank, self.local_size = topology.local_rank, topology.local_size
        self.hosts, self.node_index, self.num_nodes = (topology.hosts, topology.node_index,
                                                       topology.num_nodes)
        self.thread_level = mpi.Query_thread()
        config = get_config()
        self.guard = CollectiveGuard(mpi, self._comm, self._control, topology, config,
                                     threads_may_overlap=self.thread_level >= mpi.THREAD_MULTIPLE)
        self._shm = SharedMemoryAllReduce(mpi, topology.node, topology.cross) \
            if topology.uniform and self.local_size > 1 else None
        self.shm_min_bytes = _shm_threshold(config, self.num_nodes)
        self.allreduce_algorithm = "auto"
        self._gpu_aware: bool | None = None  # found out at the first device buffer
        set_rank(self.rank, self.size)
        log.info("communicator ready: rank %d of %d on %s (node %d of %d, local rank %d of %d); "
                 "shared-memory all-reduce %s; collective checks %s", self.rank, self.size,
                 self.hosts[self.rank], self.node_index, self.num_nodes, self.local_rank,
                 self.local_size, "on" if self._shm is not None else "off",
                 "on" if self.check_collectives else "off")
        if self.size > 1:
            install_abort_on_exception()
        # A rank that dies ends the job at once (comm/peer_watch.py); at exit the meeting
        # below comes first, then the watch's goodbye (comm/exit_sequence.py).
        self._peers = watch_peers(self._control, self.hosts)
        at_exit("meet", self._at_exit)

    @property
    def check_collectives(self) -> bool:
        return self.guard.check_collectives

    @check_collectives.setter
    def check_collectives(self, check: bool) -> None:
        self.guard.check_collectives = check

    @property
    def has_shared_memory(self) -> bool:
        """Whether this communicator has the shared-memory (hierarchical) all-reduce path."""
        return self._shm is not None

    # -- public collectives -------------------------------------------------------------
    def all_reduce(self, buf: Buffer, op: str = "sum", timeout: float | None = None,
                   send: Buffer | None = None) -> Buffer:
        """Reduce ``buf`` (a C-contiguous host or GPU array) over all ranks, in place; or, with
        ``send`` (same shape and dtype), reduce ``send`` into ``buf`` and leave ``send`` as is."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {_REDUCE_OPS}, got {op!r}.")
        if is_device_array(buf):
            if not self._device_buffers_to_mpi():
                return through_host(buf, lambda host: self.all_reduce(host, op, timeout), send)
            call = CollectiveCall("all_reduce", op=op, dtype=dtype_name(buf.dtype),
                                  shape=buf.shape)
            call.fields += _DEVICE_MEMORY
            with self.guard.collective(call, timeout) as wait, on_device_of(buf):
                if self.size == 1:
                    if send is not None:
                        buf[...] = send
                else:
                    _synchronize_stream(buf)
                    self._reduce_data(buf, op, wait, send)
            return buf
        call = CollectiveCall("all_reduce", op=op, dtype=dtype_name(buf.dtype), shape=buf.shape)
        with self.guard.collective(call, timeout) as wait:
            if self.size == 1:
                if send is not None:
                    buf[...] = send
                return buf
            self._reduce_data(buf, op, wait, send)  # host memory: no stream to finish
        return buf

    def all_reduce_packs(self, buf: Buffer, bounds: Iterable[tuple[int, int]], op: str = "sum",
                         timeout: float | None = None) -> Buffer:
        """Reduce the packs ``buf[lo:hi]`` for ``(lo, hi)`` in ``bounds`` (a 1-D C-contiguous
        host or GPU array) over all ranks, in place: one data collective per pack (each takes
        the algorithm its size calls for), under one fingerprint agreement on all of them."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {_REDUCE_OPS}, got {op!r}.")
        bounds = tuple(bounds)
        if len(bounds) == 1:
            lo, hi = bounds[0]
            self.all_reduce(buf[lo:hi], op, timeout)
            return buf
        device = is_device_array(buf)
        if device and not self._device_buffers_to_mpi():
            return through_host(buf, lambda host: self.all_reduce_packs(host, bounds, op, timeout))
        # The pack sizes are agreed too: every rank's data collectives then match one by one.
        call = CollectiveCall("all_reduce", op=op, dtype=dtype_name(buf.dtype), shape=buf.shape,
                              packs=tuple(hi - lo for lo, hi in bounds))
        if device:
            call.fields += _DEVICE_MEMORY
        with self.guard.collective(call, timeout) as wait:
            if self.size > 1:
                if device:
                    with on_device_of(buf):
                        _synchronize_stream(buf)
                        for lo, hi in bounds:
                            self._reduce_data(buf[lo:hi], op, wait, None)
                else:
                    for lo, hi in bounds:
                        self._reduce_data(buf[lo:hi], op, wait, None)
        return buf

    def broadcast(self, buf: Buffer, root: int = 0, timeout: float | None = None) -> Buffer:
        """Copy ``buf`` of rank ``root`` into ``buf`` of every rank, in place."""
        device = is_device_array(buf)
        if device and not self._device_buffers_to_mpi():
            return through_host(buf, lambda host: self.broadcast(host, root, timeout))
        call = CollectiveCall("broadcast", root=root, dtype=dtype_name(buf.dtype), shape=buf.shape)
        if device:
            call.fields += _DEVICE_MEMORY
        with self.guard.collective(call, timeout) as wait:
            if self.size > 1:
                if device:
                    with on_device_of(buf):
                        _synchronize_stream(buf)
                        self._broadcast_data(buf, root, wait)
                else:
                    self._broadcast_data(buf, root, wait)
        return buf

    def _broadcast_data(self, buf: Buffer, root: int, wait: Waiter) -> None:
        wait.blocking(lambda: self._comm.Bcast(buf, root=root),  # wait-ok: watchdog
                      lambda: self._comm.Ibcast(buf, root=root), "broadcast")

    def all_gather(self, array: npt.ArrayLike, timeout: float | None = None
                   ) -> npt.NDArray[Any]:
        """Concatenate every rank's ``array`` along axis 0, in rank order (host arrays).

        The leading dimension may differ between ranks; the rest of the shape and the dtype
        may not.
        """
        array = np.ascontiguousarray(array)
        if array.ndim == 0:
            raise ValueError("all_gather needs arrays with at least one dimension, got a scalar.")
        call = CollectiveCall("all_gather", dtype=dtype_name(array.dtype),
                              trailing_shape=array.shape[1:])
        with self.guard.collective(call, timeout) as wait:
            if self.size == 1:
                return array.copy()
            out, _, _ = all_gather_varying(self._comm, array.reshape(-1), wait)
        rows = out.size // max(1, int(np.prod(array.shape[1:], dtype=np.int64)))
        return out.reshape((rows,) + array.shape[1:])

    def all_gather_object(self, obj: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (for small metadata only)."""
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        # Checked like every collective: unchecked, it could pair with another rank's
        # fingerprint exchange and fail inside MPI instead of raising a mismatch.
        with self.guard.collective(CollectiveCall("all_gather_object"), timeout) as wait:
            gathered = all_gather_bytes(self._comm, payload, wait)
        return [pickle.loads(part.tobytes()) for part in gathered]

    def barrier(self, timeout: float | None = None) -> None:
        with self.guard.collective(CollectiveCall("barrier"), timeout) as wait:
            if self.size > 1:
                wait(self._comm.Ibarrier(), "barrier")

    # -- device buffers ------------------------------------------------------------------
    def _device_buffers_to_mpi(self) -> bool:
        """Whether device buffers go to MPI as they are: one rank (MPI never reads them), or a
        CUDA-aware MPI library (``comm.cuda_aware``) with the ranks agreeing on each call
        first, so that MPI gets the blocking call (no MPI promises non-blocking collectives on
        device memory), bounded by the watchdog. Else they travel through host memory."""
        if self.size == 1:
            return True
        aware = self._gpu_aware
        if aware is None:
            answer = cuda_aware_mpi()
            aware = self._gpu_aware = answer[0] is True
            log.info("communicator: %s", describe(answer))
        return aware and self.guard.check_collectives

    # -- data paths ----------------------------------------------------------------------
    def _reduce_data(self, buf: Buffer, op: str, wait: Waiter, send: Buffer | None) -> None:
        """The data phase of an all-reduce: shared memory (hierarchical across nodes) from the
        size this topology's crossover says, else the MPI library's Allreduce."""
        shm = self._shm
        if op == "sum" and shm is not None and self._use_shared_memory(shm, buf):
            shm.all_reduce(buf, wait, send)
            return
        source = self._mpi.IN_PLACE if send is None else send
        mpi_op = self._mpi_ops[op]
        wait.blocking(lambda: self._comm.Allreduce(source, buf, mpi_op),  # wait-ok: watchdog
                      lambda: self._comm.Iallreduce(source, buf, mpi_op), "all-reduce")

    def _use_shared_memory(self, shm: SharedMemoryAllReduce, buf: Buffer) -> bool:
        algorithm = self.allreduce_algorithm
        if algorithm == "auto" and (self.shm_min_bytes is None or buf.nbytes < self.shm_min_bytes):
            return False  # first the cheap test that rules out every small buffer
        if is_device_array(buf) or not shm.supports(buf):
            return False
        return algorithm == "auto" or algorithm == "shm"

    # -- exit ----------------------------------------------------------------------------
    def _at_exit(self) -> None:
        guard = self.guard
        if guard.broken is not None:
            abort_job(f"ending the job because {guard.broken}.")
        if self._mpi.Is_finalized():
            return
        if guard.timeline is not None:
            guard.timeline.flush()
        if self.size == 1:
            self._merge_timeline()
            self._free()
            return
        # Ranks that ran a different number of collectives meet here instead of leaving a
        # peer waiting forever in one the others never entered.
        try:
            with guard.collective(CollectiveCall("finalize"), None):
                pass
        except (InvalidArgumentError, DeadlineExceededError) as err:
            abort_job(f"at exit: {err}")
        self._merge_timeline()  # every rank has flushed its part: they all reached finalize
        self._free()

    def _merge_timeline(self) -> None:
        if self.guard.timeline is not None and self.rank == 0:
            self.guard.timeline.merge()

    def _free(self) -> None:
        """Release windows and communicators before MPI_Finalize, which fails on some
        fabrics (OFI: "fabricclose failed ... busy") while they are still allocated."""
        if self._shm is not None:
            self._shm.free()
        self.guard.close("the communicator was freed at exit")
        self.topology.free()
        for comm in (self._control, self._comm):
            comm.Free()


def _shm_threshold(config: Config, num_nodes: int) -> int | None:
    """The size from which SUM all-reduces take the shared-memory path on this topology: the
    measured crossover against the MPI library's Allreduce (docs/multi_worker.md), never below
    ``MPIDIST_SHM_MIN_BYTES``; None when either is off."""
    crossover = config.shm_min_bytes_across_nodes if num_nodes > 1 \
        else config.shm_min_bytes_one_node
    if config.shm_min_bytes is None or crossover is None:
        return None
    return max(config.shm_min_bytes, crossover)


def _synchronize_stream(buf: Buffer) -> None:
    """GPU-aware MPI reads device memory directly: finish the work that writes it first, on
    the buffer's own GPU (the thread's current device may be another)."""
    if is_device_array(buf):
        synchronize_stream_of(buf)
