"""A strategy that does nothing across ranks, launched on several ranks, warns once.

Under ``mpiexec -n 2``, a MirroredStrategy, OneDeviceStrategy, CentralStorageStrategy or the
default strategy trains each rank alone: every rank computes its own model from its own
data, nothing is averaged across ranks, and the job looks healthy while the ranks silently
diverge. TF behaves the same (these strategies are single-worker), but its users rarely
launch them under MPI by accident; mpidist's users do. The launch size comes from the
launcher's environment (``mpidist.launcher_env``), so the check starts no MPI.
"""

import warnings

from mpidist.launcher_env import announced_size

__all__ = ["warn_if_alone"]

_warned: list[bool] = []


def warn_if_alone(strategy_name: str, stacklevel: int = 3) -> bool:
    """Warn (once per process) when this process is one of several ranks of a launch and
    ``strategy_name`` runs within this process only. True when it warned now."""
    if _warned:
        return False
    launch = announced_size()
    if launch is None or launch.value <= 1:
        return False
    _warned.append(True)
    warnings.warn(
        f"{strategy_name} runs within one process, but this process is one of "
        f"{launch.value} ranks ({launch.variable}={launch.value}): each rank would train its "
        "own copy of the model on its own data, and nothing is combined across ranks. Use "
        "mpidist.MultiWorkerMirroredStrategy() to train one model across the ranks (or "
        "launch one process).", UserWarning, stacklevel=stacklevel)
    return True
