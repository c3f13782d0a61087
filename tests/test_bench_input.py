"""``mpidist bench input``: the command runs alone and under ``mpiexec -n 2`` (each launch with
a timeout), prints a row per reader format and the step row with positive numbers, its JSON
parses and is consistent (MB/s = bytes / time, ratio = ours / raw), its files are removed, and
bad options are usage errors. Not a timing test: the numbers are not compared with targets.
"""

import json
import os
import subprocess
import sys

import pytest
from mpi_launch import LOOPBACK_ENV, launch

from mpidist.cli.bench_input import FORMATS

TIMEOUT = 120
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "SLURM_", "OMPI_", "HYDRA_", "MPIEXEC_", "MPIDIST_")


def _alone(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(LOOPBACK_ENV)
    try:
        proc = subprocess.run([sys.executable, "-m", "mpidist", "bench", "input", *args], env=env,
                              text=True, capture_output=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"mpidist bench input {' '.join(args)} hung; output so far:\n{err.output}")
    return proc.returncode, proc.stdout, proc.stderr


def _launched(nprocs, *args):
    code, out = launch(nprocs, ["-m", "mpidist", "bench", "input", *args], TIMEOUT)
    assert code is not None, f"mpiexec -n {nprocs} mpidist bench input hung:\n{out}"
    return code, out


def _report(stdout):
    return json.loads(stdout[stdout.index("{"):])


def _check_report(report, ranks, directory):
    assert report["benchmark"] == "input" and report["job"]["ranks"] == ranks
    readers = {r["format"]: r for r in report["rows"] if r["part"] == "readers"}
    assert sorted(readers) == sorted(FORMATS)
    for row in readers.values():
        if "skipped" in row:  # a missing optional library: the note says what to install
            assert "pip install" in row["skipped"], row
            continue
        assert row["files"] == 2 and row["rows"] > 0 and row["bytes"] > 0, row
        assert row["ours_s"] > 0 and row["raw_s"] > 0, row
        assert row["ours_mb_s"] == pytest.approx(row["bytes"] / 1e6 / row["ours_s"]), row
        assert row["raw_mb_s"] == pytest.approx(row["bytes"] / 1e6 / row["raw_s"]), row
        assert row["ratio"] == pytest.approx(row["ours_mb_s"] / row["raw_mb_s"]), row
        assert len(row["samples_s"]["ours"]) == 2, row
    assert readers["npy"].get("skipped") is None  # NumPy is always there
    (step,) = [r for r in report["rows"] if r["part"] == "step"]
    assert step["ranks"] == ranks and step["replicas"] == ranks
    assert step["strategy"] == ("OneDevice" if ranks == 1 else f"MWMS {ranks}x1")
    assert step["memory_ms"] > 0 and step["files_ms"] > 0
    assert step["memory_input_ms"] > 0 and step["files_input_ms"] > 0
    assert step["ratio"] == pytest.approx(step["files_ms"] / step["memory_ms"])
    assert step["rows"] == step["steps"] * step["global_batch"] and step["files"] >= ranks
    assert os.listdir(directory) == []  # every rank's temporary files removed


QUICK = ["--quick", "--files", "2", "--rounds", "2", "--steps", "4", "--size", "1M"]


def test_alone_json(tmp_path):
    code, out, err = _alone(*QUICK, "--json", "--dir", str(tmp_path))
    assert code == 0, err
    _check_report(_report(out), 1, tmp_path)


def test_under_mpiexec_json(tmp_path):
    code, out = _launched(2, *QUICK, "--json", "--dir", str(tmp_path))
    assert code == 0, out
    _check_report(_report(out), 2, tmp_path)


def test_table_under_mpiexec(tmp_path):
    """The default --quick run (its own sizes) prints one table, on rank 0 only."""
    code, out = _launched(2, "--quick", "--dir", str(tmp_path))
    assert code == 0, out
    assert out.count("# mpidist bench input: 2 rank(s)") == 1, out
    lines = out.splitlines()
    for fmt in FORMATS:
        (line,) = [x for x in lines if x.startswith(f"{fmt} ")]
        if "skipped" not in line:
            ours, raw, ratio = map(float, line.split()[1:4])
            assert ours > 0 and raw > 0 and ratio > 0, line
    (step,) = [x for x in lines if x.startswith("MWMS 2x1 ")]
    assert len(step.split()) == 7 and all(float(v) > 0 for v in step.split()[2:]), step
    assert os.listdir(tmp_path) == []


def test_one_part_and_format(tmp_path):
    code, out, err = _alone("--quick", "--parts", "readers", "--formats", "npy", "--json",
                            "--dir", str(tmp_path))
    assert code == 0, err
    rows = _report(out)["rows"]
    assert [(r["part"], r["format"]) for r in rows] == [("readers", "npy")]


@pytest.mark.parametrize("args, message", [
    (["--formats", "csv"], "formats are a comma-separated list of npy, npz, parquet, hdf5"),
    (["--parts", "all"], "parts are a comma-separated list of readers, step"),
    (["--size", "lots"], "is not a size"),
    (["--files", "0"], "must be a positive integer"),
])
def test_bad_options_are_usage_errors(args, message):
    code, out, err = _alone(*args)
    assert code == 2 and message in err, (code, err)
