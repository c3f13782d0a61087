"""A rank that dies (os._exit, SIGKILL, SIGSEGV, SIGTERM) is reported, once, by its guard.

Jobs start through ``mpidist run -n N -- python tests/failure_programs/die.py ...`` (mpiexec,
each rank under ``python -m mpidist.guard``), with a hard timeout. die.py does one all-reduce
per step; collective #1 is the strategy's set-up, so step k's all-reduce is collective #k+2:
a rank that dies between steps 1 and 2 last entered (and finished) #3, a rank killed while it
waits in step 2's all-reduce died inside #4.

The guard's own behaviour (signal forwarding, death with the guard, bad commands) is checked
on a plain child process, without MPI.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from mpi_launch import LOOPBACK_ENV
from test_mpi_failures import remove_leaked_mpich_segments  # noqa: F401 - autouse fixture

from mpidist.comm.communicator import CollectiveCall
from mpidist.comm.rank_state import (FILE_BYTES, RankStateWriter, create_state_file,
                                     read_state_file)
from mpidist.core.user_calls import user_call
from mpidist.launch.deaths import claim_first_death, first_death
from mpidist.launch.report import later_death_note

PROGRAMS = Path(__file__).parent / "failure_programs"
LAUNCH_TIMEOUT = 60  # a launch still running after this is a hang
HOST = socket.gethostname()
STEP1 = "#3 all_reduce(op=sum, dtype=float64, shape=[3])"  # finished before dying between
STEP2 = "#4 all_reduce(op=sum, dtype=float64, shape=[3])"  # died inside it
HEAD = "mpidist: rank "


def mpidist_run(nprocs, *args, timeout=LAUNCH_TIMEOUT):
    """``(exit code, output)`` of ``mpidist run -n N -- python die.py args``; fails on a hang."""
    cmd = [sys.executable, "-m", "mpidist", "run", "-n", str(nprocs), "--", sys.executable,
           str(PROGRAMS / "die.py"), *map(str, args)]
    env = {**os.environ, **LOOPBACK_ENV}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s; output so far:\n{out}")
    return proc.returncode, out


def report_of(out):
    """The report lines (``mpidist: ...``) of the one rank that reported; fails unless exactly
    one rank did."""
    heads = [line for line in out.splitlines() if line.startswith(HEAD)]
    assert len(heads) == 1, f"expected one report, got {len(heads)}:\n{out}"
    lines = out.splitlines()
    start = lines.index(heads[0])
    return [heads[0]] + [ln for ln in lines[start + 1:start + 4] if ln.startswith("mpidist:   ")]


# -- 1. a rank that exits, on 2 and 4 ranks ------------------------------------------------------
@pytest.mark.parametrize("nprocs", [2, 4])
def test_os_exit_between_collectives_is_reported_with_its_code(nprocs):
    code, out = mpidist_run(nprocs, 1, "exit3", "between")
    assert code == 3, f"mpidist run should exit with the dead rank's 3, got {code}:\n{out}"
    head, last, command, given = report_of(out)
    assert head.startswith(f"mpidist: rank 1 of {nprocs} (pid "), head
    assert head.endswith(f" on {HOST}) exited with status 3."), head
    assert last.startswith(f"mpidist:   last collective: {STEP1}"), last
    assert "Strategy.reduce" in last, last
    assert last.endswith(": it had finished it and died between collectives."), last
    assert command.endswith("die.py 1 exit3 between"), command
    assert given == "mpidist:   exit code given to the launcher: 3.", given
    for rank in range(nprocs):
        assert f"rank {rank}: step 1 sum [{float(nprocs)}, {float(nprocs)}, {float(nprocs)}]" \
            in out, out
    assert "reached the end" not in out and "step 2 sum" not in out, out


# -- 2. signals --------------------------------------------------------------------------------
def test_sigkill_inside_a_collective_names_the_oom_killer():
    """Rank 1 waits in step 2's all-reduce (rank 0 sleeps) and is killed there by SIGKILL."""
    code, out = mpidist_run(2, 1, "SIGKILL", "inside")
    assert code == 128 + 9, out
    head, last, _, given = report_of(out)
    assert head.startswith("mpidist: rank 1 of 2 (pid "), head
    assert head.endswith(f" on {HOST}) was killed by SIGKILL (signal 9): often the kernel's OOM "
                         "killer; check `dmesg`/Slurm's memory accounting."), head
    assert last.startswith(f"mpidist:   last collective: {STEP2}"), last
    assert last.endswith(": it died inside it (the other ranks wait for it there)."), last
    assert given == "mpidist:   exit code given to the launcher: 137.", given


@pytest.mark.parametrize("how, number, hint", [
    ("SIGSEGV", 11, "a crash in native code"),
    ("SIGTERM", 15, "sent by someone else"),
])
def test_signal_between_collectives(how, number, hint):
    code, out = mpidist_run(2, 1, how, "between")
    assert code == 128 + number, out
    head, last, _, _ = report_of(out)
    assert f" on {HOST}) was killed by {how} (signal {number}): {hint}" in head, head
    assert last.startswith(f"mpidist:   last collective: {STEP1}"), last
    assert "died between collectives" in last, last


def test_rank_0_dying_inside_on_4_ranks():
    code, out = mpidist_run(4, 0, "exit3", "inside")
    assert code == 3, out
    head, last, _, _ = report_of(out)
    assert head.startswith("mpidist: rank 0 of 4 (pid "), head
    assert last.startswith(f"mpidist:   last collective: {STEP2}") and "died inside it" in last


# -- 3. clean jobs and Python errors -----------------------------------------------------------
@pytest.mark.parametrize("nprocs", [2, 4])
def test_clean_job_prints_no_report_and_exits_0(nprocs):
    code, out = mpidist_run(nprocs, 1, "none", "between")
    assert code == 0, out
    assert out.count("reached the end") == nprocs, out
    assert "mpidist:" not in out, out


def test_python_exception_gets_no_second_report():
    """The abort hook prints the traceback; the guard adds no report block for it."""
    cmd = [sys.executable, "-m", "mpidist", "run", "-n", "2", "--", sys.executable,
           str(PROGRAMS / "raise_midway.py"), "1", "loop"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **LOOPBACK_ENV}, timeout=LAUNCH_TIMEOUT,
                          check=False)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "RuntimeError: boom on purpose" in out, out
    assert "exit code given to the launcher" not in out, out
    assert "last collective: #" not in out, out  # at most the one-line note


# -- 4. the guard itself, without MPI --------------------------------------------------------------
CHILD = """
import os, signal, sys, time
def on(number, frame):
    print(f"child got signal {number}", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGUSR1, on)
print(f"child ready {os.getpid()}", flush=True)
time.sleep(30)
print("child slept through (must not happen)", flush=True)
"""


def start_guard(code=CHILD):
    return subprocess.Popen([sys.executable, "-m", "mpidist.guard", "--", sys.executable, "-c",
                             code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_ready(guard):
    line = guard.stdout.readline()
    assert line.startswith("child ready "), line
    return int(line.split()[-1])


def finish(proc, timeout=20):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the guard did not end within {timeout} s: {proc.communicate()[0]}")
    return out


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGUSR1])
def test_guard_forwards_signals_and_keeps_quiet(number):
    """SIGTERM (scancel, mpiexec) and SIGUSR1 (Slurm's time-limit signal) reach the program; its
    exit code (7) is the guard's, and the job being stopped is no death to report."""
    guard = start_guard()
    wait_ready(guard)
    guard.send_signal(number)
    out = finish(guard)
    assert guard.returncode == 7, out
    assert f"child got signal {int(number)}" in out, out
    assert "mpidist:" not in out, out


def test_program_dies_with_its_guard():
    """mpiexec ends the other ranks with SIGKILL to their guards: the programs must go too."""
    guard = start_guard()
    child = wait_ready(guard)
    guard.kill()
    finish(guard)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail(f"the program {child} outlived its guard")


def test_guard_without_a_launcher_reports_the_program():
    guard = start_guard("import os; os._exit(5)")
    out = finish(guard)
    assert guard.returncode == 5, out
    assert "mpidist: the program (pid " in out and f" on {HOST}) exited with status 5." in out
    assert "last collective: unknown (the program made no mpidist communicator)." in out, out


def test_guard_bad_command():
    proc = subprocess.run([sys.executable, "-m", "mpidist.guard", "--", "no-such-program-xyz"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 127, proc.stderr
    assert "mpidist.guard: cannot start 'no-such-program-xyz': No such file or directory." \
        in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "mpidist.guard"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 2 and "usage: python -m mpidist.guard" in proc.stderr


def test_run_needs_the_program_after_a_double_dash():
    proc = subprocess.run([sys.executable, "-m", "mpidist", "run", "-n", "2", "python", "x.py"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "mpidist run: error: put the program after '--', e.g. `mpidist run -n 4 -- python " \
        "train.py --epochs 3`" in proc.stderr, proc.stderr


def test_run_dry_run_shows_the_guarded_command():
    proc = subprocess.run([sys.executable, "-m", "mpidist", "run", "--launcher", "mpiexec",
                           "-n", "3", "-iface", "lo", "--dry-run", "--", "python", "t.py", "-n",
                           "5"], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words[1:5] == ["-n", "3", "-iface", "lo"], words
    guard = words.index("mpidist.guard")
    assert words[guard - 2:guard] == [sys.executable, "-m"], words
    assert words[guard + 1] == "--report-dir", words
    assert words[guard + 3:] == ["--", "python", "t.py", "-n", "5"], words


# -- 5. the rank-state file ------------------------------------------------------------------
@pytest.fixture
def state_file(monkeypatch):
    import mpidist.comm.rank_state as rank_state

    monkeypatch.setattr(rank_state, "_claimed", False)  # one writer per process
    path = create_state_file()
    yield path
    os.unlink(path)


def test_state_file_round_trip(state_file):
    assert read_state_file(state_file) is None  # nobody claimed it yet
    writer = RankStateWriter.attach(state_file, 2, 4)
    call = CollectiveCall("all_reduce", op="sum", dtype="float32", shape=(5,))
    with user_call("Strategy.reduce", reduce_op="SUM"):
        writer.enter(7, call)
    state = read_state_file(state_file)
    assert (state.pid, state.rank, state.size, state.entered, state.completed) == \
        (os.getpid(), 2, 4, 7, 0)
    assert state.operation == "all_reduce" and state.label == "Strategy.reduce"
    assert state.description.startswith("all_reduce(op=sum, dtype=float32, shape=[5])")
    assert state.inside
    writer.complete(7)
    writer.enter(8, CollectiveCall("barrier"))
    state = read_state_file(state_file)
    assert (state.entered, state.completed, state.operation, state.label) == \
        (8, 7, "barrier", "")
    writer.complete(8)
    assert not read_state_file(state_file).inside


def test_state_file_torn_write_shows_the_previous_collective(state_file):
    """A rank killed while writing slot 9 leaves it unstamped: the reader shows #8, whole."""
    writer = RankStateWriter.attach(state_file, 0, 2)
    writer.enter(7, CollectiveCall("all_reduce", op="max", dtype="int64", shape=(1,)))
    writer.enter(8, CollectiveCall("broadcast", root=0, dtype="int64", shape=(2,)))
    assert read_state_file(state_file).entered == 8
    with open(state_file, "r+b") as f:  # what a death halfway through enter(9) leaves
        f.seek(8 * (6 + 64))  # slot 1's stamp (seq 9 would go to slot 1)
        f.write((0).to_bytes(8, sys.byteorder) + b"all_re")
    state = read_state_file(state_file)
    assert (state.entered, state.operation) == (8, "broadcast"), state
    assert state.description.startswith("broadcast(root=0, dtype=int64, shape=[2])"), state


def test_state_file_bad_path_warns_and_is_ignored(state_file, tmp_path):
    other = tmp_path / "not-a-state-file"
    other.write_bytes(b"x" * FILE_BYTES)
    before = other.read_bytes()
    with pytest.warns(RuntimeWarning, match=r"MPIDIST_RANK_STATE='.*not-a-state-file' is "
                                            r"ignored: it is not an mpidist rank-state file"):
        assert RankStateWriter.attach(str(other), 0, 1) is None
    assert other.read_bytes() == before
    with pytest.warns(RuntimeWarning, match=r"is ignored: it cannot be opened \(No such file"):
        assert RankStateWriter.attach(str(tmp_path / "missing"), 0, 1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RankStateWriter.attach(None, 0, 1) is None


def test_first_death_claim_and_the_note_of_a_later_death(tmp_path):
    """The first guard to claim the directory reports in full; a later one gets a one-line
    note naming the first; ``mpidist run`` reads the first rank's code back."""
    assert first_death(str(tmp_path)) is None
    assert claim_first_death(str(tmp_path), 1, 137) is None  # first: print the full report
    assert claim_first_death(str(tmp_path), 0, 1) == (1, 137)  # later: the note
    assert first_death(str(tmp_path)) == (1, 137)
    assert claim_first_death(str(tmp_path / "missing"), 0, 1) is None  # another node: report
    note = later_death_note(-15, 0, "node7", 4242, (1, 137))
    assert note == ("mpidist: rank 0 (pid 4242 on node7) was killed by SIGTERM (signal 15) after "
                    "rank 1 had died; the report for rank 1 above says why.\n")
