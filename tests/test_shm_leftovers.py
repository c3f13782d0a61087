"""A killed MPI job leaves none of MPICH's shared memory in /dev/shm when its ranks run under
``mpidist.guard`` (as the batch scripts and ``mpidist run`` start them), and a leftover under
a name the next job reuses is cleared before that job's MPI_Init. Real mpiexec launches."""

import sys
import time
from pathlib import Path

import pytest

from mpi_launch import launch

SHM = Path("/dev/shm")
PROGRAM = """
import os, signal, sys, time
from mpi4py import MPI
world = MPI.COMM_WORLD
world.Barrier()  # every rank has attached MPICH's shared memory
print(f"rank {world.Get_rank()} ready", flush=True)
if world.Get_rank() == int(sys.argv[1]):
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
time.sleep(60)
"""

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")


def segments():
    return {p.name for p in SHM.glob("mpich_*")}


def mapped_by_anyone():
    from mpidist.launch.leftovers import mapped_segments

    return mapped_segments()


@pytest.mark.parametrize("victim,how", [(1, "SIGKILL"), (0, "SIGTERM"), (1, "SIGSEGV")])
def test_a_killed_job_leaves_no_shared_memory(tmp_path, victim, how):
    program = tmp_path / "killed.py"
    program.write_text(PROGRAM)
    before = segments()
    code, out = launch(2, ["-m", "mpidist.guard", "--", sys.executable, str(program),
                           str(victim), how], 120)
    assert code is not None, f"hung:\n{out}"  # (gforker may say 0 for a killed rank)
    assert out.count("ready") == 2, out
    deadline = time.monotonic() + 40  # the detached cleaner waits for the ranks to go
    while time.monotonic() < deadline:
        left = segments() - before - mapped_by_anyone()  # (other tests' live jobs may run)
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"left in /dev/shm after the job was killed: {sorted(left)}\n{out}"
