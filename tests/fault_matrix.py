"""The real-fault matrix: one MultiWorkerMirroredStrategy job in which one rank really dies,
run under each launcher, placement and clean-up mode, with the MPI library's defaults.

A scenario is ``(launcher, nodes, cleanup, victim, how)``:

- launcher: ``mpiexec`` (Hydra, the mpich wheel's), ``run`` (``mpidist run``), ``guard``
  (``mpiexec ... python -m mpidist.guard -- python ...``);
- nodes: 1 (``mpiexec -n 4``) or 2 simulated nodes (``-launcher fork -hosts n0,n1 -ppn 2``);
- cleanup: ``auto`` (Hydra's default) or ``disabled`` (``-disable-auto-cleanup``);
- victim: 0 (the chief) or 3 (a non-chief; on two nodes it is on the second node);
- how: ``SIGKILL``, ``SIGSEGV`` (a real segmentation fault) or ``exit3`` (``os._exit(3)``).

Nothing forces a transport: no ``MPIR_CVAR_CH4_NETMOD``, ``FI_PROVIDER`` or ``UCX_*``, so the
job runs on the wheel's default netmod, as a user's does. Only the launcher's control traffic is
kept on loopback (``HYDRA_IFACE=lo``).

``run_scenario`` returns an ``Outcome``: whether the job ended by itself within the timeout,
its exit code, whether the output names the dead rank and how it died, and the processes it left
behind. ``python tests/fault_matrix.py [--jobs J] [--timeout S] [--quick]`` prints the whole
table.
"""

import itertools
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple

PROGRAM = Path(__file__).parent / "failure_programs" / "real_fault.py"
NPROCS = 4
LAUNCHERS = ("mpiexec", "run", "guard")
NODES = (1, 2)
CLEANUPS = ("auto", "disabled")
VICTIMS = (0, 3)
HOWS = ("SIGKILL", "SIGSEGV", "exit3")
SIGNALS = {"SIGKILL": 9, "SIGSEGV": 11}
ENV = {"HYDRA_IFACE": "lo"}  # the launcher's own sockets; nothing about MPI's transport
TRANSPORT_VARIABLES = ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE", "UCX_TLS",
                       "UCX_NET_DEVICES")


class Scenario(NamedTuple):
    launcher: str
    nodes: int
    cleanup: str
    victim: int
    how: str

    def __str__(self):
        return (f"{self.launcher}-{self.nodes}node-{self.cleanup}-rank{self.victim}-"
                f"{self.how}")


class Outcome(NamedTuple):
    ended: bool  # by itself, within the timeout
    code: int | None  # the launcher's exit code (None: killed after the timeout)
    seconds: float
    reported: bool  # the output names the victim rank and its signal or exit code
    leftovers: list  # command lines of the job's processes still alive after it ended
    output: str
    command: list


def all_scenarios():
    return [Scenario(*values) for values in
            itertools.product(LAUNCHERS, NODES, CLEANUPS, VICTIMS, HOWS)]


def hydra():
    """The mpich wheel's Hydra mpiexec (next to this interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec.hydra"
    if beside.exists():
        return str(beside)
    import shutil

    return shutil.which("mpiexec.hydra") or shutil.which("mpiexec")


def command_of(scenario, marker, steps=6):
    """The argv that starts ``scenario``; ``marker`` (a unique word on every rank's command
    line) finds the job's processes afterwards."""
    options = []
    if scenario.nodes > 1:
        options += ["-launcher", "fork", "-hosts", ",".join(f"n{i}" for i in range(scenario.nodes)),
                    "-ppn", str(NPROCS // scenario.nodes)]
    if scenario.cleanup == "disabled":
        options.append("-disable-auto-cleanup")
    options += ["-n", str(NPROCS)]
    program = [sys.executable, str(PROGRAM), str(scenario.victim), scenario.how, str(steps),
               marker]
    if scenario.launcher == "mpiexec":
        return [hydra(), *options, *program]
    if scenario.launcher == "guard":
        return [hydra(), *options, sys.executable, "-m", "mpidist.guard", "--", *program]
    return [sys.executable, "-m", "mpidist", "run", "--mpiexec", hydra(), *options, "--",
            *program]


def names_the_death(out, scenario):
    """Whether ``out`` reports the death.

    Under the guard (``run``, ``guard``): the guard's report naming the victim's rank, pid,
    host and signal or exit status (``mpidist: rank 3 of 4 (pid ... on HOST) was killed by
    SIGKILL``). Under plain ``mpiexec``, where no process outlives the victim to see how it
    died: mpidist's line from a survivor naming the victim's rank, pid and host (``rank 3 of 4
    (pid ... on HOST) is gone``), or, when Hydra killed the survivors first, Hydra's own
    report: its block (``BAD TERMINATION ... PID ... RUNNING AT HOST / EXIT CODE: N``) or its
    line ``YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)``."""
    victim = scenario.victim
    if scenario.launcher != "mpiexec":
        if scenario.how in SIGNALS:
            how = rf"was killed by {scenario.how} \(signal {SIGNALS[scenario.how]}\)"
        else:
            how = r"exited with status 3\b"
        return bool(re.search(rf"mpidist: rank {victim} of {NPROCS} \(pid \d+ on \S+\) {how}",
                              out))
    survivor = re.search(rf"rank {victim} of {NPROCS} \(pid \d+ on \S+\) is gone", out)
    hydra_block = re.search(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=\s+PID \d+ "
                            r"RUNNING AT \S+\n=\s+EXIT CODE: \d+", out)
    # Hydra alone, when its proxy killed every rank of the node at once (a signal death).
    hydra_exit = re.search(r"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*\(signal \d+\)",
                           out)
    return bool(survivor or hydra_block or hydra_exit)


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


def run_scenario(scenario, timeout=60.0, steps=6, grace=3.0):
    """Run ``scenario`` once; an ``Outcome``. A job still running after ``timeout`` seconds is
    killed (its process group and every process carrying its marker)."""
    marker = f"fault-{uuid.uuid4().hex[:12]}"
    cmd = command_of(scenario, marker, steps)
    env = {k: v for k, v in os.environ.items() if k not in TRANSPORT_VARIABLES}
    env.update(ENV)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        ended, code = True, proc.returncode
    except subprocess.TimeoutExpired:
        ended, code = False, None
        _kill(proc.pid, marker)
        out, _ = proc.communicate()
    seconds = time.monotonic() - start
    leftovers = []
    deadline = time.monotonic() + grace  # processes told to go may take a moment
    while True:
        leftovers = job_processes(marker)
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if leftovers:
        _kill(None, marker)
    return Outcome(ended, code, seconds, names_the_death(out, scenario), leftovers, out, cmd)


def _kill(group, marker):
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


def verdict(outcome):
    """``ok``, or what went wrong: ``HANG``, ``exit 0``, ``no report``, ``left N``."""
    if not outcome.ended:
        return "HANG"
    problems = []
    if outcome.code == 0:
        problems.append("exit 0")
    if not outcome.reported:
        problems.append("no report")
    if outcome.leftovers:
        problems.append(f"left {len(outcome.leftovers)}")
    return ", ".join(problems) or "ok"


def main(argv):
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(description="Run the real-fault matrix; print a table.")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--only", default="", help="substring of the scenario names to run")
    parser.add_argument("--show", action="store_true", help="print the output of failures")
    args = parser.parse_args(argv)
    scenarios = [s for s in all_scenarios() if args.only in str(s)]
    print("| launcher | nodes | cleanup | victim | how | result | exit | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    bad = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for s, o in zip(scenarios, pool.map(lambda s: run_scenario(s, args.timeout), scenarios)):
            v = verdict(o)
            bad += v != "ok"
            print(f"| {s.launcher} | {s.nodes} | {s.cleanup} | {s.victim} | {s.how} | {v} | "
                  f"{o.code} | {o.seconds:.1f} |", flush=True)
            if args.show and v != "ok":
                print(" ".join(o.command), "\n", o.output[-3000:], o.leftovers, flush=True)
    print(f"{len(scenarios) - bad} of {len(scenarios)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
