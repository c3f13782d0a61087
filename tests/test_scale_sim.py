"""MultiWorkerMirroredStrategy at scale, by simulation (issue 22, item 8): 16 ranks on 4
simulated nodes (MPICH's Hydra, ``-launcher fork -hosts n0,n1,n2,n3 -ppn 4``; the ranks share
memory only within their node, so the job crosses "nodes" through the MPI library's default
transport), started by ``mpidist run``, under a hard timeout.

One launch (16 Python processes on 2 cores start slowly) runs the three phases of
tests/failure_programs/scale_sim.py: exact all-reduce sums in float64 and int64 on every rank,
a collective mismatch caught on every rank with the same message, then a real death (SIGKILL)
of rank 13, on the last node: reported by its guard, and the job ends by itself.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from fault_matrix import ENV, TRANSPORT_VARIABLES, hydra, job_processes
from test_mpi_failures import remove_leaked_mpich_segments  # noqa: F401 - autouse fixture

PROGRAM = Path(__file__).parent / "failure_programs" / "scale_sim.py"
SIZE, NODES, STEPS, VICTIM = 16, 4, 2, 13
LAUNCH_TIMEOUT = 240  # 16 ranks oversubscribe 2 cores: start-up alone takes tens of seconds


def launch(marker):
    hosts = ",".join(f"n{i}" for i in range(NODES))
    cmd = [sys.executable, "-m", "mpidist", "run", "--mpiexec", hydra(), "-launcher", "fork",
           "-hosts", hosts, "-ppn", str(SIZE // NODES), "-n", str(SIZE), "--", sys.executable,
           str(PROGRAM), str(VICTIM), str(STEPS), marker]
    env = {k: v for k, v in os.environ.items() if k not in TRANSPORT_VARIABLES}
    env.update(ENV)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid, _ in job_processes(marker):
            os.kill(pid, signal.SIGKILL)
        return None, proc.communicate()[0]


def test_sixteen_ranks_on_four_nodes():
    marker = f"scale-{os.getpid()}-{time.monotonic_ns()}"
    code, out = launch(marker)
    assert code is not None, f"hung: still running after {LAUNCH_TIMEOUT} s:\n{out}"
    # 1. exact sums: sum over r of (r + 1 + step) = SIZE (SIZE + 1) / 2 + SIZE * step
    for step in range(STEPS):
        exact = SIZE * (SIZE + 1) // 2 + SIZE * step
        for rank in range(SIZE):
            assert f"rank {rank}: step {step} sums {float(exact)!r} {exact}\n" in out, \
                f"rank {rank} step {step}: expected {exact}:\n{out}"
    assert "uneven sums" not in out, out
    # 2. the mismatch: the same message on every rank, naming rank 1 and the shapes
    caught = dict(re.findall(r"rank (\d+): mismatch caught: ([^\n]*)", out))
    assert sorted(map(int, caught)) == list(range(SIZE)), f"not every rank caught it:\n{out}"
    others = ", ".join(str(r) for r in range(SIZE) if r != 1)
    for rank, message in caught.items():
        assert f"(seen on rank {rank}): ranks [{others}] are at collective #" in message, message
        assert "shape=[5]" in message and "ranks [1] are at collective #" in message, message
        assert "shape=[4]" in message and "They differ in: shape." in message, message
    for rank in range(SIZE):
        assert f"rank {rank}: after the mismatch, sum {float(SIZE)!r}" in out, out
    # 3. the death: reported by its guard, the job ends non-zero, nothing left behind
    assert re.search(rf"mpidist: rank {VICTIM} of {SIZE} \(pid \d+ on \S+\) was killed by "
                     r"SIGKILL \(signal 9\)", out), out
    assert code == 128 + signal.SIGKILL, f"mpidist run should exit with rank {VICTIM}'s 137, " \
        f"got {code}:\n{out}"
    assert "must not happen" not in out, out
    time.sleep(1)
    assert not job_processes(marker), job_processes(marker)
