"""What the launcher told this process: the one reader of launcher environment variables.

Launchers announce a process's place in the job through environment variables before MPI
starts: MPICH's mpiexec (Hydra) sets ``PMI_RANK``/``PMI_SIZE``, a PMIx launcher
``PMIX_RANK``, Open MPI's mpirun ``OMPI_COMM_WORLD_*``, Slurm's srun ``SLURM_*``. mpidist
reads them where MPI cannot answer yet or cannot answer at all: the rank in a log line or an
error before MPI runs, the check that MPI sees the job the launcher started
(``mpidist.comm.mpi.check_launch``), the launcher ``mpidist run`` picks, the report of a dead
rank, and the cluster ``SlurmClusterResolver`` builds. Every such read is here, so which
variable wins when several are set is decided in one place. Once MPI runs, its own numbering
wins over all of them.

``config.py`` reads mpidist's own ``MPIDIST_*`` settings; this module reads only what
launchers set. Every function reads ``os.environ`` at call time, or the mapping given as
``environ`` (tests pass a dict).
"""

import dataclasses
import os
from collections.abc import Mapping
from typing import NamedTuple

__all__ = [
    "RANK_VARIABLES", "SIZE_VARIABLES", "PROCESS_MANAGER_SIZE_VARIABLES", "REPORTED_VARIABLES",
    "Announced", "announced_rank", "launcher_rank", "announced_size", "process_manager_agrees",
    "launcher_variables", "in_slurm_allocation",
    "TaskVariables", "SRUN_TASK", "MPIRUN_TASK", "slurm_task_variables", "step_nodelist",
    "step_tasks_per_node", "mpirun_local_size", "slurm_gpus_per_task",
]

Environ = Mapping[str, str]

# A process's rank, in the order they are trusted: the process manager that started this very
# process first, Slurm's task id (which an mpiexec inside an allocation does not reset) last.
RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")

# The number of tasks a launcher started. Under Slurm the step's own count wins over the
# job's (``srun -n 2`` in a 4-task job).
SIZE_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

# Sizes set by the process manager that started this very process (never inherited from an
# enclosing Slurm job).
PROCESS_MANAGER_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

# What ``mpidist info`` shows of the launcher, in this order (shown, never trusted over MPI).
REPORTED_VARIABLES = (
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NUM_NODES", "PMI_RANK", "PMI_SIZE",
    "PMIX_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
)

_IN_A_SLURM_STEP = "inside a SLURM step"


def _read(environ: Environ | None) -> Environ:
    return os.environ if environ is None else environ


class Announced(NamedTuple):
    """A number a launcher announced, and the variable it came in (a tuple: ``name, n = ...``)."""

    variable: str
    value: int


def _first_number(names: tuple[str, ...], environ: Environ | None) -> Announced | None:
    """The first of ``names`` whose value is a whole number (blanks around it ignored)."""
    environ = _read(environ)
    for name in names:
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return Announced(name, int(raw))
    return None


def announced_rank(environ: Environ | None = None) -> Announced | None:
    """This process's rank as its launcher announced it (``RANK_VARIABLES``), or None when no
    launcher started it."""
    return _first_number(RANK_VARIABLES, environ)


def launcher_rank(environ: Environ | None = None) -> int | None:
    """``announced_rank``'s number alone, or None."""
    announced = announced_rank(environ)
    return None if announced is None else announced.value


def announced_size(environ: Environ | None = None) -> Announced | None:
    """How many tasks the launcher started (``SIZE_VARIABLES``, the first that holds a
    number), or None."""
    return _first_number(SIZE_VARIABLES, environ)


def process_manager_agrees(size: int, environ: Environ | None = None) -> bool:
    """True when the process manager that started this process announced exactly ``size``
    tasks (e.g. ``mpiexec -n 2`` inside a 4-task Slurm allocation says 2)."""
    environ = _read(environ)
    return any(environ.get(name, "").strip() == str(size)
               for name in PROCESS_MANAGER_SIZE_VARIABLES)


def launcher_variables(environ: Environ | None = None) -> dict[str, str]:
    """``{name: value}`` of the ``REPORTED_VARIABLES`` that are set, for a report."""
    environ = _read(environ)
    return {name: environ[name] for name in REPORTED_VARIABLES if name in environ}


def in_slurm_allocation(environ: Environ | None = None) -> bool:
    """True inside a Slurm allocation (``SLURM_JOB_ID`` set and not empty)."""
    return bool(_read(environ).get("SLURM_JOB_ID"))


# -- a Slurm step's task, for SlurmClusterResolver ---------------------------------------------
def _required(name: str, where: str, environ: Environ | None) -> str:
    environ = _read(environ)
    try:
        return environ[name]
    except KeyError:
        fix = ""
        if where == _IN_A_SLURM_STEP:
            inside = "This process runs in Slurm job {} but not in a step (a batch script " \
                "that ran python itself). ".format(environ["SLURM_JOB_ID"]) \
                if environ.get("SLURM_JOB_ID") else ""
            fix = (f" {inside}SlurmClusterResolver reads the step srun starts: launch each task "
                   "with srun (srun --mpi=pmi2 -n N python train.py; in a batch script, srun "
                   "before python), or keep MPIClusterResolver, the default, under mpiexec.")
        raise RuntimeError(f"{name} not found in environment. Not running {where}?{fix}") \
            from None


def _integer(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"The environment variable {name}={raw!r} is not an integer.") from None


@dataclasses.dataclass(frozen=True)
class TaskVariables:
    """The variables that place this task in a Slurm step, and how errors name the launcher.

    Under srun they are Slurm's own (``SRUN_TASK``); when Open MPI's mpirun started the task
    inside an allocation (``MPIRUN_TASK``) the step describes mpirun's daemons, and the
    task's rank, count and local rank are Open MPI's.
    """

    rank_variable: str
    size_variable: str
    local_rank_variable: str
    where: str  # the end of "<VARIABLE> not found in environment. Not running <where>?"

    def rank(self, environ: Environ | None = None) -> int:
        """This task's rank; RuntimeError when unset, ValueError when not an integer."""
        return _integer(self.rank_variable, _required(self.rank_variable, self.where, environ))

    def size(self, environ: Environ | None = None) -> int:
        """The number of tasks; RuntimeError when unset, ValueError when not an integer."""
        return _integer(self.size_variable, _required(self.size_variable, self.where, environ))

    def local_rank(self, environ: Environ | None = None) -> int | None:
        """This task's index on its node, or None when unset (ValueError when not an integer)."""
        environ = _read(environ)
        if self.local_rank_variable not in environ:
            return None
        return _integer(self.local_rank_variable, environ[self.local_rank_variable])


SRUN_TASK = TaskVariables("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                          _IN_A_SLURM_STEP)
MPIRUN_TASK = TaskVariables("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "under mpirun")


def slurm_task_variables(environ: Environ | None = None) -> TaskVariables:
    """``MPIRUN_TASK`` when Open MPI's mpirun started this process (``OMPI_COMM_WORLD_RANK``
    set), else ``SRUN_TASK``."""
    return MPIRUN_TASK if "OMPI_COMM_WORLD_RANK" in _read(environ) else SRUN_TASK


def step_nodelist(environ: Environ | None = None) -> str:
    """``SLURM_STEP_NODELIST``, the step's compressed host list; RuntimeError when unset."""
    return _required("SLURM_STEP_NODELIST", _IN_A_SLURM_STEP, environ)


def step_tasks_per_node(environ: Environ | None = None) -> str:
    """``SLURM_STEP_TASKS_PER_NODE`` (e.g. ``"3(x2),2"``); RuntimeError when unset."""
    return _required("SLURM_STEP_TASKS_PER_NODE", _IN_A_SLURM_STEP, environ)


def mpirun_local_size(environ: Environ | None = None) -> int | None:
    """``OMPI_COMM_WORLD_LOCAL_SIZE``, the tasks mpirun started on this node, or None when
    unset (ValueError when not an integer)."""
    environ = _read(environ)
    if "OMPI_COMM_WORLD_LOCAL_SIZE" not in environ:
        return None
    return _integer("OMPI_COMM_WORLD_LOCAL_SIZE", environ["OMPI_COMM_WORLD_LOCAL_SIZE"])


def slurm_gpus_per_task(environ: Environ | None = None) -> int:
    """``SLURM_GPUS_PER_TASK`` (``srun --gpus-per-task``) as a number; 0 when unset or not a
    whole number."""
    raw = _read(environ).get("SLURM_GPUS_PER_TASK", "").strip()
    return int(raw) if raw.isdigit() else 0
