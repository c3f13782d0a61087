"""All-reduce through MPI-3 shared memory: the ranks of a node reduce straight from each
other's buffers.

Each rank copies its buffer into its slot of a shared window; rank r then sums chunk r of
every slot with the fused kernel (one pass over p inputs) and writes the result into its own
slot's chunk r, which no other rank reads; after a barrier every rank copies the p reduced
chunks out. Across nodes, rank r's chunk is all-reduced with the ranks of the same local rank
on the other nodes (the hierarchical layout), so each node still moves only 1/p per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mpidist.kernels import reduce_n
from mpidist.kernels.arrays import KERNEL_DTYPES

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpidist.comm.deadlines import Waiter

__all__ = ["SharedMemoryAllReduce"]

_PAGE = 4096


class SharedMemoryAllReduce:
    """SUM all-reduce of host buffers over one node's shared memory.

    Args:
        mpi: The ``mpi4py.MPI`` module.
        node: Communicator of this node's ranks.
        cross: Communicator of the ranks with this local rank on every node, or None for a
            single-node job.
    """

    def __init__(self, mpi: Any, node: MPI.Comm, cross: MPI.Comm | None) -> None:
        self._mpi = mpi
        self._node = node
        self._cross = cross
        self._rank = node.Get_rank()
        self._size = node.Get_size()
        self._window: MPI.Win | None = None
        self._capacity = 0
        self._slots: list[npt.NDArray[np.uint8]] = []

    @staticmethod
    def supports(array: npt.NDArray[Any]) -> bool:
        return array.dtype in KERNEL_DTYPES and array.flags.c_contiguous

    def _ensure_capacity(self, nbytes: int) -> None:
        # Every rank asks for the same size (the fingerprint check agreed on it), so the
        # collective re-allocation happens on all of them together.
        if nbytes <= self._capacity:
            return
        capacity = max(nbytes, 2 * self._capacity)
        capacity = -(-capacity // _PAGE) * _PAGE
        if self._window is not None:
            self._slots = []
            self._window.Free()
        self._window = self._mpi.Win.Allocate_shared(capacity, 1, comm=self._node)
        # mpi4py's stub gives Shared_query's buffer no __buffer__; it has the buffer protocol.
        self._slots = [np.frombuffer(self._window.Shared_query(q)[0],  # type: ignore[arg-type]
                                     dtype=np.uint8)
                       for q in range(self._size)]
        self._capacity = capacity

    def all_reduce(self, buf: npt.NDArray[Any], wait: Waiter,
                   send: npt.NDArray[Any] | None = None) -> npt.NDArray[Any]:
        """Sum ``buf`` (C-contiguous host array) over all ranks, in place (or ``send`` into
        ``buf`` when given).

        ``wait`` is the collective's deadline-aware waiter (``comm.deadlines.Waiter``):
        once the ranks have agreed on the call its barriers are blocking calls under the
        watchdog, otherwise polled non-blocking ones, so a lost peer becomes a timeout.
        """
        flat = buf.reshape(-1)
        n = flat.size
        self._ensure_capacity(flat.nbytes)
        slots = [s[:flat.nbytes].view(flat.dtype) for s in self._slots]
        mine = slots[self._rank]
        np.copyto(mine, flat if send is None else send.reshape(-1))
        node = self._node
        wait.blocking(node.Barrier, node.Ibarrier, "shared-memory barrier before the reduce")
        lo, hi = _chunk(n, self._rank, self._size)
        if hi > lo:
            others = [s[lo:hi] for q, s in enumerate(slots) if q != self._rank]
            reduce_n([mine[lo:hi], *others], out=mine[lo:hi])
        cross = self._cross
        if cross is not None:  # every rank calls it: chunks are empty alike on all nodes
            chunk, mpi = mine[lo:hi], self._mpi
            wait.blocking(lambda: cross.Allreduce(mpi.IN_PLACE, chunk, mpi.SUM),  # wait-ok: watchdog
                          lambda: cross.Iallreduce(mpi.IN_PLACE, chunk, mpi.SUM),
                          "all-reduce across nodes")
        wait.blocking(node.Barrier, node.Ibarrier, "shared-memory barrier after the reduce")
        for q, slot in enumerate(slots):
            lo, hi = _chunk(n, q, self._size)
            flat[lo:hi] = slot[lo:hi]
        # Nobody may overwrite a slot while another rank still copies its chunk out.
        wait.blocking(node.Barrier, node.Ibarrier, "shared-memory barrier after the copy-out")
        return buf

    def free(self) -> None:
        if self._window is not None:
            self._slots = []
            self._window.Free()
            self._window = None
            self._capacity = 0


def _chunk(n: int, index: int, parts: int) -> tuple[int, int]:
    return n * index // parts, n * (index + 1) // parts
