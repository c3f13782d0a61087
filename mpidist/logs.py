"""mpidist's log lines: silent by default, rank-prefixed when on.

Every module logs to a child of the ``mpidist`` logger. ``MPIDIST_LOG=info`` (or ``debug``)
turns on lines like::

    [mpidist 1/4 node0] INFO mpidist.comm: communicator ready: rank 1 of 4, local rank 1 of 4

Without it only warnings print (a stalled collective, a launch problem), with the same prefix.
The rank comes from the communicator once it exists, before that from the launcher's
environment (PMI_RANK, PMIX_RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID: see
``mpidist.launcher_env``).
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any

from mpidist.config import get_config
from mpidist.launcher_env import launcher_rank

__all__ = ["get_logger", "set_rank"]

_LEVELS = {"": logging.WARNING, "warning": logging.WARNING, "info": logging.INFO,
           "debug": logging.DEBUG}
_state: dict[str, Any] = {"configured": False, "rank": None, "size": None}


def set_rank(rank: int | None, size: int | None) -> None:
    """Called by the communicator: the rank and job size shown in every line from now on."""
    _state["rank"], _state["size"] = rank, size


class _RankFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._host = socket.gethostname().split(".")[0]

    def filter(self, record: logging.LogRecord) -> bool:
        rank = _state["rank"] if _state["rank"] is not None else launcher_rank()
        size = _state["size"]
        label = "?" if rank is None else str(rank) if size is None else f"{rank}/{size}"
        record.mpidist_prefix = f"[mpidist {label} {self._host}]"
        return True


def _configure() -> None:
    logger = logging.getLogger("mpidist")
    level_name = get_config().log_level
    level = _LEVELS.get(level_name)
    if level is None:
        level = logging.WARNING
        print(f"mpidist: MPIDIST_LOG={level_name!r} is not one of info, debug, warning; "
              "logging warnings only.", file=sys.stderr)
    logger.setLevel(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RankFilter())
    handler.setFormatter(logging.Formatter("%(mpidist_prefix)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    _state["configured"] = True


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` (under ``mpidist``), with mpidist's handler installed once."""
    if not _state["configured"]:
        _configure()
    return logging.getLogger(name)
