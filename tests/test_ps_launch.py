"""ParameterServerStrategy jobs under a real mpiexec (issue 15): every test launches programs
from tests/ps_programs/ with a hard timeout (a hang fails the test with the output so far) and
checks the exit code and the lines they print (the chief's one ``REPORT {json}`` line).

- training.py on chief + 1 ps + 1 worker, chief + 2 ps + 2 workers, and 4 ranks on two
  simulated nodes: TF's counter example, 1000 concurrent posted updates, placement under a
  partitioner, per-worker datasets, SGD / Adam / metrics against the chief's NumPy reference;
- TF's ``Server(...).join()`` idiom, and an MPMD job (chief.py : ps.py : worker.py);
- injected faults (``MPIDIST_PS_FAULTS``): a preempted closure, a hung worker, a hung ps, and a
  worker that really dies under Hydra's ``-disable-auto-cleanup``;
- too few ranks for a parameter-server job.
"""

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_launch import find_hydra, find_mpiexec, launch, mpmd_launch
from test_mpi_failures import remove_leaked_mpich_segments  # noqa: F401 - autouse fixture

PROGRAMS = Path(__file__).parent / "ps_programs"
LAUNCH_TIMEOUT = 90   # a launch still running after this is a hang
QUICK = 30            # seconds within which a job that must fail has ended (start-up included)
EXACT = {"rtol": 1e-12, "atol": 1e-12}


def ps_device(task):
    return f"/job:ps/replica:0/task:{task}/device:CPU:0"


def run(nprocs, program, *args, env=None, nodes=1, timeout=LAUNCH_TIMEOUT):
    """``(returncode, output, seconds)`` of ``program args`` on ``nprocs`` ranks; fails on a
    hang."""
    start = time.monotonic()
    code, out = launch(nprocs, [str(PROGRAMS / program), *map(str, args)], timeout, env,
                       nodes=nodes)
    elapsed = time.monotonic() - start
    assert code is not None, (f"mpiexec -n {nprocs} {program} {' '.join(map(str, args))} hung: "
                              f"still running after {timeout} s; output so far:\n{out}")
    return code, out, elapsed


def report_of(out):
    """The chief's REPORT, which it prints once."""
    found = re.findall(r"^REPORT (\{.*\})$", out, flags=re.MULTILINE)
    assert len(found) == 1, f"expected one REPORT line from the chief:\n{out}"
    return json.loads(found[0])


def assert_own_copy_per_worker(sums, batch_sum):
    """``sums``: ``[worker, sum of next(iterator)]`` in schedule order. Each worker iterates its
    own full copy of the dataset, so the sums a worker returned are the first batches' sums, in
    order: ``batch_sum(0), batch_sum(1), ...``."""
    by_worker = {}
    for worker, total in sums:
        by_worker.setdefault(worker, []).append(total)
    for worker, got in by_worker.items():
        assert got == [batch_sum(k) for k in range(len(got))], (worker, sums)


# -- 1. a complete job ------------------------------------------------------------------------------
def check_training_report(report, num_ps, num_workers):
    assert (report["num_ps"], report["num_workers"]) == (num_ps, num_workers)
    # TF's counter example (spec §9.5).
    assert report["counter"] == {"fetched": [4.0, 5.0, 6.0, 7.0, 8.0], "w": 8.0}
    # 1000 posted assign_adds, from every worker at once, none lost.
    assert report["posted"] == {"total": 1000.0, "workers": list(range(num_workers))}
    # Round-robin placement by creation count, shards one by one; a colocated variable is
    # whole, beside w, and does not advance the count (TF's _variable_count).
    placed = report["placed"]
    assert placed["w"] == [[[], ps_device(0)]]
    assert placed["total"] == [[[], ps_device(1 % num_ps)]]
    assert placed["table_class"] == "ShardedVariable"
    assert placed["table"] == [[[3, 2], ps_device(2 % num_ps)], [[2, 2], ps_device(3 % num_ps)]]
    assert placed["beside_w"] == [[[4], ps_device(0)]]
    assert report["trained"]["w_sgd_shards"] == [[[2], ps_device(4 % num_ps)],
                                                 [[1], ps_device(5 % num_ps)]]
    # embedding_lookup and scatter_add from closures, on the rows of both shards.
    assert placed["lookup"] == [[8.0, 9.0], [0.0, 1.0], [6.0, 7.0]]
    table = np.arange(10.0).reshape(5, 2)
    table[[0, 4]] += 1
    assert placed["table_after_scatter"] == table.tolist()
    # Dataset.range(100).batch(4): batch k sums to 16k + 6.
    assert len(report["dataset_sums"]) == 8
    assert_own_copy_per_worker(report["dataset_sums"], lambda k: 16 * k + 6)
    # Training: every step applied once by each optimizer, every example counted.
    trained, reference = report["trained"], report["reference"]
    assert trained["iterations"] == [12, 12, 12]
    assert trained["seen"] == 12 * 16
    np.testing.assert_allclose(trained["mean_adam_loss"],
                               np.mean([losses[1] for losses in trained["losses"]]), **EXACT)
    # The drift weights' gradient depends on the batch only: the same in any order.
    np.testing.assert_allclose(trained["u"], reference["u"], **EXACT)
    for final in trained["final_loss"]:
        assert final < trained["initial_loss"] / 2, trained
    if num_workers == 1:  # one worker runs the steps in order: exactly the NumPy reference
        for key in ("w_sgd", "b_sgd", "w_adam", "b_adam", "losses", "mean_adam_loss"):
            np.testing.assert_allclose(trained[key], reference[key], err_msg=key, **EXACT)
        assert set(trained["workers"]) == {0}


@pytest.mark.parametrize("nprocs,num_ps", [(3, 1), (5, 2)], ids=["1ps-1worker", "2ps-2workers"])
def test_training_job(nprocs, num_ps):
    code, out, _ = run(nprocs, "training.py", num_ps)
    assert code == 0, f"exit {code}:\n{out}"
    check_training_report(report_of(out), num_ps, nprocs - 1 - num_ps)


def test_training_job_on_two_simulated_nodes():
    """4 ranks as 2 x 2 on two simulated nodes: the chief and the ps on one, the workers on the
    other, talking through the netmod."""
    if find_hydra() is None:
        pytest.skip("simulating nodes needs MPICH's mpiexec.hydra")
    code, out, _ = run(4, "training.py", 1, nodes=2)
    assert code == 0, f"exit {code}:\n{out}"
    check_training_report(report_of(out), 1, 2)


# -- 2. TF's Server idiom ---------------------------------------------------------------------------
@pytest.mark.parametrize("nprocs,num_ps,form", [(3, 1, "spec"), (5, 2, "resolver")])
def test_server_idiom(nprocs, num_ps, form):
    """``if task_type in ("worker", "ps"): mpidist.Server(...).join()``: join() returns on
    every ps and worker rank when the chief is done, and the job exits 0."""
    code, out, _ = run(nprocs, "server_idiom.py", num_ps, form)
    assert code == 0, f"exit {code}:\n{out}"
    report = report_of(out)
    assert report["task"] == "chief:0"
    assert report["fetched"] == [4.0, 5.0, 6.0, 7.0, 8.0] and report["w"] == 8.0
    assert_own_copy_per_worker(report["sums"], lambda k: [10, 35][k])
    tasks = [("ps", i, 1 + i) for i in range(num_ps)]
    tasks += [("worker", i, 1 + num_ps + i) for i in range(nprocs - 1 - num_ps)]
    for job, task, rank in tasks:
        assert f"{job}:{task} joined (mpi:///job:{job}/replica:0/task:{task} (rank {rank}))\n" \
            in out, out


# -- 3. MPMD ---------------------------------------------------------------------------------------
LAUNCHERS = {"gforker": find_mpiexec, "hydra": find_hydra}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_mpmd_job(launcher):
    """``mpiexec -n 1 python chief.py : -n 1 python ps.py : -n 2 python worker.py``: one
    MPI_COMM_WORLD, roles from the resolver; the chief's functions travel by value to the
    workers (another program)."""
    mpiexec = LAUNCHERS[launcher]()
    if mpiexec is None:
        pytest.skip(f"no mpiexec.{launcher} here")
    apps = [(1, [str(PROGRAMS / "chief.py")]), (1, [str(PROGRAMS / "ps.py")]),
            (2, [str(PROGRAMS / "worker.py")])]
    code, out = mpmd_launch(apps, LAUNCH_TIMEOUT, mpiexec=mpiexec)
    assert code is not None, f"the MPMD job hung; output so far:\n{out}"
    assert code == 0, f"exit {code}:\n{out}"
    report = report_of(out)
    assert report["task"] == "chief:0"
    assert {job: len(tasks) for job, tasks in report["layout"].items()} == \
        {"chief": 1, "ps": 1, "worker": 2}
    assert report["fetched"] == [4.0, 5.0, 6.0, 7.0, 8.0] and report["w"] == 8.0
    assert len(report["sums"]) == 10
    assert_own_copy_per_worker(report["sums"], lambda k: 16 * k + 6)
    assert report["total"] == [10.0, float(sum(total for _, total in report["sums"]))]
    for line in ("ps.py: ps:0 joined", "worker.py: worker:0 joined", "worker.py: worker:1 joined"):
        assert out.count(line + "\n") == 1, out


# -- 4. injected faults ------------------------------------------------------------------------------
def closure_results(closures):
    """What faults_job.py's closures 1..closures return, without the worker index."""
    return [[i, i * i] for i in range(1, closures + 1)]


def test_preempted_closure_runs_again():
    """closure:3:preempt: the worker runs closure 3, then fails as a preempted worker; the
    closure runs again (its update is applied twice: at least once), every result is right and
    the job exits 0."""
    code, out, _ = run(4, "faults_job.py", 10, 0, env={"MPIDIST_PS_FAULTS": "closure:3:preempt"})
    assert code == 0, f"exit {code}:\n{out}"
    assert re.search(r"/job:worker/replica:0/task:\d \(rank \d\): injected fault: preempted "
                     r"during closure 3\n", out), out
    assert re.search(r"/job:worker/replica:0/task:\d \(rank \d\) was preempted: re-running its "
                     r"closures and rebuilding its resources\n", out), out
    report = report_of(out)
    assert [result[:2] for result in report["results"]] == closure_results(10)
    assert report["total"] == 11.0


def test_hung_worker_closures_finish_on_the_other():
    """worker:1:after=2:hang with 0.2 s heartbeats: worker 1 stops after two closures; 0.6 s
    later the chief gives its closures to worker 0, which runs the rest. The job lost a worker:
    at the end the chief says so and every rank leaves without MPI_Finalize, exit code 1."""
    env = {"MPIDIST_PS_FAULTS": "worker:1:after=2:hang", "MPIDIST_PS_HEARTBEAT_SECONDS": "0.2"}
    code, out, elapsed = run(4, "faults_job.py", 20, 0.05, env=env)
    assert code == 1, f"exit {code}:\n{out}"
    assert "the job ends with exit code 1: it lost /job:worker/replica:0/task:1 (rank 3): no " \
        "heartbeat for " in out, out
    assert "/job:worker/replica:0/task:1 (rank 3): injected fault: hanging\n" in out, out
    assert re.search(r"/job:worker/replica:0/task:1 \(rank 3\) failed \(no heartbeat for "
                     r"[\d.]+ s\): its closures run on the other workers\n", out), out
    report = report_of(out)
    assert [result[:2] for result in report["results"]] == closure_results(20)
    workers = [result[2] for result in report["results"]]
    assert workers.count(1) == 2, workers  # its two closures, then nothing
    assert report["total"] == 20.0           # the closures it held never ran there
    assert elapsed < QUICK, f"took {elapsed:.1f} s:\n{out}"


PS_UNAVAILABLE = ("parameter server /job:ps/replica:0/task:0 (rank 1) did not answer within 2 s "
                  "(updating variable 'total'). A parameter server that fails cannot be "
                  "replaced: restart the job and restore the latest checkpoint")


@pytest.mark.parametrize("handling", ["caught", "uncaught"])
def test_hung_ps_is_an_error_on_the_chief_never_a_hang(handling):
    """ps:0:after=5:hang with MPIDIST_PS_TIMEOUT=2: a worker's request times out after 2 s, and
    join() raises PSUnavailableError naming the ps task and its rank, as does every later call.
    Caught, the program ends and so does the job, still with exit code 1 (a job whose ps failed
    did not succeed); uncaught, it ends the job at once (exit 1). Either way well within the
    launch timeout."""
    env = {"MPIDIST_PS_FAULTS": "ps:0:after=5:hang", "MPIDIST_PS_TIMEOUT": "2"}
    args = [20, 0] + (["uncaught"] if handling == "uncaught" else [])
    code, out, elapsed = run(4, "faults_job.py", *args, env=env)
    assert "/job:ps/replica:0/task:0 (rank 1): injected fault: hanging\n" in out, out
    first = re.search(r"PSUnavailableError after ([\d.]+) s: (.*)\n", out)
    assert first, f"the chief did not report the PSUnavailableError:\n{out}"
    assert first.group(2).startswith(PS_UNAVAILABLE), first.group(2)
    assert 1.9 <= float(first.group(1)) < QUICK, first.group(0)
    assert re.search(r"PSUnavailableError again: " + re.escape(PS_UNAVAILABLE), out), out
    assert "REPORT" not in out, out
    assert elapsed < QUICK, f"the job took {elapsed:.1f} s to end:\n{out}"
    if handling == "caught":
        assert code == 1, f"exit {code}:\n{out}"
        assert "the job ends with exit code 1: it lost /job:ps/replica:0/task:0 (rank 1): a " \
            "parameter server that did not answer." in out, out
    else:
        assert code != 0, out
        assert "uncaught exception; ending the job on every rank." in out, out
        assert "mpidist.ps.coordinator.PSUnavailableError: " + PS_UNAVAILABLE in out, out


def hydra_without_cleanup():
    """MPICH's Hydra, when it has ``-disable-auto-cleanup`` (the other ranks keep running when
    one dies); else skip the test."""
    hydra = find_hydra()
    if hydra is None:
        pytest.skip("a rank's real death is survivable only under MPICH's mpiexec.hydra "
                    "-disable-auto-cleanup; there is no Hydra here")
    usage = subprocess.run([hydra, "-h"], capture_output=True, text=True, timeout=30)
    if "-disable-auto-cleanup" not in usage.stdout + usage.stderr:
        pytest.skip(f"{hydra} has no -disable-auto-cleanup: the launcher ends the job when a "
                    "rank dies")
    return hydra


DEATH_ENV = {"MPIDIST_PS_FAULTS": "closure:3:exit", "MPIDIST_PS_HEARTBEAT_SECONDS": "0.2"}
TF_CONFIG = json.dumps({"cluster": {"chief": ["localhost:2220"], "ps": ["localhost:2221"],
                                    "worker": ["localhost:2222", "localhost:2223"]}})


def test_worker_that_really_dies():
    """closure:3:exit: the worker running closure 3 exits (os._exit(3)) after its update was
    applied. Under ``mpiexec.hydra -disable-auto-cleanup`` the other ranks keep running: the
    chief stops hearing the dead worker, closure 3 runs again on the other one, the chief
    reports every result and the survivors end the job; Hydra then exits with the dead rank's
    code, 3. (The cluster comes from TF_CONFIG: see the next test for MPIClusterResolver.)"""
    argv = [str(PROGRAMS / "faults_job.py"), "10", "0.05", "tf_config"]
    code, out = mpmd_launch([(4, argv)], LAUNCH_TIMEOUT, {**DEATH_ENV, "TF_CONFIG": TF_CONFIG},
                            mpiexec=hydra_without_cleanup(), launcher_args=["-disable-auto-cleanup"])
    assert code is not None, f"the survivors did not end the job; output so far:\n{out}"
    dead = re.search(r"/job:worker/replica:0/task:(\d) \(rank (\d)\): injected fault: exiting "
                     r"during closure 3\n", out)
    assert dead, out
    # The chief sees the process end through the watch's socket, before any missed heartbeat.
    assert re.search(rf"/job:worker/replica:0/task:{dead.group(1)} \(rank {dead.group(2)}\) "
                     r"failed \(its process \(pid \d+ on \S+\) ended without leaving the job\)",
                     out), out
    report = report_of(out)
    assert [result[:2] for result in report["results"]] == closure_results(10)
    assert report["results"][2][2] != int(dead.group(1)), "closure 3 must have run again elsewhere"
    assert report["total"] == 11.0  # closure 3's update, applied before the death, and again
    assert code == 3, f"Hydra should exit with the dead rank's code 3, got {code}:\n{out}"


def test_worker_that_really_dies_with_mpi_cluster_resolver():
    """The same with MPIClusterResolver, which starts mpidist's world communicator: its at-exit
    meeting of all ranks is off in a ps job, so the survivors exit though a worker is dead."""
    argv = [str(PROGRAMS / "faults_job.py"), "10", "0.05"]
    code, out = mpmd_launch([(4, argv)], LAUNCH_TIMEOUT, DEATH_ENV, mpiexec=hydra_without_cleanup(),
                            launcher_args=["-disable-auto-cleanup"])
    assert report_of(out)["total"] == 11.0  # the chief got there: the hang is at exit
    assert code == 3, f"exit {code} (None: the survivors did not end the job):\n{out}"


# -- 5. bad input ------------------------------------------------------------------------------------
def test_a_rank_whose_task_is_not_its_own_names_itself_before_any_collective():
    """Rank 2 of 3 says (TF_CONFIG) it is ps:0, rank 1's task: it raises at once, before the
    ranks agree on the cluster, and its error, printed, ends the job; the others do not wait
    for it and nobody trains."""
    code, out, elapsed = run(3, "wrong_task.py")
    assert code != 0, out
    assert elapsed < QUICK, f"took {elapsed:.1f} s:\n{out}"
    assert "[mpidist rank 2 of 3 on " in out and "uncaught exception" in out, out
    assert ("The cluster resolver makes this process ps:0 but it is MPI rank 2 of 3, which is "
            "worker:0") in out, out
    assert "must not happen" not in out, out


@pytest.mark.parametrize("how", ["resolver", "default"])
def test_two_ranks_with_one_ps_have_no_worker(how):
    """``mpiexec -n 2`` with one ps (``MPIClusterResolver(num_ps=1)``, or the default resolver
    with MPIDIST_NUM_PS=1): every rank fails at once with TF's message and the job exits
    nonzero."""
    code, out, elapsed = run(2, "bad_layout.py", how, env={"MPIDIST_NUM_PS": "1"})
    assert code != 0, out
    assert elapsed < QUICK, f"took {elapsed:.1f} s:\n{out}"
    message = ("There must be at least one worker: MPI_COMM_WORLD has 2 ranks, taken by the "
               "chief and 1 ps. Launch with mpiexec -n 3 or more, or use fewer ps.")
    for rank in (0, 1):
        assert f"rank {rank}: ValueError: {message}\n" in out, out
    assert "uncaught exception; ending the job on every rank." in out, out
    assert "must not happen" not in out, out
