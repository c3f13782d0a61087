"""No save is ever lost, by real kills: each save (Checkpoint.write, CheckpointManager.save,
BackupAndRestore and ModelCheckpoint under fit, Dataset.save) is SIGKILLed at each of its file
operations in turn (a forked child, through mpidist.core.durable's seam); after each, the last
published save loads exactly, and a resumed fit ends with the uninterrupted run's weights.
The injected errors (ENOSPC, EIO) are in tests/unit/test_durable_saves.py."""

import os
import shutil

import numpy as np

import mpidist
from mpidist.data import Dataset
from mpidist.train import Checkpoint, CheckpointManager
from save_faults import killed_at, operations, plain, train


def test_checkpoint_write_killed_at_every_operation_keeps_a_whole_file(tmp_path):
    path = str(tmp_path / "ck")
    Checkpoint(w=plain([1.0, 2.0])).write(path)
    ops = operations(lambda: Checkpoint(w=plain([3.0, 4.0])).write(path))
    assert [op for op, _ in ops].count("rename") == 1
    Checkpoint(w=plain([1.0, 2.0])).write(path)
    for k in range(len(ops)):
        assert killed_at(k, lambda: Checkpoint(w=plain([3.0, 4.0])).write(path))
        w = plain([0.0, 0.0])
        Checkpoint(w=w).restore(path)
        published = k > [op for op, _ in ops].index("rename")
        assert w.numpy().tolist() == ([3.0, 4.0] if published else [1.0, 2.0]), k
        Checkpoint(w=plain([1.0, 2.0])).write(path)  # back to the old value for the next k


def test_manager_save_killed_at_every_operation_restores_the_last_published(tmp_path):
    """max_to_keep=1: the save deletes the old checkpoint, after publishing the new state."""
    directory = str(tmp_path / "run")

    def save(value):
        x = plain(0.0)
        manager = CheckpointManager(Checkpoint(x=x), directory, max_to_keep=1)
        manager.restore_or_initialize()
        x.assign(value)
        manager.save()

    def restored():
        x = plain(-1.0)
        CheckpointManager(Checkpoint(x=x), directory, max_to_keep=1).restore_or_initialize()
        return float(x.numpy())

    save(1.0)
    snapshot = {n: (tmp_path / "run" / n).read_bytes() for n in os.listdir(directory)}
    ops = operations(lambda: save(2.0))
    names = [(op, os.path.basename(p)) for op, p in ops]
    state_rename = names.index(("rename", "checkpoint"))
    assert names.index(("unlink", "ckpt-1")) > state_rename  # published before deleting
    for k in range(len(ops)):
        for name in os.listdir(directory):  # the directory as the first save left it
            os.unlink(os.path.join(directory, name))
        for name, data in snapshot.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        assert killed_at(k, lambda: save(2.0))
        assert restored() == (2.0 if k > state_rename else 1.0), (k, ops[k])


def test_backup_killed_at_every_operation_resumes_to_the_uninterrupted_weights(tmp_path):
    reference = train()
    backup_dir = str(tmp_path / "backup")

    def run():
        return train([mpidist.callbacks.BackupAndRestore(backup_dir, save_freq=4)])

    ops = operations(run)
    assert [op for op, _ in ops].count("rename") == 7  # the owner record, 3 backups x 2
    for k in range(len(ops)):
        killed = killed_at(k, run)
        assert killed or k >= len(ops) - 1, k
        for got, want in zip(run(), reference):  # resumes (or starts again) and finishes
            np.testing.assert_array_equal(got, want)
        assert not os.path.exists(backup_dir)


def test_model_checkpoint_killed_at_every_operation_leaves_a_restorable_latest(tmp_path):
    directory = str(tmp_path / "ckpts")

    def run():
        train([mpidist.callbacks.ModelCheckpoint(directory, max_to_keep=1)], epochs=2)

    n = len(operations(run))
    for k in range(n):
        shutil.rmtree(directory, ignore_errors=True)
        assert killed_at(k, run)
        latest = mpidist.train.latest_checkpoint(directory)
        if latest is not None:
            w = mpidist.Variable(np.zeros((2, 1)))  # LinearModel's one weight
            mpidist.train.Checkpoint(model={"trainable": {"0": w}}).restore(latest)


def test_dataset_save_killed_at_every_operation_keeps_a_whole_dataset(tmp_path):
    path = str(tmp_path / "ds")
    Dataset.range(10).save(path)
    old, new = list(range(10)), list(range(100, 117))
    ops = operations(lambda: Dataset.range(100, 117).save(path))
    published = [i for i, (op, p) in enumerate(ops)
                 if op == "rename" and p.endswith("mpidist-dataset.json")]
    assert len(published) == 1
    Dataset.range(10).save(path)
    for k in range(len(ops)):
        assert killed_at(k, lambda: Dataset.range(100, 117).save(path))
        got = sorted(int(v) for v in Dataset.load(path).as_numpy_iterator())
        assert got == (new if k > published[0] else old), (k, ops[k])
        Dataset.range(10).save(path)  # clears what the killed save left, and resets
        shards = [n for n in os.listdir(path) if n.startswith("shard-")]
        assert len({n.split(".", 1)[1].rsplit(".", 1)[0] for n in shards}) == 1, shards
