"""Dataset.save's format (mpidist.data.saved_format) at scale: 200 MiB written and read back,
rows and blocks, with the process's memory growing by a few blocks, never by the data: 400 MiB
of disk traffic per case, so a scenario; the format itself is tests/unit/test_saved_format.py."""

import gc
import os
import shutil

import numpy as np
import pytest

from mpidist.data import saved_format as sf
from mpidist.data.spec import TensorSpec


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
@pytest.mark.parametrize("blocks", [False, True])
def test_write_and_read_200mb_with_rss_bounded_by_blocks(tmp_path, blocks):
    rows, row_floats = 3200, 8192  # 3200 rows of 64 KiB: 200 MiB
    block_bytes = 2 << 20
    gc.collect()
    base, peak = _rss(), 0

    def elements():
        nonlocal peak
        step = 16 if blocks else 1
        for i in range(0, rows, step):
            peak = max(peak, _rss())
            index = np.arange(i, i + step)
            values = np.repeat(index[:, None], row_floats, axis=1).astype(np.float64)
            yield (values, index) if blocks else (values[0], index[0])

    spec = (TensorSpec((row_floats,), np.float64), TensorSpec((), np.int64))
    meta = sf.write_dataset(elements(), spec, tmp_path / "ds", num_shards=4,
                            block_bytes=block_bytes, blocks=blocks)
    write_growth = peak - base
    assert meta.rows == rows and sum(s.bytes for s in meta.shards) > 200 << 20

    gc.collect()
    base, peak, seen, total = _rss(), 0, 0, 0
    for shard in meta.shards:
        for values, index in sf.read_shard_blocks(shard.path):
            peak = max(peak, _rss())
            assert (values[:, 0] == index).all() and (values[:, -1] == index).all()
            seen += len(index)
            total += int(index.sum())
            del values, index
    read_growth = peak - base
    assert seen == rows and total == rows * (rows - 1) // 2
    # 4 shards' pending blocks while writing, one block while reading, plus allocator slack;
    # far below the 200 MiB written and read
    assert write_growth < 4 * block_bytes + (24 << 20), write_growth
    assert read_growth < 2 * block_bytes + (24 << 20), read_growth
    print(f"RSS growth: write {write_growth / 2**20:.1f} MiB, read {read_growth / 2**20:.1f} "
          f"MiB for {sum(s.bytes for s in meta.shards) / 2**20:.0f} MiB")
    shutil.rmtree(tmp_path / "ds")
