"""Shared test configuration.

Plain ``pytest`` runs the unit tests and, through tests/test_mpi_launch.py, every file in
tests/mpi/ under ``mpiexec -n N``. The files in tests/mpi/ are collected only by those
launches (they run with ``--with-mpi``).
"""

import json
import os
from pathlib import Path

MPI_DIR = Path(__file__).parent / "mpi"


def pytest_ignore_collect(collection_path, config):
    if Path(collection_path).is_relative_to(MPI_DIR) and not config.getoption("--with-mpi", False):
        return True
    return None


def pytest_sessionfinish(session, exitstatus):
    """Under an MPI launch, leave this rank's outcome where the launcher looks for it."""
    results_dir = os.environ.get("MPIDIST_TEST_RESULTS_DIR")
    if not results_dir or not session.config.getoption("--with-mpi", False):
        return
    from mpi4py import MPI  # only under an MPI launch

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {key: len(reporter.stats.get(key, [])) for key in ("passed", "failed", "error", "skipped")}
    counts["exitstatus"] = int(exitstatus)
    path = Path(results_dir) / f"rank-{MPI.COMM_WORLD.Get_rank()}.json"
    path.write_text(json.dumps(counts))


def pytest_report_header(config):
    lines = []
    if config.getoption("--with-mpi", False):
        from mpi4py import MPI  # only under an MPI launch

        comm = MPI.COMM_WORLD
        lines.append(f"MPI vendor: {MPI.get_vendor()}, rank {comm.Get_rank()} of {comm.Get_size()}")
    lines.append(f"MPIDIST_TEST_GPU={os.environ.get('MPIDIST_TEST_GPU', '0')}")
    return lines
