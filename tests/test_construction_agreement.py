"""A strategy built on some ranks only, or with another configuration per rank, ends by itself
with a report on the ranks that waited, naming the ranks that never came or which rank has
which configuration; never a hang (issue 22, items 1 and 6).

Each case is its own launch (tests/failure_programs/construct_on_some_ranks.py) with a short
construction deadline, and the launch itself has a timeout: a hang fails the test.
"""

from pathlib import Path

import pytest

from mpi_launch import launch

PROGRAM = str(Path(__file__).parent / "failure_programs" / "construct_on_some_ranks.py")
DEADLINE = 5  # MPIDIST_CONSTRUCTION_TIMEOUT for these launches
LAUNCH_TIMEOUT = 120


def run(nprocs, case):
    code, out = launch(nprocs, [PROGRAM, case], LAUNCH_TIMEOUT,
                       {"MPIDIST_CONSTRUCTION_TIMEOUT": str(DEADLINE)})
    assert code is not None, f"{case} on {nprocs} ranks hung:\n{out}"
    assert code != 0, f"{case} on {nprocs} ranks exited 0:\n{out}"
    assert "rank 0: built" not in out and "rank 0: end" not in out, out  # rank 0 never went on
    return out


@pytest.mark.parametrize("nprocs", [2, 3])
def test_mwms_built_on_rank_0_only_while_the_others_sleep_names_them(nprocs):
    out = run(nprocs, "mwms-sleep")
    missing = ", ".join(str(r) for r in range(1, nprocs))
    named = f"rank {missing} of {nprocs} never arrived" if nprocs == 2 else \
        f"ranks {missing} of {nprocs} never arrived"
    assert "DeadlineExceededError" in out and named in out, out
    assert "MPIDIST_CONSTRUCTION_TIMEOUT" in out, out


def test_mwms_built_on_rank_0_only_while_the_others_exit():
    out = run(2, "mwms-exit")
    assert "rank 1" in out and ("never arrived" in out or "ended its program" in out), out


def test_mwms_after_the_communicator_exists_names_the_missing_ranks():
    out = run(3, "mwms-comm")
    assert "MultiWorkerMirroredStrategy()" in out and "MPIDIST_CONSTRUCTION_TIMEOUT" in out, out
    assert "never arrived: [1, 2]" in out or "[1, 2]" in out, out


def test_ps_strategy_missing_on_one_rank_names_it():
    out = run(3, "ps-missing")
    assert "rank 2 of 3 never arrived" in out, out


def test_ps_layout_differing_on_one_rank_is_named_on_every_rank():
    out = run(4, "ps-layout")
    line = "tasks per job: ranks 0, 1, 2 have {'chief': 1, 'ps': 1, 'worker': 2}; rank 3 has " \
        "{'chief': 1, 'ps': 2, 'worker': 1}"
    assert out.count(line) >= 1, out
