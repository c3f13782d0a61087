"""slurm/ps.sbatch on a real single-node Slurm (the ``slurm`` fixture of conftest.py): one srun
starts the ranks, which take their roles from SlurmClusterResolver, and runs
examples/ps_embedding.py, the script's default program, to the end: the step exits 0 by itself.
Submitted as the README shows, its defaults (4 tasks: chief, 1 ps, 2 workers) fit the test
node's 4 CPUs; 5 tasks with 2 ps need --overcommit there. A job with too few tasks for its
parameter servers is refused before srun, and one no node can hold is refused before it is
submitted, when the script submits itself.
"""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "slurm" / "ps.sbatch"
JOB_TIMEOUT = 120  # seconds from submission to the end of the job
NAME = "mpidist-ps"


def read_logs(workdir, jobid):
    paths = [Path(workdir) / "logs" / f"{NAME}-{jobid}.{ext}" for ext in ("out", "err")]
    return paths, [p.read_text(errors="replace") if p.exists() else "" for p in paths]


def submit(slurm, workdir, options, env=None):
    # The default program is examples/ps_embedding.py relative to the submission directory:
    # a link to the repository's examples/ stands in for a checkout.
    (workdir / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    (workdir / "tmp").mkdir()
    jobid = slurm.sbatch(SCRIPT, [], options=options, workdir=workdir,
                         env={"TMPDIR": str(workdir / "tmp"), **(env or {})})
    paths, _ = read_logs(workdir, jobid)
    info = slurm.wait(jobid, JOB_TIMEOUT, logs=paths)
    _, (out, err) = read_logs(workdir, jobid)
    return jobid, info, out, err


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_ps, options", [(1, []), (2, ["--ntasks=5", "--overcommit"])],
                         ids=["as-the-readme-shows", "2-ps-overcommitted"])
def test_ps_script_runs_the_embedding_example(slurm, tmp_path, num_ps, options):
    env = {} if num_ps == 1 else {"NUM_PS": str(num_ps)}
    jobid, info, out, err = submit(slurm, tmp_path, options, env=env)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
        f"{info.get('JobState')} {info.get('ExitCode')}\n--- out\n{out}\n--- err\n{err}"
    tasks = num_ps + 3
    assert info["NumTasks"] == str(tasks), info
    assert f"job {jobid} on localhost: {tasks} ranks (1 chief, {num_ps} ps, 2 workers), " \
        "srun --mpi=pmi2 " in out, out
    assert f"examples/ps_embedding.py --resolver slurm --num-ps {num_ps}" in out, out
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(reports) == 1, out  # the chief alone reports
    report = reports[0]
    assert report["num_ps"] == num_ps and report["num_workers"] == 2
    assert report["examples_evaluated"] == report["eval_set_size"] == 297
    assert report["accuracy"] > 0.85, report
    assert report["steps"] == report["scheduled"] == 400
    assert [device for _, device in report["embedding_shards"]] == [  # 2 shards, round-robin
        f"/job:ps/replica:0/task:{k % num_ps}/device:CPU:0" for k in range(2)]
    assert Path(report["checkpoint"]).parent.parent == tmp_path / "tmp", report["checkpoint"]
    assert Path(report["checkpoint"]).is_file(), report["checkpoint"]  # written by the chief
    assert out.rstrip().endswith("step ended with 0"), out
    assert "Traceback" not in err, err


@pytest.mark.timeout(120)
def test_ps_script_refuses_too_few_tasks(slurm, tmp_path):
    """3 tasks cannot hold a chief, 2 ps and a worker: the script says so and srun never runs."""
    _, info, out, err = submit(slurm, tmp_path, ["--ntasks=3"], env={"NUM_PS": "2"})
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", (info, out, err)
    assert ("a parameter-server job needs 1 chief + 2 ps + at least 1 worker = 4 tasks, but the "
            "job has 3: submit with --ntasks=4 or more, or lower NUM_PS") in err, err
    assert "srun --mpi" not in out, out


@pytest.mark.timeout(120)
def test_a_job_no_node_can_hold_is_refused_before_it_is_submitted(slurm, tmp_path):
    """``bash slurm/ps.sbatch`` (the script submits itself) with more tasks than the node has
    CPUs: one clear line instead of a job that waits forever (Reason=PartitionConfig)."""
    script = tmp_path / "big.sbatch"
    script.write_text(SCRIPT.read_text().replace("#SBATCH --ntasks=4 ", "#SBATCH --ntasks=9 "))
    before = slurm.command(["squeue", "-h", "-o", "%i"]).stdout.split()
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=slurm.job_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "this cluster cannot run the job as its #SBATCH lines ask" in proc.stderr, proc.stderr
    assert "Requested node configuration is not available" in proc.stderr, proc.stderr
    assert slurm.command(["squeue", "-h", "-o", "%i"]).stdout.split() == before  # none queued
