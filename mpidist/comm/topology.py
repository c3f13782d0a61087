"""Topology: where the ranks of a communicator run.

Built once, collectively, from a communicator: this rank's place in it, the ranks that share
its node's memory (``Split_type(COMM_TYPE_SHARED)``), the host of every rank, the index of its
node, and, when every node holds the same number of ranks, the communicator of the ranks with
this local rank on every node (the cross-node step of the hierarchical all-reduce).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["Topology"]


class Topology:
    """Who runs where, for the ranks of ``comm``.

    Creating one is collective over ``comm``. It owns the node and cross-node communicators it
    splits off; ``free`` releases them.

    Args:
        mpi: The ``mpi4py.MPI`` module.
        comm: The communicator whose ranks are described.

    Attributes:
        rank, size: This rank and the number of ranks of ``comm``.
        node: Communicator of the ranks on this node (sharing its memory).
        local_rank, local_size: This rank's place in ``node``, and its size.
        node_ranks: The rank in ``comm`` of each rank of ``node``, in node-rank order.
        hosts: The processor name of every rank, in rank order.
        node_index, num_nodes: This node's index (nodes ordered by their lowest rank), and
            how many nodes there are.
        uniform: Whether every node holds the same number of ranks.
        cross: Communicator of the ranks with this local rank on every node; None on a
            single node, or when the nodes are not uniform.
    """

    def __init__(self, mpi: Any, comm: MPI.Comm) -> None:
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.node: MPI.Comm = comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank: int = self.node.Get_rank()
        self.local_size: int = self.node.Get_size()
        # Blocking collectives are safe here: callers build a Topology on a communicator made
        # once every rank had arrived (``arrival.private_duplicate``).
        self.node_ranks: tuple[int, ...] = tuple(self.node.allgather(self.rank))  # wait-ok: arrived
        leader = min(self.node_ranks)  # a node is known by its lowest rank
        facts = comm.allgather((mpi.Get_processor_name(), self.local_size, leader))  # wait-ok: arrived
        self.hosts: list[str] = [host for host, _, _ in facts]
        leaders = sorted({node_leader for _, _, node_leader in facts})
        self.node_index: int = leaders.index(leader)
        self.num_nodes: int = len(leaders)
        self.uniform: bool = len({local_size for _, local_size, _ in facts}) == 1
        self.cross: MPI.Comm | None = comm.Split(self.local_rank, self.rank) \
            if self.num_nodes > 1 and self.uniform else None

    def free(self) -> None:
        """Release the communicators split off (before MPI_Finalize)."""
        for comm in (self.cross, self.node):
            if comm is not None:
                comm.Free()
