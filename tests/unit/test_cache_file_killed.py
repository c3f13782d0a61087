"""``Dataset.cache(filename)`` killed at every file operation of its write: the write goes
through mpidist's one commit primitive (``mpidist.core.durable``), so a writer SIGKILLed at
any operation leaves no cache file (nothing that a later pass could read as complete), and the
next pipeline reads the source, writes the cache whole, and a third reads it back."""

import os

import numpy as np

from mpidist.data import Dataset
from save_faults import killed_at, operations

ROWS = np.arange(12.0).reshape(6, 2)


def pipeline(path):
    return Dataset.from_tensor_slices(ROWS).map(lambda r: r * 2).cache(path)


def one_pass(path):
    return [e.tolist() for e in pipeline(path)]


def test_a_writer_killed_at_any_file_operation_leaves_no_cache(tmp_path):
    reference = (ROWS * 2).tolist()
    ops = operations(lambda: one_pass(str(tmp_path / "probe")))
    kinds = [op for op, _ in ops]
    assert {"open", "write", "fsync", "rename", "fsync_dir"} <= set(kinds), kinds
    for k in range(len(ops)):
        path = str(tmp_path / f"cache{k}")
        assert killed_at(k, lambda: one_pass(path)), f"operation {k} ({ops[k][0]}) not reached"
        published = os.path.exists(path + ".npcache")
        # Only a kill after the rename (the directory's fsync) may leave the file: it is whole.
        assert not published or ops[k][0] == "fsync_dir", (k, ops[k], os.listdir(tmp_path))
        assert one_pass(path) == reference  # reads the source or the whole file
        assert os.path.exists(path + ".npcache")
        assert one_pass(path) == reference  # the published cache
        leftovers = [n for n in os.listdir(tmp_path) if n.startswith(f"cache{k}") and
                     not n.endswith(".npcache")]
        assert leftovers == [], leftovers
