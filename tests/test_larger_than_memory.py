"""A dataset 4x larger than a rank's memory cap trains at 2 ranks: every row exactly once per
epoch, each rank's peak RSS under the cap (benchmarks/larger_than_memory.py measures both)."""

import json
import sys
from pathlib import Path

from mpi_launch import launch

SCRIPT = str(Path(__file__).resolve().parents[1] / "benchmarks" / "larger_than_memory.py")


def test_one_gib_of_files_trains_under_a_256_mib_rss_cap_per_rank(tmp_path):
    data = str(tmp_path / "big")
    code, out = launch(1, [SCRIPT, "--write", "--dir", data, "--data-mb", "1024"], 240)
    assert code == 0, out
    code, out = launch(2, [SCRIPT, "--dir", data, "--cap-mb", "256"], 300)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"exit {code} (None = hang):\n{out}"
    result = json.loads(lines[-1])
    print(json.dumps(result), file=sys.stderr)
    assert result["data_mib"] == 1024.0 and result["ranks"] == 2
    assert result["every_row_once"], result
    assert max(result["peak_rss_mib"]) <= 256, result
    assert code == 0 and result["ok"], out
