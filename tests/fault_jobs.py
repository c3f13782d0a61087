"""What the real-fault matrices share (tests/fault_matrix.py for collective jobs,
tests/ps_fault_matrix.py for parameter-server jobs): the launcher and its options, one job run
under a timeout with a marker on every rank's command line, the processes it left behind, and
the table printed by ``python tests/<matrix>.py``.

Nothing here forces an MPI transport: the variables that would are removed from the jobs'
environment, so they run on the MPI library's defaults, as a user's do. Only the launcher's
own control traffic is kept on loopback (``HYDRA_IFACE=lo``).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

HYDRA_ENV = {"HYDRA_IFACE": "lo"}  # the launcher's own sockets; nothing about MPI's transport
TRANSPORT_VARIABLES = ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE", "UCX_TLS",
                       "UCX_NET_DEVICES")


class Outcome(NamedTuple):
    ended: bool         # by itself, within the timeout
    code: int | None    # the launcher's exit code (None: killed after the timeout)
    seconds: float
    output: str
    leftovers: list     # command lines of the job's processes still alive after it ended
    command: list


def hydra():
    """The mpich wheel's Hydra mpiexec (next to this interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec.hydra"
    if beside.exists():
        return str(beside)
    import shutil

    return shutil.which("mpiexec.hydra") or shutil.which("mpiexec")


def launch_options(nodes, cleanup, nprocs):
    """Hydra's options for ``nprocs`` ranks on ``nodes`` simulated nodes (the fork launcher:
    one proxy per named host), with ``cleanup`` ``auto`` or ``disabled``."""
    options = []
    if nodes > 1:
        options += ["-launcher", "fork", "-hosts", ",".join(f"n{i}" for i in range(nodes)),
                    "-ppn", str(nprocs // nodes)]
    if cleanup == "disabled":
        options.append("-disable-auto-cleanup")
    return [*options, "-n", str(nprocs)]


def job_processes(marker):
    """``[(pid, command line)]`` of live processes whose command line holds ``marker``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            words = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in words and int(proc.name) != os.getpid():
            found.append((int(proc.name), b" ".join(words).decode(errors="replace").strip()))
    return found


def kill_job(group, marker):
    """SIGKILL the process group ``group`` (None: none) and every process carrying ``marker``."""
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid, _ in job_processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# MPICH 5.0.2's Hydra proxy crashes (EPIPE, then "assert (!closed) failed" in mpiexec) when a
# rank is killed while the proxy forwards it a PMI response: the launcher's own race (one
# -disable-auto-cleanup launch in each of two of the full runs of 2026-11-26). The job still
# ends and leaves nothing, but mpidist's report may lose the race against the crash.
HYDRA_PMI_RACE = "unable to forward PMI response to MPI process"


def run_job(command, marker, env=None, timeout=60.0, grace=3.0, cwd=None):
    """Run ``command`` on the MPI library's default transport (``env`` added); an ``Outcome``.
    A job still running after ``timeout`` seconds is killed, and so is whatever carries
    ``marker`` ``grace`` seconds after it ended (and is listed as left behind). A launch that
    ended in Hydra's own PMI race (``HYDRA_PMI_RACE``) runs once more; the output says so."""
    first = _run_job_once(command, marker, env, timeout, grace, cwd)
    if not (first.ended and HYDRA_PMI_RACE in first.output and not first.leftovers):
        return first
    again = _run_job_once(command, marker, env, timeout, grace, cwd)
    note = "(the first launch ended in Hydra's PMI race, not mpidist's: run once more)\n"
    return again._replace(output=note + again.output)


def _run_job_once(command, marker, env, timeout, grace, cwd):
    job_env = {k: v for k, v in os.environ.items() if k not in TRANSPORT_VARIABLES}
    job_env.update(HYDRA_ENV)
    job_env.update(env or {})
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=job_env, start_new_session=True, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
        ended, code = True, proc.returncode
    except subprocess.TimeoutExpired:
        ended, code = False, None
        kill_job(proc.pid, marker)
        out, _ = proc.communicate(timeout=30)
    seconds = time.monotonic() - start
    deadline = time.monotonic() + grace  # processes told to go may take a moment
    while True:
        leftovers = job_processes(marker)
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if leftovers:
        kill_job(None, marker)
    return Outcome(ended, code, seconds, out, leftovers, command)


def matrix_main(argv, description, scenarios, run, verdict, ci_scenarios=None):
    """The command line of a matrix: ``--jobs``, ``--timeout``, ``--only TEXT``, ``--show``
    (and ``--ci`` where there is a CI subset); runs ``run(scenario, timeout)`` and prints the
    table. The exit code: 1 if any scenario is not ok."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--only", default="", help="substring of the scenario names to run")
    if ci_scenarios is not None:
        parser.add_argument("--ci", action="store_true", help="only the CI subset")
    parser.add_argument("--show", action="store_true", help="print the output of failures")
    args = parser.parse_args(argv)
    chosen = ci_scenarios if getattr(args, "ci", False) else scenarios
    chosen = [s for s in chosen if args.only in str(s)]
    return print_table(chosen, lambda s: run(s, args.timeout), verdict, args.jobs, args.show)


def print_table(scenarios, run, verdict, jobs, show):
    """Run ``scenarios`` (``jobs`` at a time) with ``run(scenario) -> Outcome``, print one
    Markdown row each with ``verdict(scenario, outcome)``; the exit code (1 if any is not ok)."""
    from concurrent.futures import ThreadPoolExecutor

    print("| launcher | nodes | cleanup | victim | how | result | exit | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    bad = 0
    with ThreadPoolExecutor(jobs) as pool:
        for s, o in zip(scenarios, pool.map(run, scenarios)):
            v = verdict(s, o)
            bad += v != "ok"
            print(f"| {s.launcher} | {s.nodes} | {s.cleanup} | {s.victim} | {s.how} | {v} | "
                  f"{o.code} | {o.seconds:.1f} |", flush=True)
            if show and v != "ok":
                print(" ".join(o.command), "\n", o.output[-3000:], o.leftovers, flush=True)
    print(f"{len(scenarios) - bad} of {len(scenarios)} ok")
    return 1 if bad else 0
