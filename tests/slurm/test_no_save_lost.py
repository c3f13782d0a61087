"""No save is ever lost, on slurm/cpu.sbatch and the real local Slurm:

- the tasks of an array each back up into their own directory: a requeued task resumes its
  own model, never another task's, even where the program differs by task;
- a second live run of the same job (same name and command, so the same backup directory)
  refuses to start, naming the first, and the first trains on undisturbed;
- a requeue that lands in the middle of a backup write, at several random moments, resumes
  from an intact backup each time;
- after an ``MPI_Abort`` (which Slurm answers by killing every rank and guard of the step), the
  script clears the step's MPI shared memory on the node and logs that the program did not
  finish, and which step its backup holds;
- a node that goes DOWN during the run: srun returns 0, but the log does not say the step ended
  well; Slurm requeues the job and it resumes.
"""

import random
import re
import time
from pathlib import Path

import pytest

from jobs import (
    ENDED_WITHOUT_FINISHING,
    NAME,
    PROGRAMS,
    SLURM,
    TRAIN,
    assert_completed,
    assert_nothing_left_in_shm,
    assert_same_model,
    finished,
    json_lines,
    logs,
    mpich_segments,
    read,
    submit,
    wait_for,
)
from mpi_launch import launch

REFUSED = re.compile(r"Error: BackupAndRestore: the backup directory .* is in use by another "
                     r"live run")
RESUMED = re.compile(r"^train\.py: resumed from the backup at step (\d+) in (\S+)$", re.MULTILINE)
TERMINATED = re.compile(r"^\[[^]]+\] TERM: Slurm is stopping the job .*backups: \S+ "
                        r"\(a backup is there\)", re.MULTILINE)
# The script's second line: the backup directory and what it holds when the run starts.
STARTS_WITH = re.compile(r"^\[[^]]+\] backups: (\S+) \((.*)\)$", re.MULTILINE)


def train_args(step_seconds, save_freq=10, program=TRAIN):
    return [program, "--json", "--save-freq", str(save_freq), "--step-seconds", str(step_seconds)]


def backup_dirs(workdir):
    return sorted((Path(workdir) / "backups").glob(f"{NAME}-*"))


def finish_records_left(workdir):
    return sorted((Path(workdir) / "logs").glob(".finished-*"))


def the_result(out, reference):
    results = json_lines(out)
    assert len(results) == 1, out
    assert results[0]["steps"] == 5 * 23, out
    assert_same_model(results[0], reference)
    return results[0]


def mpiexec_train(args, backup_dir, timeout=180):
    """slurm/train.py under the wheel's mpiexec on 2 ranks: the uninterrupted run's result."""
    code, out = launch(2, [str(TRAIN), "--json", "--backup-dir", str(backup_dir), *args], timeout)
    assert code == 0, f"mpiexec run failed (None = hang):\n{out}"
    results = json_lines(out)
    assert len(results) == 1, out
    return results[0]


# -- (a) arrays ---------------------------------------------------------------------------------
@pytest.mark.timeout(360)
def test_array_tasks_resume_their_own_backups(slurm, tmp_path, mpiexec_reference):
    """``--array=0-1`` of one command whose learning rate depends on the task; task 1 requeued
    mid-run with ``scontrol requeue JOBID_1``. Each task ends with the weights of its own
    uninterrupted run (the two differ), the requeued one after resuming its own backup."""
    rates = ["0.1", "0.05"]  # task 0's run is the session's reference (train.py's default rate)
    references = [mpiexec_reference,
                  mpiexec_train(["--learning-rate", rates[1]], tmp_path / "reference")]
    assert references[0]["weights"] != references[1]["weights"]
    before = mpich_segments()
    args = [PROGRAMS / "train_by_task.py", "--rates", ",".join(rates),
            *train_args(0.1)[1:]]
    array = slurm.sbatch(SLURM / "cpu.sbatch", args,
                         options=["--ntasks-per-node=2", "--array=0-1"], workdir=tmp_path)
    tasks = [f"{array}_{task}" for task in range(2)]
    deadline = time.monotonic() + 60
    while not all(slurm.job(t).get("JobState") == "RUNNING" for t in tasks):
        assert time.monotonic() < deadline, [slurm.job(t) for t in tasks]
        time.sleep(0.25)
    # Each task is a job of its own (its log is named by that id); scontrol is asked by
    # ARRAY_TASK, since the array's own id stands for all of its tasks.
    job_logs = [logs(tmp_path, slurm.job(t)["JobId"], NAME) for t in tasks]
    wait_for(slurm, tasks[1], job_logs[1],
             lambda: any((d / "checkpoint").exists() for d in backup_dirs(tmp_path)
                         if d.name.endswith("-task1")))
    slurm.command(["scontrol", "requeue", tasks[1]])
    wait_for(slurm, tasks[1], job_logs[1], lambda: slurm.job(tasks[1]).get("Restarts") == "1")
    for task, (name, task_logs) in enumerate(zip(tasks, job_logs, strict=True)):
        info, out, err = finished(slurm, name, task_logs)
        assert_completed(info, out, err)
        assert info["Restarts"] == str(task), (info, out)
        backup = STARTS_WITH.search(out).group(1)
        assert backup.endswith(f"-task{task}"), out  # its own directory, named by its task
        resumed = RESUMED.findall(out)
        assert [directory for _, directory in resumed] == [backup] * task, out
        result = the_result(out, references[task])
        assert result["resumed_from"] == (int(resumed[0][0]) if task else 0), out
    assert not backup_dirs(tmp_path), "each task removes its backup when its training ends"
    assert not finish_records_left(tmp_path)
    assert_nothing_left_in_shm(before)


# -- (b) the same job twice ---------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_second_live_run_of_the_same_job_refuses_to_start(slurm, tmp_path, mpiexec_reference):
    """The same job submitted again while the first trains: same name and command, so the same
    backup directory. The second fails at once, on every rank, naming the first job, and is
    not requeued; the first is left alone and ends with the uninterrupted weights."""
    args = train_args(0.15)
    first, first_logs = submit(slurm, tmp_path, args)
    wait_for(slurm, first, first_logs, lambda: any((d / "checkpoint").exists()
                                                   for d in backup_dirs(tmp_path)))
    second, second_logs = submit(slurm, tmp_path, args)
    info, out, err = finished(slurm, second, second_logs)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", (info, out, err)
    # every rank's error (the tracebacks' last lines), and the reason in the output log
    refusals = [line for line in err.splitlines() if REFUSED.search(line)]
    assert len(refusals) == 2, err
    stopped = [line for line in out.splitlines() if line.startswith("train.py: training stopped")]
    assert len(stopped) == 1 and REFUSED.search(stopped[0]), out
    assert all(f"Slurm job {first} " in line for line in [*refusals, *stopped]), out + err
    ended = ENDED_WITHOUT_FINISHING.findall(out)
    assert len(ended) == 1 and ended[0][0] != "0", out
    assert "requeueing" not in out and "step ended with" not in out, out
    # The first run still trains, its backup intact.
    assert slurm.job(first)["JobState"] == "RUNNING", (slurm.job(first), read(first_logs[0]))
    assert any((d / "checkpoint").exists() for d in backup_dirs(tmp_path))
    info, out, err = finished(slurm, first, first_logs)
    assert_completed(info, out, err)
    assert the_result(out, mpiexec_reference)["resumed_from"] == 0, out
    assert not backup_dirs(tmp_path)


# -- (c) requeues during backup writes ---------------------------------------------------------
@pytest.mark.timeout(400)
def test_requeues_during_backup_writes_resume_intact(slurm, tmp_path, mpiexec_reference):
    """A backup every step (``--save-freq 1``), so that a requeue often lands while one is
    being written; three requeues at random moments. Every run resumes from the step the
    script saw in the backup at its start, and the job ends with the uninterrupted weights."""
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    times = 3
    before = mpich_segments()
    jobid, job_logs = submit(slurm, tmp_path, train_args(0.02, save_freq=1))

    def resumed_runs():
        return read(job_logs[0]).count("train.py: resumed from the backup")

    def written_since(moment):
        def written():
            return any((d / "checkpoint").exists() and (d / "checkpoint").stat().st_mtime > moment
                       for d in backup_dirs(tmp_path))
        return written

    for n in range(times):
        # run n trains (it said it resumed) and has written a backup of its own since
        wait_for(slurm, jobid, job_logs, lambda runs=n: resumed_runs() == runs)
        wait_for(slurm, jobid, job_logs, written_since(time.time()))
        time.sleep(rng.uniform(0.0, 0.6))
        slurm.command(["scontrol", "requeue", str(jobid)])
        wait_for(slurm, jobid, job_logs,
                 lambda restarts=str(n + 1): slurm.job(jobid).get("Restarts") == restarts)
    info, out, err = finished(slurm, jobid, job_logs)
    note = f"(random seed {seed})\n{out}"
    assert_completed(info, out, err + note)
    assert info["Restarts"] == str(times), (info, note)
    starts = STARTS_WITH.findall(out)
    resumed = RESUMED.findall(out)
    assert len(starts) == times + 1 and len(resumed) == times, note
    # Each restart said at its start which step its backup held, and resumed from that one.
    assert all(what.startswith("step ") for _, what in starts[1:]), note
    said = [int(what[len("step "):]) for _, what in starts[1:]]
    assert said == [int(step) for step, _ in resumed], note
    assert said == sorted(said), note
    # ... which is the step each killed run's last line named
    assert [what for _, _, what in ENDED_WITHOUT_FINISHING.findall(out)] == \
        [f"step {step}" for step in said], note
    result = the_result(out, mpiexec_reference)
    assert result["resumed_from"] == said[-1], note
    assert not backup_dirs(tmp_path) and not finish_records_left(tmp_path), note
    assert_nothing_left_in_shm(before, note)


# -- (d) MPI_Abort -------------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_mpi_abort_leaves_nothing_and_the_log_names_the_backup(slurm, tmp_path):
    """Rank 1 calls ``MPI_Abort`` after step 12 (a backup every 5 steps). Slurm kills the
    step's ranks and guards together, so no guard clears the MPI shared memory: the script's
    cleanup step does. The log says the program did not finish, and that the backup holds
    step 10. An abort is not requeued."""
    before = mpich_segments()
    program = PROGRAMS / "abort_in_step.py"
    jobid, job_logs = submit(slurm, tmp_path, [program, "--save-freq", "5", "--abort-at", "12"])
    info, out, err = finished(slurm, jobid, job_logs)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", (info, out, err)
    assert "abort_in_step.py: rank 1 calls MPI_Abort after step 12" in out, out
    assert "MPI_Abort(MPI_COMM_WORLD, 3)" in err, err
    ended = ENDED_WITHOUT_FINISHING.findall(out)
    assert len(ended) == 1, out
    status, directory, what = ended[0]
    assert status != "0" and what == "step 10", out
    assert directory == str(backup_dirs(tmp_path)[0]), out
    assert "step ended with" not in out and "requeueing" not in out, out
    # what the killed ranks left, cleared by the script's cleanup step
    assert "mpidist.launch.leftovers: localhost: removed 1 MPI shared-memory segment" in out, out
    assert_nothing_left_in_shm(before, out)
    assert not finish_records_left(tmp_path)


# -- (e) a node failure -------------------------------------------------------------------------
def node_state(slurm):
    return slurm.command(["sinfo", "-h", "-n", "localhost", "-o", "%t"]).stdout.strip()


@pytest.mark.timeout(300)
def test_a_node_failure_is_not_logged_as_a_good_end(slurm, tmp_path, mpiexec_reference):
    """``scontrol update nodename=localhost state=down`` during training: Slurm kills the job's
    processes and requeues it (NODE_FAIL with --requeue), and srun returns 0. The first run's
    log says it ended without finishing (or, where Slurm's SIGKILL cut it short, that Slurm was
    stopping it), never that it ended with 0; the requeued run resumes and ends with the
    uninterrupted weights."""
    before = mpich_segments()
    jobid, job_logs = submit(slurm, tmp_path, train_args(0.1))
    wait_for(slurm, jobid, job_logs, lambda: any((d / "checkpoint").exists()
                                                 for d in backup_dirs(tmp_path)))
    try:
        slurm.command(["scontrol", "update", "nodename=localhost", "state=down",
                       "reason=mpidist-test-node-failure"])
        wait_for(slurm, jobid, job_logs, lambda: slurm.job(jobid).get("Restarts") == "1")
    finally:  # the test cluster's only node: the later tests need it back
        deadline = time.monotonic() + 60
        while node_state(slurm).rstrip("*") in {"down", "drain", "drng", "fail"}:
            slurm.command(["scontrol", "update", "nodename=localhost", "state=resume"],
                          check=False)
            assert time.monotonic() < deadline, f"the node stays {node_state(slurm)}"
            time.sleep(0.5)
    info, out, err = finished(slurm, jobid, job_logs)
    assert_completed(info, out, err)
    assert info["Restarts"] == "1", (info, out)
    first_run = out[:out.index(f"job {jobid} (restart 1)")]
    assert "step ended with" not in first_run, out
    # Slurm TERMs the batch script and SIGKILLs it KillWait later: the TERM line comes at once,
    # the last line only if the ranks exit in time. Each says the run did not finish.
    ended = ENDED_WITHOUT_FINISHING.findall(first_run)
    assert len(ended) == 1 or (not ended and TERMINATED.search(first_run)), out
    step = int(STARTS_WITH.findall(out)[1][1][len("step "):])  # the restart's own first line
    for _, _, what in ended:  # TERM can cut the `mpidist backup` call: the shell's own check
        assert what in {f"step {step}", "a backup is there"}, out
    assert [int(k) for k, _ in RESUMED.findall(out)] == [step], out
    assert the_result(out, mpiexec_reference)["resumed_from"] == step
    assert not backup_dirs(tmp_path) and not finish_records_left(tmp_path)
    assert_nothing_left_in_shm(before, out)
