"""MPI's shared memory left in /dev/shm by killed jobs (``mpidist.launch.leftovers``): stale
segments go before a program starts, a dead program's go once nothing maps them, and what
cannot be removed is named with the fix. /dev/shm is a temporary directory here; the real one
is checked by the launch tests (tests/test_real_faults.py and tests/slurm)."""

import mmap
import os
import time

import pytest

from mpidist.launch import leftovers


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setattr(leftovers, "SHM", tmp_path)
    return tmp_path


def segment(directory, name, age=60.0):
    path = directory / name
    path.write_bytes(b"\0" * 4096)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_stale_segments_go_and_young_mapped_or_foreign_ones_stay(shm, monkeypatch):
    stale = segment(shm, "mpich_shm_1234_0")
    ucx = segment(shm, "ucx_posix_77")
    young = segment(shm, "mpich_shm_5678_0", age=0.1)  # a starting job's, not yet mapped
    other = segment(shm, "not-mpi-at-all")
    in_use = segment(shm, "mpich_shm_9999_0")
    monkeypatch.setattr(leftovers, "mapped_segments", lambda: {"mpich_shm_9999_0"})
    cleared = leftovers.clear_stale()
    assert sorted(cleared.removed) == sorted([str(stale), str(ucx)])
    assert young.exists() and other.exists() and in_use.exists()
    assert cleared.message() is None


def test_a_segment_this_process_maps_is_seen_as_mapped():
    if not os.path.isdir("/dev/shm"):  # /proc/self/maps names the real /dev/shm only
        pytest.skip("no /dev/shm")
    real = leftovers.SHM / f"mpich_shm_test_{os.getpid()}_0"
    real.write_bytes(b"\0" * 4096)
    try:
        with open(real, "r+b") as f, mmap.mmap(f.fileno(), 4096):
            assert real.name in leftovers.segments_mapped_by(os.getpid())
            assert real.name in leftovers.mapped_segments()
            assert real.name not in leftovers.clear_unused({real.name}).removed
            assert real.exists()
        assert leftovers.clear_unused({real.name}, grace_seconds=0).removed == [str(real)]
        assert not real.exists()
    finally:
        real.unlink(missing_ok=True)


def test_a_dead_programs_segments_go_once_nothing_maps_them(shm, monkeypatch):
    mine = segment(shm, "mpich_shm_aaaa_0", age=5)
    shared = segment(shm, "mpich_shm_bbbb_0", age=5)
    starting = segment(shm, "mpich_shm_cccc_0", age=0.1)  # a new job's, not yet mapped
    monkeypatch.setattr(leftovers, "mapped_segments", lambda: {"mpich_shm_bbbb_0"})
    cleared = leftovers.clear_unused({"mpich_shm_aaaa_0", "mpich_shm_bbbb_0", "mpich_gone_0",
                                      "mpich_shm_cccc_0"})
    assert cleared.removed == [str(mine)] and shared.exists() and starting.exists()


def test_what_cannot_be_removed_is_named_with_the_fix(shm, monkeypatch):
    stuck = shm / "mpich_shm_dir_0"
    stuck.mkdir()  # unlink fails on a directory: stands for a file we may not remove
    then = time.time() - 60
    os.utime(stuck, (then, then))
    monkeypatch.setattr(leftovers, "mapped_segments", set)
    message = leftovers.clear_stale().message()
    assert message is not None and str(stuck) in message
    assert "fails in MPI_Init" in message and "Remove these files" in message
