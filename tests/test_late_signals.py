"""A signal that arrives after the work is done must not turn a finished run into a failure.

Slurm's time-limit signal (``--signal=B:USR1@T``) comes at a time of its choosing, so it can
reach a job whose ranks have just finished. CPython resets every signal that has a Python
handler to its default action while the interpreter shuts down, and USR1's default action
ends the process: a rank that had finished, printed its result and deleted its backup died of
USR1, the batch script saw a signalled step fail and requeued the job, which trained again
from scratch (CI, tests/slurm/test_preemption.py, 2026-11-26: the result printed twice).

Both processes of a rank had that window: ``slurm/train.py`` (its USR1 handler) and the guard
(``python -m mpidist.guard``, whose handlers forward signals). The rule now: once there is
nothing left to act on a signal, it is ignored (``SIG_IGN`` survives the shutdown). These tests
send USR1 over and over from the moment the work is done until the process has exited.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mpi_launch import LOOPBACK_ENV

from mpidist.launch import signals as forwarding
from mpidist.launch.guard import run_guarded

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "slurm" / "train.py"
TIMEOUT = 120  # a run still going after this is a hang


def start(command, **kwargs):
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kwargs)


def signal_until_exit(proc, number, interval=0.0005):
    """Send ``number`` to ``proc`` every ``interval`` s until it exits; the count sent."""
    sent = 0
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None:
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{proc.args} did not exit within {TIMEOUT} s")
        try:
            proc.send_signal(number)
            sent += 1
        except ProcessLookupError:
            break
        time.sleep(interval)
    return sent


def read_until(proc, predicate):
    """Lines of ``proc``'s output up to the first for which ``predicate`` holds."""
    lines = []
    deadline = time.monotonic() + TIMEOUT
    for line in proc.stdout:
        lines.append(line)
        if predicate(line):
            return lines
        if time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"{proc.args}: no such line within {TIMEOUT} s:\n{''.join(lines)}")


# The child ignores USR1 itself: only the guard's own window is tried here.
QUIET_CHILD = """
import signal, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
print("done", flush=True)
time.sleep(0.3)
"""


@pytest.mark.parametrize("attempt", range(3))
def test_usr1_after_the_program_ended_leaves_the_guard_with_its_exit_code(attempt):
    del attempt  # a window of milliseconds: tried three times
    guard = start([sys.executable, "-m", "mpidist.guard", "--", sys.executable, "-c",
                   QUIET_CHILD])
    read_until(guard, lambda line: line.strip() == "done")
    sent = signal_until_exit(guard, signal.SIGUSR1)
    rest = guard.stdout.read()
    assert sent > 0
    assert guard.returncode == 0, (guard.returncode, rest)
    assert "mpidist:" not in rest, rest


def test_the_guard_ignores_the_forwarded_signals_once_its_program_has_ended():
    """The mechanism behind the test above, in this process: after ``run_guarded`` returns,
    every forwarded signal is ignored, which CPython keeps through its shutdown."""
    before = {number: signal.getsignal(number) for number in forwarding.FORWARDED_SIGNALS}
    try:
        assert run_guarded([sys.executable, "-c", "pass"]) == 0
        after = {number: signal.getsignal(number) for number in forwarding.FORWARDED_SIGNALS}
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert after == {number: signal.SIG_IGN for number in forwarding.FORWARDED_SIGNALS}


@pytest.mark.timeout(TIMEOUT + 30)
def test_usr1_to_a_finished_training_run_is_no_requeue(tmp_path):
    """slurm/train.py under the guard, as a Slurm step runs it: USR1 from its result line until
    it exits. It ends with 0 (not 75, not killed by USR1), prints one result, and leaves no
    backup, so the batch script neither requeues it nor retrains from scratch."""
    backups = tmp_path / "backups"
    env = {**os.environ, **LOOPBACK_ENV, "PYTHONPATH": str(ROOT)}
    run = start([sys.executable, "-m", "mpidist.guard", "--", sys.executable, str(TRAIN),
                 "--json", "--epochs", "1", "--backup-dir", str(backups)], env=env, cwd=tmp_path)
    lines = read_until(run, lambda line: line.startswith("{"))
    sent = signal_until_exit(run, signal.SIGUSR1)
    rest = run.stdout.read()
    out = "".join(lines) + rest
    assert sent > 0
    assert run.returncode == 0, (run.returncode, out)
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(results) == 1 and results[0]["resumed_from"] == 0, out
    assert not any(backups.glob("*/checkpoint")) and not (backups / "checkpoint").exists(), out
