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
import re
import sys
import uuid
from pathlib import Path
from typing import NamedTuple

from fault_jobs import HYDRA_ENV, TRANSPORT_VARIABLES, Outcome, hydra, job_processes, launch_options, \
    matrix_main, run_job

PROGRAM = Path(__file__).parent / "failure_programs" / "real_fault.py"
NPROCS = 4
LAUNCHERS = ("mpiexec", "run", "guard")
NODES = (1, 2)
CLEANUPS = ("auto", "disabled")
VICTIMS = (0, 3)
HOWS = ("SIGKILL", "SIGSEGV", "exit3")
SIGNALS = {"SIGKILL": 9, "SIGSEGV": 11}
ENV = HYDRA_ENV
__all__ = ["ENV", "TRANSPORT_VARIABLES", "Outcome", "Scenario", "all_scenarios", "command_of",
           "hydra", "job_processes", "names_the_death", "run_scenario", "verdict"]


class Scenario(NamedTuple):
    launcher: str
    nodes: int
    cleanup: str
    victim: int
    how: str

    def __str__(self):
        return (f"{self.launcher}-{self.nodes}node-{self.cleanup}-rank{self.victim}-"
                f"{self.how}")


def all_scenarios():
    return [Scenario(*values) for values in
            itertools.product(LAUNCHERS, NODES, CLEANUPS, VICTIMS, HOWS)]


def command_of(scenario, marker, steps=6):
    """The argv that starts ``scenario``; ``marker`` (a unique word on every rank's command
    line) finds the job's processes afterwards."""
    options = launch_options(scenario.nodes, scenario.cleanup, NPROCS)
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


def run_scenario(scenario, timeout=60.0, steps=6, grace=3.0):
    """Run ``scenario`` once; an ``Outcome`` (``fault_jobs.run_job``)."""
    marker = f"fault-{uuid.uuid4().hex[:12]}"
    return run_job(command_of(scenario, marker, steps), marker, timeout=timeout, grace=grace)


def verdict(scenario, outcome):
    """``ok``, or what went wrong: ``HANG``, ``exit 0``, ``no report``, ``left N``."""
    if not outcome.ended:
        return "HANG"
    problems = []
    if outcome.code == 0:
        problems.append("exit 0")
    if not names_the_death(outcome.output, scenario):
        problems.append("no report")
    if outcome.leftovers:
        problems.append(f"left {len(outcome.leftovers)}")
    return ", ".join(problems) or "ok"


def main(argv):
    return matrix_main(argv, "Run the real-fault matrix; print a table.", all_scenarios(),
                       run_scenario, verdict)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
