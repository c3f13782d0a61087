"""User mistakes with checkpoints: each raises the error TF would (a builtin or an
mpidist.errors type) with a message that names the offending value and says the fix, and
leaves every variable, the save counter and the files on disk as they were."""

import os

import numpy as np
import pytest

import mpidist
from mpidist.errors import InvalidArgumentError
from mpidist.train import Checkpoint, CheckpointManager, latest_checkpoint
from replicas import mirrored as S


class Box:
    def __init__(self, deps):
        self.deps = deps

    def _checkpoint_dependencies(self):
        return self.deps


def tree(directory):
    """Every file under ``directory`` with its bytes (the state on disk)."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, directory)] = f.read()
    return found


@pytest.fixture
def saved(tmp_path):
    """A saved checkpoint of w = [1, 2, 3], b = 4; then w, b are set to other values."""
    w, b = mpidist.Variable([1.0, 2.0, 3.0], name="w"), mpidist.Variable(4.0, name="b")
    ck = Checkpoint(model=Box({"w": w, "b": b}))
    path = ck.save(str(tmp_path / "run" / "ck"))
    w.assign([7.0, 8.0, 9.0])
    b.assign(0.5)
    return ck, w, b, path, tmp_path / "run"


def unchanged(ck, w, b, directory, before, counter=1):
    assert w.numpy().tolist() == [7.0, 8.0, 9.0] and float(b.numpy()) == 0.5
    assert int(ck.save_counter.numpy()) == counter
    assert tree(directory) == before


def raises(exc_type, *parts):
    """pytest.raises that also checks that every part is in the message."""
    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(exc_type)
            self._info = self._ctx.__enter__()
            return self._info

        def __exit__(self, *exc):
            handled = self._ctx.__exit__(*exc)
            message = str(self._info.value)
            for part in parts:
                assert part in message, f"{part!r} not in: {message}"
            return handled

    return _Check()


# -- restoring the wrong path ---------------------------------------------------------------
def test_restore_a_path_that_does_not_exist(saved):
    ck, w, b, _, directory = saved
    before = tree(directory)
    missing = str(directory / "nothing-here")
    with raises(FileNotFoundError, repr(missing), "pass a path returned by save()",
                "latest_checkpoint(directory)"):
        ck.restore(missing)
    elsewhere = str(directory / "no-such-dir" / "ck-1")
    with raises(FileNotFoundError, repr(elsewhere), "does not exist"):
        ck.restore(elsewhere)
    unchanged(ck, w, b, directory, before)


def test_restore_a_directory(saved):
    ck, w, b, _, directory = saved
    before = tree(directory)
    with raises(IsADirectoryError, repr(str(directory)), "is a directory",
                "latest_checkpoint(directory)"):
        ck.restore(str(directory))
    unchanged(ck, w, b, directory, before)


def test_restore_the_prefix_given_to_save(saved):
    """save('ck') wrote 'ck-1': restoring 'ck' lists it and says how save names files."""
    ck, w, b, path, directory = saved
    before = tree(directory)
    prefix = path[:-2]
    with raises(FileNotFoundError, repr(prefix), "'ck-1'", "save('ck') writes 'ck' + '-<n>'"):
        ck.restore(prefix)
    unchanged(ck, w, b, directory, before)


def test_restore_a_prefix_with_a_typo(saved):
    ck, w, b, _, directory = saved
    before = tree(directory)
    typo = str(directory / "kc-1")
    with raises(FileNotFoundError, repr(typo), "similar names: 'ck-1'"):
        ck.restore(typo)
    unchanged(ck, w, b, directory, before)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint\n", b"PK\x03\x04garbage"])
def test_restore_a_file_that_is_not_a_checkpoint(saved, content):
    ck, w, b, _, directory = saved
    bogus = directory / "bogus"
    bogus.write_bytes(content)
    before = tree(directory)
    with raises(InvalidArgumentError, repr(str(bogus)), "truncated or corrupt",
                "Nothing was restored", "restore an earlier checkpoint"):
        ck.restore(str(bogus))
    unchanged(ck, w, b, directory, before)


def test_restore_an_npz_that_is_not_a_checkpoint(saved):
    ck, w, b, _, directory = saved
    npz = directory / "weights.npz"
    np.savez(npz, w=np.zeros(3))
    before = tree(directory)
    with raises(InvalidArgumentError, repr(str(npz)), "member 'manifest.npy' is missing",
                "restore an earlier checkpoint"):
        ck.restore(str(npz))
    unchanged(ck, w, b, directory, before)


# -- restoring into the wrong objects ------------------------------------------------------
def test_restore_a_checkpoint_of_another_model_shape(saved):
    _, _, _, path, directory = saved
    before = tree(directory)
    w5, b = mpidist.Variable(np.full(5, 7.0), name="w5"), mpidist.Variable(0.5)
    ck = Checkpoint(model=Box({"w": w5, "b": b}))
    with raises(ValueError, "checkpoint key 'model/w'", "'w5:0'", "holds shape (3,) dtype float64",
                "has shape (5,) dtype float64", "Nothing was restored",
                "create the variable with the saved shape and dtype"):
        ck.restore(path)
    assert w5.numpy().tolist() == [7.0] * 5 and float(b.numpy()) == 0.5  # b not half-restored
    assert int(ck.save_counter.numpy()) == 0
    assert tree(directory) == before


def test_restore_a_checkpoint_of_another_model_shape_under_mirrored(saved):
    _, _, _, path, _ = saved
    s = S(2)
    with s.scope():
        w = mpidist.Variable(np.zeros((3, 1)))
    with raises(ValueError, "'model/w'", "holds shape (3,)", "has shape (3, 1)"):
        Checkpoint(model=Box({"w": w})).restore(path)
    assert [c.numpy().tolist() for c in w.values] == [[[0.0]] * 3] * 2


# -- the status of a restore -----------------------------------------------------------------
def test_status_assertions_name_the_keys_and_the_fix(saved):
    _, _, _, path, _ = saved
    w = mpidist.Variable(np.zeros(3))
    extra = mpidist.Variable(5.0)
    status = Checkpoint(model=Box({"w": w, "extra": extra})).restore(path)
    assert w.numpy().tolist() == [1.0, 2.0, 3.0] and float(extra.numpy()) == 5.0
    with raises(AssertionError, "no variable has taken yet: 'model/b'",
                "no value for (they keep their values): 'model/extra'",
                "expect_partial()"):
        status.assert_consumed()
    with raises(AssertionError, "does not match the existing objects", "'model/extra'",
                "Pass the objects that were saved"):
        status.assert_existing_objects_matched()
    assert float(extra.numpy()) == 5.0
    assert status.expect_partial() is status


def test_status_nothing_matched(saved):
    _, _, _, path, _ = saved
    v = mpidist.Variable(3.0)
    with pytest.warns(RuntimeWarning, match=r"matched no key: .*'model/w', 'model/b' .* 'other'"):
        status = Checkpoint(other=v).restore(path)
    with raises(AssertionError, "Nothing but the save counter was restored", repr(path),
                "compare the keys"):
        status.assert_nontrivial_match()
    assert float(v.numpy()) == 3.0


def test_status_of_restore_none():
    v = mpidist.Variable(3.0)
    status = Checkpoint(v=v).restore(None)
    for check in (status.assert_consumed, status.assert_existing_objects_matched,
                  status.assert_nontrivial_match):
        with raises(AssertionError, "save_path=None", "Pass a checkpoint's path"):
            check()
    assert float(v.numpy()) == 3.0


def test_status_run_restore_ops_with_a_session(saved):
    ck, _, _, path, _ = saved
    status = ck.restore(path)
    with raises(TypeError, "run_restore_ops takes no session", "'sess'",
                "call run_restore_ops()"):
        status.run_restore_ops("sess")


# -- saving the wrong things / to the wrong place --------------------------------------------
@pytest.mark.parametrize("bad,exc,parts", [
    (123, TypeError, ["got 123 of type int", "pass e.g. '/tmp/training/ckpt'"]),
    (None, TypeError, ["got None of type NoneType"]),
    (b"/tmp/x", TypeError, ["got b'/tmp/x' of type bytes"]),
    ("", ValueError, ["must not be empty", "pass a path such as"]),
])
def test_save_with_a_path_that_is_not_a_path(saved, bad, exc, parts):
    ck, w, b, _, directory = saved
    before = tree(directory)
    with raises(exc, "file_prefix must", *parts):
        ck.save(bad)
    with raises(exc, "file_prefix must", *parts):
        ck.write(bad)
    unchanged(ck, w, b, directory, before)


def test_save_under_a_file(saved):
    ck, w, b, _, directory = saved
    (directory / "afile").write_text("x")
    before = tree(directory)
    target = str(directory / "afile" / "ck")
    with raises(FileExistsError, f"Saving checkpoint {target + '-2'!r}", "Nothing was written",
                "is missing or is a file",
                "pass a path in a directory this process can create and write"):
        ck.save(target)
    unchanged(ck, w, b, directory, before)


def test_save_with_options(saved):
    ck, w, b, _, directory = saved
    before = tree(directory)
    with raises(NotImplementedError, "Checkpoint.save takes no `options`", "leave it None"):
        ck.save(str(directory / "ck"), options=object())
    unchanged(ck, w, b, directory, before)


def test_save_inside_strategy_run(saved):
    ck, w, b, _, directory = saved
    before = tree(directory)
    s = S(2)
    with raises(RuntimeError, "Checkpoint.save must be called in cross-replica context",
                "call it outside the function given to strategy.run"):
        s.run(lambda: ck.save(str(directory / "ck")))
    unchanged(ck, w, b, directory, before)


def test_object_that_is_not_trackable():
    with raises(TypeError, "cannot save 'model'", "it is a object",
                "wrap arrays in mpidist.Variable", "_checkpoint_dependencies()"):
        Checkpoint(model=object())
    with raises(TypeError, "cannot save 'w'", "it is a ndarray", "wrap arrays in mpidist.Variable"):
        Checkpoint(w=np.zeros(3))
    with raises(TypeError, "Checkpoint(root=...) must be a trackable object", "got a list"):
        Checkpoint(root=[mpidist.Variable(1.0)])
    with raises(ValueError, "`save_counter` is the checkpoint's own counter",
                "name the object differently"):
        Checkpoint(save_counter=mpidist.Variable(1.0))


def test_untrackable_object_deep_in_the_graph(tmp_path):
    v = mpidist.Variable(1.0)
    ck = Checkpoint(model=Box({"layers": [v, "relu"]}))
    with raises(TypeError, "cannot save 'model/layers/1'", "it is a str"):
        ck.save(str(tmp_path / "ck"))
    assert int(ck.save_counter.numpy()) == 0 and os.listdir(tmp_path) == []


def test_dependencies_that_are_not_a_dict(tmp_path):
    ck = Checkpoint(model=Box([mpidist.Variable(1.0)]))
    with raises(TypeError, "Box._checkpoint_dependencies() (at 'model') returned a list",
                "it must return a dict"):
        ck.save(str(tmp_path / "ck"))
    assert int(ck.save_counter.numpy()) == 0 and os.listdir(tmp_path) == []


def test_two_variables_under_one_key(tmp_path):
    a, b = mpidist.Variable(1.0, name="a"), mpidist.Variable(2.0, name="b")
    ck = Checkpoint(root=Box({"k": a}), k=b)
    with raises(ValueError, "'a:0' and 'b:0'", "checkpoint key 'k'", "give them different names"):
        ck.save(str(tmp_path / "ck"))
    assert int(ck.save_counter.numpy()) == 0 and os.listdir(tmp_path) == []


def test_variable_of_a_string_dtype(tmp_path):
    s = mpidist.Variable(np.array(["a", "b"]), name="labels")
    ck = Checkpoint(s=s)
    with raises(TypeError, "checkpoint key 's'", "'labels:0'", "dtype <U1",
                "checkpoints hold bool, integer, float and complex arrays only"):
        ck.save(str(tmp_path / "ck"))
    assert int(ck.save_counter.numpy()) == 0 and os.listdir(tmp_path) == []


# -- CheckpointManager -------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_manager_max_to_keep_not_positive(tmp_path, bad):
    ck = Checkpoint(v=mpidist.Variable(1.0))
    with raises(ValueError, "Expected a positive integer or `None` for `max_to_keep`",
                f"got {bad!r}"):
        CheckpointManager(ck, str(tmp_path / "run"), max_to_keep=bad)
    assert os.listdir(tmp_path) == []


def test_manager_of_something_else(tmp_path):
    with raises(TypeError, "needs an mpidist.train.Checkpoint, got a dict",
                "Checkpoint(model=..., ...)"):
        CheckpointManager({"v": mpidist.Variable(1.0)}, str(tmp_path), max_to_keep=2)
    with raises(ValueError, "checkpoint_name must be a non-empty file name", "got 'a/b'"):
        CheckpointManager(Checkpoint(), str(tmp_path), max_to_keep=2, checkpoint_name="a/b")
    with raises(TypeError, "directory must be a path", "got 7 of type int"):
        CheckpointManager(Checkpoint(), 7, max_to_keep=2)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad,exc,parts", [
    ("3", TypeError, ["checkpoint_number must be an integer", "got '3'"]),
    (1.5, TypeError, ["got 1.5"]),
    (True, TypeError, ["got True"]),
    (-1, ValueError, ["checkpoint_number must be >= 0, got -1", "optimizer.iterations"]),
])
def test_manager_save_with_a_bad_number(tmp_path, bad, exc, parts):
    v = mpidist.Variable(1.0)
    manager = CheckpointManager(Checkpoint(v=v), str(tmp_path), max_to_keep=2)
    manager.save()
    before = tree(tmp_path)
    with raises(exc, *parts):
        manager.save(checkpoint_number=bad)
    assert tree(tmp_path) == before and int(manager.checkpoint.save_counter.numpy()) == 1
    assert manager.checkpoints == [str(tmp_path / "ckpt-1")]


def test_latest_checkpoint_of_a_non_path():
    with raises(TypeError, "checkpoint_dir must be a path", "got None"):
        latest_checkpoint(None)
