"""Real faults never hang a MultiWorkerMirroredStrategy job (issue 22, item 1).

One rank of a 4-rank MWMS job dies mid-training by a real fault (SIGKILL, a segmentation
fault, ``os._exit(3)``: tests/failure_programs/real_fault.py), under the MPI library's default
transport (nothing forces a netmod: tests/fault_matrix.py). Every scenario must end by itself
within LAUNCH_TIMEOUT seconds, with a non-zero exit code, a report naming the dead rank, and no
process of the job left behind.

The scenarios are the product (tests/fault_matrix.py) of:
launcher {plain mpiexec, ``mpidist run``, ``mpiexec ... python -m mpidist.guard``} x nodes {1,
2 simulated} x Hydra's clean-up {default, ``-disable-auto-cleanup``} x victim {rank 0 (the
chief), rank 3} x fault {SIGKILL, SIGSEGV, exit 3}: 72 scenarios.

CI runs a subset (about 2 minutes on 2 cores): every fault x every placement (victim x nodes)
under ``mpidist run`` with the default clean-up (12), and for each other (launcher, clean-up)
pair two scenarios on two simulated nodes, the victim rank 0 then rank 3, the fault rotating
(10); plus a clean run under each launcher on two nodes (no death: exit 0, no report).
``MPIDIST_REAL_FAULTS=all`` runs the whole product.
"""

import itertools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from fault_matrix import (CLEANUPS, HOWS, LAUNCHERS, NODES, VICTIMS, Scenario, names_the_death,
                          run_scenario)
from test_mpi_failures import remove_leaked_mpich_segments  # noqa: F401 - autouse fixture

from mpidist.launch.runner import OWN_OPTIONS, split_arguments

LAUNCH_TIMEOUT = 60  # a job still running after this is a hang
FULL = os.environ.get("MPIDIST_REAL_FAULTS", "").strip().lower() == "all"


def ci_scenarios():
    """The subset named in the module's docstring, generated from the same axes."""
    chosen = [Scenario("run", nodes, "auto", victim, how)
              for nodes, victim, how in itertools.product(NODES, VICTIMS, HOWS)]
    others = [(launcher, cleanup) for launcher, cleanup in itertools.product(LAUNCHERS, CLEANUPS)
              if (launcher, cleanup) != ("run", "auto")]
    for i, (launcher, cleanup) in enumerate(others):
        for j, victim in enumerate(VICTIMS):
            chosen.append(Scenario(launcher, 2, cleanup, victim, HOWS[(2 * i + j) % len(HOWS)]))
    return chosen


SCENARIOS = [Scenario(*values) for values in
             itertools.product(LAUNCHERS, NODES, CLEANUPS, VICTIMS, HOWS)] if FULL \
    else ci_scenarios()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_real_fault_ends_the_job_with_a_report(scenario):
    outcome = run_scenario(scenario, timeout=LAUNCH_TIMEOUT)
    what = f"{' '.join(outcome.command)}\n--- output:\n{outcome.output}"
    assert outcome.ended, f"hung: still running after {LAUNCH_TIMEOUT} s: {what}"
    assert not outcome.leftovers, f"processes left behind {outcome.leftovers}: {what}"
    assert outcome.code != 0, f"a job that lost a rank exited 0: {what}"
    assert names_the_death(outcome.output, scenario), \
        f"no report naming rank {scenario.victim}: {what}"
    assert "must not happen" not in outcome.output, what
    assert "reached the end" not in outcome.output, what
    if scenario.launcher == "run" and scenario.how == "exit3":
        assert outcome.code == 3, f"mpidist run should exit with the dead rank's 3: {what}"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_clean_run_on_two_nodes_is_no_death(launcher):
    """No rank dies: the ranks' goodbyes at exit keep the watch of dead ranks quiet."""
    outcome = run_scenario(Scenario(launcher, 2, "auto", 0, "none"), timeout=LAUNCH_TIMEOUT)
    assert outcome.ended and outcome.code == 0, f"{outcome.code}: {outcome.output}"
    assert outcome.output.count("reached the end") == 4, outcome.output
    assert "is gone" not in outcome.output and "mpidist:" not in outcome.output, outcome.output
    assert not outcome.leftovers


def test_the_report_check_can_fail():
    """The report check is no rubber stamp: another rank's report, or none, does not count."""
    scenario = Scenario("run", 2, "auto", 3, "SIGKILL")
    assert names_the_death("mpidist: rank 3 of 4 (pid 7 on n1) was killed by SIGKILL (signal "
                           "9): often", scenario)
    assert not names_the_death("mpidist: rank 2 of 4 (pid 7 on n1) was killed by SIGKILL "
                               "(signal 9): often", scenario)
    assert not names_the_death("rank 3: step 1 sum [4.0]", scenario)


# -- mpidist run's arguments: the launcher's own flags pass through --------------------------
HYDRA_FLAGS = [["-hosts", "n0,n1"], ["-ppn", "2"], ["-launcher", "fork"],
               ["-disable-auto-cleanup"], ["-nameserver", "h:1"], ["-genv", "A", "1"],
               ["-iface", "lo"], ["-bind-to", "core"], ["--mpi=pmi2"], ["--ntasks-per-node=2"],
               ["-f", "hostfile"], ["-host", "n0"], ["-hostfile", "h"], ["-l"]]


@pytest.mark.parametrize("flags", [HYDRA_FLAGS[i:i + 3] for i in range(0, len(HYDRA_FLAGS), 3)])
def test_launcher_flags_pass_through_in_order(flags):
    words = [w for flag in flags for w in flag]
    argv = ["-n", "4", *words[:2], "--dry-run", *words[2:], "--launcher", "mpiexec"]
    own, launcher = split_arguments(argv)
    assert launcher == words, (argv, launcher)
    assert own == ["-n", "4", "--dry-run", "--launcher", "mpiexec"], own


OWN_WITH_VALUES = [["-n", "4"], ["-np", "2"], ["--nprocs", "8"], ["--nprocs=8"],
                   ["--launcher", "mpiexec"], ["--launcher=srun"], ["--mpiexec", "/x/mpiexec"],
                   ["--dry-run"]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(r"\A-{1,2}[a-z][a-z-]{0,12}(=[a-z0-9,]{1,6})?\Z")
                .filter(lambda w: w.split("=", 1)[0] not in OWN_OPTIONS), max_size=8),
       st.lists(st.sampled_from(OWN_WITH_VALUES), max_size=3), st.randoms())
def test_every_word_that_is_not_ours_goes_to_the_launcher(theirs, ours, rng):
    """Generated launcher flags (single- and double-dash, with and without ``=value``), mixed
    with mpidist run's own options anywhere: the launcher gets exactly its words, in order,
    whatever their prefix (``-hosts`` is not ``-h``, ``--mpi`` is not ``--mpiexec``)."""
    slots = [("theirs", [w]) for w in theirs] + [("ours", o) for o in ours]
    rng.shuffle(slots)
    ours_in_order = [o for kind, o in slots if kind == "ours"]
    theirs_in_order = [w[0] for kind, w in slots if kind == "theirs"]
    own, launcher = split_arguments([w for _, words in slots for w in words])
    assert launcher == theirs_in_order
    assert own == [w for o in ours_in_order for w in o]
