"""``mpidist selftest --gpu`` (mpidist/cli/selftest.py): the dry run without a GPU (report
schema, every path listed, under 30 s, says so at the top, exit 3), and the step runner's
handling of steps that hang, crash, print several rank results, or find the budget spent
(stand-in steps: commands of our own, so a hang becomes a failure with its timeout, never a
hang of the selftest). The steps themselves are rehearsed on the CPU in
tests/test_selftest_stand_in.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpidist.cli import selftest, selftest_env
from mpidist.cli.selftest import Step
from mpidist.cli.selftest_steps import MARKER, STEP_FUNCTIONS, ulp_distance

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
STEP_NAMES = [s.name for s in selftest.STEPS]
ENV_KEYS = {"python", "executable", "platform", "packages", "gpus", "nvvm", "mpi", "jax",
            "components", "variables", "missing", "probe"}
STEP_KEYS = {"name", "title", "status", "seconds", "timeout_s", "command", "detail"}
REPORT_KEYS = {"schema", "suite", "mode", "gpu_found", "headline", "mpidist", "source",
               "started", "budget_s", "environment", "steps", "summary", "seconds", "exit_code"}


def _no_gpu_env():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a GPU machine runs this test as a dry run too
    return env


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("selftest") / "out" / "report.json"
    start = time.monotonic()
    proc = subprocess.run([PY, "-m", "mpidist", "selftest", "--gpu", "--report", str(path)],
                          env=_no_gpu_env(), capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start, json.loads(path.read_text()), path


def test_dry_run_says_there_is_no_gpu_and_exits_3_within_30_s(dry_run):
    proc, seconds, report, path = dry_run
    assert proc.returncode == selftest.EXIT_NO_GPU == 3, proc.stdout + proc.stderr
    assert seconds < 30, seconds
    first = proc.stdout.splitlines()[0]
    assert first.startswith("mpidist selftest --gpu: NO GPU: dry run"), first
    assert "nothing ran on a GPU" in first
    assert f"report: {path}" in proc.stdout
    assert "exit 3 (no GPU: dry run)" in proc.stdout
    for name in STEP_NAMES:  # the table lists every path
        assert any(line.startswith(f"{name} ") and " skip " in line
                   for line in proc.stdout.splitlines()), name


def test_dry_run_report_schema(dry_run):
    _, _, report, _ = dry_run
    assert set(report) == REPORT_KEYS
    assert report["schema"] == selftest.SCHEMA and report["suite"] == "gpu"
    assert report["mode"] == "dry-run" and report["gpu_found"] is False
    assert report["headline"].startswith("NO GPU")
    assert report["exit_code"] == 3 and report["budget_s"] == selftest.BUDGET_S
    env = report["environment"]
    assert set(env) >= ENV_KEYS, sorted(ENV_KEYS - set(env))
    assert set(env["packages"]) == set(selftest_env.PACKAGES)
    assert env["packages"]["numpy"]["version"] == np.__version__
    assert env["gpus"]["count"] == 0 and env["gpus"]["reason"]
    assert env["probe"]["exit_code"] == 0 and "error" not in env["probe"]
    from mpidist.cli.gpu_components import COMPONENTS  # mpidist info's list, the same here

    assert [c["name"] for c in env["components"]] == list(COMPONENTS)
    for item in env["missing"]:
        assert set(item) == {"what", "detail", "fix"} and "pip install" in item["fix"]
    assert [s["name"] for s in report["steps"]] == STEP_NAMES
    for entry in report["steps"]:
        assert set(entry) == STEP_KEYS
        assert entry["status"] == "skip" and entry["seconds"] == 0.0
        assert entry["detail"]["reason"].startswith("no GPU (")
        assert "mpidist.cli.selftest_steps " + entry["name"] in entry["command"]
    assert report["summary"] == {"pass": 0, "fail": 0, "skip": len(STEP_NAMES)}


def test_every_step_has_a_function_and_the_timeouts_fit_the_budget():
    assert set(STEP_NAMES) == set(STEP_FUNCTIONS)
    assert selftest.BUDGET_S <= 8 * 60
    assert all(s.timeout_s <= selftest.BUDGET_S / 2 for s in selftest.STEPS)
    assert [s.name for s in selftest.STEPS if s.ranks > 1] == ["mwms_2_ranks"]


# -- the runner, on stand-in steps ---------------------------------------------------------------
def _step(code, timeout=30.0, ranks=1, name="stand-in"):
    return Step(name, "a stand-in step", timeout, ranks=ranks, command=(PY, "-c", code))


def _result(status, **detail):
    return MARKER + json.dumps({"status": status, "detail": detail})


def test_a_hanging_step_is_killed_with_its_children_and_fails_naming_its_timeout():
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "print('child', child.pid, flush=True)\n"
            "time.sleep(300)\n")
    start = time.monotonic()
    entry = selftest.run_step(_step(code), timeout=3.0)
    assert time.monotonic() - start < 20
    assert entry["status"] == "fail"
    assert entry["detail"]["error"].startswith("timed out after 3 s")
    assert 3.0 <= entry["seconds"] < 20
    child = int(entry["detail"]["output_tail"].split("child ")[1].split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the grandchild was in the step's process group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {child} survived the timeout")


def test_a_step_that_ignores_sigterm_is_killed_too():
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(300)\n")
    start = time.monotonic()
    entry = selftest.run_step(_step(code), timeout=2.0)
    assert entry["status"] == "fail" and time.monotonic() - start < 25
    assert "timed out after 2 s" in entry["detail"]["error"]


@pytest.mark.parametrize("code, error", [
    ("import sys; print('boom'); sys.exit(7)", "exited with code 7 after 0 of 1 rank result(s)"),
    ("raise SystemExit('crashed')", "exited with code 1 after 0 of 1"),
    (f"print({_result('pass', x=1)!r}); import sys; sys.exit(4)",
     "every result passed but the command exited with 4"),
])
def test_a_step_that_crashes_or_exits_wrong_fails_with_its_output(code, error):
    entry = selftest.run_step(_step(code), timeout=30.0)
    assert entry["status"] == "fail"
    assert entry["detail"]["error"].startswith(error), entry["detail"]


@pytest.mark.parametrize("printed, ranks, status", [
    ([_result("pass", checks=3)], 1, "pass"),
    ([_result("fail", error="wrong bits")], 1, "fail"),
    ([_result("skip", reason="no JAX")], 1, "skip"),
    ([_result("pass", rank=0) + _result("pass", rank=1)], 2, "pass"),  # ranks' lines glued
    ([_result("pass", rank=0), _result("fail", rank=1, error="x")], 2, "fail"),
    ([_result("pass", rank=0), _result("skip", rank=1)], 2, "fail"),
    ([_result("pass", rank=0)], 2, "fail"),  # a rank that printed nothing
])
def test_rank_results_combine(printed, ranks, status):
    code = "".join(f"print({line!r}, flush=True)\n" for line in printed)
    entry = selftest.run_step(_step(code, ranks=ranks), timeout=30.0)
    assert entry["status"] == status, entry
    if status == "pass" and ranks == 2:
        assert [d["rank"] for d in entry["detail"]["ranks"]] == [0, 1]


def _fake_gpu_probe():
    return {"gpus": {"count": 1, "names": ["stand-in GPU"]}, "probe": {"seconds": 0.0}}


def test_the_budget_bounds_the_whole_run_and_unstarted_steps_fail():
    steps = [_step("import time; time.sleep(60)", timeout=100.0, name="slow"),
             _step(f"print({_result('pass')!r})", name="never")]
    start = time.monotonic()
    report = selftest.run_selftest(steps, budget_s=8.0, probe=_fake_gpu_probe)
    assert time.monotonic() - start < 30
    slow, never = report["steps"]
    assert slow["status"] == "fail" and slow["timeout_s"] <= 8.0
    assert never["status"] == "fail" and "budget was spent" in never["detail"]["error"]
    assert report["exit_code"] == selftest.EXIT_FAIL == 1


def test_exit_status_pass_fail_and_the_table():
    ok = selftest.run_selftest([_step(f"print({_result('pass', checks=2)!r})", name="a"),
                                _step(f"print({_result('skip', reason='no JAX')!r})", name="b")],
                               probe=_fake_gpu_probe)
    assert ok["exit_code"] == selftest.EXIT_PASS == 0 and ok["mode"] == "gpu"
    text = selftest.render(ok, "/tmp/r.json")
    assert text.splitlines()[0] == "mpidist selftest --gpu: GPU: 1 GPU(s): stand-in GPU"
    assert "1 passed, 0 failed, 1 skipped" in text and "exit 0" in text
    bad = selftest.run_selftest([_step(f"print({_result('fail', error='3 ulp')!r})")],
                                probe=_fake_gpu_probe)
    assert bad["exit_code"] == 1 and "exit 1 (a step failed)" in selftest.render(bad)


def test_a_probe_that_cannot_count_gpus_still_runs_the_steps():
    report = selftest.run_selftest([_step(f"print({_result('pass')!r})")],
                                   probe=lambda: {"gpus": {"error": "CUDARuntimeError"},
                                                  "probe": {}})
    assert report["mode"] == "gpu" and report["steps"][0]["status"] == "pass"
    assert "could not count the GPUs (CUDARuntimeError)" in report["headline"]


def test_usage_errors_exit_2():
    for argv in (["selftest"], ["selftest", "--gpu", "--steps", "nope"]):
        proc = subprocess.run([PY, "-m", "mpidist", *argv], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)


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


# -- tests/gpu/first_contact.sh ------------------------------------------------------------------
FIRST_CONTACT = ROOT / "tests" / "gpu" / "first_contact.sh"


def _make_wheel(folder, name="fc_probe", version="0.1"):
    """A tiny pure-Python wheel (module ``name``), as pip builds them."""
    import base64
    import hashlib
    import zipfile

    files = {f"{name}.py": "VALUE = 42\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text)}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def _first_contact(tmp_path, wheels, *args):
    env = {**_no_gpu_env(), "PYTHON": PY, "MPIDIST_WHEELS": str(wheels), "TMPDIR": str(tmp_path)}
    report = tmp_path / "report.json"
    proc = subprocess.run(["bash", str(FIRST_CONTACT), "--report", str(report), *args],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    return proc, (json.loads(report.read_text()) if report.exists() else None)


def test_first_contact_runs_the_checkout_staged_and_installs_the_carried_wheels(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels)
    proc, report = _first_contact(tmp_path, wheels)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "first_contact: installed 1 wheel(s)" in proc.stderr and "fc_probe-0.1" in proc.stderr
    assert proc.stdout.startswith("mpidist selftest --gpu: NO GPU: dry run")
    # the checkout, made importable by links (kernels/ as mpidist/kernels), not an installed copy
    assert report["source"].startswith(str(tmp_path / "mpidist-first-contact."))
    assert report["source"].endswith("/src")
    assert not list(tmp_path.glob("mpidist-first-contact.*"))  # removed at exit


def test_first_contact_without_wheels_says_so_and_passes_arguments_on(tmp_path):
    proc, report = _first_contact(tmp_path, tmp_path / "none", "--steps", "mirrored,bench")
    assert proc.returncode == 3
    assert "no wheels in" in proc.stderr and "fetch_wheels.sh" in proc.stderr
    assert [s["name"] for s in report["steps"]] == ["mirrored", "bench"]
    proc, _ = _first_contact(tmp_path, tmp_path / "none", "--steps", "nope")
    assert proc.returncode == 2


def test_first_contact_loads_the_mpich_wheel_it_installed(tmp_path):
    wheels = ROOT / "wheels"
    if not list(wheels.glob("mpich-*.whl")):
        pytest.skip("wheels/ holds no mpich wheel (tests/gpu/fetch_wheels.sh fetches it)")
    proc, report = _first_contact(tmp_path, wheels)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    loaded = report["environment"]["mpi"]["loaded_from"]
    assert loaded.startswith(str(tmp_path / "mpidist-first-contact.")), loaded
