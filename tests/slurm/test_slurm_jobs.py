"""The batch scripts in slurm/ and the Slurm-facing code, on a real single-node Slurm.

The cluster comes from the ``slurm`` fixture (conftest.py: slurm/local-cluster.sh in a temporary
directory, 4 CPUs, MpiDefault=pmi2, 4 fake GPUs where character devices can be made). Each job
runs in its own temporary directory, where its logs/ and backups/ land.

1. slurm/cpu.sbatch trains examples/digits_mlp.py on 2 ranks: the same accuracy and weights,
   bit for bit, as the same program under the wheel's mpiexec.
2. SlurmClusterResolver under the real srun: tasks, ranks, cluster and reduces agree.
3. ``srun --mpi=none`` (every rank alone) is refused by the launch check, loudly.
4. The requeue path: USR1 to the batch script makes the ranks back up and exit, the script
   requeues the job, and the second run resumes from the backup to the weights of an
   uninterrupted run.
5. The GPU scripts bind GPUs by local rank (on fake GPUs) and run the default program.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

from jobs import (
    JOB_TIMEOUT,
    PROGRAMS,
    SLURM,
    TRAIN,
    assert_completed,
    assert_same_model,
    json_lines,
    logs,
    read,
)

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits_mlp.py"
DIGITS_ARGS = ["--strategy", "multi-worker", "--replicas", "1", "--loop", "fit", "--json"]


def run_cpu_script(slurm, workdir, args, options=("--ntasks-per-node=2",)):
    jobid = slurm.sbatch(SLURM / "cpu.sbatch", args, options=options, workdir=workdir)
    out_log, err_log = logs(workdir, jobid, "mpidist-cpu")
    info = slurm.wait(jobid, JOB_TIMEOUT, logs=[out_log, err_log])
    return jobid, info, read(out_log), read(err_log)


# -- 1. the CPU script trains as mpiexec does -----------------------------------------------------
@pytest.mark.timeout(240)
def test_cpu_script_trains_like_mpiexec(slurm, tmp_path, mpiexec_reference):
    jobid, info, out, err = run_cpu_script(slurm, tmp_path, [DIGITS, *DIGITS_ARGS])
    assert_completed(info, out, err)
    assert info["NumTasks"] == "2" and info["NodeList"] == "localhost"
    assert f"job {jobid} (restart 0) on localhost: 2 ranks, srun --mpi=pmi2" in out, out
    results = json_lines(out)
    assert len(results) == 1, out  # the chief alone reports
    assert results[0]["replicas"] == 2
    assert_same_model(results[0], mpiexec_reference)
    assert "Traceback" not in err, err


@pytest.mark.timeout(240)
def test_cpu_script_default_program_with_slurm_resolver(slurm, tmp_path, mpiexec_reference):
    """slurm/train.py (the scripts' default program: the same MLP with BackupAndRestore) with
    SlurmClusterResolver: the same model again; its backup is gone when training ended."""
    _, info, out, err = run_cpu_script(slurm, tmp_path, [TRAIN, "--resolver", "slurm", "--json"])
    assert_completed(info, out, err)
    results = json_lines(out)
    assert len(results) == 1, out
    assert results[0]["steps"] == 5 * 23 and results[0]["resumed_from"] == 0
    assert_same_model(results[0], mpiexec_reference)
    backups = tmp_path / "backups"
    assert backups.is_dir() and not any(backups.iterdir()), list(backups.iterdir())


# -- 2. SlurmClusterResolver under the real srun ---------------------------------------------------
@pytest.mark.timeout(180)
@pytest.mark.parametrize("ntasks, jobs", [(2, None), (4, None), (2, {"chief": 1, "worker": 1})],
                         ids=["2-workers", "4-workers", "chief-and-worker"])
def test_slurm_cluster_resolver_under_srun(slurm, ntasks, jobs):
    args = ["-n", ntasks, sys.executable, PROGRAMS / "resolver_report.py"]
    if jobs:
        args.append(json.dumps(jobs))
    code, out = slurm.srun(args, timeout=120)
    assert code == 0, out
    reports = sorted(json_lines(out, "REPORT "), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == list(range(ntasks)), out
    addresses = [f"localhost:{8888 + k}" for k in range(ntasks)]
    if jobs:
        expected_spec = {"chief": addresses[:1], "worker": addresses[1:]}
        tasks = [("chief", 0)] + [("worker", k) for k in range(ntasks - 1)]
    else:
        expected_spec = {"worker": addresses}
        tasks = [("worker", k) for k in range(ntasks)]
    jobids = {r["env"]["SLURM_JOB_ID"] for r in reports}
    assert len(jobids) == 1, out
    for rank, report in enumerate(reports):
        env = report["env"]
        # What Slurm says about this task ...
        assert env["SLURM_PROCID"] == str(rank) and env["SLURM_LOCALID"] == str(rank)
        assert env["SLURM_STEP_NUM_TASKS"] == str(ntasks)
        assert env["SLURM_STEP_NODELIST"] == "localhost"
        assert env["SLURM_STEP_TASKS_PER_NODE"] == str(ntasks)
        assert env["PMI_SIZE"] == str(ntasks)  # srun's pmi2 plugin started this rank
        # ... is what the resolver makes of it ...
        assert (report["task_type"], report["task_id"]) == tasks[rank]
        assert report["cluster_spec"] == expected_spec
        assert report["local_rank"] == rank
        assert report["master"] == f"grpc://{addresses[rank]}"
        if shutil.which("nvidia-smi") is None:  # no GPUs to count
            assert report["num_accelerators"] == {"GPU": 0}
        # ... and what MPI and the strategy agree with.
        assert report["size"] == ntasks
        assert report["strategy_task"] == list(tasks[rank])
        assert report["num_replicas_in_sync"] == ntasks
        assert report["is_chief"] == (rank == 0)
        assert report["reduce_sum_replicas"] == ntasks * (ntasks + 1) / 2
        assert report["reduce_sum_workers"] == ntasks * (ntasks + 1) / 2


# -- 3. the launch check -----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_srun_without_pmi_is_refused(slurm):
    """``srun --mpi=none -n 2``: each rank initialises MPI alone (size 1) while Slurm says 2
    tasks. The strategy must refuse to start instead of training two separate models."""
    code, out = slurm.srun(["--mpi=none", "-n", 2, sys.executable,
                            PROGRAMS / "launch_check.py"], timeout=90)
    assert code != 0, out
    assert "num_replicas_in_sync" not in out, out
    for task in range(2):
        prefix = f"task {task}: RuntimeError: "
        line = next((text for text in out.splitlines() if text.startswith(prefix)), None)
        assert line is not None, out
        assert ("The launcher started 2 tasks (SLURM_STEP_NUM_TASKS=2) but MPI reports a world "
                "of size 1 on this process: every task is running alone and would train its "
                "own model.") in line, line
        assert "srun --mpi=" in line, line


@pytest.mark.timeout(180)
def test_cpu_script_with_the_wrong_mpi_plugin_fails(slurm, tmp_path):
    """The same through the batch script (MPI_PLUGIN=none): the job FAILS, with the reason in
    its error log, and is not requeued."""
    jobid = slurm.sbatch(SLURM / "cpu.sbatch", [PROGRAMS / "launch_check.py"],
                         options=["--ntasks-per-node=2"], workdir=tmp_path,
                         env={"MPI_PLUGIN": "none"})
    out_log, err_log = logs(tmp_path, jobid, "mpidist-cpu")
    info = slurm.wait(jobid, JOB_TIMEOUT, logs=[out_log, err_log])
    out, err = read(out_log), read(err_log)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", (info, out, err)
    assert "srun --mpi=none" in out and "num_replicas_in_sync" not in out, out
    assert "but MPI reports a world of size 1" in out + err, out + err


# -- 4. requeue on the time-limit signal -----------------------------------------------------
@pytest.mark.timeout(300)
def test_requeue_on_signal_resumes_from_backup(slurm, tmp_path, mpiexec_reference):
    """USR1 to the batch shell (what ``--signal=B:USR1@120`` sends before the time limit; here
    ``scancel --signal=USR1 --batch`` sends it mid-training): the ranks back up and exit 75, the
    script requeues the job, and the second run (same job id, Restarts=1) resumes from the
    backup and ends with the weights of an uninterrupted run."""
    args = [TRAIN, "--json", "--save-freq", "10", "--step-seconds", "0.05"]  # ~6 s of training
    jobid = slurm.sbatch(SLURM / "cpu.sbatch", args, options=["--ntasks-per-node=2"],
                         workdir=tmp_path)
    out_log, err_log = logs(tmp_path, jobid, "mpidist-cpu")
    # Signal once the first regular backup exists (step 10): training is under way.
    slurm.wait(jobid, JOB_TIMEOUT, logs=[out_log, err_log],
               done=lambda info: any((tmp_path / "backups").glob("mpidist-cpu-*/checkpoint"))
               or info.get("JobState") in {"COMPLETED", "FAILED", "CANCELLED"})
    backup = next((tmp_path / "backups").glob("mpidist-cpu-*"))  # keyed by name and command
    info = slurm.job(jobid)
    assert info["JobState"] == "RUNNING", (info, read(out_log), read(err_log))
    slurm.command(["scancel", "--signal=USR1", "--batch", str(jobid)])
    info = slurm.wait(jobid, 2 * JOB_TIMEOUT, logs=[out_log, err_log],
                      done=lambda info: info.get("JobState") in {"FAILED", "CANCELLED", "TIMEOUT"}
                      or (info.get("JobState") == "COMPLETED"))
    out, err = read(out_log), read(err_log)
    assert_completed(info, out, err)
    assert info["Restarts"] == "1", (info, out)
    # The first run: the signal, the backup, the requeue.
    assert "USR1: time limit near; asking the ranks to back up and stop" in out, out
    stopped = [line for line in out.splitlines() if line.startswith("train.py: signal received")]
    assert len(stopped) == 1, out
    step = int(stopped[0].split("backed up at step ")[1].split()[0])
    assert 10 <= step < 115, out
    assert f"ended without finishing (srun status 75); backup: {backup} (step {step})" in out, out
    assert f"requeueing job {jobid} (the ranks backed up and exited 75)" in out, out
    # The second run: resumed from that backup, finished, and removed the backup.
    assert f"job {jobid} (restart 1) on localhost" in out, out
    assert f"train.py: resumed from the backup at step {step} in {backup}" in out, out
    results = json_lines(out)
    assert len(results) == 1, out
    assert results[0]["resumed_from"] == step and results[0]["restarts"] == 1
    assert results[0]["steps"] == 5 * 23
    assert_same_model(results[0], mpiexec_reference)
    assert not backup.exists()


# -- 5. the GPU scripts, on fake GPUs --------------------------------------------------------
GPU_OPTIONS = ["--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=2"]


def need_gpus(slurm):
    if slurm.gpus < 2:
        pytest.skip("the test cluster has no fake GPUs (character devices cannot be made here)")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", ["gpu-single-node", "gpu-multi-node"])
@pytest.mark.parametrize("one_gpu_per_rank", [False, True], ids=["all-visible", "one-per-rank"])
def test_gpu_scripts_bind_gpus_by_local_rank(slurm, tmp_path, script, one_gpu_per_rank):
    need_gpus(slurm)
    env = {"ONE_GPU_PER_RANK": "1" if one_gpu_per_rank else "0"}
    options = GPU_OPTIONS + (["--nodes=1"] if script == "gpu-multi-node" else [])
    jobid = slurm.sbatch(SLURM / f"{script}.sbatch", [PROGRAMS / "gpu_report.py"],
                         options=options, workdir=tmp_path, env=env)
    name = "mpidist-gpu-multi" if script == "gpu-multi-node" else "mpidist-gpu"
    out_log, err_log = logs(tmp_path, jobid, name)
    info = slurm.wait(jobid, JOB_TIMEOUT, logs=[out_log, err_log])
    out, err = read(out_log), read(err_log)
    assert_completed(info, out, err)
    reports = sorted(json_lines(out, "REPORT "), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1], out
    for rank, report in enumerate(reports):
        assert report["size"] == 2 and report["num_replicas_in_sync"] == 2
        assert report["local_rank"] == rank and report["slurm_localid"] == str(rank)
        assert report["omp_num_threads"] == report["slurm_cpus_per_task"] == "2"
        # Slurm gave the job GPUs 0 and 1; a rank sees both, or only its own.
        assert report["cuda_visible_devices"] == (str(rank) if one_gpu_per_rank else "0,1")


@pytest.mark.timeout(240)
def test_gpu_script_runs_the_default_program(slurm, tmp_path):
    """No program given: the script runs slurm/train.py (relative to the submission directory;
    a link to the repository's slurm/ stands in for a checkout). Without CuPy the fake GPUs are
    not used: each rank trains on its CPU, to the same result."""
    need_gpus(slurm)
    (tmp_path / "slurm").symlink_to(SLURM, target_is_directory=True)
    jobid = slurm.sbatch(SLURM / "gpu-single-node.sbatch", [], options=GPU_OPTIONS,
                         workdir=tmp_path)
    out_log, err_log = logs(tmp_path, jobid, "mpidist-gpu")
    info = slurm.wait(jobid, JOB_TIMEOUT, logs=[out_log, err_log])
    out, err = read(out_log), read(err_log)
    assert_completed(info, out, err)
    assert "srun --mpi=pmi2 " in out and out.rstrip().endswith("step ended with 0"), out
    assert out.count("Epoch 5/5 - loss:") == 1, out
    assert "train.py: 2 replicas, 115 steps: test accuracy 0.9596" in out, out
