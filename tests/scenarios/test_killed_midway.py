"""What a SIGKILL in the middle of a write leaves (a time limit's KILL, scancel, a lost node):
a checkpoint's atomic write and Dataset.save, each killed in a Python process of its own
(tests/unit/killed_midway.py), so scenarios; the atomic write's other paths are
tests/unit/test_checkpoint.py and the saves tests/unit/test_save_load.py."""

import pytest

from mpidist.data import Dataset
from mpidist.core import durable


class TestAtomicWrite:
    @pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "named-temporary"])
    def test_a_writer_killed_midway_leaves_nothing_behind(self, tmp_path, unnamed):
        """SIGKILL in the middle of a write (a time limit's KILL, scancel): with unnamed files
        nothing is left; with named temporaries (filesystems without O_TMPFILE) the next write
        there removes the dead writer's."""
        from killed_midway import kill_when_it_says

        target = tmp_path / "ck"
        code = (
            "import sys, time\n"
            "from mpidist.core import durable as f\n"
            + ("" if unnamed else "f._open_unnamed = lambda directory: None\n")
            + f"f.write_file({str(target)!r}, lambda out: (out.write(b'x' * 4096), "
            "out.flush(), print('writing', flush=True), time.sleep(60)), 'test')\n")
        kill_when_it_says(code, "writing")
        left = sorted(p.name for p in tmp_path.iterdir())
        if unnamed:
            assert left == []
            return
        assert len(left) == 1 and left[0].startswith(".ck.tmp-"), left
        durable._open_unnamed, real = (lambda directory: None), durable._open_unnamed
        try:
            durable.write_file(str(target), lambda out: out.write(b"done"), "test")
        finally:
            durable._open_unnamed = real
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
        assert target.read_bytes() == b"done"


def test_a_save_killed_midway_is_cleared_by_the_next_save_there(tmp_path):
    from killed_midway import kill_when_it_says

    code = ("import time\nimport numpy as np\nfrom mpidist.data import Dataset, TensorSpec\n"
            "def rows():\n    yield np.int64(1)\n    print('saving', flush=True)\n"
            "    time.sleep(60)\n    yield np.int64(2)\n"
            "Dataset.from_generator(rows, output_signature=TensorSpec((), np.int64))"
            f".save({str(tmp_path / 'd')!r})\n")
    kill_when_it_says(code, "saving")
    left = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert left and all(n.startswith("shard-") for n in left), left  # unpublished: no metadata
    Dataset.range(2).save(str(tmp_path / "d"))
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert not set(left) & set(names), names  # the killed save's shards are gone
    assert list(Dataset.load(str(tmp_path / "d")).as_numpy_iterator()) == [0, 1]
