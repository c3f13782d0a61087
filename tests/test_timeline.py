"""MPIDIST_TIMELINE writes one Chrome trace for the whole job and names the straggler;
MPIDIST_LOG turns on rank-prefixed log lines. Real launches, each with a timeout."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import launch

PROGRAM = Path(__file__).parent / "programs" / "timeline_straggler.py"
CALLS = ["all_reduce"] * 5 + ["broadcast", "barrier"]


def run(nprocs, env):
    if nprocs == 1:
        import os

        proc = subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, **env})
        return proc.returncode, proc.stdout + proc.stderr
    code, out = launch(nprocs, [str(PROGRAM)], 120, env)
    assert code is not None, f"hang:\n{out}"
    return code, out


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_timeline_trace_and_straggler(tmp_path, nprocs):
    path = tmp_path / "trace.json"
    code, out = run(nprocs, {"MPIDIST_TIMELINE": str(path)})
    assert code == 0, out
    trace = json.loads(path.read_text())
    assert not Path(str(path) + ".parts").exists()  # the per-rank parts were merged away
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"rank {r} ({e})" for r, e in enumerate(trace["otherData"]["hosts"])}
    slices = [e for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    for rank in range(nprocs):
        mine = sorted((e for e in slices if e["pid"] == rank), key=lambda e: e["args"]["seq"])
        assert [e["name"] for e in mine] == CALLS  # every collective of every rank, in order
        assert [e["args"]["seq"] for e in mine] == list(range(1, len(CALLS) + 1))
        assert [e["args"]["bytes"] for e in mine] == [16384] * 5 + [80, 0]
        for e in mine:
            assert isinstance(e["ts"], int) and e["ts"] >= 0 and e["dur"] >= 0
            assert 0 <= e["args"]["wait_us"] <= e["dur"]
        starts = [e["ts"] for e in mine]
        assert starts == sorted(starts)
    waits = [e for e in events if e["ph"] == "X" and e["cat"] == "wait"]
    for w in waits:  # each wait slice sits inside its collective's slice
        parent = next(e for e in slices if e["pid"] == w["pid"] and e["args"]["seq"] == w["args"]["seq"])
        assert parent["ts"] <= w["ts"] and w["ts"] + w["dur"] <= parent["ts"] + parent["dur"] + 1
    summary = trace["otherData"]["summary"]
    assert f"on {nprocs} rank(s)" in summary and summary in out
    if nprocs == 1:
        assert trace["otherData"]["straggler"] is None
        return
    last = nprocs - 1
    assert trace["otherData"]["straggler"] == last
    assert trace["otherData"]["last_arrivals"][str(last)] >= 5  # it came last to every all_reduce
    assert f"straggler: rank {last} " in summary
    # The others waited ~50 ms for it at each of 5 all-reduces.
    assert trace["otherData"]["waited_for_us"][str(last)] > 5 * 40_000 * (nprocs - 1) * 0.8


def test_logging_is_silent_by_default_and_rank_prefixed_when_on():
    code, out = run(2, {})
    assert code == 0, out
    assert "[mpidist" not in out
    code, out = run(2, {"MPIDIST_LOG": "info"})
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("[mpidist")]
    for rank in (0, 1):
        assert any(line.startswith(f"[mpidist {rank}/2 ") and "INFO mpidist.comm: communicator ready"
                   f": rank {rank} of 2" in line for line in lines), out
