"""A real full disk: a 256 KiB tmpfs mounted for the test (root only; skipped elsewhere, saying
why). CheckpointManager.save and Dataset.save that run out of space raise the OSError with its
errno, naming the path and the fix, change nothing in memory, and leave the last save loadable
and the filesystem without their partial files. The same at every write, fsync and close, by
injection, is tests/unit/test_durable_saves.py."""

import errno
import os
import subprocess
import tempfile

import numpy as np
import pytest

import mpidist
from mpidist.data import Dataset
from mpidist.train import Checkpoint, CheckpointManager


@pytest.fixture
def tiny_disk():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tempfile.mkdtemp(prefix="mpidist-tiny-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        os.rmdir(mount)
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", mount], capture_output=True, timeout=30)
        os.rmdir(mount)


def test_a_checkpoint_that_does_not_fit_keeps_the_last_one(tiny_disk):
    directory = os.path.join(tiny_disk, "run")
    x = mpidist.Variable(np.zeros(18000))  # 144 KB: one fits, two do not
    manager = CheckpointManager(Checkpoint(x=x), directory, max_to_keep=1)
    manager.save()
    x.assign(np.ones(18000))
    with pytest.raises(OSError) as info:
        manager.save()
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert f"Saving checkpoint '{directory}/ckpt-2'" in message and "df -h" in message, message
    assert int(manager.checkpoint.save_counter.numpy()) == 1
    assert manager.checkpoints == [os.path.join(directory, "ckpt-1")]
    assert sorted(os.listdir(directory)) == ["checkpoint", "ckpt-1"]
    y = mpidist.Variable(np.ones(18000))
    CheckpointManager(Checkpoint(x=y), directory, max_to_keep=1).restore_or_initialize()
    assert not np.asarray(y.numpy()).any()


def test_a_dataset_that_does_not_fit_keeps_the_last_one(tiny_disk):
    path = os.path.join(tiny_disk, "ds")
    Dataset.range(10).save(path)
    before = sorted(os.listdir(path))
    with pytest.raises(OSError) as info:
        Dataset.from_tensor_slices(np.ones((100, 1000))).save(path)
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert f"Dataset.save to {path!r}" in message and "unchanged" in message, message
    assert sorted(os.listdir(path)) == before
    assert sorted(int(v) for v in Dataset.load(path).as_numpy_iterator()) == list(range(10))
