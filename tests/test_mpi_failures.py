"""Each way a multi-rank job can go wrong ends in a clear error within seconds, never a hang.

Every test launches a small program from tests/failure_programs/ under ``mpiexec -n N`` (N in
2 and 4) with a hard timeout, then checks that the launch finished (a hang is reported with the
output so far), how long it took, its exit code, and the exact parts of the message that a
user needs: the operation, the ranks, and what differs.

When a rank ends the job with MPI_Abort, the other ranks die at once; which of them got to print
is a race. Where a test needs every rank's message, the program catches the error and prints it
before anyone aborts; otherwise the test asks for at least one complete message.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mpi_launch import LOOPBACK_ENV, launch

PROGRAMS = Path(__file__).parent / "failure_programs"
LAUNCH_TIMEOUT = 60  # a launch still running after this is a hang
QUICK = 30  # seconds within which a failed job must have ended (start-up included)
NPROCS = [2, 4]
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "SLURM_", "OMPI_", "HYDRA_", "MPIEXEC_")
SHM = Path("/dev/shm")


def mapped_mpich_segments():
    """Names of the MPICH shared-memory files some live process has mapped."""
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            names.update(re.findall(r"/dev/shm/(mpich_\S+)", maps.read_text()))
        except OSError:
            pass  # the process ended, or is not ours to read
    return names


@pytest.fixture(autouse=True)
def remove_leaked_mpich_segments():
    """A job ended by MPI_Abort leaves MPICH's /dev/shm/mpich_shm_* file behind (MPI_Finalize
    would have removed it). Left there, they pile up, and a later job whose world id matches a
    leftover's fails in MPI_Init ("MPIDI_POSIX_comm_bootstrap: Out of memory") or hangs. Remove
    the files that appeared during the test and that no live process maps."""
    before = set(SHM.glob("mpich_*")) if SHM.is_dir() else set()
    yield
    leaked = set(SHM.glob("mpich_*")) - before if SHM.is_dir() else set()
    deadline = time.monotonic() + 3  # aborted ranks may take a moment to die
    while leaked:
        in_use = mapped_mpich_segments()
        for path in [p for p in leaked if p.name not in in_use]:
            path.unlink(missing_ok=True)
            leaked.discard(path)
        if not leaked or time.monotonic() > deadline:
            break  # what is still mapped belongs to a live job
        time.sleep(0.1)


def run(nprocs, program, *args, env=None, nodes=1):
    """``(returncode, output, seconds)`` of ``program args`` on ``nprocs`` ranks (on ``nodes``
    simulated nodes); fails on a hang."""
    argv = [str(PROGRAMS / program), *(str(a) for a in args)]
    start = time.monotonic()
    code, out = launch(nprocs, argv, LAUNCH_TIMEOUT, env, nodes=nodes)
    elapsed = time.monotonic() - start
    what = f"mpiexec -n {nprocs} {program} {' '.join(map(str, args))}"
    assert code is not None, (
        f"{what} hung: still running after {LAUNCH_TIMEOUT} s; output so far:\n{out}")
    return code, out, elapsed


def reports(out, head):
    """``[(rank, text), ...]`` of the one-line reports ``<head with {rank}><text>`` in ``out``.

    Searched anywhere in a line: a report is one write, but it may land right after a partial
    line of another rank's long traceback.
    """
    pattern = re.escape(head).replace(re.escape("{rank}"), r"(\d+)") + r"([^\n]*)"
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(pattern, out)]


def assert_died_quickly(code, out, elapsed):
    assert code != 0, f"the job should have failed, but exited with 0:\n{out}"
    assert elapsed < QUICK, f"the job took {elapsed:.1f} s to die (limit {QUICK} s):\n{out}"
    assert "must not happen" not in out, out


def mismatch_pattern(groups, differ, public=None):
    """Regex of the InvalidArgumentError text for ``groups``: ``[(ranks, call), ...]``; the
    advice names ``public``, the user's collective call(s), when the collectives came from one."""
    parts = "; ".join(rf"ranks \[{', '.join(map(str, ranks))}\] are at collective #\d+ "
                      + re.escape(call) for ranks, call in groups)
    advice = (re.escape(f"{public} is a collective call under MultiWorkerMirroredStrategy: every "
                        "rank must make it, in the same order") if public
              else r"Every rank must issue the same")
    return (r"Ranks issued different collectives \(seen on rank (\d+)\): " + parts
            + re.escape(f". They differ in: {differ}. ") + advice)


# -- 1. a rank skips a collective ----------------------------------------------------------
@pytest.mark.parametrize("nprocs", NPROCS)
def test_skipped_collective_with_timeout_names_the_missing_rank(nprocs):
    """The last rank skips a collective and sleeps 10 s: the others' collective times out
    after 2 s naming it, and the job ends long before the sleeper would have finished."""
    last = nprocs - 1
    code, out, elapsed = run(nprocs, "skip.py", 2, 10)
    assert_died_quickly(code, out, elapsed)
    assert f"rank {last}: skipping the second step" in out, out
    assert f"rank {last}: reached the end" not in out, f"the job waited for the sleeper:\n{out}"
    found = reports(out, "rank {rank}: DeadlineExceededError: ")
    assert found, f"no rank reported the timeout:\n{out}"
    for rank, line in found:
        assert rank != last, line
        assert line.startswith("Collective has timed out during execution: collective #"), line
        assert "all_reduce(op=sum, dtype=float64, shape=[3])" in line, line
        assert f"did not complete within 2 s on rank {rank}." in line, line
        assert f"Ranks that never arrived: [{last}] (rank {last} last entered collective #" \
            in line, line
    assert "uncaught exception; ending the job on every rank" in out, out


@pytest.mark.parametrize("nprocs,nodes", [(2, 1), (4, 1), (4, 2)], ids=["2", "4", "4on2nodes"])
def test_a_rank_frozen_inside_a_collective_is_named(nprocs, nodes):
    """The last rank enters a collective, then is stopped (SIGSTOP) inside it: every rank
    entered it, so progress alone cannot tell who is stuck; the silent heartbeat names it,
    with its pid and host (on two simulated nodes too: its node's rows come from a stuck
    node-mate)."""
    last = nprocs - 1
    code, out, elapsed = run(nprocs, "freeze.py", 3, nodes=nodes)
    assert_died_quickly(code, out, elapsed)
    # from the waiting rank's own except (a caught error), or from its watchdog, which ends
    # the job from a blocking wait
    found = [(rank, line) for rank, line in
             reports(out, "rank {rank}: DeadlineExceededError: ")
             + reports(out, f"[mpidist rank {{rank}} of {nprocs} on ")
             if "Collective has timed out during execution" in line]
    assert found, f"no rank reported the timeout:\n{out}"
    for rank, line in found:
        assert rank != last, line
        assert re.search(rf"rank {last} \(pid \d+ on \S+\) has shown no sign of life for "
                         r"\d+\.\d s: its process is stopped \(SIGSTOP, Ctrl-Z, a debugger\) "
                         "or frozen", line), line
        assert "a peer stopped responding" not in line, line
        names = set(re.findall(r"rank (\d+) \(pid", line))
        assert names == {str(last)}, line  # the running ranks are not blamed


@pytest.mark.parametrize("nprocs", NPROCS)
def test_skipped_collective_without_timeout_mismatches_finalize(nprocs):
    """Without a timeout the skipping rank goes on to the end: its at-exit ``finalize()`` meets
    the others' all-reduce, and the fingerprint check reports the mismatch on the ranks that
    get to print (the first one to abort ends the rest)."""
    last = nprocs - 1
    code, out, elapsed = run(nprocs, "skip.py", 0, 0)
    assert_died_quickly(code, out, elapsed)
    assert f"rank {last}: reached the end" in out, out
    pattern = mismatch_pattern(
        [(range(last), "all_reduce(op=sum, dtype=float64, shape=[3]) in "
                       "Strategy.reduce(reduce_op=SUM, axis=None)"),
         ([last], "finalize() at the end of the program")],
        "the public call (Strategy.reduce vs the end of the program), operation",
        public="Strategy.reduce")
    at_exit = [(rank, line) for rank, line in re.findall(
        rf"\[mpidist rank (\d+) of {nprocs} on [^\]\n]*\] at exit: ([^\n]*)", out)]
    caught = reports(out, "rank {rank}: InvalidArgumentError: ")
    assert at_exit or caught, f"no rank reported the mismatch:\n{out}"
    assert all(int(rank) == last for rank, _ in at_exit), out
    assert all(rank != last for rank, _ in caught), out
    for rank, line in at_exit + caught:
        match = re.match(pattern, line)
        assert match, f"unexpected mismatch message (pattern {pattern!r}):\n{line}"
        assert match.group(1) == str(rank), line


# -- 2. a rank raises ----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["loop", "replica"])
@pytest.mark.parametrize("nprocs", NPROCS)
def test_uncaught_exception_on_one_rank_ends_the_job(nprocs, where):
    """Rank 1 raises at step 1 (in the loop, or inside the replica function) while the others
    wait in a collective with no timeout: its excepthook prints the traceback and aborts."""
    code, out, elapsed = run(nprocs, "raise_midway.py", 1, where)
    assert_died_quickly(code, out, elapsed)
    assert f"[mpidist rank 1 of {nprocs} on " in out, out
    assert "uncaught exception; ending the job on every rank." in out, out
    assert "Traceback (most recent call last):" in out, out
    assert 'raise RuntimeError("boom on purpose")' in out, out
    assert "RuntimeError: boom on purpose" in out, out
    assert "step 1 done" not in out, out


# -- 3, 4, 7. ranks all-reduce tensors that do not match -------------------------------------
REDUCE = " in Strategy.reduce(reduce_op=SUM, axis=None)"
IN_RUN = " in ReplicaContext.all_reduce(reduce_op=SUM, num_values=1)"
MISMATCHES = {
    # what: (call of rank 1, call of the others, differing field, replicas per rank, public call)
    "shape": ("all_reduce(op=sum, dtype=float64, shape=[4])" + REDUCE,
              "all_reduce(op=sum, dtype=float64, shape=[5])" + REDUCE, "shape", 1,
              "Strategy.reduce"),
    "dtype": ("all_reduce(op=sum, dtype=float32, shape=[5])" + REDUCE,
              "all_reduce(op=sum, dtype=float64, shape=[5])" + REDUCE, "dtype", 1,
              "Strategy.reduce"),
    "replica": ("all_reduce(op=sum, dtype=float64, shape=[4])" + IN_RUN,
                "all_reduce(op=sum, dtype=float64, shape=[5])" + IN_RUN, "shape", 2,
                "ReplicaContext.all_reduce"),
}


@pytest.mark.parametrize("what", sorted(MISMATCHES))
@pytest.mark.parametrize("nprocs", NPROCS)
def test_mismatched_all_reduce_raises_the_same_error_on_every_rank(nprocs, what):
    """Rank 1's tensor differs from the others' (shape, dtype, or shape inside strategy.run with
    two CPU replicas per rank): every rank gets an InvalidArgumentError that names both calls
    and the differing field, catches it, and the next correct collective works."""
    mine, others, differ, replicas, public = MISMATCHES[what]
    code, out, elapsed = run(nprocs, "mismatch.py", what)
    rest = [0] + list(range(2, nprocs))
    pattern = mismatch_pattern([(rest, others), ([1], mine)], differ, public)
    caught = reports(out, "caught on rank {rank}: InvalidArgumentError: ")
    assert sorted(rank for rank, _ in caught) == list(range(nprocs)), \
        f"every rank should report the mismatch once:\n{out}"
    for rank, line in caught:
        match = re.match(pattern, line)
        assert match, f"unexpected message on rank {rank} (pattern {pattern!r}):\n{line}"
        assert match.group(1) == str(rank), line
    for rank in range(nprocs):
        total = [float(nprocs * replicas)] * 3
        assert f"rank {rank}: after the error, sum = {total}" in out, out
    assert "must not happen" not in out, out
    assert elapsed < QUICK, f"took {elapsed:.1f} s:\n{out}"
    assert code == 0, f"the ranks caught the error and carried on, yet the job exited {code}:\n{out}"


# -- 5. a collective times out -------------------------------------------------------------
@pytest.mark.parametrize("nprocs", NPROCS)
def test_timeout_caught_on_every_waiting_rank(nprocs):
    """The last rank sleeps 6 s while the others wait with timeout_seconds=1: each of them
    gets DeadlineExceededError after about 1 s naming the sleeper, the broken communicator
    refuses the next collective, and the job ends at exit without waiting for the sleeper."""
    last = nprocs - 1
    code, out, elapsed = run(nprocs, "timeout.py", 1, 6, "caught")
    assert_died_quickly(code, out, elapsed)
    assert f"rank {last}: woke up" not in out, f"the job waited for the sleeping rank:\n{out}"
    found = reports(out, "rank {rank}: DeadlineExceededError after ")
    assert sorted(rank for rank, _ in found) == list(range(last)), \
        f"every waiting rank should report the timeout once:\n{out}"
    for rank, line in found:
        seconds = float(re.match(r"([\d.]+) s: ", line).group(1))
        assert 0.99 <= seconds < 3.0, f"rank {rank} timed out after {seconds} s, not ~1 s:\n{line}"
        assert "s: Collective has timed out during execution: collective #" in line, line
        assert "all_reduce(op=sum, dtype=float64, shape=[3])" in line, line
        assert f"did not complete within 1 s on rank {rank}." in line, line
        assert f"Ranks that never arrived: [{last}] (rank {last} last entered collective #" \
            in line, line
        assert f"rank {rank}: next collective: UnavailableError: mpidist's communicator was " \
            "aborted by an earlier failure (collective #" in out, out
    # Past the barrier the first rank to exit aborts the job, so not every rank gets to say so.
    assert reports(out, "rank {rank}: exiting"), out
    assert re.search(rf"\[mpidist rank \d+ of {nprocs} on .*\] ending the job because collective "
                     r"#\d+ all_reduce\(op=sum, dtype=float64, shape=\[3\]\) in "
                     r"Strategy\.reduce\(reduce_op=SUM, axis=None\) timed out on rank \d+\.",
                     out), out


@pytest.mark.parametrize("nprocs", NPROCS)
def test_timeout_uncaught_ends_the_job_with_the_error(nprocs):
    """As above, but the DeadlineExceededError propagates: the excepthook prints it and ends
    the job well before the sleeping rank wakes up."""
    last = nprocs - 1
    code, out, elapsed = run(nprocs, "timeout.py", 1, 6, "uncaught")
    assert_died_quickly(code, out, elapsed)
    assert f"rank {last}: sleeping 6 s" in out, out
    assert f"rank {last}: woke up" not in out, f"the job waited for the sleeping rank:\n{out}"
    assert "uncaught exception; ending the job on every rank." in out, out
    assert "DeadlineExceededError: Collective has timed out during execution: collective #" \
        in out, f"the error itself is missing from the output:\n{out}"
    assert re.search(r"did not complete within 1 s on rank \d+\. Ranks that never arrived: "
                     + re.escape(f"[{last}]"), out), out


# -- 6. the launcher and MPI disagree --------------------------------------------------------
def clean_env(**extra):
    """This environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(LOOPBACK_ENV)
    env.update(extra)
    return env


def run_alone(env):
    """launch_check.py as one plain process (no mpiexec)."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(PROGRAMS / "launch_check.py")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=LAUNCH_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"launch_check.py hung for {LAUNCH_TIMEOUT} s; output so far:\n{err.output}")
    return proc.returncode, proc.stdout, time.monotonic() - start


@pytest.mark.parametrize("variable", ["PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"])
@pytest.mark.parametrize("nprocs", NPROCS)
def test_launcher_variable_without_mpi_world_is_refused(nprocs, variable):
    """A launcher announced N tasks but MPI started alone (wrong PMI, wrong mpiexec): creating
    the strategy raises a RuntimeError that says so and how to fix it."""
    tasks = nprocs + 1 if variable.startswith("SLURM") else nprocs
    code, out, elapsed = run_alone(clean_env(**{variable: str(tasks)}))
    assert code != 0, out
    assert elapsed < QUICK, out
    found = reports(out, "rank {rank}: RuntimeError: ")
    assert [rank for rank, _ in found] == [0], out
    line = found[0][1]
    assert line.startswith(f"The launcher started {tasks} tasks ({variable}={tasks}) but MPI "
                           "reports a world of size 1 on this process: every task is running "
                           "alone and would train its own model."), line
    assert "srun --mpi=pmi2" in line and "srun --mpi=pmix" in line, line
    assert "Traceback (most recent call last):" in out, out
    assert "num_replicas_in_sync" not in out, out


def test_no_launcher_variable_runs_alone():
    code, out, _ = run_alone(clean_env())
    assert code == 0, out
    assert "num_replicas_in_sync 1" in out, out


@pytest.mark.parametrize("nprocs", NPROCS)
def test_mpiexec_inside_a_larger_slurm_step_is_accepted(nprocs):
    """mpiexec -n N inside an allocation of more tasks: the process manager that started the
    ranks (PMI_SIZE=N) agrees with MPI, so the job runs."""
    code, out, _ = run(nprocs, "launch_check.py",
                       env={"SLURM_STEP_NUM_TASKS": str(nprocs + 1), "SLURM_NTASKS": str(nprocs + 2)})
    assert code == 0, out
    assert out.count(f"num_replicas_in_sync {nprocs}") == nprocs, out


# -- an uncaught mismatch: its message once per rank, with the user's frames ----------------------
@pytest.mark.parametrize("nprocs", NPROCS)
def test_uncaught_mismatch_prints_once_per_rank_with_the_users_frames(nprocs):
    """Nobody catches the mismatch: each rank that gets to print before the job ends prints
    the message once, after a traceback of the program's own lines and the public call it made
    (mpidist's frames are counted, not shown)."""
    code, out, elapsed = run(nprocs, "mismatch.py", "shape", "uncaught")
    assert_died_quickly(code, out, elapsed)
    headers = re.findall(rf"\[mpidist rank (\d+) of {nprocs} on [^\]\n]*\] uncaught exception; "
                         r"ending the job on every rank\.\n", out)
    assert headers, f"no rank reported the uncaught mismatch:\n{out}"
    for rank in set(headers):
        assert headers.count(rank) == 1, f"rank {rank} reported twice:\n{out}"
        seen = out.count(f"Ranks issued different collectives (seen on rank {rank})")
        assert seen == 1, f"rank {rank}'s message printed {seen} times:\n{out}"
    frames = re.findall(r'  File "([^"]+)", line \d+, in (\S+)', out)
    assert any(path.endswith("mismatch.py") for path, _ in frames), out
    inside = [(path, fn) for path, fn in frames if f"{os.sep}mpidist{os.sep}" in path]
    assert inside and all(fn == "reduce" for _, fn in inside), (
        f"only the public call (Strategy.reduce) may show from inside mpidist:\n{out}")
    assert re.search(r"\(\d+ frames inside mpidist not shown; set MPIDIST_FULL_TRACEBACKS=1 "
                     r"to see them\)", out), out
