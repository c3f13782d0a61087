"""``mpidist selftest --gpu`` (mpidist/cli/selftest.py): every step has its function and a
timeout within the budget, and the step runner on quick stand-in steps (tests/unit/
selftest_stand_ins.py): steps that crash, exit wrong or print several rank results, the exit
status and the table; the ulp distance of the bitwise checks. The dry run, first_contact.sh and
steps that hang or spend the budget wait out real timeouts: they are the scenario
tests/scenarios/test_selftest_runs.py. The steps themselves are rehearsed on the CPU in
tests/test_selftest_stand_in.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from selftest_stand_ins import fake_gpu_probe, result_line, stand_in_step

from mpidist.cli import selftest
from mpidist.cli.selftest_steps import STEP_FUNCTIONS, ulp_distance

STEP_NAMES = [s.name for s in selftest.STEPS]


def test_every_step_has_a_function_and_the_timeouts_fit_the_budget():
    assert set(STEP_NAMES) == set(STEP_FUNCTIONS)
    assert selftest.BUDGET_S <= 8 * 60
    assert all(s.timeout_s <= selftest.BUDGET_S / 2 for s in selftest.STEPS)
    assert [s.name for s in selftest.STEPS if s.ranks > 1] == ["mwms_2_ranks"]


# -- the runner, on stand-in steps ---------------------------------------------------------------
@pytest.mark.parametrize("code, error", [
    ("import sys; print('boom'); sys.exit(7)", "exited with code 7 after 0 of 1 rank result(s)"),
    ("raise SystemExit('crashed')", "exited with code 1 after 0 of 1"),
    (f"print({result_line('pass', x=1)!r}); import sys; sys.exit(4)",
     "every result passed but the command exited with 4"),
])
def test_a_step_that_crashes_or_exits_wrong_fails_with_its_output(code, error):
    entry = selftest.run_step(stand_in_step(code), timeout=30.0)
    assert entry["status"] == "fail"
    assert entry["detail"]["error"].startswith(error), entry["detail"]


@pytest.mark.parametrize("printed, ranks, status", [
    ([result_line("pass", checks=3)], 1, "pass"),
    ([result_line("fail", error="wrong bits")], 1, "fail"),
    ([result_line("skip", reason="no JAX")], 1, "skip"),
    ([result_line("pass", rank=0) + result_line("pass", rank=1)], 2, "pass"),  # ranks' lines glued
    ([result_line("pass", rank=0), result_line("fail", rank=1, error="x")], 2, "fail"),
    ([result_line("pass", rank=0), result_line("skip", rank=1)], 2, "fail"),
    ([result_line("pass", rank=0)], 2, "fail"),  # a rank that printed nothing
])
def test_rank_results_combine(printed, ranks, status):
    code = "".join(f"print({line!r}, flush=True)\n" for line in printed)
    entry = selftest.run_step(stand_in_step(code, ranks=ranks), timeout=30.0)
    assert entry["status"] == status, entry
    if status == "pass" and ranks == 2:
        assert [d["rank"] for d in entry["detail"]["ranks"]] == [0, 1]


def test_exit_status_pass_fail_and_the_table():
    ok = selftest.run_selftest([stand_in_step(f"print({result_line('pass', checks=2)!r})", name="a"),
                                stand_in_step(f"print({result_line('skip', reason='no JAX')!r})", name="b")],
                               probe=fake_gpu_probe)
    assert ok["exit_code"] == selftest.EXIT_PASS == 0 and ok["mode"] == "gpu"
    text = selftest.render(ok, "/tmp/r.json")
    assert text.splitlines()[0] == "mpidist selftest --gpu: GPU: 1 GPU(s): stand-in GPU"
    assert "1 passed, 0 failed, 1 skipped" in text and "exit 0" in text
    bad = selftest.run_selftest([stand_in_step(f"print({result_line('fail', error='3 ulp')!r})")],
                                probe=fake_gpu_probe)
    assert bad["exit_code"] == 1 and "exit 1 (a step failed)" in selftest.render(bad)


def test_a_probe_that_cannot_count_gpus_still_runs_the_steps():
    report = selftest.run_selftest([stand_in_step(f"print({result_line('pass')!r})")],
                                   probe=lambda: {"gpus": {"error": "CUDARuntimeError"},
                                                  "probe": {}})
    assert report["mode"] == "gpu" and report["steps"][0]["status"] == "pass"
    assert "could not count the GPUs (CUDARuntimeError)" in report["headline"]


# -- ulp distance ------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float16", "float32", "float64"]),
       x=st.floats(-1e4, 1e4, allow_nan=False), k=st.integers(0, 50))
def test_ulp_distance_counts_representable_steps(dtype, x, k):
    a = np.array([x], dtype=dtype)
    b = a.copy()
    for _ in range(k):
        b = np.nextafter(b, np.array(np.inf, dtype=dtype)).astype(dtype)
    assert ulp_distance(b, a) == ulp_distance(a, b) == k


def test_ulp_distance_special_values():
    assert ulp_distance(np.float32([0.0]), np.float32([-0.0])) == 0
    assert ulp_distance(np.float32([np.nan]), np.float32([np.nan])) == 0
    assert ulp_distance(np.float32([np.nan]), np.float32([1.0])) == float("inf")
    assert ulp_distance(np.int32([5, 1]), np.int32([2, 1])) == 3
    smallest = np.float32(np.nextafter(np.float32(0), np.float32(1)))
    assert ulp_distance(np.float32([smallest]), np.float32([-smallest])) == 2
    with pytest.raises(AssertionError, match="shape/dtype"):
        ulp_distance(np.float32([1]), np.float64([1]))


