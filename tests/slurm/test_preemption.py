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
    ENDED_WITHOUT_FINISHING,
    NAME,
    SLURM,
    TRAIN,
    assert_completed,
    assert_nothing_left_in_shm,
    assert_same_model,
    finished,
    json_lines,
    mpich_segments,
    read,
    submit,
    wait_for,
)


def train_args(step_seconds):
    return [TRAIN, "--json", "--save-freq", "10", "--step-seconds", str(step_seconds)]


def backup_dirs(workdir):
    return sorted((workdir / "backups").glob(f"{NAME}-*"))


def has_backup(workdir):
    return any((d / "checkpoint").exists() for d in backup_dirs(workdir))


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
    ended = ENDED_WITHOUT_FINISHING.findall(out)
    assert len(ended) == 1 and ended[0][0] == "75" and ended[0][2].startswith("step "), out
    assert f"requeueing job {jobid} (the ranks backed up and exited 75)" in out, out
    the_result(out, mpiexec_reference)
    assert_nothing_left_in_shm(before, out)


def assert_names_its_backup(out):
    """The TERM line names the backup directory, and the script's last line the step the
    backup holds (once the step has ended): that step, K."""
    stop = [line for line in out.splitlines() if "TERM: Slurm is stopping the job" in line]
    assert stop, out
    assert re.search(r"backups: \S+/backups/mpidist-cpu-\d+ \(a backup is there\)", stop[-1]), out
    ended = ENDED_WITHOUT_FINISHING.findall(out)
    assert len(ended) == 1 and "step ended with" not in out, out
    step = re.fullmatch(r"step (\d+)", ended[0][2])
    assert step and ended[0][0] != "0", out
    return int(step.group(1))


def resubmission_resumes(slurm, workdir, args, reference, step):
    """The same job submitted again says at its start that it finds the backup at ``step``,
    resumes from it, and ends with the uninterrupted weights."""
    jobid, job_logs = submit(slurm, workdir, args)
    info, out, err = finished(slurm, jobid, job_logs)
    assert_completed(info, out, err)
    assert out.splitlines()[1].endswith(f" (step {step})"), out  # said at the start
    assert the_result(out, reference)["resumed_from"] == step, out
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
    step = assert_names_its_backup(out)
    assert_nothing_left_in_shm(before, out)
    resubmission_resumes(slurm, tmp_path, args, mpiexec_reference, step)
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
    step = assert_names_its_backup(out)
    assert_nothing_left_in_shm(before, out)
    resubmission_resumes(slurm, tmp_path, args, mpiexec_reference, step)


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
