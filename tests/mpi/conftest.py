"""What the tests in this folder share (loaded only by their ``mpiexec`` launches, which pass
``--with-mpi``): a directory every rank sees, and tests/unit's helper modules on sys.path."""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))


@pytest.fixture
def shared_dir():
    """A temporary directory rank 0 makes and every rank is given; removed after the test,
    once every rank is done with it."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="mpidist-ranks-") if comm.rank == 0 else None)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
