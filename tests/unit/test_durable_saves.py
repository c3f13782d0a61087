"""No save is ever lost: CheckpointManager.save, BackupAndRestore under fit and Dataset.save
made to fail with ENOSPC and EIO at each write, fsync and close (mpidist.core.durable's seam):
each error names the path and the fix, and the last published save loads exactly (a resumed
fit ends with an uninterrupted run's weights). A damaged or missing newest checkpoint falls
back to the newest complete one; concurrent savers of one dataset each publish a whole copy;
a BackupAndRestore directory has one live owner. The kills at every file operation are
tests/scenarios/test_saves_killed_at_every_operation.py."""

import errno
import multiprocessing
import os
import time

import numpy as np
import pytest

import mpidist
from mpidist.core import durable
from mpidist.data import Dataset
from mpidist.train import Checkpoint, CheckpointManager
from mpidist.training.backup_status import describe_backup
from save_faults import count_faultable, failing, operations, plain, train



# -- Checkpoint and CheckpointManager -------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_manager_save_failing_at_every_write_fsync_close_keeps_the_last_save(tmp_path, code):
    directory = str(tmp_path / "run")
    x = plain(1.0)
    manager = CheckpointManager(Checkpoint(x=x), directory, max_to_keep=1)
    manager.save()
    x.assign(2.0)
    probe = CheckpointManager(Checkpoint(x=plain(2.0)), str(tmp_path / "probe"), max_to_keep=1)
    probe.save()
    n = count_faultable(operations(probe.save))
    assert n >= 6
    for k in range(n):
        with durable.inject(failing(k, code)), pytest.raises(OSError) as info:
            manager.save()
        assert info.value.errno == code
        message = str(info.value)
        assert directory in message and os.strerror(code) in message, message
        assert "Nothing was" in message and ("df -h" in message or
                                                       "I/O error" in message), message
        assert int(manager.checkpoint.save_counter.numpy()) == 1  # state unchanged
        assert manager.checkpoints == [os.path.join(directory, "ckpt-1")]
        fresh = plain(0.0)
        CheckpointManager(Checkpoint(x=fresh), directory, max_to_keep=1).restore_or_initialize()
        assert fresh.numpy() == 1.0
    assert manager.save() == os.path.join(directory, "ckpt-2")  # and the next save works


def test_newest_complete_checkpoint_is_restored_and_the_warning_names_the_rest(tmp_path):
    directory = str(tmp_path)
    x = plain(0.0)
    manager = CheckpointManager(Checkpoint(x=x), directory, max_to_keep=3)
    for value in (1.0, 2.0, 3.0):
        x.assign(value)
        manager.save()
    newest = os.path.join(directory, "ckpt-3")
    os.truncate(newest, os.path.getsize(newest) // 2)  # damaged by the storage
    os.unlink(os.path.join(directory, "ckpt-2"))  # and one gone
    fresh = plain(0.0)
    again = CheckpointManager(Checkpoint(x=fresh), directory, max_to_keep=3)
    with pytest.warns(RuntimeWarning, match=r"restored '.*ckpt-1', the newest complete.*"
                                            r"ckpt-3'.*corrupt.*ckpt-2'.*No checkpoint file"):
        assert again.restore_or_initialize() == os.path.join(directory, "ckpt-1")
    assert fresh.numpy() == 1.0
    os.unlink(os.path.join(directory, "ckpt-1"))
    with pytest.raises(mpidist.errors.InvalidArgumentError,
                       match="no checkpoint in .* can be restored.*Nothing was restored"):
        CheckpointManager(Checkpoint(x=fresh), directory, max_to_keep=3).restore_or_initialize()


def test_latest_checkpoint_falls_back_to_a_listed_file_that_is_there(tmp_path):
    x = plain(0.0)
    manager = CheckpointManager(Checkpoint(x=x), str(tmp_path), max_to_keep=2)
    manager.save()
    manager.save()
    os.unlink(tmp_path / "ckpt-2")
    with pytest.warns(RuntimeWarning, match="names .*ckpt-2.*which is gone"):
        assert mpidist.train.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-1")


# -- fit's callbacks --------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_backup_failing_at_every_write_fsync_close_resumes_exactly(tmp_path, code):
    reference = train()
    backup_dir = str(tmp_path / "backup")

    def run():
        return train([mpidist.callbacks.BackupAndRestore(backup_dir, save_freq=4)])

    n = count_faultable(operations(run))
    for k in range(0, n, 3):  # every third: each save's write, fsync and close come round
        with durable.inject(failing(k, code)), pytest.raises(OSError) as info:
            run()
        assert info.value.errno == code and backup_dir in str(info.value), str(info.value)
        for got, want in zip(run(), reference):
            np.testing.assert_array_equal(got, want)


# -- Dataset.save -------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_dataset_save_failing_at_every_write_fsync_close_keeps_the_old(tmp_path, code):
    path = str(tmp_path / "ds")
    Dataset.range(10).save(path)
    before = sorted(os.listdir(path))
    n = count_faultable(operations(lambda: Dataset.range(5).save(str(tmp_path / "probe"))))
    for k in range(n):
        with durable.inject(failing(k, code)), pytest.raises(OSError) as info:
            Dataset.range(100, 117).save(path)
        assert info.value.errno == code
        assert f"Dataset.save to {path!r}" in str(info.value) and "unchanged" in str(info.value)
        assert sorted(os.listdir(path)) == before
        assert sorted(int(v) for v in Dataset.load(path).as_numpy_iterator()) == list(range(10))


def _save_many(path, start, barrier):
    barrier.wait()
    for _ in range(5):
        Dataset.range(start, start + 50).save(path)


def test_concurrent_savers_to_one_path_each_publish_a_whole_dataset(tmp_path):
    """What every rank calling save(path) does: no raw OSError, and the path always holds one
    saver's complete dataset."""
    path = str(tmp_path / "ds")
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_save_many, args=(path, s, barrier)) for s in (0, 1000, 2000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    got = sorted(int(v) for v in Dataset.load(path).as_numpy_iterator())
    assert got in [list(range(s, s + 50)) for s in (0, 1000, 2000)]
    Dataset.range(3).save(path)  # the savers are gone: their files are cleared
    assert len({n.split(".", 1)[1].rsplit(".", 1)[0] for n in os.listdir(path) if n.startswith("shard-")}) == 1


def test_shards_of_another_hosts_save_are_kept_while_fresh_and_cleared_when_abandoned(tmp_path):
    """Another host's unpublished shard files: a save running there now (fresh files: kept,
    and named in a warning), or one killed there (untouched for a day: deleted)."""
    path = tmp_path / "ds"
    Dataset.range(4).save(str(path))
    fresh = path / "shard-00000.elsewhere-77-0a0b0c0d.mpds"
    stale = path / "shard-00003.gone-88-1a1b1c1d.mpds"
    fresh.write_bytes(b"being written")
    stale.write_bytes(b"left by a kill")
    day_ago = time.time() - 25 * 3600
    os.utime(stale, (day_ago, day_ago))
    with pytest.warns(RuntimeWarning, match=r"other save\(s\) running now "
                                            r"\(elsewhere-77-0a0b0c0d: host-pid-id\)"):
        Dataset.range(6).save(str(path))
    assert fresh.exists() and not stale.exists()
    assert sorted(int(v) for v in Dataset.load(str(path)).as_numpy_iterator()) == list(range(6))


# -- one live owner per backup directory -------------------------------------------------------
def _hold(directory, env, ready, stop):
    os.environ.update(env)
    from mpidist.training.backup_owner import claim

    claim(directory)
    ready.set()
    stop.wait(60)


@pytest.fixture
def owner(tmp_path):
    """Start a live owner of a directory (another process) with some Slurm environment."""
    ctx = multiprocessing.get_context("fork")
    started = []

    def start(directory, **env):
        ready, stop = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_hold, args=(directory, env, ready, stop))
        proc.start()
        assert ready.wait(30)
        started.append((proc, stop))
        return proc, stop

    yield start
    for proc, stop in started:
        stop.set()
        proc.join(10)


def test_a_second_live_run_is_refused_naming_the_owner(tmp_path, owner, monkeypatch):
    backup_dir = str(tmp_path / "backup")
    proc, stop = owner(backup_dir, SLURM_JOB_ID="111", SLURM_ARRAY_TASK_ID="0")
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    with pytest.raises(RuntimeError, match=r"backup directory .* is in use by another live "
                                           rf"run: Slurm job 111 \(array task 0\) on host "
                                           rf".*pid {proc.pid}.*MPIDIST_BACKUP_DIR"):
        train([mpidist.callbacks.BackupAndRestore(backup_dir)])
    assert sorted(os.listdir(backup_dir)) == ["owner.json", "owner.lock"]  # nothing touched
    stop.set()
    proc.join(10)  # the owner is gone: a new run takes the directory over
    reference = train()
    for got, want in zip(train([mpidist.callbacks.BackupAndRestore(backup_dir)]), reference):
        np.testing.assert_array_equal(got, want)


def test_a_requeue_of_the_same_job_waits_for_its_predecessor(tmp_path, owner, monkeypatch):
    from mpidist.training import backup_owner

    backup_dir = str(tmp_path / "backup")
    proc, stop = owner(backup_dir, SLURM_JOB_ID="333")
    monkeypatch.setenv("SLURM_JOB_ID", "333")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    import threading

    threading.Timer(0.4, stop.set).start()  # the predecessor ends a moment later
    began = time.monotonic()
    backup_owner.claim(backup_dir)
    try:
        assert 0.3 < time.monotonic() - began < backup_owner.REQUEUE_WAIT_SECONDS
    finally:
        backup_owner.release(backup_dir)


def test_describe_backup_names_the_step(tmp_path):
    backup_dir = tmp_path / "backup"
    assert describe_backup(backup_dir) == f"{backup_dir} (no backup)"
    train([mpidist.callbacks.BackupAndRestore(backup_dir, save_freq=3,
                                              delete_checkpoint=False)], epochs=1)
    assert describe_backup(backup_dir) == f"{backup_dir} (step 3)"  # 5 steps: the last at 3
    (backup_dir / "ckpt-1").write_bytes(b"not a checkpoint")
    assert describe_backup(backup_dir) == f"{backup_dir} (a backup of unknown step)"
