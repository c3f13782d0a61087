"""Runs every tests/mpi/test_*.py under ``mpiexec -n N`` for N in 1, 2, 4, and once more as 4
ranks on two simulated nodes (2 x 2: ``mpiexec -launcher fork -hosts n0,n1 -ppn 2``, see
mpi_launch.py), where the all-reduce goes hierarchical and the board is exchanged by message.

One launch per (file, layout), so a hang or a failure points at one file and one layout.
Inside, each test also has pytest-timeout's limit; the launch as a whole is killed after
LAUNCH_TIMEOUT seconds and reported as a hang.
"""

import json
from pathlib import Path

import pytest

from mpi_launch import launch

MPI_TESTS = sorted((Path(__file__).parent / "mpi").glob("test_*.py"))
LAUNCH_TIMEOUT = 240
PER_TEST_TIMEOUT = 60


# (ranks, simulated nodes)
LAYOUTS = [(1, 1), (2, 1), (4, 1), (4, 2)]


@pytest.mark.parametrize("path", MPI_TESTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("nprocs,nodes", LAYOUTS,
                         ids=[str(n) if k == 1 else f"{n}on{k}nodes" for n, k in LAYOUTS])
def test_mpi_file(path, nprocs, nodes, tmp_path):
    argv = ["-m", "mpi4py", "-m", "pytest", str(path), "--with-mpi", "-q", "-p", "no:cacheprovider",
            f"--timeout={PER_TEST_TIMEOUT}", "-W", "error::pytest.PytestUnraisableExceptionWarning"]
    env = {"MPIDIST_TEST_NPROCS": str(nprocs), "MPIDIST_TEST_RESULTS_DIR": str(tmp_path)}
    if nodes > 1:
        env["MPIDIST_TEST_NODES"] = str(nodes)
    code, out = launch(nprocs, argv, LAUNCH_TIMEOUT, env, nodes=nodes)
    where = f"-n {nprocs}" + (f" on {nodes} simulated nodes" if nodes > 1 else "")
    assert code is not None, (
        f"mpiexec {where} {path.name} did not finish within {LAUNCH_TIMEOUT}s (a hang); "
        f"output so far:\n{out}"
    )
    assert code == 0, f"mpiexec {where} {path.name} exited with {code}:\n{out}"
    reports = sorted(tmp_path.glob("rank-*.json"))
    assert len(reports) == nprocs, f"expected a result from each of {nprocs} ranks:\n{out}"
    for report in reports:
        counts = json.loads(report.read_text())
        assert counts["failed"] == 0 and counts["error"] == 0, f"{report.name}: {counts}\n{out}"
        assert counts["passed"] > 0, f"{report.name} ran no test: {counts}\n{out}"
