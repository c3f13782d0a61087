"""All-gathers of 1-D host buffers whose length differs from rank to rank.

The data travels as buffers, never pickled: the ranks first gather every rank's length, then
the data with ``Iallgatherv``. Both requests complete through the collective's Waiter, so a
lost peer becomes a timeout instead of a hang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpidist.comm.deadlines import Waiter

__all__ = ["all_gather_varying", "all_gather_bytes"]


def all_gather_varying(comm: MPI.Comm, flat: npt.NDArray[Any], wait: Waiter
                       ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Every rank's 1-D ``flat`` (sizes may differ) concatenated in rank order:
    ``(result, counts, displacements)``."""
    counts = np.zeros(comm.Get_size(), dtype=np.int64)
    wait(comm.Iallgather(np.array([flat.size], dtype=np.int64), counts), "all-gather of sizes")
    out = np.empty(int(counts.sum()), dtype=flat.dtype)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    wait(comm.Iallgatherv(flat, [out, (counts.tolist(), displs.tolist())]), "all-gather")
    return out, counts, displs


def all_gather_bytes(comm: MPI.Comm, payload: npt.NDArray[np.uint8], wait: Waiter
                     ) -> list[npt.NDArray[np.uint8]]:
    """Every rank's ``payload`` (bytes as a uint8 array), one array per rank in rank order."""
    if comm.Get_size() == 1:
        return [payload]
    out, counts, displs = all_gather_varying(comm, payload, wait)
    return [out[d:d + c] for d, c in zip(displs, counts)]
