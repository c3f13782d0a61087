"""What the tests of tests/slurm share: where the scripts are, submitting a script and waiting
for it, reading a job's logs, and the checks of a finished job (state, the model it trained,
what it left in /dev/shm)."""

import json
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "slurm"
PROGRAMS = Path(__file__).parent / "programs"
TRAIN = SLURM / "train.py"
JOB_TIMEOUT = 90  # seconds from submission to the end of one job
SHM = Path("/dev/shm")
NAME = "mpidist-cpu"  # cpu.sbatch's job name
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
# The scripts' line for a step whose program did not finish on every rank.
ENDED_WITHOUT_FINISHING = re.compile(
    r"ended without finishing \(srun status (\d+)\); backup: (\S+) \((.*)\)$", re.MULTILINE)


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


def submit(slurm, workdir, args, script=SLURM / "cpu.sbatch", options=(), env=None, name=NAME):
    """Submit ``script`` with 2 tasks; ``(job id, [its .out, its .err])``."""
    jobid = slurm.sbatch(script, args, options=["--ntasks-per-node=2", *options],
                         workdir=workdir, env=env)
    return jobid, logs(workdir, jobid, name)


def wait_for(slurm, jobid, job_logs, condition, timeout=JOB_TIMEOUT):
    """Until ``condition()``; fails (with the logs) if the job ends first."""
    def done(info):
        if info.get("JobState") in ENDED:
            raise AssertionError(f"job {jobid} ended ({info.get('JobState')}) before the test "
                                 f"could act:\n{read(job_logs[0])}\n{read(job_logs[1])}")
        return condition()
    slurm.wait(jobid, timeout, logs=job_logs, done=done)


def finished(slurm, jobid, job_logs, timeout=3 * JOB_TIMEOUT):
    """Wait for the job's end; ``(scontrol's record, its .out, its .err)``."""
    info = slurm.wait(jobid, timeout, logs=job_logs,
                      done=lambda info: info.get("JobState") in ENDED)
    return info, read(job_logs[0]), read(job_logs[1])
