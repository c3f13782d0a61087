"""BackupAndRestore: a job killed mid-epoch and started again resumes from its last backup and
ends with the weights of an uninterrupted run, bit for bit, in one process and across MPI
ranks. The program is tests/programs/fit_resume.py; each run has a hard timeout."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpi_launch import launch

PROGRAM = Path(__file__).parent / "programs" / "fit_resume.py"
TIMEOUT = 180


def run(out, backup, args, nprocs=None, kill_at=None):
    env = {"KILL_AT_STEP": str(kill_at)} if kill_at else {}
    argv = [str(PROGRAM), str(out), str(backup), *args]
    if nprocs is None:
        import os

        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              timeout=TIMEOUT, env={**os.environ, **env})
        return proc.returncode, proc.stdout + proc.stderr
    code, output = launch(nprocs, argv, TIMEOUT, env)
    assert code is not None, f"the launch hung:\n{output}"
    return code, output


def weights(folder):
    return {p.name: np.load(p) for p in sorted(Path(folder).glob("*.npy"))}


@pytest.mark.parametrize("nprocs, args", [
    (None, ["--strategy", "mirrored", "--replicas", "2", "--save-freq", "5"]),
    (None, ["--strategy", "one-device", "--save-freq", "epoch"]),
    (2, ["--strategy", "multi-worker", "--replicas", "1", "--save-freq", "5"]),
], ids=["mirrored-every-5-steps", "one-device-every-epoch", "2-ranks-every-5-steps"])
def test_killed_job_resumes_bit_for_bit(tmp_path, nprocs, args):
    code, out = run(tmp_path / "straight", tmp_path / "backup-a", args, nprocs)
    assert code == 0, out
    # 23 steps per epoch: killed at step 33 (mid-epoch 2, 3 steps after the step-30 backup),
    # or at step 40 (after the epoch-1 backup) for epoch backups.
    kill_at = 40 if "epoch" in args else 33
    code, out = run(tmp_path / "resumed", tmp_path / "backup-b", args, nprocs, kill_at)
    assert code == 17, f"the first run should have been killed at step {kill_at}:\n{out}"
    assert not (tmp_path / "resumed").exists()
    assert (tmp_path / "backup-b" / "checkpoint").exists()
    code, out = run(tmp_path / "resumed", tmp_path / "backup-b", args, nprocs)
    assert code == 0, out
    straight, resumed = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    for name in ("w0.npy", "w1.npy", "w2.npy", "w3.npy", "iterations.npy"):
        assert straight[name].tobytes() == resumed[name].tobytes(), name
    assert int(resumed["iterations.npy"]) == 3 * 23
    # The resumed run reports the epochs it ran, with the same numbers as the straight run.
    ran = len(resumed["loss.npy"])
    np.testing.assert_array_equal(resumed["loss.npy"], straight["loss.npy"][-ran:])
    np.testing.assert_array_equal(resumed["accuracy.npy"], straight["accuracy.npy"][-ran:])
    assert not (tmp_path / "backup-b").exists()  # deleted when training ended
