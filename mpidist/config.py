"""Runtime configuration: the one place that reads ``MPIDIST_*`` environment variables.

Precedence everywhere is: explicit argument > environment variable > default.
"""

import dataclasses
import os
import warnings

__all__ = ["Config", "get_config"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_bool(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    warnings.warn(
        f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off. "
        f"Using the default {default}.",
        RuntimeWarning,
        stacklevel=3,
    )
    return default


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings read once from the environment.

    Attributes:
        log_level: ``MPIDIST_LOG`` (``""`` = silent, ``info``, ``debug``).
        gpu_aware_mpi: ``MPIDIST_GPU_AWARE_MPI``: hand device buffers straight to MPI.
    """

    log_level: str = ""
    gpu_aware_mpi: bool = False

    @classmethod
    def from_env(cls):
        return cls(
            log_level=os.environ.get("MPIDIST_LOG", "").strip().lower(),
            gpu_aware_mpi=_env_bool("MPIDIST_GPU_AWARE_MPI", False),
        )


_config = None


def get_config():
    """The process-wide Config, read from the environment on first use."""
    global _config
    if _config is None:
        _config = Config.from_env()
    return _config
