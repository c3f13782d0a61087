"""Stopping a job from outside, and a rank leaving without a word, under MPICH's plain
``mpiexec`` (Hydra, no guard) with the MPI library's defaults: each stopped rank prints one
line, saying how it was stopped, where the program was and what survives (the latest backup
and how to resume), never a traceback; a rank that ends by ``os._exit`` is named by a survivor.

- Ctrl-C: SIGINT to the job's whole process group (what a terminal sends), every rank stopped;
- SIGTERM to one rank (kill, a time limit, a preemption), which used to end it without a word;
  in Hydra's fault-tolerant mode the survivors then end the job within seconds;
- ``os._exit(1)`` on one rank, which Hydra answers by killing the others without naming it;
- a program that handles SIGTERM itself keeps its own handler (unit-tested below).
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpi_launch import find_hydra
from mpidist.comm import stop_report
from mpidist.core import saves

PROGRAM = Path(__file__).parent / "failure_programs" / "stop_fit.py"
DIE = Path(__file__).parent / "failure_programs" / "die_how.py"
ENDLESS_PS = Path(__file__).parent / "ps_programs" / "endless.py"
TIMEOUT = 120
LINE = re.compile(r"^\[mpidist rank (\d+) of (\d+) on \S+\] (interrupted by Ctrl-C \(SIGINT\)|"
                  r"stopped by SIGTERM \(kill, scancel, a time limit or a preemption\)) at "
                  r"stop_fit\.py:\d+ in \S+; last backup: step (\d+) in (\S+), \d+ s ago \(run "
                  r"the same command again: BackupAndRestore resumes from it\)\.$", re.MULTILINE)


def stop_job(nprocs, backup_dir, stop, program=PROGRAM, trains=None):
    """Start ``program BACKUP_DIR`` on ``nprocs`` ranks under Hydra in a new process group,
    wait until ``trains`` (default: every rank) lines say ``: training``, then
    ``stop(job_process, rank_pids)``; ``(exit code, output, seconds the job took to end)``."""
    hydra = find_hydra()
    if hydra is None:
        pytest.skip("needs MPICH's mpiexec.hydra")
    out_path = Path(backup_dir).parent / "job.out"
    with open(out_path, "w") as out:
        # SIGINT at its default for the ranks (a shell's background job inherits it ignored)
        job = subprocess.Popen([hydra, "-n", str(nprocs), sys.executable, str(program),
                                str(backup_dir)], stdout=out, stderr=subprocess.STDOUT,
                               cwd=program.parent, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + TIMEOUT
        while out_path.read_text().count(": training") < (trains or nprocs):
            assert job.poll() is None, out_path.read_text()
            assert time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.1)
        ranks = subprocess.run(["pgrep", "-f", f"{program} {backup_dir}"], capture_output=True,
                               text=True).stdout.split()
        stop(job, [int(pid) for pid in ranks])
        stopped = time.monotonic()
        code = job.wait(timeout=TIMEOUT)
        took = time.monotonic() - stopped
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return code, out_path.read_text(), took


@pytest.mark.timeout(300)
def test_ctrl_c_prints_one_line_per_rank_naming_the_backup(tmp_path):
    code, out, _ = stop_job(2, tmp_path / "backup",
                            lambda job, _: os.killpg(job.pid, signal.SIGINT))
    assert code != 0, out
    lines = LINE.findall(out)
    assert sorted(int(rank) for rank, *_ in lines) == [0, 1], out
    for _, size, how, step, where in lines:
        assert size == "2" and how.startswith("interrupted by Ctrl-C") and int(step) >= 5, out
        assert where == str(tmp_path / "backup"), out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


@pytest.mark.timeout(300)
def test_sigterm_to_one_rank_is_reported_by_that_rank(tmp_path):
    code, out, _ = stop_job(2, tmp_path / "backup",
                            lambda job, pids: os.kill(max(pids), signal.SIGTERM))
    assert code != 0, out
    lines = LINE.findall(out)
    assert len(lines) == 1 and lines[0][2].startswith("stopped by SIGTERM"), out
    assert "Traceback" not in out, out


@pytest.mark.timeout(300)
def test_ctrl_c_stops_a_parameter_server_job_within_seconds(tmp_path):
    """Chief, ps and workers all get SIGINT: each prints its one line, and the chief leaves at
    once instead of waiting for closures and for goodbyes from ranks that are gone."""
    code, out, took = stop_job(4, tmp_path / "unused", lambda job, _: os.killpg(job.pid,
                                                                             signal.SIGINT),
                               program=ENDLESS_PS, trains=1)
    assert code != 0, out
    assert took < 5, (took, out)
    lines = re.findall(r"^\[mpidist rank (\d) of 4 on \S+\] interrupted by Ctrl-C \(SIGINT\) "
                       r"at \S+ in \S+; nothing was saved by this run\.$", out, re.MULTILINE)
    assert len(lines) == len(set(lines)) and "0" in lines, out  # at most one per rank
    assert "WARNING" not in out and "Traceback" not in out, out


def run_die(how, *launcher_args, guarded=False):
    """``(exit code, output, seconds)`` of die_how.py on 4 ranks, rank 3 leaving by ``how``;
    ``guarded``: under ``mpidist run`` (each rank under its guard)."""
    hydra = find_hydra()
    if hydra is None:
        pytest.skip("needs MPICH's mpiexec.hydra")
    program = [sys.executable, str(DIE), "3", how]
    command = [sys.executable, "-m", "mpidist", "run", "--mpiexec", hydra, *launcher_args,
               "-n", "4", "--", *program] if guarded else [hydra, *launcher_args, "-n", "4",
                                                          *program]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=DIE.parent, env={**os.environ, "HYDRA_IFACE": "lo"})
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.parametrize("nodes", [1, 2])
def test_an_os_exit_is_named_by_a_survivor(nodes):
    """Hydra kills the other ranks milliseconds after one exits 1 and names none of them; the
    survivor that notices (its watch of dead ranks) says who, at once."""
    placement = ["-launcher", "fork", "-hosts", "n0,n1", "-ppn", "2"] if nodes == 2 else []
    code, out, _ = run_die("exit1", *placement)
    assert code != 0, out
    assert re.search(r"\[mpidist rank 0 of 4 on \S+\] rank 3 of 4 \(pid \d+ on \S+\) is gone: "
                     r"its process ended without leaving the job \(os\._exit", out), out


@pytest.mark.parametrize("launcher", ["mpiexec", "mpidist run"])
def test_sigterm_to_one_rank_of_a_fault_tolerant_job_ends_it_with_two_lines(launcher):
    """Under -disable-auto-cleanup the survivors wait in the step's all-reduce: the stopped
    rank's line, then rank 0's, then rank 0 ends the job. Under ``mpidist run`` that is what
    happens, every time: the guard hands Hydra the rank's end as an exit code, which Hydra
    leaves alone in this mode. Under a plain ``mpiexec`` the rank dies of the signal itself, and
    Hydra ends the whole job on a signal death even in this mode, often before rank 0's grace
    (1 s) is over: then Hydra's own line ends the output instead of rank 0's (measured: 2 of 4
    runs, before this change as after it)."""
    code, out, seconds = run_die("SIGTERM", "-disable-auto-cleanup",
                                 guarded=launcher == "mpidist run")
    assert code != 0, out
    assert seconds < 60, (seconds, out)
    assert re.search(r"\[mpidist rank 3 of 4 on \S+\] stopped by SIGTERM .* at die_how\.py:\d+ "
                     r"in <module>; nothing was saved by this run\.", out), out
    rank0 = re.search(r"\[mpidist rank 0 of 4 on \S+\] rank 3 of 4 \(pid \d+ on \S+\) was "
                      r"stopped \(its line above says how\); the job cannot continue", out)
    hydra = "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated (signal 15)" in out
    assert rank0 or (launcher == "mpiexec" and hydra), out
    assert "is gone" not in out and "Traceback" not in out, out


# -- the pieces, in one process ----------------------------------------------------------------
def test_the_summary_names_the_newest_saves_and_how_to_resume(monkeypatch):
    monkeypatch.setattr(saves, "_latest", {})
    assert saves.saves_summary() == "nothing was saved by this run"
    saves.record_save("checkpoint", "/ck", "/ck/ckpt-1", "checkpoint.restore('/ck/ckpt-1') reads it")
    saves.record_save("checkpoint", "/bk", "/bk/ckpt-4", "x")
    saves.forget_save("checkpoint", "/bk")  # a backup's own files: its record says it better
    saves.record_save("backup", "/bk", "step 40 in /bk", "run the same command again")
    text = saves.saves_summary()
    assert text.startswith("last backup: step 40 in /bk, 0 s ago (run the same command again)")
    assert "last checkpoint: /ck/ckpt-1" in text and "/bk/ckpt-4" not in text


def test_a_program_s_own_sigterm_handler_is_kept():
    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        stop_report.install_term_report(lambda: "rank 0 of 1 on here")
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_line_points_at_the_user_s_frame():
    frame = sys._getframe()
    line = stop_report.stop_line("rank 3 of 4 on n1", stop_report.TERMINATED, frame)
    assert line.startswith("[mpidist rank 3 of 4 on n1] stopped by SIGTERM (kill, scancel, a "
                           "time limit or a preemption) at test_stop_reports.py:")
    assert " in test_the_line_points_at_the_user_s_frame; " in line
