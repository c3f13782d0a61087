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


def segment(directory, name, age=60.0, mode=0o600):
    path = directory / name
    path.write_bytes(b"\0" * 4096)
    path.chmod(mode)  # MPICH's: 0600
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_stale_segments_go_and_young_mapped_or_foreign_ones_stay(shm, monkeypatch):
    stale = segment(shm, "mpich_shm_1234_0")
    ucx = segment(shm, "ucx_posix_77")
    young = segment(shm, "mpich_shm_5678_0", age=0.1)  # a starting job's, not yet mapped
    other = segment(shm, "not-mpi-at-all")
    in_use = segment(shm, "mpich_shm_9999_0")
    monkeypatch.setattr(leftovers, "usage", lambda: leftovers.Usage(names={"mpich_shm_9999_0"}))
    cleared = leftovers.clear_stale()
    assert sorted(cleared.removed) == sorted([str(stale), str(ucx)])
    assert young.exists() and other.exists() and in_use.exists()
    assert cleared.message() is None


def test_a_segment_this_process_maps_is_seen_as_mapped():
    if not os.path.isdir("/dev/shm"):  # /proc/self/maps names the real /dev/shm only
        pytest.skip("no /dev/shm")
    real = leftovers.SHM / f"mpich_shm_test_{os.getpid()}_0"
    real.write_bytes(b"\0" * 4096)
    real.chmod(0o600)  # as MPICH creates them: its owner's alone
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
    monkeypatch.setattr(leftovers, "usage", lambda: leftovers.Usage(names={"mpich_shm_bbbb_0"}))
    cleared = leftovers.clear_unused({"mpich_shm_aaaa_0", "mpich_shm_bbbb_0", "mpich_gone_0",
                                      "mpich_shm_cccc_0"})
    assert cleared.removed == [str(mine)] and shared.exists() and starting.exists()


def test_what_cannot_be_removed_is_named_with_the_fix(shm, monkeypatch):
    stuck = shm / "mpich_shm_dir_0"
    stuck.mkdir()  # unlink fails on a directory: stands for a file we may not remove
    then = time.time() - 60
    os.utime(stuck, (then, then))
    monkeypatch.setattr(leftovers, "usage", leftovers.Usage)
    message = leftovers.clear_stale().message()
    assert message is not None and str(stuck) in message
    assert "fails in MPI_Init" in message and "Remove these files" in message


# -- failing closed ---------------------------------------------------------------------------
def test_nothing_goes_when_a_process_of_this_user_cannot_be_seen(shm, monkeypatch):
    stale = segment(shm, "mpich_shm_1234_0")
    monkeypatch.setattr(leftovers, "usage", lambda: leftovers.Usage(complete=False))
    assert leftovers.clear_stale().removed == [] and stale.exists()
    assert leftovers.clear_unused({stale.name}).removed == [] and stale.exists()


def test_a_segment_others_may_open_stays_while_their_processes_are_hidden(shm, monkeypatch):
    private = segment(shm, "mpich_shm_1111_0")
    shared = segment(shm, "mpich_shm_2222_0", mode=0o644)
    monkeypatch.setattr(leftovers, "usage", lambda: leftovers.Usage(others_hidden=True))
    assert leftovers.clear_stale().removed == [str(private)] and shared.exists()
    monkeypatch.setattr(leftovers, "usage", leftovers.Usage)  # every process seen
    assert leftovers.clear_stale().removed == [str(shared)]


def test_an_open_or_mapped_inode_stays_whatever_its_name(shm, monkeypatch):
    """A process may hold the segment open under a name the maps do not show (opened, not
    mapped yet), or mapped after a rename: the inode decides."""
    held = segment(shm, "mpich_shm_3333_0")
    monkeypatch.setattr(leftovers, "usage",
                        lambda: leftovers.Usage(inodes={held.stat().st_ino}))
    assert leftovers.clear_stale().removed == [] and held.exists()


def test_another_user_s_segment_stays_even_for_root(shm, monkeypatch):
    theirs = segment(shm, "mpich_shm_4444_0")
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(theirs, 12345, 12345)
    monkeypatch.setattr(leftovers, "usage", leftovers.Usage)
    assert leftovers.clear_stale().removed == [] and theirs.exists()


def test_a_name_reused_by_a_new_segment_meanwhile_is_not_removed(shm, monkeypatch):
    """Judged unused, then replaced by a new job's segment of the same name before the
    unlink: the inode check keeps the new one."""
    old = segment(shm, "mpich_shm_5555_0")

    def usage_while_a_new_job_starts():
        old.unlink()
        time.sleep(0.05)  # file times tick in jiffies: the new file's change time differs
        segment(shm, old.name, age=60)  # same name; a new inode, or a reused number
        return leftovers.Usage()

    monkeypatch.setattr(leftovers, "usage", usage_while_a_new_job_starts)
    assert leftovers.clear_stale().removed == [] and old.exists()


def test_open_files_count_as_well_as_maps():
    """MPICH opens a segment before it maps it: an open descriptor alone keeps it."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    real = leftovers.SHM / f"mpich_shm_open_{os.getpid()}_0"
    fd = os.open(real, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        seen = leftovers.usage()
        assert real.name in seen.names and real.stat().st_ino in seen.inodes
        assert leftovers.clear_unused({real.name}, grace_seconds=0).removed == []
    finally:
        os.close(fd)
        real.unlink(missing_ok=True)
