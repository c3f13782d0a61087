"""What the tests of tests/slurm share: where the scripts are, reading a job's logs, and the
checks of a finished job (state, the model it trained, what it left in /dev/shm)."""

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "slurm"
PROGRAMS = Path(__file__).parent / "programs"
TRAIN = SLURM / "train.py"
JOB_TIMEOUT = 90  # seconds from submission to the end of one job
SHM = Path("/dev/shm")


def logs(workdir, jobid, name):
    return [Path(workdir) / "logs" / f"{name}-{jobid}.out",
            Path(workdir) / "logs" / f"{name}-{jobid}.err"]


def read(path):
    return Path(path).read_text(errors="replace") if Path(path).exists() else ""


def json_lines(text, prefix="{"):
    return [json.loads(line[line.index("{"):]) for line in text.splitlines()
            if line.startswith(prefix)]


def assert_completed(info, out, err):
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
        f"job {info.get('JobId')}: {info.get('JobState')} exit {info.get('ExitCode')}\n" \
        f"--- out\n{out}\n--- err\n{err}"


def assert_same_model(result, reference):
    assert result["accuracy"] == reference["accuracy"]
    assert len(result["weights"]) == len(reference["weights"]) == 4
    for got, want in zip(result["weights"], reference["weights"], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def mpich_segments():
    """MPICH's shared-memory segments in /dev/shm now."""
    return {p.name for p in SHM.glob("mpich_*")} if SHM.is_dir() else set()


def assert_nothing_left_in_shm(before, out=""):
    """No MPICH segment that was not there before the job (and that no live process maps:
    another test's job may be running) remains once the job ended."""
    from mpidist.launch.leftovers import mapped_segments

    left = mpich_segments() - before - mapped_segments()
    assert not left, f"the job left {sorted(left)} in /dev/shm\n{out}"
