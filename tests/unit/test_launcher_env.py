"""mpidist.launcher_env: what each launcher announces, which variable wins when several are
set, and what is read when none is."""

import re

import pytest

from mpidist import launcher_env
from mpidist.launcher_env import MPIRUN_TASK, SRUN_TASK, Announced

# Every variable launcher_env reads, cleared before each test (and restored after it).
_VARIABLES = sorted(set(
    launcher_env.RANK_VARIABLES + launcher_env.SIZE_VARIABLES + launcher_env.REPORTED_VARIABLES
    + ("SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
       "SLURM_GPUS_PER_TASK", "OMPI_COMM_WORLD_LOCAL_SIZE")))


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _set(monkeypatch, **variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


# -- nothing set --------------------------------------------------------------------------------
def test_a_process_started_alone_announces_nothing():
    assert launcher_env.announced_rank() is None
    assert launcher_env.launcher_rank() is None
    assert launcher_env.announced_size() is None
    assert launcher_env.process_manager_agrees(1) is False
    assert launcher_env.launcher_variables() == {}
    assert launcher_env.in_slurm_allocation() is False
    assert launcher_env.slurm_task_variables() is SRUN_TASK
    assert launcher_env.mpirun_local_size() is None
    assert launcher_env.slurm_gpus_per_task() == 0


def test_an_explicit_mapping_is_read_instead_of_the_environment(monkeypatch):
    _set(monkeypatch, PMI_RANK="5", PMI_SIZE="8")
    assert launcher_env.announced_rank({}) is None
    assert launcher_env.announced_size({"SLURM_NTASKS": "2"}) == ("SLURM_NTASKS", 2)
    assert launcher_env.launcher_variables({"PMI_RANK": "1", "HOME": "/"}) == {"PMI_RANK": "1"}


# -- each launcher --------------------------------------------------------------------------------
@pytest.mark.parametrize("variables,rank,size", [
    ({"PMI_RANK": "1", "PMI_SIZE": "4"}, ("PMI_RANK", 1), ("PMI_SIZE", 4)),  # MPICH's Hydra
    ({"PMIX_RANK": "2"}, ("PMIX_RANK", 2), None),  # a PMIx launcher
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6"},  # Open MPI's mpirun
     ("OMPI_COMM_WORLD_RANK", 3), ("OMPI_COMM_WORLD_SIZE", 6)),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8"},  # srun
     ("SLURM_PROCID", 7), ("SLURM_NTASKS", 8)),
])
def test_each_launcher_announces_rank_and_size(monkeypatch, variables, rank, size):
    _set(monkeypatch, **variables)
    assert launcher_env.announced_rank() == rank
    assert launcher_env.launcher_rank() == rank[1]
    assert launcher_env.announced_size() == size


def test_an_announcement_is_a_named_pair(monkeypatch):
    _set(monkeypatch, PMI_RANK=" 4 ")  # blanks around the number are ignored
    announced = launcher_env.announced_rank()
    assert announced == Announced(variable="PMI_RANK", value=4)
    name, value = announced
    assert (name, value) == ("PMI_RANK", 4)


def test_values_that_are_not_whole_numbers_are_skipped(monkeypatch):
    _set(monkeypatch, PMI_RANK="", PMIX_RANK="-1", OMPI_COMM_WORLD_RANK="x", SLURM_PROCID="2")
    assert launcher_env.announced_rank() == ("SLURM_PROCID", 2)
    _set(monkeypatch, SLURM_STEP_NUM_TASKS="4.0", SLURM_NTASKS="3")
    assert launcher_env.announced_size() == ("SLURM_NTASKS", 3)


# -- precedence -----------------------------------------------------------------------------------
def test_rank_precedence_process_manager_before_slurm(monkeypatch):
    _set(monkeypatch, SLURM_PROCID="0", OMPI_COMM_WORLD_RANK="1", PMIX_RANK="2", PMI_RANK="3")
    assert launcher_env.announced_rank() == ("PMI_RANK", 3)
    monkeypatch.delenv("PMI_RANK")
    assert launcher_env.announced_rank() == ("PMIX_RANK", 2)
    monkeypatch.delenv("PMIX_RANK")
    assert launcher_env.announced_rank() == ("OMPI_COMM_WORLD_RANK", 1)
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    assert launcher_env.announced_rank() == ("SLURM_PROCID", 0)


def test_size_precedence_the_slurm_step_before_the_job(monkeypatch):
    _set(monkeypatch, PMI_SIZE="1", OMPI_COMM_WORLD_SIZE="2", SLURM_NTASKS="4",
         SLURM_STEP_NUM_TASKS="3")
    assert launcher_env.announced_size() == ("SLURM_STEP_NUM_TASKS", 3)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    assert launcher_env.announced_size() == ("SLURM_NTASKS", 4)
    monkeypatch.delenv("SLURM_NTASKS")
    assert launcher_env.announced_size() == ("OMPI_COMM_WORLD_SIZE", 2)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    assert launcher_env.announced_size() == ("PMI_SIZE", 1)


@pytest.mark.parametrize("variables,size,agrees", [
    ({"PMI_SIZE": "2", "SLURM_NTASKS": "4"}, 2, True),  # mpiexec -n 2 in a 4-task allocation
    ({"OMPI_COMM_WORLD_SIZE": " 2 "}, 2, True),
    ({"PMI_SIZE": "4"}, 2, False),
    ({"SLURM_NTASKS": "2"}, 2, False),  # Slurm's count is not the process manager's
])
def test_process_manager_agrees(monkeypatch, variables, size, agrees):
    _set(monkeypatch, **variables)
    assert launcher_env.process_manager_agrees(size) is agrees


# -- reports and mpidist run ----------------------------------------------------------------------
def test_launcher_variables_keep_the_report_order(monkeypatch):
    _set(monkeypatch, PMI_SIZE="2", SLURM_JOB_ID="77", PMI_RANK="0", MPI_LOCALRANKID="0",
         OTHER_VARIABLE="x")
    assert list(launcher_env.launcher_variables().items()) == [
        ("SLURM_JOB_ID", "77"), ("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "0")]


@pytest.mark.parametrize("value,inside", [("123", True), ("", False)])
def test_in_slurm_allocation(monkeypatch, value, inside):
    _set(monkeypatch, SLURM_JOB_ID=value)
    assert launcher_env.in_slurm_allocation() is inside


# -- a Slurm step's task ------------------------------------------------------------------------
def test_srun_task(monkeypatch):
    _set(monkeypatch, SLURM_PROCID="3", SLURM_STEP_NUM_TASKS="4", SLURM_LOCALID="1")
    task = launcher_env.slurm_task_variables()
    assert task is SRUN_TASK
    assert (task.rank(), task.size(), task.local_rank()) == (3, 4, 1)


def test_mpirun_task_wins_over_slurm_variables(monkeypatch):
    _set(monkeypatch, SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID="0",
         OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="1",
         OMPI_COMM_WORLD_LOCAL_SIZE="4")
    task = launcher_env.slurm_task_variables()
    assert task is MPIRUN_TASK
    assert (task.rank(), task.size(), task.local_rank()) == (5, 8, 1)
    assert launcher_env.mpirun_local_size() == 4


def test_task_local_rank_is_none_when_unset(monkeypatch):
    _set(monkeypatch, SLURM_PROCID="0")
    assert SRUN_TASK.local_rank() is None


@pytest.mark.parametrize("task,message", [
    (SRUN_TASK, "SLURM_PROCID not found in environment. Not running inside a SLURM step?"),
    (MPIRUN_TASK,
     "OMPI_COMM_WORLD_RANK not found in environment. Not running under mpirun?"),
])
def test_a_missing_task_variable_names_it(task, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        task.rank()


def test_a_task_variable_that_is_not_an_integer(monkeypatch):
    _set(monkeypatch, SLURM_PROCID="one", SLURM_LOCALID="1.5", OMPI_COMM_WORLD_LOCAL_SIZE="x")
    with pytest.raises(ValueError, match=re.escape(
            "The environment variable SLURM_PROCID='one' is not an integer.")):
        SRUN_TASK.rank()
    with pytest.raises(ValueError, match=re.escape(
            "The environment variable SLURM_LOCALID='1.5' is not an integer.")):
        SRUN_TASK.local_rank()
    with pytest.raises(ValueError, match=re.escape(
            "The environment variable OMPI_COMM_WORLD_LOCAL_SIZE='x' is not an integer.")):
        launcher_env.mpirun_local_size()


def test_step_layout_variables(monkeypatch):
    for read, name in ((launcher_env.step_nodelist, "SLURM_STEP_NODELIST"),
                       (launcher_env.step_tasks_per_node, "SLURM_STEP_TASKS_PER_NODE")):
        with pytest.raises(RuntimeError, match=re.escape(
                f"{name} not found in environment. Not running inside a SLURM step?")):
            read()
    _set(monkeypatch, SLURM_STEP_NODELIST="n[01-02]", SLURM_STEP_TASKS_PER_NODE="2(x2)")
    assert launcher_env.step_nodelist() == "n[01-02]"
    assert launcher_env.step_tasks_per_node() == "2(x2)"


@pytest.mark.parametrize("value,gpus", [("2", 2), (" 1 ", 1), ("0", 0), ("", 0), ("2(x2)", 0)])
def test_slurm_gpus_per_task(monkeypatch, value, gpus):
    _set(monkeypatch, SLURM_GPUS_PER_TASK=value)
    assert launcher_env.slurm_gpus_per_task() == gpus


def test_a_batch_script_that_ran_python_without_srun_is_told_to_use_srun():
    """Inside a job but not a step (SLURM_JOB_ID and SLURM_PROCID set, no SLURM_STEP_*): TF's
    message, then what happened and the fix."""
    environ = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0"}
    with pytest.raises(RuntimeError) as info:
        SRUN_TASK.size(environ)
    text = str(info.value)
    assert text.startswith("SLURM_STEP_NUM_TASKS not found in environment. Not running inside "
                           "a SLURM step?")
    assert "Slurm job 77 but not in a step" in text and "srun --mpi=pmi2 -n N" in text
    assert "MPIClusterResolver" in text
