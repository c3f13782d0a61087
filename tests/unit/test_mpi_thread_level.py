"""The MPI thread level setting as Config reads it (MPIDIST_MPI_THREAD_LEVEL, a typo warned
about) and the shared-memory crossovers. The level mpidist asks MPI for, each case in a fresh
interpreter, is the scenario tests/scenarios/test_mpi_thread_level_requested.py."""

import pytest

from mpidist.config import Config


def test_config_reads_the_level_and_warns_on_a_typo(monkeypatch):
    monkeypatch.setenv("MPIDIST_MPI_THREAD_LEVEL", "Funneled")
    assert Config.from_env().mpi_thread_level == "funneled"
    monkeypatch.setenv("MPIDIST_MPI_THREAD_LEVEL", "many")
    with pytest.warns(RuntimeWarning, match="MPIDIST_MPI_THREAD_LEVEL='many'"):
        assert Config.from_env().mpi_thread_level == "serialized"


def test_config_reads_the_crossovers(monkeypatch):
    monkeypatch.setenv("MPIDIST_SHM_MIN_BYTES_ONE_NODE", "1048576")
    monkeypatch.setenv("MPIDIST_SHM_MIN_BYTES_ACROSS_NODES", "off")
    config = Config.from_env()
    assert config.shm_min_bytes_one_node == 1 << 20
    assert config.shm_min_bytes_across_nodes is None
