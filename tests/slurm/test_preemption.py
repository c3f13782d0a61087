"""Preemption as a real Slurm does it, on slurm/cpu.sbatch running slurm/train.py: whatever
stops a job — ``scontrol requeue`` (what preemption with PreemptMode=REQUEUE and node failures
do), ``scancel`` with or without ``--batch`` and ``--signal``, a time limit with or without the
script's signal line — the job (requeued, or submitted again with the same command) resumes
from its latest backup and ends with the weights of an uninterrupted run, bit for bit, and
leaves no MPICH shared memory in /dev/shm.

Before the guard cleared MPI's leftovers, a job requeued by ``scontrol requeue`` died in
MPI_Init on restart: its ranks attached to the killed predecessor's segment, which has the same
name (same job id and step).
"""

import re
import time

import pytest

from jobs import (
    JOB_TIMEOUT,
    SLURM,
    TRAIN,
    assert_completed,
    assert_nothing_left_in_shm,
    assert_same_model,
    json_lines,
    logs,
    mpich_segments,
    read,
)

NAME = "mpidist-cpu"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def train_args(step_seconds):
    return [TRAIN, "--json", "--save-freq", "10", "--step-seconds", str(step_seconds)]


def backup_dirs(workdir):
    return sorted((workdir / "backups").glob(f"{NAME}-*"))


def has_backup(workdir):
    return any((d / "checkpoint").exists() for d in backup_dirs(workdir))


def submit(slurm, workdir, args, script=SLURM / "cpu.sbatch", options=()):
    jobid = slurm.sbatch(script, args, options=["--ntasks-per-node=2", *options], workdir=workdir)
    return jobid, logs(workdir, jobid, NAME)


def wait_for(slurm, jobid, job_logs, condition, timeout=JOB_TIMEOUT):
    """Until ``condition()``; fails (with the logs) if the job ends first."""
    def done(info):
        if info.get("JobState") in ENDED:
            raise AssertionError(f"job {jobid} ended ({info.get('JobState')}) before the test "
                                 f"could act:\n{read(job_logs[0])}\n{read(job_logs[1])}")
        return condition()
    slurm.wait(jobid, timeout, logs=job_logs, done=done)


def finished(slurm, jobid, job_logs, timeout=3 * JOB_TIMEOUT):
    info = slurm.wait(jobid, timeout, logs=job_logs,
                      done=lambda info: info.get("JobState") in ENDED)
    return info, read(job_logs[0]), read(job_logs[1])


def the_result(out, reference, resumed=True):
    results = json_lines(out)
    assert len(results) == 1, out
    assert results[0]["steps"] == 5 * 23
    if resumed:
        assert results[0]["resumed_from"] > 0, out
    assert_same_model(results[0], reference)
    return results[0]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("times", [1, 2], ids=["once", "twice"])
def test_scontrol_requeue_resumes_from_the_backup(slurm, tmp_path, mpiexec_reference, times):
    before = mpich_segments()
    jobid, job_logs = submit(slurm, tmp_path, train_args(0.1))
    for n in range(times):
        if n == 0:
            wait_for(slurm, jobid, job_logs, lambda: has_backup(tmp_path))
        else:  # this run resumed: requeue it again while it trains
            wait_for(slurm, jobid, job_logs, lambda: read(job_logs[0]).count(
                "train.py: resumed from the backup") == n)
            time.sleep(1.5)
        slurm.command(["scontrol", "requeue", str(jobid)])
        wait_for(slurm, jobid, job_logs, lambda: slurm.job(jobid).get("Restarts") == str(n + 1))
    info, out, err = finished(slurm, jobid, job_logs)
    assert_completed(info, out, err)
    assert info["Restarts"] == str(times), info
    assert out.count("train.py: resumed from the backup") == times, out
    assert "TERM: Slurm is stopping the job" in out, out
    the_result(out, mpiexec_reference)
    assert_nothing_left_in_shm(before, out)


@pytest.mark.timeout(300)
def test_usr1_to_the_steps_requeues_too(slurm, tmp_path, mpiexec_reference):
    """``scancel --signal=USR1`` without ``--batch`` (and ``--signal=USR1@T`` without ``B:``)
    reaches the ranks, not the script: the ranks back up and exit 75, and the script requeues
    the job on that status, which Slurm would not do by itself."""
    before = mpich_segments()
    jobid, job_logs = submit(slurm, tmp_path, train_args(0.05))
    wait_for(slurm, jobid, job_logs, lambda: has_backup(tmp_path))
    slurm.command(["scancel", "--signal=USR1", str(jobid)])
    info, out, err = finished(slurm, jobid, job_logs)
    assert_completed(info, out, err)
    assert info["Restarts"] == "1", info
    assert "USR1: time limit near" not in out  # the script itself got no signal
    assert f"step ended with 75 (75: backed up); requeueing job {jobid}" in out, out
    the_result(out, mpiexec_reference)
    assert_nothing_left_in_shm(before, out)


def assert_names_its_backup(out):
    stop = [line for line in out.splitlines() if "TERM: Slurm is stopping the job" in line]
    assert stop, out
    assert re.search(r"backups: \S+/backups/mpidist-cpu-\d+ \(a backup is there\)", stop[-1]), out


def resubmission_resumes(slurm, workdir, args, reference):
    jobid, job_logs = submit(slurm, workdir, args)
    info, out, err = finished(slurm, jobid, job_logs)
    assert_completed(info, out, err)
    assert "(a backup is there)" in out.splitlines()[1], out  # said at the start
    the_result(out, reference)
    assert not backup_dirs(workdir), "the backup is removed when training ends"


@pytest.mark.timeout(400)
def test_scancel_names_the_backup_and_the_same_job_again_resumes(slurm, tmp_path,
                                                                 mpiexec_reference):
    before = mpich_segments()
    args = train_args(0.1)
    jobid, job_logs = submit(slurm, tmp_path, args)
    wait_for(slurm, jobid, job_logs, lambda: has_backup(tmp_path))
    slurm.command(["scancel", str(jobid)])
    info, out, _ = finished(slurm, jobid, job_logs)
    assert info["JobState"] == "CANCELLED", info
    assert_names_its_backup(out)
    assert_nothing_left_in_shm(before, out)
    resubmission_resumes(slurm, tmp_path, args, mpiexec_reference)
    assert_nothing_left_in_shm(before)


@pytest.mark.timeout(500)
def test_a_hard_time_limit_names_the_backup_and_the_same_job_again_resumes(
        slurm, tmp_path, mpiexec_reference):
    """No signal line (a script that lost it): Slurm ends the job at its limit with TERM, then
    KILL; the log names the backup, and submitting the same job again resumes from it."""
    before = mpich_segments()
    script = tmp_path / "no-signal.sbatch"
    script.write_text("".join(line for line in (SLURM / "cpu.sbatch").read_text()
                              .splitlines(keepends=True) if not line.startswith("#SBATCH --signal")))
    args = train_args(1.0)  # 115 s of training: longer than the 1 min limit plus its check
    jobid, job_logs = submit(slurm, tmp_path, args, script=script, options=["--time=1"])
    info, out, _ = finished(slurm, jobid, job_logs, timeout=200)
    assert info["JobState"] == "TIMEOUT", (info, out)
    assert_names_its_backup(out)
    assert_nothing_left_in_shm(before, out)
    resubmission_resumes(slurm, tmp_path, args, mpiexec_reference)


@pytest.mark.timeout(500)
def test_a_time_limit_with_the_signal_line_requeues_until_done(slurm, tmp_path,
                                                                mpiexec_reference):
    """The script's own ``--signal=B:USR1@T`` (T shortened to fit a 1 min limit): every run
    backs up and requeues before its limit, and the job ends with the uninterrupted weights."""
    before = mpich_segments()
    jobid, job_logs = submit(slurm, tmp_path, train_args(0.6),
                             options=["--time=1", "--signal=B:USR1@50"])
    info, out, err = finished(slurm, jobid, job_logs, timeout=400)
    assert_completed(info, out, err)
    assert int(info["Restarts"]) >= 1, (info, out)
    assert "USR1: time limit near" in out, out
    the_result(out, mpiexec_reference)
    assert_nothing_left_in_shm(before, out)
